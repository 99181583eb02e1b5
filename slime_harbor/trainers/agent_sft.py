"""SFT episodes in a third-party agent's own format: what `slime-harbor demo --agent mini-swe-agent`
warm-starts on.

The native agent's episodes are ours to render (`tasks.families.oracle_episode`). Harbor's
mini-swe-agent's are not: its system prompt, how it presents the task, its tools and how it
reports a command's output are its own (its default tool-calling config), and the gateway renders
them with the policy's chat template. So the format is read off the agent itself: one real trial
of it, in the run's own sandbox, against a scripted endpoint in the gateway's place that answers a
silent command, then the submit command, and records the two requests (`capture_format`). An
oracle episode of any instance is then those messages with the instance's instruction in the
task's place, rendered and bridged exactly as a gateway session renders them
(`GatewaySession.resolve`: the first prompt rendered whole, every later one the earlier tokens
bridged to the new messages), with the replies in the model family's tool-call format
(`agent_episode`). Every family's command is silent and succeeds, so the captured observation of
the silent command is the observation of every oracle command.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from slime_harbor.tasks import families as task_families

SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
"""mini-swe-agent's submit command (its default config ends the episode on this output)."""
SILENT_COMMAND = "true"
"""What the scripted endpoint has the agent run first: silent and successful, like every oracle command."""
SFT_AGENTS = ("mini-swe-agent",)
"""Agents whose format capture_format reads (a bash tool and a submit command)."""


@dataclass(frozen=True)
class AgentFormat:
    """One agent's requests, read off a real trial: the first request's messages (the task's
    instruction in them), its tools, and the messages it adds after a silent command."""

    agent: str
    instruction: str
    first_messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    observation_messages: list[dict[str, Any]]

    def messages_for(self, instruction: str) -> list[dict[str, Any]]:
        """The first request's messages with `instruction` in the captured task's place."""
        out = []
        for message in self.first_messages:
            content = message.get("content")
            if isinstance(content, str) and self.instruction in content:
                message = {**message, "content": content.replace(self.instruction, instruction)}
            out.append(message)
        return out


def reply_text(command: str) -> str:
    """A reply that calls the agent's bash tool, in the Qwen3 / Hermes format the gateway parses."""
    call = json.dumps({"name": "bash", "arguments": {"command": command}})
    return f"<tool_call>\n{call}\n</tool_call><|im_end|>"


def agent_episode(fmt: AgentFormat, renderer, tokenizer, instruction: str, commands: list[str]):
    """The token sequence and loss mask of an episode that runs `commands` (one per turn): the
    tokens a gateway session holds for it, replies masked 1."""
    prompt = renderer.render_ids(fmt.messages_for(instruction), tools=fmt.tools, add_generation_prompt=True)
    tokens, mask = list(prompt), [0] * len(prompt)
    for k, command in enumerate(commands):
        if k:
            bridged = renderer.bridge_to_next_turn(tokens, reply, fmt.observation_messages, tools=fmt.tools)
            if bridged is None or bridged.token_ids[: len(tokens) + len(reply)] != tokens + reply:
                raise RuntimeError(f"the renderer cannot bridge {fmt.agent}'s observation onto a reply")
            new = bridged.token_ids[len(tokens) + len(reply):]
            tokens, mask = tokens + reply + new, mask + [1] * len(reply) + [0] * len(new)
        reply = tokenizer.encode(reply_text(command), add_special_tokens=False)
    return tokens + reply, mask + [1] * len(reply)


def oracle_agent_episode(fmt: AgentFormat, renderer, tokenizer, inst: task_families.Instance,
                         command: str | None = None):
    """`tasks.families.oracle_episode` in the agent's format: the command (or `command`, e.g. the
    near miss), then submit."""
    return agent_episode(fmt, renderer, tokenizer, inst.instruction, [command or inst.command, SUBMIT])


# ---- reading the format off the agent -----------------------------------------------------------


class ScriptedChat:
    """An OpenAI chat-completions endpoint on loopback, in the gateway's place: it records each
    request and answers with a bash tool call, `commands` in order."""

    def __init__(self, commands: list[str]):
        self.requests: list[dict[str, Any]] = []
        scripted = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                scripted.requests.append(body)
                n = len(scripted.requests)
                command = commands[min(n, len(commands)) - 1]
                reply = {
                    "id": f"chatcmpl-{n}", "object": "chat.completion", "created": 0, "model": body.get("model"),
                    "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                        "role": "assistant", "content": "",
                        "tool_calls": [{"id": f"call_{n}", "type": "function", "function": {
                            "name": "bash", "arguments": json.dumps({"command": command})}}]}}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                }  # fmt: skip
                data = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def capture_format(agent: str, env: str, inst: task_families.Instance, work: Path, model_name: str = "policy",
                   max_new_tokens: int = 64) -> AgentFormat:
    """Run `agent` once on `inst` in sandbox `env` against ScriptedChat (a silent command, then
    submit) and read its format off the two requests it sent."""
    from harbor.models.trial.config import TaskConfig, TrialConfig
    from harbor.trial.trial import Trial

    from slime_harbor.trial_setup import ModelEndpoint, RolloutConfig, agent_config, environment_config

    if agent not in SFT_AGENTS:
        raise ValueError(f"no SFT format for agent {agent!r}: one of {', '.join(SFT_AGENTS)}")
    if work.exists():
        shutil.rmtree(work)
    task_dir = task_families.write_task(inst, work / "tasks")
    scripted = ScriptedChat([SILENT_COMMAND, SUBMIT])
    try:
        where = SimpleNamespace(host="127.0.0.1", port=scripted.port)  # what the sandbox forwards to
        cfg = RolloutConfig(agent=agent, env=env, step_limit=3, model_name=model_name, max_new_tokens=max_new_tokens)
        agent_cfg = agent_config(cfg, ModelEndpoint.of(where, "format-capture"))
        config = TrialConfig(task=TaskConfig(path=task_dir), trials_dir=work / "trials", agent=agent_cfg,
                             environment=environment_config(env, where, agent_cfg))
        result = asyncio.run(_run_trial(config, Trial))
    finally:
        scripted.close()
    requests = scripted.requests
    if result.exception_info is not None or len(requests) != 2:
        why = result.exception_info.exception_message if result.exception_info else f"{len(requests)} requests"
        raise RuntimeError(f"could not read {agent}'s format off a trial in {work / 'trials'}: {why}")
    first, second = requests[0]["messages"], requests[1]["messages"]
    if second[: len(first)] != first or second[len(first)]["role"] != "assistant":
        raise RuntimeError(f"{agent}'s second request does not extend its first: its format is not append-only")
    if sum(inst.instruction in str(m.get("content")) for m in first) != 1:
        raise RuntimeError(f"{agent}'s first request does not hold the task's instruction verbatim, once")
    return AgentFormat(agent=agent, instruction=inst.instruction, first_messages=first,
                       tools=requests[0].get("tools") or [], observation_messages=second[len(first) + 1:])


async def _run_trial(config, trial_cls):
    trial = await trial_cls.create(config)
    return await trial.run()
