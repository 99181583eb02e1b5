"""The reward decided in one place (reward.py): each rule of REWARD_RULES, the order they run in,
and a rule added to the list acting in every runner (a real oracle trial through rollout, the SLiME
hook's samples, train-local's samples, the verifiers env's trace)."""

from __future__ import annotations

import asyncio

import pytest

from slime_harbor import reward
from slime_harbor.converter import trial_to_episode
from slime_harbor.grading import hack_monitor
from slime_harbor.grading.grade import GradingReport, run_counts
from slime_harbor.grading.hack_monitor import HackFlag
from slime_harbor.reward import RewardCase, decide_reward, reward_under
from helpers.trial_results import linear_detail, make_result

FLAG = HackFlag("always_equal", "slug.py:5 __eq__ ignores other")


def decided(rewards, scored=True, **case):
    return decide_reward(RewardCase(rewards=rewards, scored=scored, **case))


def test_the_rules_run_in_the_order_the_issue_names():
    assert [rule.__name__ for rule in reward.REWARD_RULES] == ["verifier_value", "tampering", "mapping", "hack_action"]


def test_the_verifiers_raw_value_is_its_reward_key_else_the_convention():
    assert decided({"reward": 0.5, "tests": 1.0}).reward == 0.5
    assert decided({"a": 1.0, "b": 0.0}).reward == 0.5  # no `reward` key: the mean
    assert decided({"reward": 0.5, "tests": 1.0}, reward_key="tests").reward == 1.0
    assert decided({"reward": 0.5}, reward_key="missing").reward == 0.5
    assert decided({"reward": 1.0}, scored=False).reward is None  # not scored: no reward, whatever was written


def test_tampering_is_named_and_scored_zero_before_the_mapping():
    assert decided({"reward": 0.0, "tampering_startup_hook": 1.0, "tampering_other": 0.0}).metadata["tampering"] == \
        ["startup_hook"]
    assert decided(None, scored=False).metadata["tampering"] == []
    # a grader that names tampering but leaves a passing value beside it: the tampering wins
    caught = {"reward": 1.0, "tampering_modified_runtime": 1.0}
    assert decided(caught).reward == 0.0 and decided(caught, mapping="pm1").reward == -1.0
    assert decided({"reward": 1.0, "tampering_modified_runtime": 0.0}).reward == 1.0  # a 0 names nothing


def test_the_mapping_is_raw_or_pm1_and_anything_else_is_one_line():
    assert decided({"reward": 0.25}).reward == 0.25
    assert decided({"reward": 0.25}, mapping="pm1").reward == -0.5
    assert decided({"reward": 1.0}, scored=False, mapping="pm1").reward is None
    with pytest.raises(ValueError, match=r"^unknown reward_mapping 'bogus' \(use 'raw' or 'pm1'\)$"):
        decided({"reward": 1.0}, mapping="bogus")


def test_the_hack_action_comes_after_the_mapping():
    flags = (FLAG,)
    flagged = decided({"reward": 1.0}, mapping="pm1", hack_flags=flags, hack_action="flag")
    assert (flagged.reward, flagged.metadata["hack_flags"], flagged.masked_by) == (1.0, ["always_equal"], None)
    penalised = decided({"reward": 1.0}, mapping="pm1", hack_flags=flags, hack_action="penalty")
    # the failure value of the mapping, and the mapped reward it replaced
    assert (penalised.reward, penalised.metadata["reward_before_hack_penalty"]) == (-1.0, 1.0)
    assert decided({"reward": 1.0}, hack_flags=flags, hack_action="screen").masked_by == "hack"
    unscored = decided({"reward": 1.0}, scored=False, hack_flags=flags, hack_action="penalty")
    assert unscored.reward is None and "reward_before_hack_penalty" not in unscored.metadata
    judge_down = decided({"reward": 1.0}, hack_flags=(HackFlag(reward.DETECTOR_ERROR, "judge unreachable"),),
                         hack_action="penalty")
    assert judge_down.reward == 1.0 and judge_down.metadata["hack_flags"] == []
    assert decided({"reward": 1.0}).metadata.get("hack_flags") is None  # not monitored yet: nothing recorded
    with pytest.raises(ValueError, match=r"^hack_action must be one of flag, penalty, screen, got 'fine'$"):
        decided({"reward": 1.0}, hack_flags=flags, hack_action="fine")


def test_each_side_of_a_grader_read_has_its_name_and_hack_reads_grader_counts_the_episodes_either_flagged():
    """reads_grader/static (the monitor's reading of the code) and reads_grader/runtime (the grading
    watch) are recorded and counted apart; reads_grader, their total, counts an episode once."""
    from types import SimpleNamespace

    static, runtime = HackFlag(reward.READS_GRADER_STATIC, "/app/a.py:3: names a frame API"), \
        HackFlag(reward.READS_GRADER_RUNTIME, "/app/a.py:3 in answer: sys._getframe")
    both = decided({"reward": 1.0}, hack_flags=(static, runtime, FLAG), hack_action="flag")
    assert both.metadata["hack_flags"] == ["always_equal", "reads_grader", "reads_grader/runtime",
                                           "reads_grader/static"]
    assert both.metadata["hack_details"][0] == "reads_grader/static: /app/a.py:3: names a frame API"
    flags_of = [(static, runtime), (runtime,), (static,), (FLAG,), ()]
    episodes = [SimpleNamespace(metadata=decided({"reward": 1.0}, hack_flags=flags, hack_action="flag").metadata)
                for flags in flags_of]
    counts = run_counts(episodes)
    assert (counts["hack/reads_grader"], counts["hack/reads_grader/static"], counts["hack/reads_grader/runtime"],
            counts["hack/always_equal"], counts["hack_rate"]) == (3, 2, 2, 1, 0.8)


def test_the_converter_decides_the_whole_list_once_from_the_result_and_the_grading():
    result = make_result(linear_detail(), {"reward": 1.0, "tampering_x": 0.0})
    ungraded = trial_to_episode(result, reward_mapping="pm1")
    assert ungraded.reward == 1.0 and ungraded.metadata["tampering"] == []
    episode = trial_to_episode(result, reward_mapping="pm1", grading=GradingReport(flags=(FLAG,)), hack_action="penalty")
    assert episode.reward == -1.0 and episode.samples[0].reward == -1.0
    assert episode.samples[0].metadata["reward_before_hack_penalty"] == 1.0


def test_nothing_decides_a_reward_again_after_the_converter():
    """One decision: no second settling of an episode's reward anywhere (the hack monitor's old
    apply_hack_action and reward.settle are gone); the episode keeps the case it was decided from."""
    assert not hasattr(reward, "settle") and not hasattr(hack_monitor, "apply_hack_action")
    episode = trial_to_episode(make_result(linear_detail(), {"reward": 1.0}), grading=GradingReport(flags=(FLAG,)),
                               hack_action="screen")
    assert episode.reward_case.hack_flags == (FLAG,) and episode.masked_by == "hack"
    assert episode.samples[0].remove_sample and episode.samples[0].metadata["masked_by"] == "hack"


def test_the_verifiers_env_reads_its_reward_key_through_every_rule():
    result = make_result(linear_detail(), {"reward": 0.0, "tests": 1.0})
    episode = trial_to_episode(result, reward_mapping="pm1")
    assert reward_under(episode, "tests") == 1.0  # mapped, as the episode's own reward is
    episode = trial_to_episode(result, reward_mapping="pm1", grading=GradingReport(flags=(FLAG,)), hack_action="penalty")
    assert reward_under(episode, "tests") == -1.0


def test_a_rule_added_to_the_list_acts_in_every_runner(tmp_path, monkeypatch, tokenizer):
    """One real oracle trial (bubblewrap) through rollout, with a rule appended to REWARD_RULES;
    every runner's reward is the rule's."""
    vf = pytest.importorskip("verifiers.v1")
    from verifiers.v1.trace import AgentInfo, TraceTask

    from slime_harbor import hooks
    from slime_harbor.grpo import episode_advantages
    from slime_harbor.integrations.verifiers_trace import fill_trace
    from slime_harbor.rollout import run_episode
    from slime_harbor.run_config import DEFAULT_TASKS, RolloutConfig
    from helpers.slime import SampleLike

    def quarter(case, decision):
        if decision.reward is not None:
            decision.reward /= 4
            decision.metadata["quartered"] = True

    monkeypatch.setattr(reward, "REWARD_RULES", [*reward.REWARD_RULES, quarter])
    cfg = RolloutConfig(agent="oracle", reward_mapping="pm1", hack_action="penalty", progress=False)
    episode = asyncio.run(run_episode(DEFAULT_TASKS / "dedupe-lines", cfg, group_index=0, index=0,
                                      trials_dir=tmp_path / "trials"))
    assert episode.scored, episode.end.why
    # rollout (its samples.jsonl and train-local's batch are episode.samples)
    assert episode.reward == 0.25 and episode.metadata["quartered"] and episode.metadata["hack_flags"] == []
    assert [s.reward for s in episode.samples] == [0.25]
    assert episode_advantages(episode.samples) == [0.0]  # train-local's GRPO reads the same reward
    slime = hooks.to_slime_samples(SampleLike(index=0, group_index=0), episode)  # the SLiME hook
    assert [s.reward for s in slime] == [0.25]
    trace = vf.Trace(task=TraceTask(type="t", data={}, key="k", hash="h"), agent=AgentInfo(config={}))
    fill_trace(trace, episode, tokenizer)  # the verifiers env
    assert trace.ok and trace.reward == 0.25
