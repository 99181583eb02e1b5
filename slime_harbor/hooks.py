"""SLiME hooks: a thin adapter from SLiME's rollout to our rollout core.

    --custom-generate-function-path        slime_harbor.hooks.generate
    --custom-reward-post-process-path      slime_harbor.hooks.reward_post_process
    --custom-config-path                   examples/harbor/configs/harbor_grpo.yaml  (keys below)

`generate` runs ONE Harbor trial for the sample's task (`rollout.run_episode`, the same function
the local trainer and `slime-harbor rollout` use) against SLiME's SGLang router, converts it
(`converter.trial_to_samples`) and returns a `Sample`, or a list sharing `rollout_id` when the
tokens drifted between turns. Infra failures come back with `remove_sample=True` and status
aborted/failed: they are never trained as a low reward.

Aborts: SLiME's rollout ends a round by aborting every SGLang request until the servers are idle
and setting its GenerateState.aborted; then it waits for the pending generate calls. A trial whose
agent was running a command at that moment would go on to its step limit, so `generate` watches
that flag: it cancels the trial (the sandbox is torn down before the call returns) and returns an
aborted, removed sample. Trials still queued behind harbor_concurrency do not start.

Plugin settings, read from `args` (set them with SLiME's --custom-config-path YAML):
    harbor_agent                     native | terminus-2 | module:Class            (native)
    harbor_env                       local | docker | <harbor env type> | module:Class  (local)
    harbor_tasks_dir                 where task dirs named by the sample's label live
    harbor_concurrency               trials running at once in this rollout worker (8)
    harbor_trial_timeout_multiplier  scales task.toml timeouts (1.0)
    harbor_reward_mapping            raw | pm1 (2r-1)                               (raw)
    harbor_step_limit                agent turns per episode (30)
    harbor_trials_dir                where Harbor writes trial dirs (runs/slime-trials)

Dynamic filtering: groups whose rewards are all equal carry no GRPO signal. Use SLiME's filter
    --dynamic-sampling-filter-path slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std
with --over-sampling-batch-size larger than --rollout-batch-size.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

from slime_harbor.grpo import episode_advantages
from slime_harbor.rollout import RolloutConfig, run_episode
from slime_harbor.samples import SampleStatus, TrainingSample

DEFAULTS = {
    "harbor_agent": "native",
    "harbor_env": "local",
    "harbor_tasks_dir": "examples/harbor/tasks",
    "harbor_concurrency": 8,
    "harbor_trial_timeout_multiplier": 1.0,
    "harbor_reward_mapping": "raw",
    "harbor_step_limit": 30,
    "harbor_trials_dir": "runs/slime-trials",
}

_semaphores: dict[int, asyncio.Semaphore] = {}


def setting(args, key: str):
    value = getattr(args, key, None)
    return DEFAULTS[key] if value is None else value


def rollout_config(args, sampling_params: dict) -> RolloutConfig:
    """SLiME args + per-call sampling params -> the RolloutConfig our core understands."""
    router = f"http://{getattr(args, 'sglang_router_ip', None)}:{getattr(args, 'sglang_router_port', None)}"
    return RolloutConfig(
        agent=setting(args, "harbor_agent"),
        env=setting(args, "harbor_env"),
        policy_url=router,
        model_dir=getattr(args, "hf_checkpoint", None),
        temperature=float(sampling_params.get("temperature", 1.0)),
        top_p=float(sampling_params.get("top_p", 1.0)),
        top_k=int(sampling_params.get("top_k", -1)),
        max_new_tokens=int(sampling_params.get("max_new_tokens", 512)),
        step_limit=int(setting(args, "harbor_step_limit")),
        timeout_multiplier=float(setting(args, "harbor_trial_timeout_multiplier")),
        reward_mapping=setting(args, "harbor_reward_mapping"),
        progress=False,
    )


def resolve_task_dir(args, sample) -> Path | None:
    """The task dir: metadata.task_dir (from prepare-data), else tasks_dir / label."""
    metadata = sample.metadata if isinstance(sample.metadata, dict) else {}
    candidates = [metadata.get("task_dir")]
    name = metadata.get("task_name") or sample.label
    if name:
        candidates.append(Path(setting(args, "harbor_tasks_dir")) / str(name))
    for c in candidates:
        if c and (Path(c) / "task.toml").is_file():
            return Path(c)
    return None


def _failed(sample, status: SampleStatus, why: str):
    """SLiME's pattern for an unusable rollout: a minimal sample that is removed from the loss."""
    from slime.utils.types import Sample

    sample.tokens = [0, 0]
    sample.response = ""
    sample.response_length = 1
    sample.loss_mask = [0]
    sample.rollout_log_probs = [0.0]
    sample.reward = 0.0
    sample.status = Sample.Status(status.value)
    sample.remove_sample = True
    sample.metadata = {**(sample.metadata if isinstance(sample.metadata, dict) else {}), "status_reason": why}
    return sample


def slime_rollout_aborted() -> bool:
    """Whether SLiME's rollout has aborted this round (its GenerateState singleton's flag). Read
    from the module SLiME already imported, never imported or created here: outside a SLiME
    rollout there is nothing to abort."""
    module = sys.modules.get("slime.rollout.sglang_rollout")
    state_class = getattr(module, "GenerateState", None)
    state = getattr(state_class, "_instances", {}).get(state_class) if state_class is not None else None
    return bool(getattr(state, "aborted", False))


async def run_unless_aborted(episode: Awaitable, aborted: Callable[[], bool], poll_seconds: float = 0.5):
    """Await `episode` (a run_episode call); if aborted() turns true first, cancel it, wait for its
    teardown and return None. A cancellation of the caller is passed on the same way."""
    task = asyncio.ensure_future(episode)
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=poll_seconds)
            if not task.done() and aborted():
                return None
        return task.result()
    finally:  # aborted, or the caller cancelled: the episode goes too, its teardown awaited
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)  # run_episode stops the sandbox first


async def generate(args, sample, sampling_params, evaluation: bool = False):
    """SLiME custom generate: one Harbor trial for `sample`'s task."""
    task_dir = resolve_task_dir(args, sample)
    if task_dir is None:
        return _failed(sample, SampleStatus.FAILED, f"no Harbor task for label {sample.label!r} / metadata")
    cfg = rollout_config(args, sampling_params)
    loop_key = id(asyncio.get_running_loop())
    semaphore = _semaphores.setdefault(loop_key, asyncio.Semaphore(int(setting(args, "harbor_concurrency"))))
    async with semaphore:
        if slime_rollout_aborted():
            return _failed(sample, SampleStatus.ABORTED, "rollout aborted by SLiME before the trial started")
        episode = await run_unless_aborted(
            run_episode(task_dir, cfg, group_index=sample.group_index or 0, index=sample.index or 0,
                        trials_dir=Path(setting(args, "harbor_trials_dir"))),
            slime_rollout_aborted,
        )
    if episode is None:
        return _failed(sample, SampleStatus.ABORTED, "rollout aborted by SLiME during the trial")
    return to_slime_samples(sample, episode.samples)


def to_slime_samples(sample, pieces: list[TrainingSample]):
    """Fill SLiME's sample with our result; extra pieces (token drift) become siblings."""
    from slime.utils.types import Sample

    first = pieces[0]
    if first.response_length == 0:  # nothing the policy sampled (infra failure, agent crashed first)
        return _failed(sample, first.status, first.metadata.get("status_reason", "no tokens"))
    rollout_id = sample.index if sample.index is not None else 0
    out = []
    for k, piece in enumerate(pieces):
        target = sample if k == 0 else Sample(prompt=sample.prompt, label=sample.label, group_index=sample.group_index,
                                              index=sample.index, metadata=dict(sample.metadata or {}))
        piece.rollout_id = rollout_id
        piece.prompt = ""  # keep SLiME's own prompt (the task instruction)
        out.append(piece.to_slime(target))
    return out[0] if len(out) == 1 else out


def reward_post_process(args, samples):
    """(raw_rewards, rewards): GRPO advantages per group_index over kept samples only.

    SLiME's default reshapes by n_samples_per_prompt, which breaks as soon as a sample is removed
    or a rollout fans out into several samples. Here a group is a group_index, each episode counts
    once (siblings share rollout_id), and removed samples get 0 and no say in their group's mean.
    """
    flat = [s for group in samples for s in group] if samples and isinstance(samples[0], list) else list(samples)
    raw = [float(s.get_reward_value(args)) if s.reward is not None else 0.0 for s in flat]
    kept = [i for i, s in enumerate(flat) if not s.remove_sample]
    normalize = bool(getattr(args, "grpo_std_normalization", False))
    advantages = episode_advantages([flat[i] for i in kept], [raw[i] for i in kept], normalize_std=normalize)
    rewards = [0.0] * len(flat)
    for i, a in zip(kept, advantages):
        rewards[i] = a
    return raw, rewards
