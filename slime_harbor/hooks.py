"""SLiME hooks: a thin adapter from SLiME's rollout to our rollout core (docs/slime.md).

    --custom-generate-function-path        slime_harbor.hooks.generate
    --custom-reward-post-process-path      slime_harbor.hooks.reward_post_process
    --dynamic-sampling-filter-path         slime_harbor.hooks.dynamic_sampling_filter
    --custom-config-path                   examples/harbor/configs/harbor_grpo.yaml  (HookSettings)
    --rollout-function-path                slime_harbor.hooks.generate_rollout_fully_async
                                           (only with SLiME's fully-async training, train_async.py)
    --custom-eval-rollout-log-function-path slime_harbor.hooks.log_eval_rollout
                                           (with SLiME's evaluation: --eval-prompt-data)

`generate` runs one Harbor trial of the sample's task (`rollout.run_episode`, as the local trainer
does) against SLiME's router and returns a list of Samples sharing `rollout_id`: one normally,
several when the episode's tokens came as several segments, one removed placeholder for a
failure. Always a list, because SLiME flattens a batch with `while isinstance(data[0], list)` and
a batch mixing bare Samples and lists crashes it.

Failures are never trained as a low reward (`remove_sample=True`):
    ABORTED  transient (sandbox did not start, policy unreachable, SLiME ended the round): the
             task runs again while its retry budget lasts (RetryBudget, per task per window)
    FAILED   permanent (no such task, image that does not build, no reward): never retried
When SLiME aborts a round (its GenerateState.aborted), `generate` cancels the trial, tears its
sandbox down and returns an aborted placeholder. Every agent but native / oracle / nop samples
through one recording gateway per process and event loop, in front of SLiME's router.

SLiME's sampling params reach every agent (temperature, top_p, top_k, max_new_tokens, stop,
stop_token_ids, sampling_seed, custom_params.return_top_p_token_ids; sample.session_id as
X-SMG-Routing-Key; --rollout-max-context-len). What cannot apply is a one-line HookConfigError on
the first call: --use-rollout-routing-replay. --partial-rollout keeps its meaning where a trial can
hold it: a trial cannot be resumed across rounds (its sandbox is gone), so a sample SLiME recycles
runs a new trial; a model call a weight update interrupts goes on from its tokens (fully-async,
harbor_keep_interrupted), and --mask-offpolicy-in-partial-rollout masks those sampled before the
update, as SLiME's own generate masks a resumed sample's earlier response.

Plugin settings: the fields of HookSettings below (their names, defaults and docs; the YAML keys
docs/reference.md lists are generated from it), read from `args`, set by SLiME from the YAML.

Dynamic filtering: with --over-sampling-batch-size above --rollout-batch-size, use
dynamic_sampling_filter (SLiME's check_reward_nonzero_std counts removed samples' 0.0 as rewards).

Evaluation (SLiME's own eval loop calls generate with evaluation=True and flattens every list it
returns): every sample carries its trial's reward, and those of a trial the verifier did not score
carry metadata["unscored"] (why, as a short key). SLiME's default eval logging averages that flat
list, so an unscored trial counts as a failure and a segmented episode once per segment (and
--log-passrate asserts on it); log_eval_rollout counts each scored trial once instead.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import math
import re
import sys
import typing
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slime_harbor.episode import Episode, is_scored
from slime_harbor.agents.settings import check_agent_settings
from slime_harbor.config_docs import derived_fields, one_type
from slime_harbor.exits import ConfigError
from slime_harbor.filters import (
    TrajectoryFilters, apply_limit_filters, kept_episode_rewards, mask_counts, mask_stale, rewards_vary,
)
from slime_harbor.grpo import episode_advantages
from slime_harbor.grading.grade import episode_counts
from slime_harbor.policy.sampling import SamplingParams
from slime_harbor.retries import RetryBudget
from slime_harbor.policy.renderer import load_tokenizer
from slime_harbor.rollout import close_shared_gateways, run_episode, shared_gateway
from slime_harbor.agents.placement import uses_gateway
from slime_harbor.run_config import (BUNDLED_TASKS, RolloutConfig, check_agent, check_chat_format, check_run_settings,
                                     with_chat_format, with_engine)
from slime_harbor.samples import SampleStatus, episode_key, is_success, mask_older_tokens, pass_at_k


@dataclass(frozen=True)
class HookOwnSettings:
    """The plugin's own settings (HookSettings adds the ones a rollout already declares)."""

    harbor_tasks: str | None = None
    """Where the tasks prompts name (by their dir name) live: a directory of Harbor task dirs, or a
    dataset NAME[@VERSION] in a Harbor registry (e.g. terminal-bench@2.0), downloaded by Harbor
    into $SLIME_HARBOR_CACHE on the first call. null: harbor_tasks_dir."""
    harbor_registry_path: str | None = None
    """With a dataset name in harbor_tasks: the registry JSON file it is in. null: Harbor's registry."""
    harbor_registry_url: str | None = None
    """With a dataset name in harbor_tasks: the URL of the registry JSON it is in. null: Harbor's registry."""
    harbor_tasks_dir: str = BUNDLED_TASKS
    """Directory of Harbor task dirs (each with task.toml), when harbor_tasks is null (the older key)."""
    harbor_concurrency: int = 8
    """Trials running at once in one rollout worker (each holds a sandbox and agent turns in flight)."""
    harbor_trials_dir: str = "runs/slime-trials"
    """Where Harbor writes trial dirs (config, logs, verifier output) for inspection."""
    harbor_eval_trials_dir: str | None = None
    """Where SLiME's evaluation trials (--eval-prompt-data; the hook's evaluation=True) are written,
    apart from the training ones. null: <harbor_trials_dir>/eval."""
    harbor_keep_interrupted: bool = True
    """Fully-async rollout only: a model call that SLiME's weight update aborts goes on from the
    tokens it had, under the new weights (each token keeps the logprob and version that sampled
    it; SLiME's --mask-offpolicy-in-partial-rollout, with --partial-rollout, masks those sampled
    before the update). false: it is sampled again whole, its tokens discarded (counted as
    weight_sync/discarded_tokens)."""
    harbor_max_staleness: int | None = None
    """Fully-async rollout only (slime_harbor.hooks.generate_rollout_fully_async): mask episodes with
    a model call more than this many weight versions behind the engines' (masked/stale). null: no
    bound."""


HOOK_KNOBS = {
    "harbor_agent": "agent", "harbor_env": "env", "harbor_step_limit": "step_limit",
    "harbor_reward_mapping": "reward_mapping", "harbor_task_manifest": "task_manifest",
    "harbor_trial_timeout_multiplier": "timeout_multiplier", "harbor_agent_setup_timeout_sec": "agent_setup_timeout_sec",
    "harbor_max_retries_per_task": "max_retries_per_task", "harbor_retry_window_sec": "retry_window_sec",
    "harbor_retry_backoff_sec": "retry_backoff_sec", "harbor_env_start_retries": "env_start_retries",
    "harbor_hack_action": "hack_action", "harbor_hack_detectors": "hack_detectors",
    "harbor_hack_judge_url": "hack_judge_url", "harbor_hack_judge_model": "hack_judge_model",
    "harbor_impossible_twin": "impossible_twin", "harbor_grader_watch": "grader_watch",
    "harbor_renderer": "renderer", "harbor_gateway_keys": "gateway_keys",
    "harbor_fleet": "fleet", "harbor_ray_address": "ray_address", "harbor_fleet_node_trials": "fleet_node_trials",
    "harbor_fleet_node_starts_per_sec": "fleet_node_starts_per_sec",
}
"""The plugin's settings that are a rollout's knobs: key -> the RolloutConfig field it is (its type,
default and docs are that field's, declared once there)."""
HOOK_NOTES = {
    "harbor_agent": "A prompt row's metadata.harbor_agent overrides it.",
    "harbor_env": "local needs bwrap on the rollout host, docker a reachable Docker daemon.",
    "harbor_task_manifest": "Its samples are FAILED, removed, skipped_by_manifest, and counted.",
    "harbor_impossible_twin": ("Each task's twin is built (and checked by its gold, where it has one) on its first "
                               "trial in this process and cached on disk; counted as hack/passes_impossible, "
                               "hack/twin_errors, hack/twin_unproven, twin/passing, twin/graded."),
}
"""What a key means in SLiME beyond its field's docs."""
FILTER_KEYS = {f"harbor_{f.name}": f.name for f in dataclasses.fields(TrajectoryFilters)}
"""The trajectory filters' switches (train-local's --mask-*): key -> the TrajectoryFilters field it
is (its type, default and docs are that field's, declared once in filters.py)."""
FILTER_NOTES = {"harbor_mask_timeouts": ("Each harbor_mask_* key masks a training episode out of its loss and its "
                                         "group's baseline (masked/<reason>); evaluation trials are never masked.")}

HookSettings = dataclasses.make_dataclass(
    "HookSettings", derived_fields(RolloutConfig, HOOK_KNOBS, HOOK_NOTES) + derived_fields(TrajectoryFilters, FILTER_KEYS, FILTER_NOTES),
    bases=(HookOwnSettings,), frozen=True,
    namespace={"__module__": __name__, "__doc__": """The plugin's settings: each field a key of SLiME's
    --custom-config-path YAML, read off `args` (`setting`); unset or null: the default here. Its own
    (HookOwnSettings), then the rollout's knobs as harbor_<name> (HOOK_KNOBS), declared in RolloutConfig,
    and the trajectory filters' (FILTER_KEYS), declared in TrajectoryFilters."""})


DEFAULTS = dataclasses.asdict(HookSettings())
"""Each setting's default, by key."""

log = logging.getLogger(__name__)

METRICS: Counter = Counter()
"""Process-wide counts, for logs and tests: episodes, status/<status>, tampering/<kind>,
masked/<reason> (training episodes masked per filters.MASK_REASONS: a limit filter, the hack
monitor's screen, stale), hack/<detector>, weight_sync/<count> (converter.WEIGHT_SYNC_COUNTS, what
weight updates did to the calls; offpolicy_masked_tokens and stale_masked_tokens, tokens masked). `hook_metrics()` returns a copy, with RETRY_BUDGET's
`retries` and `retry_budget_exhausted`."""


RETRY_BUDGET = RetryBudget()
"""The process's retry budget (the SLiME rollout workers run one hook process each): run_episode
spends it on reruns of aborted episodes and counts `retries` and `retry_budget_exhausted` in it."""


class HookConfigError(ValueError):
    """A SLiME setting this hook cannot honour; raised on the first generate call."""


def hook_metrics() -> dict[str, int]:
    """The process's counts, with the reruns and each task's reruns in its current retry window."""
    return {**METRICS, **RETRY_BUDGET.counts, **RETRY_BUDGET.metrics()}


def setting(args, key: str):
    value = getattr(args, key, None)
    return DEFAULTS[key] if value is None else value


def switch(args, key: str) -> bool:
    """A true/false setting; anything else (a YAML string, a number) is a HookConfigError."""
    value = setting(args, key)
    if not isinstance(value, bool):
        raise HookConfigError(f"{key} must be true or false, got {value!r}")
    return value


ON_OFF_KEYS = ("harbor_impossible_twin", "harbor_grader_watch")


def on_off_setting(args, key: str):
    """An on / off setting (ON_OFF_KEYS): YAML's unquoted on / off, which it reads as true / false."""
    value = setting(args, key)
    return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value


def trajectory_filters(args) -> TrajectoryFilters:
    return TrajectoryFilters(**{field: switch(args, key) for key, field in FILTER_KEYS.items()})


def trials_dir(args, evaluation: bool) -> Path:
    """Training trials in harbor_trials_dir; SLiME's evaluation trials apart, so a run's training
    record (and `slime-harbor view` of it) holds only what was trained on."""
    train_dir = Path(setting(args, "harbor_trials_dir"))
    if not evaluation:
        return train_dir
    return Path(setting(args, "harbor_eval_trials_dir") or train_dir / "eval")


SLIME_SAMPLING = ("temperature", "top_p", "top_k", "max_new_tokens", "stop", "stop_token_ids", "sampling_seed")
"""What the episodes take of SLiME's sampling params (SamplingParams' fields of those names; a
missing one keeps SamplingParams' default). skip_special_tokens and no_stop_trim change only the text
SGLang returns, never the token ids; the native agent and the gateway decode the ids themselves,
so they need nothing from them."""


def wants_top_p_ids(sampling_params: dict) -> bool:
    """SLiME asks for the top-p nucleus ids (--rollout-top-p < 1) through custom_params."""
    return bool((sampling_params.get("custom_params") or {}).get("return_top_p_token_ids"))


def agent_for(args, sample) -> str:
    """The sample's own `metadata["harbor_agent"]` (a prompt row may name one), else harbor_agent."""
    metadata = getattr(sample, "metadata", None)
    return (metadata.get("harbor_agent") if isinstance(metadata, dict) else None) or setting(args, "harbor_agent")


def check_supported(args) -> None:
    """Raise HookConfigError for a SLiME setting no agent of ours can honour."""
    if getattr(args, "use_rollout_routing_replay", False):
        raise HookConfigError("--use-rollout-routing-replay: Harbor agents cannot return routed experts; drop the flag")
    if refusal := _agent_refusal(setting(args, "harbor_agent")):
        raise HookConfigError(f"harbor_agent: {refusal}")
    switch(args, "harbor_keep_interrupted")
    try:  # a rollout's knobs get a rollout's checks, in the plugin's names
        knobs = RolloutConfig(**hook_knobs(args))
        check_run_settings(knobs)
        check_agent_settings(knobs)
    except ValueError as exc:
        raise HookConfigError(plugin_names(str(exc))) from None
    try:  # the checkpoint's chat format, before any trial (its messages name both the flag and the key)
        check_chat_format(dataclasses.replace(knobs, model_dir=getattr(args, "hf_checkpoint", None)))
    except ValueError as exc:
        raise HookConfigError(str(exc)) from None
    from slime_harbor.grading.hack_monitor import load_detector

    for spec in setting(args, "harbor_hack_detectors"):
        try:
            load_detector(spec)
        except ValueError as exc:
            raise HookConfigError(f"harbor_hack_detectors: {exc}") from None
    tasks_dir(args)


def plugin_names(message: str) -> str:
    """A rollout check's message with each knob named as the plugin's YAML names it (harbor_<name>)."""
    for key, name in HOOK_KNOBS.items():
        message = re.sub(rf"(?<![\w]){name}(?![\w])", key, message)
    return message


def tasks_dir(args) -> Path:
    """Where the task dirs named by samples' labels live: harbor_tasks (a dataset is resolved and
    downloaded once per process), else harbor_tasks_dir. HookConfigError for a name that does
    not resolve, or for both keys set (harbor_tasks_dir at its default, as the shipped YAML
    spells it out, does not count)."""
    tasks = getattr(args, "harbor_tasks", None)
    registry_path, registry_url = getattr(args, "harbor_registry_path", None), getattr(args, "harbor_registry_url", None)
    if tasks is None:
        if registry_path is not None or registry_url is not None:
            raise HookConfigError("harbor_registry_path / harbor_registry_url need a dataset name in harbor_tasks")
        return Path(setting(args, "harbor_tasks_dir"))
    if getattr(args, "harbor_tasks_dir", None) not in (None, DEFAULTS["harbor_tasks_dir"]):
        raise HookConfigError(f"set harbor_tasks ({tasks}) or harbor_tasks_dir ({args.harbor_tasks_dir}), not both")
    try:
        return _selected_tasks_dir(str(tasks), None if registry_path is None else str(registry_path), registry_url)
    except ConfigError as exc:
        raise HookConfigError(f"harbor_tasks: {exc}") from None


@functools.lru_cache(maxsize=4)
def _selected_tasks_dir(tasks: str, registry_path: str | None, registry_url: str | None) -> Path:
    """harbor_tasks as a directory: a dataset is downloaded on the first call only (a failure is not cached)."""
    from slime_harbor.tasks.datasets import select_tasks

    return select_tasks(tasks, registry_path=None if registry_path is None else Path(registry_path),
                        registry_url=registry_url)[0]


_TRIAL_GATES: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}
"""Per event loop: the semaphore that bounds its trials (harbor_concurrency; asyncio primitives
belong to one loop)."""


async def close_gateway() -> None:
    """Close the running event loop's gateway (its sessions, server and port), if it has one."""
    await close_shared_gateways()


def rollout_config(args, sampling_params: dict, sample=None) -> RolloutConfig:
    """SLiME args + per-call sampling params (+ the sample's routing key) -> our RolloutConfig."""
    router = f"http://{getattr(args, 'sglang_router_ip', None)}:{getattr(args, 'sglang_router_port', None)}"
    return with_chat_format(with_engine(RolloutConfig(
        **hook_knobs(args) | {"agent": agent_for(args, sample)},
        policy_url=router,
        model_dir=getattr(args, "hf_checkpoint", None),
        sampling=SamplingParams(**{k: sampling_params[k] for k in SLIME_SAMPLING if sampling_params.get(k) is not None},
                                return_top_p_token_ids=wants_top_p_ids(sampling_params)),
        max_context_len=getattr(args, "rollout_max_context_len", None),
        routing_key=getattr(sample, "session_id", None),
        progress=False,
        # SLiME's fully-async rollout updates weights under running trials (pause_generation aborts
        # their calls); elsewhere an abort ends the round and the episode.
        reissue_aborted_calls=str(getattr(args, "rollout_function_path", "")).endswith("generate_rollout_fully_async"),
        keep_interrupted_calls=switch(args, "harbor_keep_interrupted"),
    )))


def hook_knobs(args) -> dict[str, Any]:
    """The rollout's knobs as the plugin's settings give them (HOOK_KNOBS: harbor_<name> ->
    RolloutConfig's <name>), each as its field's type (YAML's numbers and lists as they came)."""
    hints = typing.get_type_hints(RolloutConfig)
    knobs = {}
    for key, name in HOOK_KNOBS.items():
        value = on_off_setting(args, key) if key in ON_OFF_KEYS else setting(args, key)
        kind = one_type(hints[name])
        if value is not None and typing.get_origin(kind) is list:
            value = list(value)
        elif value is not None and kind in (int, float, Path):
            value = kind(value)
        knobs[name] = value
    return knobs


@functools.lru_cache(maxsize=4)
def _manifest_skips(path: str) -> dict[str, str]:
    """Task name -> why it is skipped, read once per manifest path (ConfigError if unreadable)."""
    from slime_harbor.tasks.manifest import load_manifest

    return load_manifest(path)


def resolve_task_dir(args, sample) -> Path | None:
    """The task dir: metadata.task_dir (from prepare-data), else tasks_dir(args) / label."""
    metadata = sample.metadata if isinstance(sample.metadata, dict) else {}
    candidates = [metadata.get("task_dir")]
    name = metadata.get("task_name") or sample.label
    if name:
        candidates.append(tasks_dir(args) / str(name))
    for c in candidates:
        if c and (Path(c) / "task.toml").is_file():
            return Path(c)
    return None


def _placeholder(sample, status: SampleStatus, why: str, top_p_ids: bool, reward: float = 0.0, **metadata) -> list:
    """SLiME's pattern for an unusable rollout: a minimal sample removed from the loss, in a list
    like every other result. With top-p replay on, it carries well-formed empty top-p data. Its
    reward is the trial's where the verifier scored it (an agent that sampled nothing), else 0.0
    with metadata["unscored"] saying why (evaluation leaves it out of the mean)."""
    sample.tokens = [0, 0]
    sample.response = ""
    sample.response_length = 1
    sample.loss_mask = [0]
    sample.rollout_log_probs = [0.0]
    sample.rollout_top_p_token_ids = [] if top_p_ids else None
    sample.rollout_top_p_token_offsets = [0, 0] if top_p_ids else None
    sample.reward = reward
    sample.status = type(sample).Status(status.value)
    sample.remove_sample = True
    sample.rollout_id = _rollout_id(sample)
    sample.metadata = {**(sample.metadata if isinstance(sample.metadata, dict) else {}), "status_reason": why, **metadata,
                       PLACEHOLDER_KEYS: ["status_reason", *metadata]}
    _count(status)
    return [sample]


PLACEHOLDER_KEYS = "harbor_placeholder_keys"
"""The metadata keys a placeholder added (SLiME's --partial-rollout hands an aborted placeholder
back for a new trial: they are dropped first)."""


def _rollout_id(sample) -> int:
    return sample.index if sample.index is not None else 0


def _count(status: SampleStatus) -> None:
    METRICS["episodes"] += 1
    METRICS[f"status/{status.value}"] += 1


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


@functools.lru_cache(maxsize=64)
def _agent_refusal(agent: str) -> str | None:
    """Why `agent` cannot run (refused, unplaced, not importable: never Harbor's own in-sandbox
    install), once per name; None when it can."""
    try:
        check_agent(RolloutConfig(agent=agent))
    except ConfigError as exc:
        return str(exc)
    return None


async def generate(args, sample, sampling_params, evaluation: bool = False) -> list:
    """SLiME custom generate: one Harbor trial for `sample`'s task -> list[Sample] (one rollout_id)."""
    check_supported(args)
    if isinstance(sample.metadata, dict) and PLACEHOLDER_KEYS in sample.metadata:  # recycled (--partial-rollout)
        for key in [*sample.metadata.pop(PLACEHOLDER_KEYS), "harbor_retries"]:
            sample.metadata.pop(key, None)
    filters = trajectory_filters(args)
    top_p_ids = wants_top_p_ids(sampling_params)
    task_dir = resolve_task_dir(args, sample)
    if task_dir is None:
        return _placeholder(sample, SampleStatus.FAILED, f"no Harbor task for label {sample.label!r} / metadata", top_p_ids,
                            unscored="no_task")
    manifest = setting(args, "harbor_task_manifest")
    skipped = _manifest_skips(str(manifest)).get(task_dir.name) if manifest else None
    if skipped is not None:
        METRICS["skipped_by_manifest"] += 1
        return _placeholder(sample, SampleStatus.FAILED, f"task {task_dir.name} skipped by {manifest}: {skipped}",
                            top_p_ids, skipped_by_manifest=True, unscored="skipped_by_manifest")
    cfg = rollout_config(args, sampling_params, sample)
    if refusal := _agent_refusal(cfg.agent):  # a prompt row's own harbor_agent is checked here
        return _placeholder(sample, SampleStatus.FAILED, refusal, top_p_ids, unscored="agent_refused")
    # one per process and loop (a Ray fleet's workers have their own)
    gateway = await shared_gateway(cfg) if uses_gateway(cfg.agent) and cfg.fleet == "local" else None
    semaphore = _TRIAL_GATES.setdefault(asyncio.get_running_loop(), asyncio.Semaphore(int(setting(args, "harbor_concurrency"))))
    async with semaphore:
        if slime_rollout_aborted():
            return _placeholder(sample, SampleStatus.ABORTED, "rollout aborted by SLiME before the trial started",
                                top_p_ids, harbor_retries=0, unscored="rollout_aborted")
        # An aborted episode runs again within the task's budget (run_episode), unless SLiME ended the round.
        episode = await run_unless_aborted(
            run_episode(task_dir, cfg, group_index=sample.group_index or 0, index=sample.index or 0,
                        trials_dir=trials_dir(args, evaluation), tokenizer=load_tokenizer(cfg.model_dir),
                        gateway=gateway, retry_budget=RETRY_BUDGET, stop_retrying=slime_rollout_aborted),
            slime_rollout_aborted,
        )
        if episode is None:
            return _placeholder(sample, SampleStatus.ABORTED, "rollout aborted by SLiME during the trial", top_p_ids,
                                unscored="rollout_aborted")
    episode.metadata["harbor_retries"] = episode.metadata.pop("retries", 0)
    if episode.metadata.get("internal_error"):  # a bug of ours (rollout.internal_error): counted, never a bad task
        METRICS["internal_errors"] += 1
    if not evaluation:
        apply_limit_filters([episode], filters)  # on the episode, before its samples are built
        for reason, n in mask_counts([episode]).items():  # the filters' and the hack monitor's screen
            if n:
                METRICS[f"masked/{reason}"] += n
        counts = dict(episode.metadata.get("weight_sync") or {})  # what updates did to its calls
        if getattr(args, "partial_rollout", False) and getattr(args, "mask_offpolicy_in_partial_rollout", False):
            counts["offpolicy_masked_tokens"] = sum(mask_older_tokens(s) for s in episode.samples)
        for key, n in counts.items():
            if n:
                METRICS[f"weight_sync/{key}"] += n
    return to_slime_samples(sample, episode, top_p_ids=top_p_ids)


def to_slime_samples(sample, episode: Episode, top_p_ids: bool = False) -> list:
    """Fill SLiME's sample with the episode's samples; its further segments become new Samples of its class."""
    Sample = type(sample)
    segments = episode.samples
    if segments[0].response_length == 0:  # nothing the policy sampled (infra failure, agent crashed first)
        if episode.scored:
            # The trial ran, but the agent sampled nothing (it crashed or quit before its first
            # call). Counted, never trained.
            METRICS["no_tokens"] += 1
            log.warning("%s: a finished trial recorded no token ids (agent %s); the sample is removed",
                        episode.task_name, episode.metadata.get("agent"))
        # Its metadata says why when the verifier did not score it (Episode.unscored_reason).
        return _placeholder(sample, episode.status, episode.end.why, top_p_ids,
                            reward=episode.reward if episode.scored else 0.0, **segments[0].metadata)
    rollout_id = _rollout_id(sample)
    out = []
    for k, segment in enumerate(segments):
        target = sample if k == 0 else Sample(prompt=sample.prompt, label=sample.label, group_index=sample.group_index,
                                              index=sample.index, session_id=sample.session_id,
                                              metadata=dict(sample.metadata or {}))
        segment.rollout_id = rollout_id
        segment.prompt = ""  # keep SLiME's own prompt (the task instruction)
        target.rollout_top_p_token_ids = target.rollout_top_p_token_offsets = None  # none left from a reused sample
        s = segment.to_slime(target)
        if top_p_ids and (getattr(s, "rollout_top_p_token_ids", None) is None
                          or getattr(s, "rollout_top_p_token_offsets", None) is None):
            raise HookConfigError("--rollout-top-p < 1 but the policy server returned no top-p token ids "
                                  "(serve the policy with SLiME's SGLang patch)")
        out.append(s)
    _count(episode.status)
    for name, value in episode_counts(episode.metadata).items():  # the grading's (grade.COUNTERS)
        METRICS[name] += value
    return out


def _flatten(samples) -> list:
    """SLiME hands post-process hooks a flat list; a filter gets a group whose items may be lists."""
    out = []
    for s in samples:
        out.extend(_flatten(s) if isinstance(s, list) else [s])
    return out


def reward_value(args, sample) -> float:
    """The scalar reward, as Sample.get_reward_value reads it, but tolerant of an args without
    reward_key (SLiME's runtime-hook contract passes a bare object)."""
    if sample.reward is None:
        return 0.0
    key = getattr(args, "reward_key", None)
    return float(sample.reward[key] if key and isinstance(sample.reward, dict) else sample.reward)


def reward_post_process(args, samples):
    """(raw_rewards, rewards): GRPO advantages per group_index over kept samples only.

    SLiME's default reshapes by n_samples_per_prompt, which breaks as soon as a sample is removed
    or a rollout fans out into several samples. Here a group is a group_index, each episode counts
    once (its segments share rollout_id), and removed samples get 0 and no say in their group's mean.
    """
    flat = _flatten(samples)
    raw = [reward_value(args, s) for s in flat]
    kept = [i for i, s in enumerate(flat) if not s.remove_sample]
    normalize = bool(getattr(args, "grpo_std_normalization", False))
    advantages = episode_advantages([flat[i] for i in kept], [raw[i] for i in kept], normalize_std=normalize)
    rewards = [0.0] * len(flat)
    for i, a in zip(kept, advantages):
        rewards[i] = a
    return raw, rewards


def dynamic_sampling_filter(args, samples, **kwargs):
    """--dynamic-sampling-filter-path: keep a group only when its kept episodes' rewards differ.

    `samples` is one SLiME group: one generate result per prompt copy, each a list of Samples here
    (bare Samples are accepted too). An episode counts once however many samples it fanned out into
    (samples.episode_key: its segments share rollout_id); removed samples (infra failures, masked
    episodes) carry no reward and are ignored. Fewer than two scored episodes, or all equal: no
    GRPO signal, drop. The rule is train-local's dynamic sampling's (filters.rewards_vary).
    """
    rewards = list(kept_episode_rewards(_flatten(samples), lambda s: reward_value(args, s)).values())
    if len(rewards) < 2:
        return DynamicFilterOutput(keep=False, reason=f"fewer_than_2_scored_episodes_{len(rewards)}")
    keep = rewards_vary(rewards)
    return DynamicFilterOutput(keep=keep, reason=None if keep else f"zero_std_{round(rewards[0], 1)}")


try:  # SLiME's own result type when slime is importable (its call_dynamic_filter checks the type)
    from slime.rollout.filter_hub.base_types import DynamicFilterOutput
except ImportError:  # the same fields, so the filter runs (and is tested) without slime

    @dataclass
    class DynamicFilterOutput:
        keep: bool
        reason: str | None = None
        keep_when_insufficient: bool = False


def log_eval_rollout(rollout_id, args, data, extra_metrics=None) -> bool:
    """--custom-eval-rollout-log-function-path: SLiME's evaluation metrics, each trial counted once.

    SLiME's log_eval_rollout_data calls it with what its eval loop returned, per dataset name
    {"rewards", "truncated", "samples"} over the flat list of our samples, and skips its own
    logging when it returns True. That logging averages the flat list: a trial the verifier did
    not score counts as a failure, an episode split into segments once per segment, and
    --log-passrate reshapes the list by --n-samples-per-eval-prompt (an extra segment fails its
    assertion). Here, per dataset (eval_dataset_metrics): the mean reward over scored trials, the
    truncated ratio, the unscored count (in total and per reason), pass@k per prompt group with
    --log-passrate; and SLiME's own per-sample statistics (eval/<name>/response_len/..., ...) over
    the samples of scored trials. Logged through SLiME's logging_utils.log at SLiME's eval step.
    A dataset without samples (a user's own --eval-function-path may return none) is left to
    SLiME's default logging: returns False, and SLiME logs every dataset itself.
    """
    from slime.observability import logging_utils
    from slime.observability.metric_utils import compute_rollout_step, dict_add_prefix
    from slime.observability.rollout_metrics import compute_metrics_from_samples

    if any(dataset.get("samples") is None for dataset in data.values()):
        log.warning("evaluation data without samples: SLiME's default eval logging counts it (not per trial)")
        return False
    log_dict = dict(extra_metrics or {})
    for name, dataset in data.items():
        log_dict |= eval_dataset_metrics(name, dataset["samples"], dataset["rewards"], eval_group_size(args, name),
                                         bool(getattr(args, "log_passrate", False)))
        if scored := [s for s in dataset["samples"] if is_scored(s)]:
            log_dict |= dict_add_prefix(compute_metrics_from_samples(args, scored), f"eval/{name}/")
    log.info("eval %s: %s", rollout_id, log_dict)
    log_dict["eval/step"] = compute_rollout_step(args, rollout_id)
    logging_utils.log(args, log_dict, step_key="eval/step")
    return True


def eval_group_size(args, name: str) -> int:
    """The trials of one prompt row in dataset `name`: its n_samples_per_eval_prompt (SLiME's
    EvalDatasetConfig, which its eval loop runs), else --n-samples-per-eval-prompt."""
    for dataset in getattr(args, "eval_datasets", None) or []:
        if dataset.name == name and dataset.n_samples_per_eval_prompt:
            return int(dataset.n_samples_per_eval_prompt)
    return int(args.n_samples_per_eval_prompt)


@dataclass
class EvalTrial:
    """One trial of an evaluation, however many samples it came back as."""

    prompt_group: int
    reward: float | None
    """None when the verifier did not score it."""
    truncated: bool
    unscored: str | None


def eval_trials(samples, rewards, group_size: int) -> list[EvalTrial]:
    """The trials of SLiME's flat eval list (`samples`, and `rewards` SLiME read off them with its
    eval reward key): segments of one episode (one episode_key) are one trial. SLiME's eval loop
    numbers the copies of prompt row i as indices i * group_size .. i * group_size + group_size - 1."""
    trials: dict = {}
    for sample, reward in zip(samples, rewards, strict=True):
        key = episode_key(sample)
        if key in trials:
            continue
        scored = is_scored(sample)
        trials[key] = EvalTrial(
            prompt_group=sample.index // group_size,
            reward=float(reward) if scored else None,
            truncated=sample.status.value == SampleStatus.TRUNCATED.value,
            unscored=None if scored else (sample.metadata or {}).get("unscored") or sample.status.value,
        )
    return list(trials.values())


def eval_dataset_metrics(name: str, samples, rewards, group_size: int, passrate: bool) -> dict[str, float]:
    """One dataset's evaluation metrics, each trial counted once (eval_trials):

        eval/<name>                        mean reward over scored trials (absent when none was)
        eval/<name>-scored                 scored trials
        eval/<name>-truncated_ratio        truncated share of the scored trials
        eval/<name>-unscored               trials the verifier did not score, and per reason
        eval/<name>-unscored/<reason>        (metadata["unscored"]: environment_start_failed, ...)
        eval/<name>-pass@k                 with passrate: per prompt group over its scored
                                           trials, averaged over the groups with >= k of them
        eval/<name>-pass@k/groups_left_out the groups with fewer than k scored trials

    k runs over SLiME's compute_pass_rate's values (1, 2, 4, ... up to group_size; none when
    group_size is 1); a success is samples.is_success; pass@k is the unbiased estimator
    (samples.pass_at_k, as SLiME's)."""

    trials = eval_trials(samples, rewards, group_size)
    scored = [t for t in trials if t.reward is not None]
    unscored = Counter(t.unscored for t in trials if t.reward is None)
    out: dict[str, float] = {f"eval/{name}-scored": len(scored), f"eval/{name}-unscored": sum(unscored.values())}
    out |= {f"eval/{name}-unscored/{reason}": n for reason, n in sorted(unscored.items())}
    if scored:
        out[f"eval/{name}"] = sum(t.reward for t in scored) / len(scored)
        out[f"eval/{name}-truncated_ratio"] = sum(t.truncated for t in scored) / len(scored)
    if passrate and group_size > 1:
        groups: dict[int, list[float]] = {t.prompt_group: [] for t in trials}
        for t in scored:
            groups[t.prompt_group].append(t.reward)
        for k in [2**i for i in range(int(math.log2(group_size)) + 1)]:  # SLiME's compute_pass_rate's k
            estimates = [pass_at_k(len(r), sum(map(is_success, r)), k) for r in groups.values() if len(r) >= k]
            if estimates:
                out[f"eval/{name}-pass@{k}"] = sum(estimates) / len(estimates)
            out[f"eval/{name}-pass@{k}/groups_left_out"] = len(groups) - len(estimates)
    return out


def generate_rollout_fully_async(args, rollout_id, data_source, evaluation: bool = False):
    """--rollout-function-path for SLiME's fully-async rollout with this hook.

    SLiME's own `slime.rollout.fully_async_rollout.generate_rollout_fully_async` orders the groups
    it collected by `getattr(item, "index")` of each group's items; for list results (ours, and
    SLiME's coding-agent example's) that is `list.index`, a method, and the round dies with a
    TypeError. This runs SLiME's own background worker (`_get_global_worker`: in-flight groups
    across rounds, the same backpressure) and collects the same way, ordering groups by their
    first Sample's index.

    Trials run on across SLiME's weight updates: its updater pauses generation, which aborts the
    calls in flight, and our clients continue those from the tokens they had once the new weights
    are in (policy/client.py; harbor_keep_interrupted false: sampled again whole), each token with
    the logprob of the version that sampled it (metadata["version_spans"]) and each Sample's
    weight_versions naming the oldest version of each call. With harbor_max_staleness K, an
    episode with a call more than K versions behind the version the engines serve now (the
    weights the next update starts from) is masked, counted as masked/stale (and its tokens as
    weight_sync/stale_masked_tokens).
    """
    from slime.rollout import fully_async_rollout
    from slime.utils.async_utils import run

    if evaluation:
        raise ValueError("fully-async rollout doesn't support evaluation mode")
    bound = setting(args, "harbor_max_staleness")
    if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int) or bound < 0):
        raise HookConfigError(f"harbor_max_staleness must be a whole number >= 0, got {bound!r}")

    async def collect() -> list:
        worker = fully_async_rollout._get_global_worker(args, data_source)
        collected: dict = {}
        while len(collected) < args.rollout_batch_size:
            completed = worker.get_completed_groups(limit=args.rollout_batch_size - len(collected))
            collected.update(completed)
            if not completed:
                await asyncio.sleep(0.05)
        return sorted(collected.values(), key=lambda group: _flatten(group)[0].index or 0)

    groups = run(collect())
    if bound is not None:  # on SLiME's Samples (one episode per episode_key): all this rollout has
        samples = _flatten(groups)
        was_kept = {id(s) for s in samples if not s.remove_sample}
        METRICS["masked/stale"] += mask_stale(samples, served_weight_version(args), bound)
        if stale_tokens := sum(sum(s.loss_mask or []) for s in samples if id(s) in was_kept and s.remove_sample):
            METRICS["weight_sync/stale_masked_tokens"] += stale_tokens
    return groups


def served_weight_version(args) -> int:
    """The weight version SLiME's engines serve now (the highest of the router's workers'; SGLang
    0.5.23 keeps it in /model_info and has no /get_weight_version): policy/probe.weight_version."""
    from slime_harbor.policy.probe import weight_version

    version = weight_version(f"http://{args.sglang_router_ip}:{args.sglang_router_port}")
    if version is None or not version.isdigit():
        raise HookConfigError(f"the engines serve weight version {version!r}: harbor_max_staleness needs SLiME's "
                              "update count (\"0\", \"1\", ...)")
    return int(version)
