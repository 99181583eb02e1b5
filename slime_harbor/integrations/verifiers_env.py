"""slime-harbor as a verifiers v1 environment: the plugin prime-rl's orchestrator (and `vf-eval`) loads.

    [orchestrator.train.source.env.taskset]
    id = "slime-harbor-verifiers"          # the top-level shim package; or "slime_harbor.integrations.verifiers_env"
    tasks_dir = "examples/harbor/tasks"
    environment_type = "local"             # local (bubblewrap) | docker | any Harbor env type | module:Class
    agent = "native"                       # native | terminus-2 | mini-swe-agent | <Harbor agent> | module:Class
    max_turns = 30
    n_parallel_envs = 8

One episode is one real Harbor Trial through rollout.run_episode (Harbor's runner, the task's
environment, the agent, the task's own verifier), sampling from the OpenAI-compatible server and
model verifiers hands the env (`ModelContext`: prime-rl's vLLM, or any /v1 base URL). The native
agent sends token ids to /v1/completions (vLLM's token-in / token-out); every other agent (terminus-2,
mini-swe-agent, any Harbor agent or module:Class) speaks chat completions to our recording gateway,
which renders the prompt and sends token ids to that same /v1/completions (one gateway per env
process and model, closed when the env stops). The trial's samples, from our converter, become the
trace prime-rl trains on: one chain of message nodes per sample (the prompt, then each sampled
completion with its logprobs and mask True, each observation with mask False), so each
`trace.branches[i]` carries exactly the tokens, mask and logprobs of one of our samples. The
verifier's `reward_key` value is the reward; its other values are metrics. Infra failures (sandbox,
policy server, verifier without a reward file) are trace errors, never a zero reward, so prime-rl
drops them instead of training on them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import re
import time
from collections.abc import Iterator
from pathlib import Path

import verifiers.v1 as vf
from pydantic import create_model, Field, model_validator
from verifiers.v1.envs.single_agent import SingleAgentEnv
from verifiers.v1.trace import AgentInfo, TraceTask

from slime_harbor.integrations.verifiers_trace import fill_trace
from slime_harbor.policy.sampling import SamplingParams
from slime_harbor.retries import RetryBudget
from slime_harbor.policy.renderer import load_tokenizer
from slime_harbor.rollout import close_shared_gateways, run_episode, shared_gateway
from slime_harbor.tasks.task_dir import discover_tasks
from slime_harbor.agents.settings import check_agent_settings
from slime_harbor.config_docs import derived_fields
from slime_harbor.agents.placement import uses_gateway
from slime_harbor.run_config import check_run_settings, RolloutConfig


class _HarborTrialsOwnConfig(vf.TasksetConfig):
    """The plugin's own knobs (HarborTrialsConfig adds a rollout's, VERIFIERS_KNOBS)."""

    max_new_tokens: int = Field(SamplingParams.max_new_tokens, ge=1)
    """Tokens per turn when the run's sampling sets no max_tokens."""
    tokenizer: str | None = None
    """The policy's HF tokenizer (dir or hub id); default: the client's renderer_model_name, else the model."""
    reward_key: str = "reward"
    """The verifier value (reward.json key) that is the reward; the other values are metrics."""
    trials_dir: Path = Path("runs/verifiers-trials")
    """Where Harbor writes its trial dirs (config, result, agent logs, verifier output)."""

    @model_validator(mode="after")
    def _checked(self):
        """A rollout's checks of its knobs, in this plugin's names (ValueError: pydantic's error)."""
        knobs = rollout_knobs(self)
        try:
            check_run_settings(knobs)
            check_agent_settings(knobs)
        except ValueError as exc:
            message = str(exc)
            for name, field in VERIFIERS_KNOBS.items():
                message = re.sub(rf"(?<![\w]){field}(?![\w])", name, message)
            raise ValueError(message) from None
        return self


VERIFIERS_KNOBS = {
    "tasks_dir": "tasks_dir", "environment_type": "env", "agent": "agent", "max_turns": "step_limit",
    "n_parallel_envs": "concurrency", "hack_action": "hack_action", "hack_detectors": "hack_detectors",
    "hack_judge_url": "hack_judge_url", "hack_judge_model": "hack_judge_model", "impossible_twin": "impossible_twin",
}
"""The plugin's knobs that are a rollout's: name (verifiers' where it has one) -> the RolloutConfig
field it is, whose type, default and docs it takes (declared once there)."""


def _pydantic(derived: tuple) -> tuple:
    name, kind, field = derived
    default = ({"default_factory": field.default_factory} if field.default_factory is not dataclasses.MISSING
               else {"default": field.default})
    return kind, Field(**default, description=field.metadata["doc"])


HarborTrialsConfig = create_model(
    "HarborTrialsConfig", __base__=_HarborTrialsOwnConfig, __module__=__name__,
    __doc__="The plugin's knobs (`--env.taskset.<field>`, or `[...env.taskset]` in TOML): its own, and a "
            "rollout's (VERIFIERS_KNOBS) as RolloutConfig declares them.",
    **{d[0]: _pydantic(d) for d in derived_fields(RolloutConfig, VERIFIERS_KNOBS)})


def rollout_knobs(cfg) -> RolloutConfig:
    """The plugin's knobs that are a rollout's, as one (the rest at RolloutConfig's defaults)."""
    return RolloutConfig(**{field: getattr(cfg, name) for name, field in VERIFIERS_KNOBS.items()})


class HarborTrialData(vf.TaskData):
    task_dir: str
    """Absolute path of the Harbor task dir."""


class HarborTrial(vf.Task[HarborTrialData]):
    """One Harbor task; its episode is a whole Harbor Trial, run by HarborTrialsEnv."""


class HarborTrials(vf.Taskset[HarborTrial, HarborTrialsConfig]):
    def load(self) -> Iterator[HarborTrial]:
        for path in discover_tasks(self.config.tasks_dir):  # subsets: verifiers' own select (names / idx)
            data = HarborTrialData(id=path.name, name=path.name, task_dir=str(path.resolve()),
                                   prompt=(path / "instruction.md").read_text())
            yield HarborTrial(data, self.config.task)


class HarborTrialsEnv(SingleAgentEnv):
    """Runs each episode as a Harbor Trial itself: the agent is Harbor's, not a verifiers harness."""

    def __init__(self, config) -> None:
        super().__init__(config)
        self._gate: asyncio.Semaphore | None = None
        self._retry_budget = RetryBudget()
        """Reruns of aborted episodes, per task, over the env's life (RolloutConfig.max_retries_per_task)."""

    @contextlib.asynccontextmanager
    async def serving(self):
        """No interception server, tunnel or shared tool servers: Harbor's agents call the policy
        server themselves, from this host (verifiers' harnesses need them; our trials do not)."""
        try:
            await self.start()
            yield
        finally:
            try:
                await self.stop()
            finally:
                await close_shared_gateways()  # the gateways this env's trials started

    async def run(self, task: vf.Task, agents: vf.Agents) -> None:  # run_episode below replaces it
        raise NotImplementedError("HarborTrialsEnv runs whole Harbor Trials in run_episode")

    async def run_episode(self, task: vf.Task, ctx, *, on_trace=None, on_discard=None) -> vf.Episode:
        cfg: HarborTrialsConfig = self.taskset.config
        tokenizer_name = cfg.tokenizer or getattr(ctx.client, "renderer_model_name", None) or ctx.model
        sampling = ctx.sampling
        rollout = dataclasses.replace(
            rollout_knobs(cfg), n_samples=1, policy_url=ctx.client.base_url, policy_api="openai", model_name=ctx.model,
            model_dir=tokenizer_name, progress=False,
            sampling=SamplingParams(temperature=1.0 if sampling.temperature is None else sampling.temperature,
                                    top_p=1.0 if sampling.top_p is None else sampling.top_p,
                                    max_new_tokens=sampling.max_tokens or cfg.max_new_tokens),
        )
        tokenizer = await asyncio.to_thread(load_tokenizer, tokenizer_name)  # loaded once per process
        self._gate = self._gate or asyncio.Semaphore(cfg.n_parallel_envs)
        trace = vf.Trace(task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
                         agent=AgentInfo(config=self.config.agent))
        if on_trace is not None:
            on_trace(trace)
        started = time.time()
        gateway = await shared_gateway(rollout) if uses_gateway(rollout.agent) else None
        async with self._gate:
            episode = await run_episode(Path(task.data.task_dir), rollout, group_index=task.data.idx or 0, index=0,
                                        trials_dir=cfg.trials_dir, tokenizer=tokenizer,
                                        gateway=gateway, retry_budget=self._retry_budget)
        fill_trace(trace, episode, tokenizer, cfg.reward_key, model=ctx.model)
        trace.timing.agent.start, trace.timing.agent.end = started, time.time()
        out = vf.Episode(env=vf.EnvInfo(id=self.config.env_id), task=trace.task)
        out.traces.append(trace)
        out.ok = trace.ok
        return out


__all__ = ["HarborTrials", "HarborTrialsEnv", "HarborTrialsConfig"]
