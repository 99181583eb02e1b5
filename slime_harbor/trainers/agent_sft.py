"""SFT episodes in a third-party agent's own format: what `slime-harbor demo --agent mini-swe-agent`
warm-starts on.

The native agent's episodes are ours to render (`trainers.sft.oracle_episode`). Harbor's
mini-swe-agent's are not: its system prompt, how it presents the task, its tools and how it
reports a command's output are its own (its default tool-calling config), and the gateway renders
them with the policy's chat template. So the format is read off the agent itself
(`capture_format`): one real trial of it, in the run's own sandbox, through the gateway
(slime_harbor.gateway) with a script in the policy's place (`ScriptedPolicy`: the token ids of a
silent command's tool call, then the submit command's, which the gateway parses into the OpenAI
tool calls the agent gets), and the two requests the agent sent, kept as it sent them. An oracle
episode of any instance is then those messages with the instance's instruction in the task's
place, rendered and bridged exactly as a gateway session renders them (`GatewaySession.resolve`:
the first prompt rendered whole, every later one the earlier tokens bridged to the new messages),
with the replies in the model family's tool-call format (`agent_episode`). Every family's
command is silent and succeeds, so the captured observation of the silent command is the
observation of every oracle command.
"""

from __future__ import annotations

import asyncio
import copy
import shutil
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slime_harbor.episode import episode_end
from slime_harbor.gateway.server import Gateway
from slime_harbor.policy.chat_formats import bash_call_text, sampled_part
from slime_harbor.policy.renderer import make_renderer
from slime_harbor.policy.sampling import Generation, SamplingParams
from slime_harbor.samples import SampleStatus
from slime_harbor.tasks import families as task_families

SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
"""mini-swe-agent's submit command (its default config ends the episode on this output)."""
SILENT_COMMAND = "true"
"""What the scripted policy has the agent run first: silent and successful, like every oracle command."""
SFT_AGENTS = ("mini-swe-agent",)
"""Agents whose format capture_format reads (a bash tool and a submit command)."""
FORMAT_TRIAL = "format-capture"
"""The name of capture_format's trial (its dir under `work`/trials) and of its gateway session."""
FORMAT_TRIAL_ATTEMPTS = 3
"""Tries of that trial when it ends in an infrastructure failure (an environment that did not
start, an install that ran out of budget: rollout's env_start_retries + 1)."""


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


def reply_ids(renderer, tokenizer, prompt_ids: list[int], command: str) -> list[int]:
    """The token ids the policy samples after `prompt_ids` for a turn that calls the agent's bash
    tool with `command`, in the renderer's chat format (chat_formats.ChatFormat.bash_call), the
    part the generation prompt already holds left out."""
    turn = bash_call_text(renderer.config.name, command)
    return tokenizer.encode(sampled_part(turn, tokenizer.decode(prompt_ids)), add_special_tokens=False)


def agent_episode(fmt: AgentFormat, renderer, tokenizer, instruction: str, commands: list[str]):
    """The token sequence and loss mask of an episode that runs `commands` (one per turn): the
    tokens a gateway session holds for it, replies masked 1."""
    prompt = renderer.render_ids(fmt.messages_for(instruction), tools=fmt.tools, add_generation_prompt=True)
    tokens, mask, reply = list(prompt), [0] * len(prompt), []
    for k, command in enumerate(commands):
        if k:
            bridged = renderer.bridge_to_next_turn(tokens, reply, fmt.observation_messages, tools=fmt.tools)
            if bridged is None or bridged.token_ids[: len(tokens) + len(reply)] != tokens + reply:
                raise RuntimeError(f"the renderer cannot bridge {fmt.agent}'s observation onto a reply")
            new = bridged.token_ids[len(tokens) + len(reply):]
            tokens, mask = tokens + reply + new, mask + [1] * len(reply) + [0] * len(new)
        reply = reply_ids(renderer, tokenizer, tokens, command)
    return tokens + reply, mask + [1] * len(reply)


def oracle_agent_episode(fmt: AgentFormat, renderer, tokenizer, inst: task_families.Instance,
                         command: str | None = None):
    """`trainers.sft.oracle_episode` in the agent's format: the command (or `command`, e.g. the
    near miss), then submit."""
    return agent_episode(fmt, renderer, tokenizer, inst.instruction, [command or inst.command, SUBMIT])


# ---- reading the format off the agent -----------------------------------------------------------


class ScriptedPolicy:
    """The gateway's upstream from a script (gateway.server.Upstream): call k's completion is the
    token ids of a bash tool call of `commands[k]` (the last one repeats) in the renderer's chat
    format (`reply_ids`), logprob 0 per token. A script, not a sampler: the run's max_new_tokens
    does not cut a reply. `prompts` holds the prompt ids of every call."""

    def __init__(self, commands: list[str], renderer, tokenizer):
        self.commands, self.renderer, self.tokenizer = commands, renderer, tokenizer
        self.prompts: list[list[int]] = []

    async def generate(self, input_ids: list[int], params: SamplingParams, rid: str | None = None,
                       routing_key: str | None = None) -> Generation:
        self.prompts.append(list(input_ids))
        command = self.commands[min(len(self.prompts), len(self.commands)) - 1]
        ids = reply_ids(self.renderer, self.tokenizer, input_ids, command)
        return Generation(token_ids=ids, logprobs=[0.0] * len(ids), text=self.tokenizer.decode(ids),
                          finish_reason="stop", rid=rid or uuid.uuid4().hex)

    async def abort(self, rid: str) -> None:
        pass  # every call is answered at once: nothing runs to abort

    async def aclose(self) -> None:
        pass


class RecordingGateway(Gateway):
    """The gateway, also keeping every turn's messages and tools exactly as the agent sent them
    (`requests`, in arrival order): its calls keep the messages canonicalised (`Call.request`),
    and an SFT episode is rendered from what the agent really sends."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.requests: list[dict[str, Any]] = []

    async def complete(self, request, session, asked, dialect):
        self.requests.append({"messages": copy.deepcopy(asked.messages), "tools": copy.deepcopy(asked.tools)})
        return await super().complete(request, session, asked, dialect)


def capture_format(agent: str, env: str, inst: task_families.Instance, work: Path, model_name: str = "policy",
                   max_new_tokens: int = 64, model_dir: str | Path | None = None) -> AgentFormat:
    """Run `agent` once on `inst` in sandbox `env` through the gateway serving `model_dir`'s
    policy (default: the offline tiny model), a ScriptedPolicy in the policy's place (a silent
    command, then submit), and read its format off the two requests it sent."""
    if agent not in SFT_AGENTS:
        raise ValueError(f"no SFT format for agent {agent!r}: one of {', '.join(SFT_AGENTS)}")
    if model_dir is None:
        from slime_harbor.policy.tiny_model import ensure_tiny_model

        model_dir = ensure_tiny_model()
    if work.exists():
        shutil.rmtree(work)
    task_dir = task_families.write_task(inst, work / "tasks")
    for attempt in range(1, FORMAT_TRIAL_ATTEMPTS + 1):  # an infrastructure failure is retried, as in a rollout
        shutil.rmtree(work / "trials", ignore_errors=True)
        result, requests, stats = asyncio.run(_scripted_trial(agent, env, task_dir, work, Path(model_dir), model_name,
                                                              max_new_tokens))
        ended = episode_end(result)
        if ended.status != SampleStatus.ABORTED or attempt == FORMAT_TRIAL_ATTEMPTS:
            break
        print(f"  reading {agent}'s format: the trial hit an infrastructure failure ({ended.why}); "
              f"trying again ({attempt + 1} of {FORMAT_TRIAL_ATTEMPTS})", file=sys.stderr)
    if result.exception_info is not None or len(requests) != 2 or stats["delivered"] != 2:
        why = (result.exception_info.exception_message if result.exception_info
               else f"{len(requests)} requests, {stats['delivered']} replies delivered")
        raise RuntimeError(f"could not read {agent}'s format off a trial in {work / 'trials'}: {why}")
    first, second = requests[0]["messages"], requests[1]["messages"]
    if second[: len(first)] != first or second[len(first)]["role"] != "assistant" or stats["branches"] != 1:
        raise RuntimeError(f"{agent}'s second request does not extend its first: its format is not append-only")
    if sum(inst.instruction in str(m.get("content")) for m in first) != 1:
        raise RuntimeError(f"{agent}'s first request does not hold the task's instruction verbatim, once")
    return AgentFormat(agent=agent, instruction=inst.instruction, first_messages=first,
                       tools=requests[0].get("tools") or [], observation_messages=second[len(first) + 1:])


async def _scripted_trial(agent: str, env: str, task_dir: Path, work: Path, model_dir: Path, model_name: str,
                          max_new_tokens: int):
    """The trial of capture_format, wired as rollout.py wires a gateway agent's (one session, its
    URL handed to the agent, the sandbox forwarding to the gateway): (its result, the requests as
    the agent sent them, the session's stats)."""
    from harbor.models.trial.config import TaskConfig, TrialConfig
    from harbor.trial.trial import Trial
    from transformers import AutoTokenizer

    from slime_harbor.agents.placement import ModelEndpoint, agent_config, gateway_step_limit
    from slime_harbor.run_config import RolloutConfig
    from slime_harbor.trial_setup import environment_config, install_agents_first

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    policy = ScriptedPolicy([SILENT_COMMAND, SUBMIT], make_renderer(model_dir, tokenizer), tokenizer)
    gateway = RecordingGateway(None, model_dir, served_model_name=model_name, upstream=policy)
    await gateway.start()
    try:
        cfg = RolloutConfig(agent=agent, env=env, step_limit=3, model_name=model_name,
                            sampling=SamplingParams(max_new_tokens=max_new_tokens))
        session = gateway.open_session(FORMAT_TRIAL, record_dir=work / "trials" / FORMAT_TRIAL / "agent" / "gateway",
                                       sampling=cfg.sampling)
        agent_cfg = agent_config(cfg, ModelEndpoint.of(gateway, session))
        session.max_calls = gateway_step_limit(agent_cfg, cfg.step_limit)
        config = TrialConfig(task=TaskConfig(path=task_dir), trial_name=FORMAT_TRIAL, trials_dir=work / "trials",
                             agent=agent_cfg, environment=environment_config(env, gateway, agent_cfg))
        trial = await Trial.create(config)
        install_agents_first(trial)
        result = await trial.run()
    finally:
        await gateway.aclose()  # closes the session: calls.jsonl and session.json in its record dir
    return result, gateway.requests, session.stats
