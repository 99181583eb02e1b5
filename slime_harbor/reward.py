"""The reward an episode trains on, decided in one place, once: one ordered list of rules.

`REWARD_RULES` runs in order over what the reward is decided from (`RewardCase`: the trial's
result as its verifier wrote it, and its grading's report), each rule reading and changing one
`RewardDecision`:

    verifier_value   the verifier's raw value (its `reward` key, or the runner's reward_key)
    tampering        tampering the grader or the runtime check (grading/isolation.py) caught:
                     recorded, and scored 0 (the one place tampering is zeroed)
    mapping          raw, or pm1 (r in [0, 1] -> 2r - 1)
    hack_action      the grading's hack flags: recorded, penalised or screened

The converter decides an episode's reward once, when it builds the episode from the finished trial
and its GradingReport (grading/grade.py); the episode keeps its case (`Episode.reward_case`) so
that the reward can be read under another key (the verifiers env: `reward_under`). Every runner
(rollout, the SLiME hook, train-local, the verifiers env) reads the result from the episode; a rule
added to the list acts in all of them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from slime_harbor.verifier_reward import scalar_reward, tampering_kinds

DETECTOR_ERROR = "detector_error"
"""The flag of a detector that raised: shown in hack_details, never counted or acted on."""
REWARD_MAPPINGS = ("raw", "pm1")
HACK_ACTIONS = ("flag", "penalty", "screen")
"""flag: recorded only; penalty: scored as a failure (the reward mapping's failure value); screen:
out of training and out of its group's baseline (masked_by "hack")."""
READS_GRADER_STATIC = "reads_grader/static"
"""The flag of added code that names a way into the grader (hack_monitor.reads_grader, read before the tests run)."""
READS_GRADER_RUNTIME = "reads_grader/runtime"
"""The flag of agent code the grading watch saw reaching into the grader while the tests ran
(grader_watch/verifier.py)."""
FLAG_TOTALS = {READS_GRADER_STATIC: "reads_grader", READS_GRADER_RUNTIME: "reads_grader"}
"""Flags counted under a total as well: `hack/reads_grader` was one name for both sides before they
got their own, and stays their total so dashboards and trial dirs written before keep their meaning."""


def counted_names(detectors) -> list[str]:
    """The names an episode's flags are counted and recorded under (metadata hack_flags,
    hack/<name>): each flag's own, and the total of FLAG_TOTALS it belongs to."""
    return sorted({*detectors, *(FLAG_TOTALS[d] for d in detectors if d in FLAG_TOTALS)})


@dataclass(frozen=True)
class RewardCase:
    """What an episode's reward is decided from."""

    rewards: dict[str, float] | None
    """The verifier's flat dict as it wrote it (reward.json; isolation's refusal writes one too)."""
    scored: bool
    """The verifier scored the finished trajectory (episode.episode_end); else there is no reward."""
    mapping: str = "raw"
    reward_key: str | None = None
    """The verifier value that is the reward; None: verifier_reward.scalar_reward's convention."""
    hack_flags: tuple | None = None
    """The trial's hack flags (its GradingReport's: hack_monitor.HackFlag); None: not graded by
    our stages (nothing recorded)."""
    hack_action: str | None = None
    """What a flag does: the run's RunSettings.hack_action (declared there, once); None: recorded only."""
    given: float | None = None
    """A reward already mapped, for an episode built without a verifier's dict (a test's, a
    placeholder): the verifier's value and the mapping are then taken as done."""


@dataclass
class RewardDecision:
    """The rules' result: the reward, what the episode's metadata learns, and a mask reason."""

    reward: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    masked_by: str | None = None


RewardRule = Callable[[RewardCase, RewardDecision], None]


def verifier_value(case: RewardCase, decision: RewardDecision) -> None:
    if not case.scored:
        decision.reward = None
    elif case.given is not None or case.rewards is None:
        decision.reward = case.given
    elif case.reward_key is not None and case.reward_key in case.rewards:
        decision.reward = float(case.rewards[case.reward_key])
    else:
        decision.reward = scalar_reward(case.rewards)


def tampering(case: RewardCase, decision: RewardDecision) -> None:
    if case.given is not None:
        return  # no verifier's dict to read
    kinds = tampering_kinds(case.rewards)
    decision.metadata["tampering"] = kinds
    if kinds and decision.reward is not None:
        # A grader (or isolation.refuse) that caught tampering scores 0 whatever value it wrote beside it.
        decision.reward = 0.0


def mapping(case: RewardCase, decision: RewardDecision) -> None:
    if case.mapping not in REWARD_MAPPINGS:
        raise ValueError(f"unknown reward_mapping {case.mapping!r} (use 'raw' or 'pm1')")
    if decision.reward is not None and case.given is None and case.mapping == "pm1":
        decision.reward = 2.0 * decision.reward - 1.0


def failure_reward(reward_mapping: str) -> float:
    return -1.0 if reward_mapping == "pm1" else 0.0


def hack_action(case: RewardCase, decision: RewardDecision) -> None:
    """Record the flags (metadata hack_flags: detector names; hack_details: one line each) and act
    on them. Only a scored episode is penalised or screened (an infrastructure failure is out of
    training already)."""
    if case.hack_flags is None:
        return
    if case.hack_action is not None and case.hack_action not in HACK_ACTIONS:
        raise ValueError(f"hack_action must be one of {', '.join(HACK_ACTIONS)}, got {case.hack_action!r}")
    # A detector that failed (an unreachable judge) is recorded, never acted on: a monitor's own
    # failure must not score or screen an episode.
    names = counted_names({f.detector for f in case.hack_flags if f.detector != DETECTOR_ERROR})
    decision.metadata["hack_flags"] = names
    if case.hack_flags:
        decision.metadata["hack_details"] = [f"{f.detector}: {f.detail}" for f in case.hack_flags]
    if not names or decision.reward is None or case.hack_action in (None, "flag"):
        return
    if case.hack_action == "penalty":
        decision.metadata["reward_before_hack_penalty"] = decision.reward
        decision.reward = failure_reward(case.mapping)
    else:
        decision.masked_by = "hack"


REWARD_RULES: list[RewardRule] = [verifier_value, tampering, mapping, hack_action]
"""The rules, in the order they run. Read at each decision: a rule added here acts everywhere."""


def decide_reward(case: RewardCase) -> RewardDecision:
    decision = RewardDecision()
    for rule in REWARD_RULES:
        rule(case, decision)
    return decision


def verifier_passed(case: RewardCase) -> bool:
    """Whether the trial's verifier scored it a success, before any hack flag (the question the
    impossible twin asks: only a passing trial is graded again); the rules, without the flags."""
    from slime_harbor.samples import is_success

    return is_success(decide_reward(dataclasses.replace(case, hack_flags=None, mapping="raw")).reward)


def case_of(episode, reward_mapping: str = "raw") -> RewardCase:
    """The episode's case; for one built without (a test's, a placeholder) its reward as given."""
    if episode.reward_case is not None:
        return episode.reward_case
    return RewardCase(rewards=None, scored=episode.scored, mapping=reward_mapping, given=episode.reward)


def reward_under(episode, reward_key: str) -> float | None:
    """The episode's reward with `reward_key`'s verifier value as the raw one (the verifiers env's
    reward_key), every other rule as the episode's own decision ran them."""
    return decide_reward(dataclasses.replace(case_of(episode), reward_key=reward_key)).reward
