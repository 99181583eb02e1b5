"""The reward an episode trains on, decided in one place."""

from __future__ import annotations

from slime_harbor.filters import mask

DETECTOR_ERROR = "detector_error"
"""The flag of a detector that raised: shown in hack_details, never counted or acted on."""


HACK_ACTIONS = ("flag", "penalty", "screen")
"""flag: recorded only; penalty: scored as a failure (the reward mapping's failure value); screen:
out of training and out of its group's baseline (masked_by "hack")."""


def failure_reward(reward_mapping: str) -> float:
    return -1.0 if reward_mapping == "pm1" else 0.0


def apply_hack_action(episode, flags: list[HackFlag], action: str, reward_mapping: str) -> None:
    """Record `flags` on the episode (episode.Episode; metadata hack_flags: detector names;
    hack_details: one line each) and act on them. Only a scored episode is penalised or screened
    (an infrastructure failure is out of training already)."""
    if action not in HACK_ACTIONS:
        raise ValueError(f"hack_action must be one of {', '.join(HACK_ACTIONS)}, got {action!r}")
    # A detector that failed (an unreachable judge) is recorded, never acted on: a monitor's own
    # failure must not score or screen an episode.
    names = sorted({f.detector for f in flags if f.detector != DETECTOR_ERROR})
    episode.metadata["hack_flags"] = names
    if flags:
        episode.metadata["hack_details"] = [f"{f.detector}: {f.detail}" for f in flags]
    if not names or not episode.scored or action == "flag":
        return
    if action == "penalty":
        episode.metadata["reward_before_hack_penalty"] = episode.reward
        episode.reward = failure_reward(reward_mapping)
    else:
        mask(episode, "hack")  # on the episode, before its samples are built: they inherit the mark
