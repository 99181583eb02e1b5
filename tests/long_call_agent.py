"""A host-side Harbor agent whose model calls are long (`--agent long_call_agent:LongCallAgent`), for
the tests of calls a weight update interrupts: two plain chat calls through the gateway, each
asking for the run's whole max_new_tokens (the untrained tiny model writes to the limit), over an
append-only conversation, so an update under asynchronous training lands while a call decodes."""

from __future__ import annotations

from chat_tools_agent import ChatToolsAgent
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext

CALLS = 2


class LongCallAgent(ChatToolsAgent):
    """ChatToolsAgent's setup (api_base from the gateway), its own run: long plain calls, no tools."""

    @staticmethod
    def name() -> str:
        return "long-call-test-agent"

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        from openai import AsyncOpenAI

        client = AsyncOpenAI(base_url=self.api_base, api_key="any", max_retries=0, timeout=600)
        messages = [{"role": "user", "content": instruction}]
        try:
            for _ in range(CALLS):  # no max_tokens: the run's max_new_tokens
                reply = await client.chat.completions.create(model=self.model_name or "policy", messages=messages)
                messages += [{"role": "assistant", "content": reply.choices[0].message.content or ""},
                             {"role": "user", "content": "Go on."}]
        finally:
            await client.close()
        context.metadata = {"exit_status": "submitted"}
