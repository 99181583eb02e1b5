"""The native agent: a Harbor `BaseAgent` that samples token-in-token-out from the policy.

Style of mini-swe-agent(-plus): each turn the model writes a THOUGHT and exactly one bash command
in a ```bash block; the command runs in the sandbox and its output comes back as the next user
message. `edit_via_str_replace` edits files safely; `submit` ends the episode. Its prompts are
native.yaml's (a user's own file replaces them: the option `prompts`); the reply format is written
and parsed here alone (format_reply, reply_commands).

Why token-in-token-out: the loss must be computed on exactly the tokens the policy sampled. The
agent never re-renders the conversation. It keeps one growing list of token ids:

    ids = render(system, instruction) + sampled_1 + obs_1 + sampled_2 + obs_2 + ...

and sends the whole list as `input_ids` each turn. Observation tokens (the tool output wrapped in
the chat format's user turn) are bridged on by the model family's renderer, the one the gateway
uses (policy/renderer.py), so turn t+1's prompt extends turn t's prompt + completion exactly, and
the converter can mask them out without guessing.

Use from Harbor's CLI:
    harbor run -p TASK --agent-import-path slime_harbor.agents.native:NativeAgent \
        --agent-kwarg policy_url=http://127.0.0.1:30000 --agent-kwarg tokenizer_path=MODEL_DIR
"""

from __future__ import annotations

import dataclasses
import os
import re
import typing
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from harbor.agents.base import BaseAgent
from harbor.agents.options import AgentOptions
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext
from harbor.models.trajectories import (Agent, FinalMetrics, Metrics, Observation, ObservationResult, Step,
                                        ToolCall, Trajectory)
from harbor.utils.trajectory_utils import format_trajectory_json
from pydantic import create_model, Field, field_validator, model_validator

from slime_harbor.config_docs import field_docs
from slime_harbor.episode import CONTEXT_EXCEEDED, STEP_LIMIT
from slime_harbor.exits import ConfigError
from slime_harbor.policy.client import PolicyClient
from slime_harbor.policy.renderer import bridge_ids, make_renderer
from slime_harbor.policy.sampling import SamplingParams, turn_seed
from slime_harbor.agents.settings import AGENT_SETTINGS, AgentSettings, check_agent_settings

PROMPTS_FILE = Path(__file__).with_suffix(".yaml")
"""The default prompts (native.yaml); the option `prompts` names a file of a user's own."""


@dataclasses.dataclass(frozen=True)
class NativePrompts:
    """The agent's messages to the model (native.yaml says what each is)."""

    system_template: str
    instance_template: str
    observation_template: str
    format_error_template: str
    submit_command: str


def load_prompts(path: str | Path | None = None) -> NativePrompts:
    """native.yaml's prompts, with those a YAML file at `path` gives instead (ValueError, one
    line, for a file that is not a mapping of these keys to strings)."""
    import yaml

    prompts = yaml.safe_load(PROMPTS_FILE.read_text())
    if path is not None:
        try:
            given = yaml.safe_load(Path(path).read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"native agent prompts {path}: {' '.join(str(exc).split())}") from None
        keys = {f.name for f in dataclasses.fields(NativePrompts)}
        if not isinstance(given, dict) or set(given) - keys or not all(isinstance(v, str) for v in given.values()):
            raise ConfigError(f"native agent prompts {path}: a mapping of {', '.join(sorted(keys))} to strings")
        prompts |= given
    return NativePrompts(**prompts)


DEFAULT_PROMPTS = load_prompts()
TOOLS_DIR = "/tmp/.slime_harbor_tools"

# Runs inside the sandbox with the task's python3. Reads "old\n=======\nnew" from stdin.
EDIT_TOOL = r'''#!/usr/bin/env python3
import sys
if len(sys.argv) != 2:
    sys.exit("usage: edit_via_str_replace FILE <<'EOF'\nold\n=======\nnew\nEOF")
path, spec = sys.argv[1], sys.stdin.read()
parts = spec.split("\n=======\n")
if len(parts) != 2:
    sys.exit("error: stdin must hold the old text, a line '=======', then the new text")
# The heredoc ends the new text with a newline the user did not mean to insert.
old, new = parts[0], parts[1].removesuffix("\n")
try:
    text = open(path).read()
except OSError as e:
    sys.exit(f"error: cannot read {path}: {e.strerror}")
count = text.count(old)
if count != 1:
    sys.exit(f"error: the old text occurs {count} times in {path}; it must occur exactly once")
open(path, "w").write(text.replace(old, new, 1))
print(f"edited {path}")
'''

# --- the reply format: written here (SFT's demonstrations) and parsed here (every turn) ----------

BASH_BLOCK = re.compile(r"```bash\s*\n(.*?)\n?```", re.DOTALL)


def format_reply(thought: str, command: str) -> str:
    """A reply in the agent's format: a THOUGHT, then exactly one ```bash block."""
    return f"THOUGHT: {thought}\n```bash\n{command}\n```"


def reply_commands(text: str) -> list[str]:
    """The bash blocks of a reply (the agent runs the command of a reply with exactly one)."""
    return BASH_BLOCK.findall(text)


def initial_messages(instruction: str, prompts: NativePrompts = DEFAULT_PROMPTS) -> list[dict]:
    return [
        {"role": "system", "content": prompts.system_template},
        {"role": "user", "content": prompts.instance_template.format(instruction=instruction)},
    ]


def initial_prompt_ids(renderer, instruction: str, prompts: NativePrompts = DEFAULT_PROMPTS) -> list[int]:
    """System prompt + task instruction, rendered by the model family's renderer, ready to generate."""
    return list(renderer.render_ids(initial_messages(instruction, prompts), add_generation_prompt=True))


def format_observation(returncode: int, output: str, max_chars: int = 2000,
                       prompts: NativePrompts = DEFAULT_PROMPTS) -> str:
    """Tool output as the model sees it; long output keeps its head and tail."""
    if len(output) > max_chars:
        half = max_chars // 2
        output = f"{output[:half]}\n[... {len(output) - max_chars} characters elided ...]\n{output[-half:]}"
    if output and not output.endswith("\n"):
        output += "\n"
    return prompts.observation_template.format(returncode=returncode, output=output)


def next_prompt_ids(renderer, messages: list[dict], prompt_ids: list[int], completion_ids: list[int]) -> list[int]:
    """The next turn's prompt: `messages` so far (the last one the observation), as tokens.

    The renderer's bridge (the gateway's, policy/renderer.py) appends the template tokens that
    close the sampled turn and wrap the observation as a user turn to prompt + completion, so the
    next prompt extends this one and the converter masks the new tokens without guessing. Where no
    bridge extends it (a reply the family cannot close, e.g. an open <think> then end-of-turn), the
    conversation is rendered anew, as the gateway starts a branch: the converter starts a new
    sample there.
    """
    bridged = bridge_ids(renderer, prompt_ids, completion_ids, messages[-1:])
    return bridged if bridged is not None else list(renderer.render_ids(messages, add_generation_prompt=True))


class _NativeOptions(AgentOptions):
    """The native agent's own options; NativeAgentOptions adds the run's agent settings."""

    policy_url: str | None = Field(
        default=None, description="Base URL of the policy server: the engines' router, or our embedded server (env SLIME_HARBOR_POLICY_URL)."
    )
    tokenizer_path: str | None = Field(
        default=None, description="HF model/tokenizer dir of the policy (env SLIME_HARBOR_TOKENIZER)."
    )
    renderer: str | None = Field(
        default=None, description="The policy's chat format, a `renderers` name (policy/chat_formats.py); "
        "None = the checkpoint's own."
    )
    sampling: SamplingParams = Field(
        default_factory=SamplingParams,
        description="Every turn's sampling (policy/sampling.py's SamplingParams, as a dict of its fields: "
        "temperature, top_p, top_k, max_new_tokens, stop, stop_token_ids, return_top_p_token_ids, ...). Its "
        "sampling_seed is the episode's (SLiME's under deterministic inference; None = random): turn t sends "
        "turn_seed(seed, t), so turns draw different noise and the episode replays exactly. With "
        "return_top_p_token_ids (SLiME's top-p replay, needed when --rollout-top-p != 1) the server reports "
        "logprobs renormalised over the kept ids. A turn gets at most the context's room as max_new_tokens.",
    )
    command_timeout_sec: float = Field(default=60.0, description="Timeout of one bash command in the sandbox.")
    max_observation_chars: int = Field(
        default=2000, description="Tool output longer than this keeps its head and tail only."
    )
    prompts: str | None = Field(
        default=None, description="A YAML file of prompts replacing native.yaml's (any of its keys: system_template, "
        "instance_template, observation_template, format_error_template, submit_command); None = native.yaml's.",
    )

    @field_validator("sampling", mode="before")
    @classmethod
    def _over_episode_defaults(cls, value):
        """A partial dict (Harbor's --agent-kwarg 'sampling={"temperature": 0.7}') keeps
        SamplingParams' defaults for the fields it leaves out, as a missing option would."""
        return {**dataclasses.asdict(SamplingParams()), **value} if isinstance(value, dict) else value

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, values):
        """lora_path: the option's name before it was RolloutConfig's lora_name (launch scripts keep it)."""
        if isinstance(values, dict) and "lora_path" in values and "lora_name" not in values:
            values = {**values, "lora_name": values["lora_path"]}
            del values["lora_path"]
        return values

    @model_validator(mode="after")
    def _checked(self):
        check_agent_settings(self)  # the same checks as a RolloutConfig's
        return self


def _agent_setting_fields() -> dict[str, tuple]:
    """The agent settings as pydantic fields: AgentSettings' types, defaults and docstrings."""
    types, docs, defaults = typing.get_type_hints(AgentSettings), field_docs(AgentSettings), AgentSettings()
    return {name: (types[name], Field(default=getattr(defaults, name), description=docs[name]))
            for name in AGENT_SETTINGS}


NativeAgentOptions = create_model("NativeAgentOptions", __base__=_NativeOptions, __module__=__name__,
                                  __doc__="Harbor `AgentConfig.kwargs` of the native agent: its own options and "
                                  "the agent settings (agents/settings.py's AgentSettings), as declared there.",
                                  **_agent_setting_fields())


class _EpisodeEnd(Exception):
    """Leaving the loop: carries why (submitted, step_limit, context_exceeded, aborted)."""

    def __init__(self, exit_status: str):
        super().__init__(exit_status)
        self.exit_status = exit_status


class NativeAgent(BaseAgent):
    options_model = NativeAgentOptions
    options: NativeAgentOptions

    @staticmethod
    def name() -> str:
        return "slime-harbor-native"

    def version(self) -> str | None:
        return "0.1.0"

    def __init__(self, logs_dir: Path, model_name: str | None = None, *args, **kwargs):
        super().__init__(logs_dir, model_name, *args, **kwargs)
        opts = self.options
        self.policy_url = opts.policy_url or os.environ.get("SLIME_HARBOR_POLICY_URL")
        tokenizer_path = opts.tokenizer_path or os.environ.get("SLIME_HARBOR_TOKENIZER")
        if not self.policy_url or not tokenizer_path:
            raise ConfigError("NativeAgent needs policy_url and tokenizer_path (kwargs or SLIME_HARBOR_* env vars)")
        from transformers import AutoConfig, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
        # The run's chat format (the gateway's too): opts.renderer, else the checkpoint's own.
        self.renderer = make_renderer(tokenizer_path, self.tokenizer, opts.renderer)
        self.max_context_len = opts.max_context_len or AutoConfig.from_pretrained(
            tokenizer_path
        ).max_position_embeddings
        self.params = opts.sampling
        self.prompts = load_prompts(opts.prompts)

    async def setup(self, environment: BaseEnvironment) -> None:
        tool = self.logs_dir / "edit_via_str_replace"
        tool.parent.mkdir(parents=True, exist_ok=True)
        tool.write_text(EDIT_TOOL)
        await environment.exec(f"mkdir -p {TOOLS_DIR}")
        await environment.upload_file(tool, f"{TOOLS_DIR}/edit_via_str_replace")
        await environment.exec(f"chmod +x {TOOLS_DIR}/edit_via_str_replace")

    # ---- the loop -------------------------------------------------------------------------
    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        self._messages = initial_messages(instruction, self.prompts)
        ids = initial_prompt_ids(self.renderer, instruction, self.prompts)
        # Filled in place every turn, so a timeout or crash still leaves every finished turn.
        detail: dict[str, Any] = {"prompt_token_ids": [], "completion_token_ids": [], "logprobs": [],
                                  "extra": {"finish_reason": [], "weight_version": [], "version_spans": [],
                                            "interrupted": [], "discarded_tokens": [], "reprefill_tokens": []}}
        if self.params.return_top_p_token_ids:
            # Per turn, flat kept ids and their len(completion) + 1 offsets (None: nothing truncated).
            detail["extra"]["top_p_token_ids"] = []
            detail["extra"]["top_p_token_offsets"] = []
        context.rollout_details = [detail]
        context.metadata = {"exit_status": "running", "turns": 0, "format_errors": 0}
        context.n_input_tokens = context.n_output_tokens = 0
        self._steps: list[Step] = []
        self._add_step("system", self._messages[0]["content"])
        self._add_step("user", self._messages[1]["content"])
        client = PolicyClient(self.policy_url, lora_path=self.options.lora_name, api=self.options.policy_api,
                              reissue_aborted=self.options.reissue_aborted_calls,
                              keep_interrupted=self.options.keep_interrupted_calls, tokenizer=self.tokenizer,
                              model=self.model_name)
        try:
            for _ in range(self.options.step_limit):
                ids = await self._turn(ids, client, environment, context, detail)
            raise _EpisodeEnd(STEP_LIMIT)
        except _EpisodeEnd as end:
            context.metadata["exit_status"] = end.exit_status
        finally:
            await client.aclose()
            self._write_trajectory(context)

    async def _turn(self, ids, client, environment, context, detail) -> list[int]:
        room = self.max_context_len - len(ids)
        if room <= 0:  # the prompt fills the context (the instruction alone, or the turns so far)
            raise _EpisodeEnd(CONTEXT_EXCEEDED)
        turn = context.metadata["turns"]
        seed = self.params.sampling_seed  # the episode's
        params = dataclasses.replace(
            self.params,
            max_new_tokens=min(self.params.max_new_tokens, room),
            sampling_seed=turn_seed(seed, turn) if seed is not None else None,
        )
        gen = await client.generate(ids, params, routing_key=self.options.routing_key)

        detail["prompt_token_ids"].append(list(ids))
        detail["completion_token_ids"].append(gen.token_ids)
        detail["logprobs"].append(gen.logprobs)
        detail["extra"]["finish_reason"].append(gen.finish_reason)
        detail["extra"]["weight_version"].append(gen.weight_version)  # the weights that sampled this turn
        detail["extra"]["version_spans"].append(gen.version_spans)  # ... token by token
        for key, value in (("interrupted", gen.interrupted), ("discarded_tokens", gen.discarded_tokens),
                           ("reprefill_tokens", gen.reprefill_tokens)):
            detail["extra"][key].append(value)
        if self.params.return_top_p_token_ids:
            detail["extra"]["top_p_token_ids"].append(gen.top_p_token_ids)
            detail["extra"]["top_p_token_offsets"].append(gen.top_p_token_offsets)
        context.metadata["turns"] += 1
        context.n_input_tokens += len(ids)
        context.n_output_tokens += len(gen.token_ids)
        text = self.tokenizer.decode(gen.token_ids, skip_special_tokens=True)
        step = self._add_step("agent", text, model_name=self.model_name, metrics=Metrics(
            prompt_tokens=len(ids), completion_tokens=len(gen.token_ids),
            completion_token_ids=gen.token_ids, logprobs=gen.logprobs))
        if gen.finish_reason == "abort":
            raise _EpisodeEnd("aborted")
        if gen.finish_reason == "length" and len(ids) + len(gen.token_ids) >= self.max_context_len:
            raise _EpisodeEnd(CONTEXT_EXCEEDED)  # the reply filled the context: no next turn fits

        blocks = reply_commands(text)
        if len(blocks) != 1:
            context.metadata["format_errors"] += 1
            observation = self.prompts.format_error_template.format(n_blocks=len(blocks))
        else:
            command = blocks[0].strip()
            step.tool_calls = [ToolCall(tool_call_id=f"call_{step.step_id}", function_name="bash",
                                        arguments={"command": command})]
            if command == self.prompts.submit_command:
                raise _EpisodeEnd("submitted")
            observation = await self._execute(command, environment)
        step.observation = Observation(results=[ObservationResult(content=observation)])
        self._write_trajectory(context)
        self._messages += [{"role": "assistant", "content": text}, {"role": "user", "content": observation}]
        return next_prompt_ids(self.renderer, self._messages, ids, gen.token_ids)

    async def _execute(self, command: str, environment: BaseEnvironment) -> str:
        timeout = self.options.command_timeout_sec
        try:
            result = await environment.exec(
                f'export PATH="$PATH:{TOOLS_DIR}"\n{command}', timeout_sec=int(timeout)
            )
        except (TimeoutError, RuntimeError) as exc:
            # Harbor's environments report an exec timeout as RuntimeError("... timed out ...").
            if isinstance(exc, RuntimeError) and "timed out" not in str(exc):
                raise
            return format_observation(124, f"command timed out after {timeout:g}s", self.options.max_observation_chars,
                                      self.prompts)
        output = (result.stdout or "") + (result.stderr or "")
        return format_observation(result.return_code, output, self.options.max_observation_chars, self.prompts)

    # ---- ATIF trajectory (Harbor's models: harbor.models.trajectories) -----------------------
    def _add_step(self, source: str, message: str, **fields) -> Step:
        step = Step(step_id=len(self._steps) + 1, timestamp=datetime.now(timezone.utc).isoformat(),
                    source=source, message=message, **fields)
        self._steps.append(step)
        return step

    def _write_trajectory(self, context: AgentContext) -> None:
        trajectory = Trajectory(
            session_id=self.session_id,
            agent=Agent(name=self.name(), version=self.version(), model_name=self.model_name),
            steps=self._steps,
            final_metrics=FinalMetrics(
                total_prompt_tokens=context.n_input_tokens,
                total_completion_tokens=context.n_output_tokens,
                total_steps=len(self._steps),
            ),
            # ATIF has no field for why the episode ended.
            extra={"exit_status": (context.metadata or {}).get("exit_status")},
        )
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        (self.logs_dir / "trajectory.json").write_text(format_trajectory_json(trajectory.to_json_dict()))
