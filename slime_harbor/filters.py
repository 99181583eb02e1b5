"""Trajectory filters: which episodes the loss may see, decided in one place.

A filtered episode is masked the way an infrastructure failure is: out of training (its samples,
when they are built, have `remove_sample=True`, so it gets no loss) and, as grpo.episode_advantages
is given only kept samples, out of its group's baseline. `Episode.masked_by` says which filter took
it (one of MASK_REASONS; its samples carry it as metadata["masked_by"]), so masked episodes are
counted apart from aborted and failed ones. `mask` is the one writer of that mark on a built
episode (the filters here call it); the hack screen is marked where the episode is built, by the
reward's one decision (reward.py's hack_action rule, in converter.trial_to_episode); `mask_counts` the one
reader (train-local's step records, rollout's summary.json and the SLiME hook's masked/<reason>
counts read it).

The filters read Episodes, before their samples are built: train-local's loop keeps its groups'
Episodes until the update's batch is built, and the SLiME hook's `generate` filters its trial's
Episode before it becomes SLiME Samples. Where only SLiME's flat Samples are at hand (the hook's
dynamic_sampling_filter, its fully-async rollout's staleness bound) the same functions take them:
`mask`, `mask_stale` and `kept_episode_rewards` accept Episodes or samples alike, one episode
per samples.episode_key (the key its segments' samples share; an Episode has it too). Nothing else
here rebuilds an episode from samples.

Episode limits, each off by default (a limit hit is then an ordinary, verifier-scored episode):
    timeout       Harbor ended the agent at its time limit (exception AgentTimeoutError)
    step_limit    the agent used all its turns without finishing (exit_status step_limit)
    length_limit  a turn ended at the context or max-new-token limit (exit_status context_exceeded,
                  or a turn whose finish_reason is "length": DAPO's overlong filter)
Staleness (asynchronous training, --max-staleness K / harbor_max_staleness): an episode with a
model call sampled by weights more than K versions older than those being updated is off-policy
beyond the bound; `mask_stale` masks it (masked_by "stale"). Versions are the servers' per-call
weight_version (Episode.weight_versions, a sample's weight_versions).
Dynamic sampling (SLiME's --dynamic-sampling-filter-path check_reward_nonzero_std): a group whose
kept episodes all have the same reward has advantage 0 everywhere and only dilutes the batch;
`drop_zero_std_groups` masks such groups (masked_by "zero_std") and the trainer samples more. One
rule decides it for train-local and for the SLiME hook's dynamic_sampling_filter alike
(`rewards_vary` over `kept_episode_rewards`: rewards further apart than ZERO_STD_TOLERANCE, one per
episode).
The hack monitor's screen (--hack-action screen) masks a flagged episode (masked_by "hack").
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from slime_harbor.episode import CONTEXT_EXCEEDED, Episode
from slime_harbor.samples import episode_key

TIMEOUT_EXCEPTIONS = frozenset({"AgentTimeoutError"})
LENGTH_EXITS = frozenset({CONTEXT_EXCEEDED})


@dataclass
class TrajectoryFilters:
    """Which episode limits mask an episode out of training: a masked episode gets no loss and no
    say in its group's baseline, counted as masked/<reason>; evaluation episodes are never masked.
    Declared here once: train-local's --mask-* flags (LocalTrainConfig extends this) and the SLiME
    plugin's harbor_mask_* keys (hooks.FILTER_KEYS) are these fields."""

    mask_timeouts: bool = False
    """Mask episodes Harbor ended at the agent's time limit (AgentTimeoutError); unmasked,
    they are trained with their verifier reward."""
    mask_step_limit: bool = False
    """Mask episodes that used every turn (the step limit) without finishing."""
    mask_length_limit: bool = False
    """Mask episodes with a turn cut at the context or max-new-token limit (DAPO's overlong filter)."""


MASK_REASONS = ("timeout", "step_limit", "length_limit", "zero_std", "stale", "hack")
"""Why an episode was masked out of training (Episode.masked_by; its samples' metadata
``masked_by``), in the order the step records, the summaries and the step line count them."""


def mask_counts(episodes: Sequence[Episode]) -> dict[str, int]:
    """Episodes masked per reason, every reason present (0 where none was)."""
    counts = Counter(e.masked_by for e in episodes if e.masked_by is not None)
    return {reason: counts.get(reason, 0) for reason in MASK_REASONS}


def limit_hit(episode: Episode) -> str | None:
    """Which episode limit the episode hit: timeout, step_limit, length_limit or None."""
    meta = episode.metadata
    if meta.get("exception_type") in TIMEOUT_EXCEPTIONS:
        return "timeout"
    if episode.end.exit_status == "step_limit":
        return "step_limit"
    if episode.end.exit_status in LENGTH_EXITS or "length" in (meta.get("finish_reasons") or []):
        return "length_limit"
    return None


def out_of_training(item) -> bool:
    """Whether an Episode (`removed`) or a sample (ours or SLiME's: `remove_sample`) is out of
    training: the one test `mask` and `kept_episode_rewards` make, on either."""
    return item.removed if isinstance(item, Episode) else item.remove_sample


def mask(target, reason: str) -> bool:
    """The one way anything is masked out of training: an Episode before its samples are built
    (they inherit the mark), or a sample (ours or SLiME's: the SLiME hook's fully-async rollout has
    only those). What is out of training already (an infrastructure failure, or masked before: its
    first reason stays) is left as it is; returns whether `target` was masked now."""
    if reason not in MASK_REASONS:
        raise ValueError(f"unknown mask reason {reason!r} (one of {', '.join(MASK_REASONS)})")
    if isinstance(target, Episode):
        assert "samples" not in vars(target), "the episode's samples were built already; mask the episode first"
    if out_of_training(target):
        return False
    if isinstance(target, Episode):
        target.masked_by = reason
    else:
        target.remove_sample = True
        target.metadata = {**(target.metadata or {}), "masked_by": reason}
    return True


def apply_limit_filters(episodes: Sequence[Episode], filters: TrajectoryFilters) -> None:
    """Mask the episodes that hit an enabled limit (mask_counts counts them)."""
    enabled = {"timeout": filters.mask_timeouts, "step_limit": filters.mask_step_limit,
               "length_limit": filters.mask_length_limit}
    for episode in episodes:
        reason = limit_hit(episode)
        if reason and enabled[reason]:
            mask(episode, reason)


def staleness(item, trained_version: int) -> int | None:
    """How many versions the oldest model call of `item` (an Episode, or a sample) is behind
    `trained_version` (the weights the update starts from); None when its calls carry no version."""
    versions = [int(v) for v in item.weight_versions if str(v).lstrip("-").isdigit()]
    return trained_version - min(versions) if versions else None


def mask_stale(items: Sequence, trained_version: int, max_staleness: int) -> int:
    """Mask every episode with a call more than `max_staleness` versions behind `trained_version`
    (Episodes, or samples: all of an episode's, an episode is trained whole or not at all);
    returns the episodes masked now."""
    stale = {episode_key(s) for s in items if (staleness(s, trained_version) or 0) > max_staleness}
    masked = set()
    for s in items:
        if episode_key(s) in stale and mask(s, "stale"):
            masked.add(episode_key(s))
    return len(masked)


ZERO_STD_TOLERANCE = 1e-6
"""Rewards closer than this are equal for dynamic sampling: their advantages would be noise."""


def kept_episode_rewards(items: Sequence, reward=lambda s: s.reward) -> dict:
    """episode_key -> the reward of each kept episode, from Episodes or from samples (an episode's
    segments count once); `reward` reads it off one (the SLiME hook's honours --reward-key)."""
    episodes: dict = {}
    for s in items:
        if not out_of_training(s) and (value := reward(s)) is not None:
            episodes.setdefault(episode_key(s), value)
    return episodes


def rewards_vary(rewards: Sequence[float]) -> bool:
    """Whether a group's episode rewards give GRPO a signal: at least two, not all equal (apart by
    more than ZERO_STD_TOLERANCE). The one zero-variance rule, train-local's and SLiME's."""
    return len(rewards) > 1 and max(rewards) - min(rewards) > ZERO_STD_TOLERANCE


def varying_groups(episodes: Sequence[Episode]) -> set:
    """Groups whose kept episodes' rewards vary (rewards_vary)."""
    groups: dict = defaultdict(list)
    for (group, _), reward in kept_episode_rewards(episodes).items():
        groups[group].append(reward)
    return {g for g, rewards in groups.items() if rewards_vary(rewards)}


def drop_zero_std_groups(episodes: Sequence[Episode]) -> int:
    """Mask every group whose kept rewards do not vary (no GRPO signal); returns groups dropped
    (SLiME's rollout/dynamic_filter/drop_zero_std)."""
    keep = varying_groups(episodes)
    dropped = set()
    for e in episodes:
        if e.group_index not in keep and mask(e, "zero_std"):
            dropped.add(e.group_index)
    return len(dropped)
