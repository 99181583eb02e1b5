"""The tool conversation the gateway tests hold (the tool model of conftest.py is taught it), and a
gateway run in a fresh event loop."""

from __future__ import annotations

import asyncio

from slime_harbor.gateway.server import Gateway
from slime_harbor.policy.sampling import SamplingParams

TOOLS = [{"type": "function", "function": {
    "name": "bash", "description": "Run one shell command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}},
                   "required": ["command"]}}}]
SYSTEM = "You are a coding agent. Use the bash tool."
TASK = "List the files in the repository."
# What the SFT'd model answers at every turn: reasoning, content and a two-key tool call.
TOOL_REPLY = ('<think>\nlook first\n</think>\n\nI will list the files.\n<tool_call>\n'
              '{"name": "bash", "arguments": {"command": "ls -la", "timeout": 10}}\n</tool_call><|im_end|>')
TURNS = 10
# The run's sampling for the SFT'd model: cool enough that it keeps to the taught format.
RUN = SamplingParams(temperature=0.3, max_new_tokens=64)


def observation(k: int) -> str:
    return f"file_{k}.txt\nREADME.md"


def run_with_gateway(upstream: str, model_dir, scenario, **kwargs):
    """Start a gateway in a fresh event loop, run `scenario(gateway)`, close it; returns the
    scenario's result and the gateway's (now free) port."""
    async def main():
        gateway = Gateway(upstream, model_dir, **kwargs)
        await gateway.start()
        try:
            return await scenario(gateway), gateway.port
        finally:
            await gateway.aclose()

    return asyncio.run(main())
