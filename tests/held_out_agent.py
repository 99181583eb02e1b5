"""A host-side Harbor agent that applies a held-out solution (`--agent held_out_agent:HeldOutAgent`,
agent kwargs `files`: sandbox path -> host file to write there), the way a policy's agent would
write it: through the sandbox, never through the task's own solution/ (the task's gold stays the
task's, as the impossible twin's check needs). It samples nothing from the model it is given."""

from __future__ import annotations

from pathlib import Path

from harbor.agents.base import BaseAgent
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext


class HeldOutAgent(BaseAgent):
    def __init__(self, logs_dir, model_name: str | None = None, api_base: str | None = None,
                 files: dict[str, str] | None = None, **kwargs):
        super().__init__(logs_dir, model_name=model_name, **kwargs)
        self.files = dict(files or {})

    @staticmethod
    def name() -> str:
        return "held-out-solution-test-agent"

    def version(self) -> str | None:
        return "0"

    async def setup(self, environment: BaseEnvironment) -> None:
        pass

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        for target, source in self.files.items():
            await environment.upload_file(Path(source), target)
        context.metadata = {"exit_status": "submitted"}
