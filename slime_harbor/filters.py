"""Trajectory filters: which episodes the loss may see, decided in one place.

A filtered episode is masked the way an infrastructure failure is: `remove_sample=True` on every
sample of it, so it gets no loss and (as grpo.episode_advantages is given only kept samples) it is
left out of its group's baseline. `metadata["masked_by"]` says which filter took it, so masked
episodes are counted apart from aborted ones.

Episode limits, each off by default (a limit hit is then an ordinary, verifier-scored episode):
    timeout       Harbor ended the agent at its time limit (exception AgentTimeoutError)
    step_limit    the agent used all its turns without finishing (exit_status step_limit)
    length_limit  a turn ended at the context or max-new-token limit (exit_status context_exceeded,
                  or a turn whose finish_reason is "length": DAPO's overlong filter)
Staleness (asynchronous training, --max-staleness K / harbor_max_staleness): an episode with a
model call sampled by weights more than K versions older than those being updated is off-policy
beyond the bound; `mask_stale` masks it (masked_by "stale"). Versions are the servers' per-call
weight_version (sample.weight_versions).
Dynamic sampling (SLiME's --dynamic-sampling-filter-path check_reward_nonzero_std): a group whose
kept episodes all have the same reward has advantage 0 everywhere and only dilutes the batch;
`drop_zero_std_groups` masks such groups (masked_by "zero_std") and the trainer samples more.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from slime_harbor.converter import CONTEXT_EXCEEDED
from slime_harbor.samples import TrainingSample, episode_key

TIMEOUT_EXCEPTIONS = frozenset({"AgentTimeoutError"})
LENGTH_EXITS = frozenset({CONTEXT_EXCEEDED})


@dataclass
class TrajectoryFilters:
    mask_timeouts: bool = False
    mask_step_limit: bool = False
    mask_length_limit: bool = False


MASK_REASONS = ("timeout", "step_limit", "length_limit", "zero_std", "stale")
"""Why an episode was masked out of training (its samples' metadata ``masked_by``), in the order
the step records, the summaries and the step line count them."""


def mask_counts(counts: dict[str, int] | None = None) -> dict[str, int]:
    """Episodes masked per reason, every reason present (0 where none was)."""
    counts = counts or {}
    return {reason: counts.get(reason, 0) for reason in MASK_REASONS}


def limit_hit(sample: TrainingSample) -> str | None:
    """Which episode limit the sample's episode hit: timeout, step_limit, length_limit or None."""
    meta = sample.metadata or {}
    if meta.get("exception_type") in TIMEOUT_EXCEPTIONS:
        return "timeout"
    if meta.get("exit_status") == "step_limit":
        return "step_limit"
    if meta.get("exit_status") in LENGTH_EXITS or "length" in (meta.get("finish_reasons") or []):
        return "length_limit"
    return None


def mask(sample: TrainingSample, reason: str) -> None:
    """The one way a filter removes a sample from training."""
    sample.remove_sample = True
    sample.metadata = {**(sample.metadata or {}), "masked_by": reason}


def apply_limit_filters(samples: Sequence[TrainingSample], filters: TrajectoryFilters) -> Counter:
    """Mask the samples of episodes that hit an enabled limit; returns episodes masked per reason."""
    enabled = {"timeout": filters.mask_timeouts, "step_limit": filters.mask_step_limit,
               "length_limit": filters.mask_length_limit}
    masked: Counter = Counter()
    seen = set()
    for s in samples:
        if s.remove_sample:  # already out (an infra failure, or masked before)
            continue
        reason = limit_hit(s)
        if reason and enabled[reason]:
            mask(s, reason)
            episode = episode_key(s)
            if episode not in seen:
                seen.add(episode)
                masked[reason] += 1
    return masked


def staleness(sample: TrainingSample, trained_version: int) -> int | None:
    """How many versions the oldest model call of `sample` is behind `trained_version` (the
    weights the update starts from); None when its calls carry no version."""
    versions = [int(v) for v in sample.weight_versions if str(v).lstrip("-").isdigit()]
    return trained_version - min(versions) if versions else None


def mask_stale(samples: Sequence[TrainingSample], trained_version: int, max_staleness: int) -> int:
    """Mask every episode with a call more than `max_staleness` versions behind `trained_version`
    (all of its samples: an episode is trained whole or not at all); returns episodes masked."""
    stale = {episode_key(s) for s in samples if (staleness(s, trained_version) or 0) > max_staleness}
    masked = set()
    for s in samples:
        if episode_key(s) in stale and not s.remove_sample:
            mask(s, "stale")
            masked.add(episode_key(s))
    return len(masked)


def kept_rewards_by_group(samples: Sequence[TrainingSample]) -> dict:
    """group_index -> the rewards of its kept episodes (one per episode)."""
    episodes: dict = {}
    for s in samples:
        if not s.remove_sample and s.reward is not None:
            episodes.setdefault(episode_key(s), s.reward)
    groups: dict = defaultdict(list)
    for (group, _), reward in episodes.items():
        groups[group].append(reward)
    return dict(groups)


def varying_groups(samples: Sequence[TrainingSample]) -> set:
    """Groups with at least two kept episodes whose rewards are not all equal."""
    return {g for g, rewards in kept_rewards_by_group(samples).items() if len(rewards) > 1 and len(set(rewards)) > 1}


def drop_zero_std_groups(samples: Sequence[TrainingSample]) -> int:
    """Mask every group whose kept rewards do not vary (no GRPO signal); returns groups dropped."""
    keep = varying_groups(samples)
    dropped = set()
    for s in samples:
        if not s.remove_sample and s.group_index not in keep:
            mask(s, "zero_std")
            dropped.add(s.group_index)
    return len(dropped)
