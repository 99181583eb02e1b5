"""A host-side Harbor agent for the asynchronous-training tests (`--agent paced_agent:PacedAgent`):
three plain chat calls through the gateway, an append-only conversation. The test paces it: with
PACED_AGENT_WAIT="G:PATH" the trials of group G, after their first call, wait until PATH exists
(a checkpoint the trainer writes after an update), so their later calls come after that update."""

from __future__ import annotations

import asyncio
import os
import re
import time
from pathlib import Path

from chat_tools_agent import ChatToolsAgent
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext

CALLS = 3


class PacedAgent(ChatToolsAgent):
    """ChatToolsAgent's setup (api_base from the gateway), its own run: plain calls, no tools."""

    @staticmethod
    def name() -> str:
        return "paced-test-agent"

    def _waits_for(self) -> Path | None:
        group, _, path = os.environ.get("PACED_AGENT_WAIT", "").partition(":")
        trial = Path(self.logs_dir).parent.name  # <task>__g<group>_<index>__<id>
        match = re.search(r"__g(\d+)_", trial)
        return Path(path) if path and match and match.group(1) == group else None

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        from openai import AsyncOpenAI

        client = AsyncOpenAI(base_url=self.api_base, api_key="any", max_retries=0, timeout=120)
        messages = [{"role": "user", "content": instruction}]
        try:
            for call in range(CALLS):
                if call == 1 and (marker := self._waits_for()) is not None:
                    deadline = time.monotonic() + 300
                    while not marker.exists() and time.monotonic() < deadline:
                        await asyncio.sleep(0.05)
                reply = await client.chat.completions.create(model=self.model_name or "policy", messages=messages,
                                                             max_tokens=16)
                messages += [{"role": "assistant", "content": reply.choices[0].message.content or ""},
                             {"role": "user", "content": "Go on."}]
        finally:
            await client.close()
