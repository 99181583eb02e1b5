"""The interrupted-calls bench's agent (`--agent long_call_agent:LongCallAgent`, this folder on the
import path): `calls` plain chat calls through the gateway, each asking for the run's whole
max_new_tokens (the untrained tiny model writes to the limit), over an append-only conversation.
Generation-heavy on purpose: nearly all of a trial's time is decoding, so every weight update
lands on calls in flight."""

from __future__ import annotations

from harbor.agents.base import BaseAgent
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext


class LongCallAgent(BaseAgent):
    def __init__(self, logs_dir, model_name: str | None = None, api_base: str | None = None, calls: int = 2, **kwargs):
        super().__init__(logs_dir, model_name=model_name, **kwargs)
        if not api_base:
            raise ValueError("LongCallAgent needs api_base (the gateway session's OpenAI base URL)")
        self.api_base, self.calls = api_base, calls

    @staticmethod
    def name() -> str:
        return "long-call-bench-agent"

    def version(self) -> str | None:
        return "0"

    async def setup(self, environment: BaseEnvironment) -> None:
        pass

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        from openai import AsyncOpenAI

        client = AsyncOpenAI(base_url=self.api_base, api_key="any", max_retries=0, timeout=900)
        messages = [{"role": "user", "content": instruction}]
        try:
            for _ in range(self.calls):
                reply = await client.chat.completions.create(model=self.model_name or "policy", messages=messages)
                messages += [{"role": "assistant", "content": reply.choices[0].message.content or ""},
                             {"role": "user", "content": "Go on."}]
        finally:
            await client.close()
        context.metadata = {"exit_status": "submitted"}
