"""A host-side Harbor agent of a user's own (`--agent chat_tools_agent:ChatToolsAgent`), for the
gateway tests: it speaks OpenAI chat completions with a `bash` tool through the openai SDK to the
`api_base` it is given, runs the tool calls it gets in the trial's sandbox, and sends the results
back as tool messages. A reply without a tool call is answered with a short user nudge, so every
episode runs `max_turns` model calls over an append-only conversation (one token-exact sample)."""

from __future__ import annotations

import json

from harbor.agents.base import BaseAgent
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext

BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command in the task's sandbox and return its output.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    },
}


class ChatToolsAgent(BaseAgent):
    def __init__(self, logs_dir, model_name: str | None = None, api_base: str | None = None, max_turns: int = 3,
                 api_key: str | None = None, **kwargs):
        super().__init__(logs_dir, model_name=model_name, **kwargs)
        if not api_base:
            raise ValueError("ChatToolsAgent needs api_base (the gateway session's OpenAI base URL)")
        self.api_base, self.api_key = api_base, api_key
        self.max_turns = max_turns

    @staticmethod
    def name() -> str:
        return "chat-tools-test-agent"

    def version(self) -> str | None:
        return "0"

    async def setup(self, environment: BaseEnvironment) -> None:
        pass

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        from openai import AsyncOpenAI

        client = AsyncOpenAI(base_url=self.api_base, api_key=self.api_key or "none", max_retries=0, timeout=120)
        messages = [{"role": "system", "content": "Solve the task with the bash tool."},
                    {"role": "user", "content": instruction}]
        turns = 0
        try:
            for turn in range(self.max_turns):
                messages = self.history(messages, turn)
                reply = await client.chat.completions.create(model=self.model_name or "policy", messages=messages,
                                                             tools=[BASH_TOOL], max_tokens=64)
                turns += 1
                message = reply.choices[0].message
                calls = message.tool_calls or []
                messages.append({"role": "assistant", "content": message.content or "",
                                 **({"tool_calls": [c.model_dump() for c in calls]} if calls else {})})
                if not calls:
                    messages.append({"role": "user", "content": "Use the bash tool."})
                for call in calls:
                    try:
                        command = json.loads(call.function.arguments).get("command", "")
                    except (json.JSONDecodeError, AttributeError):
                        command = ""
                    result = await environment.exec(command or "true", timeout_sec=30)
                    messages.append({"role": "tool", "tool_call_id": call.id,
                                     "content": (result.stdout or "") + (result.stderr or "")})
        finally:
            await client.close()
            context.metadata = {"turns": turns, "exit_status": "step_limit" if turns == self.max_turns else None}


    def history(self, messages: list[dict], turn: int) -> list[dict]:
        """The conversation sent for `turn`: the whole history (append-only)."""
        return messages


class CompactingAgent(ChatToolsAgent):
    """A user's agent that compacts its history before its last turn (`--agent
    chat_tools_agent:CompactingAgent`), as Claude Code's /compact does: the conversation restarts
    from the task and a summary, which does not extend what the policy sampled, so the gateway
    records a second branch and the episode comes back as two samples (segments) sharing its
    rollout_id, whatever the policy answered."""

    def history(self, messages: list[dict], turn: int) -> list[dict]:
        if turn != self.max_turns - 1:
            return messages
        return [messages[0], {"role": "user", "content": messages[1]["content"]
                              + f"\n\nSummary: {turn} turns so far, use the bash tool."}]


class GatewayLimitedAgent(ChatToolsAgent):
    """A user's agent without a step limit of its own (`--agent chat_tools_agent:GatewayLimitedAgent`):
    it asks the gateway to enforce `--step-limit` and stops when a call is refused, reporting no
    exit status of its own."""

    GATEWAY_STEP_LIMIT = True

    def __init__(self, logs_dir, max_turns: int = 50, **kwargs):
        super().__init__(logs_dir, max_turns=max_turns, **kwargs)

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        import openai

        try:
            await super().run(instruction, environment, context)
        except openai.BadRequestError:  # the gateway's step_limit_reached: the episode is over
            pass
        context.metadata = {"turns": (context.metadata or {}).get("turns")}
