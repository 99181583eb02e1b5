"""A host-side Harbor agent that applies a held-out solution (`--agent held_out_agent:HeldOutAgent`),
the way a policy's agent would: one call to the model it is given (through the gateway, so its
episode has tokens), then the files written through the sandbox, never through the task's own
solution/ (the task's gold stays the task's, as the impossible twin's check needs). The files:
agent kwarg `files` (sandbox path -> host file), else the JSON of $HELD_OUT_AGENT_FILES (the SLiME
hook passes no agent kwargs); `files_by_task` (task dir name -> such a dict) lets one run apply
another solution to each of its tasks (the trial's name starts with its task's)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from harbor.agents.base import BaseAgent
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext


class HeldOutAgent(BaseAgent):
    def __init__(self, logs_dir, model_name: str | None = None, api_base: str | None = None,
                 files: dict[str, str] | None = None, files_by_task: dict[str, dict[str, str]] | None = None,
                 **kwargs):
        super().__init__(logs_dir, model_name=model_name, **kwargs)
        self.api_base = api_base
        self.files = dict(files or json.loads(os.environ.get("HELD_OUT_AGENT_FILES", "{}")))
        trial_name = Path(logs_dir).parent.name
        for task, task_files in (files_by_task or {}).items():
            if trial_name.startswith(f"{task}__"):
                self.files = dict(task_files)

    @staticmethod
    def name() -> str:
        return "held-out-solution-test-agent"

    def version(self) -> str | None:
        return "0"

    async def setup(self, environment: BaseEnvironment) -> None:
        pass

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        if self.api_base:
            from openai import AsyncOpenAI

            client = AsyncOpenAI(base_url=self.api_base, api_key="any", max_retries=0, timeout=120)
            try:
                await client.chat.completions.create(model=self.model_name or "policy", max_tokens=8,
                                                     messages=[{"role": "user", "content": instruction}])
            finally:
                await client.close()
        for target, source in self.files.items():
            await environment.upload_file(Path(source), target)
        context.metadata = {"exit_status": "submitted"}
