"""Trajectory filters: which episodes the loss may see, decided in one place.

A filtered episode is masked the way an infrastructure failure is: `remove_sample=True` on every
sample of it, so it gets no loss and (as grpo.episode_advantages is given only kept samples) it is
left out of its group's baseline. `metadata["masked_by"]` says which filter took it (one of
MASK_REASONS), so masked episodes are counted apart from aborted and failed ones. `mask` is the one
writer of that mark (the filters here and the hack monitor's screen, hack_monitor.apply_hack_action,
call it); `mask_counts` the one reader (train-local's step records, rollout's summary.json and the
SLiME hook's masked/<reason> counts read it).

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
`drop_zero_std_groups` masks such groups (masked_by "zero_std") and the trainer samples more. One
rule decides it for train-local and for the SLiME hook's dynamic_sampling_filter alike
(`rewards_vary`: rewards further apart than ZERO_STD_TOLERANCE, one per episode, episode_key).
The hack monitor's screen (--hack-action screen) masks a flagged episode (masked_by "hack").
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from slime_harbor.episode import CONTEXT_EXCEEDED, Episode
from slime_harbor.samples import TrainingSample, episode_key

TIMEOUT_EXCEPTIONS = frozenset({"AgentTimeoutError"})
LENGTH_EXITS = frozenset({CONTEXT_EXCEEDED})


@dataclass
class TrajectoryFilters:
    mask_timeouts: bool = False
    mask_step_limit: bool = False
    mask_length_limit: bool = False


MASK_REASONS = ("timeout", "step_limit", "length_limit", "zero_std", "stale", "hack")
"""Why an episode was masked out of training (its samples' metadata ``masked_by``), in the order
the step records, the summaries and the step line count them."""


def mask_counts(samples: Sequence) -> dict[str, int]:
    """Episodes masked per reason (each once, however many samples it has), every reason present
    (0 where none was): read off the samples' ``masked_by`` marks (TrainingSamples or SLiME's)."""
    episodes = {episode_key(s): (s.metadata or {}).get("masked_by") for s in samples if s.remove_sample}
    counts = Counter(episodes.values())
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


def mask(target, reason: str) -> bool:
    """The one way anything is masked out of training: a sample (ours or SLiME's), or a
    episode.Episode before its samples are built (they inherit the mark: Episode.removed). What
    is out of training already (an infrastructure failure, or masked before: its first reason
    stays) is left as it is; returns whether `target` was masked now."""
    if reason not in MASK_REASONS:
        raise ValueError(f"unknown mask reason {reason!r} (one of {', '.join(MASK_REASONS)})")
    if isinstance(target, Episode):
        assert "samples" not in vars(target), "the episode's samples were built already; mask them instead"
        if target.removed:
            return False
        target.metadata["masked_by"] = reason
        return True
    if target.remove_sample:
        return False
    target.remove_sample = True
    target.metadata = {**(target.metadata or {}), "masked_by": reason}
    return True


def apply_limit_filters(samples: Sequence[TrainingSample], filters: TrajectoryFilters) -> None:
    """Mask the samples of episodes that hit an enabled limit (mask_counts counts them)."""
    enabled = {"timeout": filters.mask_timeouts, "step_limit": filters.mask_step_limit,
               "length_limit": filters.mask_length_limit}
    for s in samples:
        reason = limit_hit(s)
        if reason and enabled[reason]:
            mask(s, reason)


def staleness(sample: TrainingSample, trained_version: int) -> int | None:
    """How many versions the oldest model call of `sample` is behind `trained_version` (the
    weights the update starts from); None when its calls carry no version."""
    versions = [int(v) for v in sample.weight_versions if str(v).lstrip("-").isdigit()]
    return trained_version - min(versions) if versions else None


def mask_stale(samples: Sequence[TrainingSample], trained_version: int, max_staleness: int) -> None:
    """Mask every episode with a call more than `max_staleness` versions behind `trained_version`
    (all of its samples: an episode is trained whole or not at all)."""
    stale = {episode_key(s) for s in samples if (staleness(s, trained_version) or 0) > max_staleness}
    for s in samples:
        if episode_key(s) in stale:
            mask(s, "stale")


ZERO_STD_TOLERANCE = 1e-6
"""Rewards closer than this are equal for dynamic sampling: their advantages would be noise."""


def kept_episode_rewards(samples: Sequence, reward=lambda s: s.reward) -> dict:
    """episode_key -> the reward of each kept episode (its segments count once); `reward` reads
    it off a sample (the SLiME hook's honours --reward-key)."""
    episodes: dict = {}
    for s in samples:
        if not s.remove_sample and (value := reward(s)) is not None:
            episodes.setdefault(episode_key(s), value)
    return episodes


def rewards_vary(rewards: Sequence[float]) -> bool:
    """Whether a group's episode rewards give GRPO a signal: at least two, not all equal (apart by
    more than ZERO_STD_TOLERANCE). The one zero-variance rule, train-local's and SLiME's."""
    return len(rewards) > 1 and max(rewards) - min(rewards) > ZERO_STD_TOLERANCE


def varying_groups(samples: Sequence[TrainingSample]) -> set:
    """Groups whose kept episodes' rewards vary (rewards_vary)."""
    groups: dict = defaultdict(list)
    for (group, _), reward in kept_episode_rewards(samples).items():
        groups[group].append(reward)
    return {g for g, rewards in groups.items() if rewards_vary(rewards)}


def drop_zero_std_groups(samples: Sequence[TrainingSample]) -> int:
    """Mask every group whose kept rewards do not vary (no GRPO signal); returns groups dropped
    (SLiME's rollout/dynamic_filter/drop_zero_std)."""
    keep = varying_groups(samples)
    dropped = set()
    for s in samples:
        if s.group_index not in keep and mask(s, "zero_std"):
            dropped.add(s.group_index)
    return len(dropped)
