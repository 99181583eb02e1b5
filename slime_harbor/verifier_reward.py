"""What a trial's verifier reports, as its producers write it and its readers read it: Harbor's
flat rewards dict (reward.json, or reward.txt read as {"reward": v}), its scalar reward, and the
`tampering_<kind>: 1` keys a grader adds beside a 0 when it caught the agent tampering (the
SWE-bench-format tasks' tests/grade.py; isolation.py's refusal of a tampered runtime).
"""

from __future__ import annotations

TAMPERING_PREFIX = "tampering_"
"""Reward keys `tampering_<kind>: 1` name tampering the grader detected (and scored 0)."""


def scalar_reward(rewards: dict[str, float] | None) -> float | None:
    """Harbor verifiers write a flat dict; `reward` is the convention, else a single key, else the mean."""
    if not rewards:
        return None
    if "reward" in rewards:
        return float(rewards["reward"])
    values = [float(v) for v in rewards.values()]
    return values[0] if len(values) == 1 else sum(values) / len(values)


def tampering_kinds(rewards: dict | None) -> list[str]:
    """The kinds of tampering a verifier reported beside its reward."""
    return sorted(k.removeprefix(TAMPERING_PREFIX) for k, v in (rewards or {}).items()
                  if k.startswith(TAMPERING_PREFIX) and v)
