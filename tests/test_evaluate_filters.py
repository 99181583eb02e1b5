"""Held-out metrics (pass@k), trajectory filters and the wandb name mapping, on hand-built samples:
each checked against a hand computation, each filter against what it must and must not mask."""

from __future__ import annotations

import math

import pytest

from slime_harbor.filters import (
    MASK_REASONS, TrajectoryFilters, apply_limit_filters, drop_zero_std_groups, limit_hit, mask, mask_counts,
)
from slime_harbor.grpo import episode_advantages
from slime_harbor.episode import Episode
from slime_harbor.samples import SampleStatus, TrainingSample
from slime_harbor.samples import pass_at_k
from slime_harbor.trainers.evaluate import eval_metrics
from slime_harbor.trainers.learner import trainable
from slime_harbor.trainers.training_run import TaskStream
from slime_harbor.trainers.tracking import flatten, wandb_key
from helpers.samples import make_episode, make_sample


# --- pass@k ----------------------------------------------------------------------------------


def test_pass_at_k_matches_hand_computation():
    # n=4, c=1: pass@1 = 1/4; pass@2 = 1 - C(3,2)/C(4,2) = 1 - 3/6; pass@4 = 1 (any 4 of 4 hold the success).
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    assert pass_at_k(4, 1, 4) == 1.0
    # n=5, c=2, k=3: 1 - C(3,3)/C(5,3) = 1 - 1/10.
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9)
    assert pass_at_k(4, 0, 2) == 0.0
    assert pass_at_k(1, 1, 2) is None  # fewer episodes than k: not estimable
    with pytest.raises(ValueError):
        pass_at_k(2, 3, 1)


def test_eval_metrics_per_task_and_overall():
    rewards = {"a": [1.0, 0.0, 0.0, 1.0], "b": [0.0, 0.0, 0.0, 0.0], "c": [1.0, None, 0.5, 1.0]}
    m = eval_metrics(rewards, k=2)
    a, b, c = (m["per_task"][t] for t in "abc")
    assert (a["n"], a["n_success"], a["pass@1"]) == (4, 2, 0.5)
    assert a["pass@2"] == pytest.approx(1 - math.comb(2, 2) / math.comb(4, 2))  # 5/6
    assert (b["pass@1"], b["pass@2"]) == (0.0, 0.0)
    # The unscored trial of c is left out of n (an outage is not a failure) and counted.
    assert (c["n"], c["n_success"], c["n_unscored"]) == (3, 2, 1)
    assert c["pass@2"] == pytest.approx(1 - math.comb(1, 2) / math.comb(3, 2))  # 1.0
    assert m["pass@1"] == pytest.approx((0.5 + 0.0 + 2 / 3) / 3)
    assert m["pass@2"] == pytest.approx((5 / 6 + 0.0 + 1.0) / 3)
    assert (m["n_trials"], m["n_unscored"], m["k"]) == (12, 1, 2)


# --- filters ---------------------------------------------------------------------------------


def episode(group: int, index: int, reward: float | None, status=SampleStatus.COMPLETED, *, segments: int = 1,
            exit_status: str = "submitted", **meta) -> Episode:
    return make_episode(reward, status, group, index, segments=segments, exit_status=exit_status,
                        metadata={"exception_type": None, "finish_reasons": ["stop"], **meta})


def limited_group() -> list[Episode]:
    """One group: a clean success, a clean failure, and one episode per limit, each scored."""
    return [
        episode(0, 0, 1.0),
        episode(0, 1, 0.0),
        episode(0, 2, 0.0, SampleStatus.TRUNCATED, exception_type="AgentTimeoutError", exit_status="running"),
        episode(0, 3, 0.0, SampleStatus.TRUNCATED, exit_status="step_limit", finish_reasons=["stop"] * 3),
        episode(0, 4, 1.0, SampleStatus.COMPLETED, finish_reasons=["length", "stop"]),  # max-new-token cut
        episode(0, 5, 0.0, SampleStatus.TRUNCATED, exit_status="context_exceeded"),
    ]


def samples_of(episodes: list[Episode]) -> list[TrainingSample]:
    return [s for e in episodes for s in e.samples]


def test_limit_hit_reads_what_the_converter_records():
    assert [limit_hit(e) for e in limited_group()] == [None, None, "timeout", "step_limit", "length_limit", "length_limit"]


@pytest.mark.parametrize("flag, masked", [
    ("mask_timeouts", {2}), ("mask_step_limit", {3}), ("mask_length_limit", {4, 5}),
])
def test_each_filter_masks_its_episodes_and_nothing_else(flag, masked):
    episodes = limited_group()
    apply_limit_filters(episodes, TrajectoryFilters(**{flag: True}))
    assert {e.index for e in episodes if e.removed} == masked
    assert sum(mask_counts(episodes).values()) == len(masked)
    # Masked: no loss, and out of the group's baseline (the advantages of the kept ones).
    samples = samples_of(episodes)
    assert {s.index for s in samples if s.remove_sample} == masked
    kept = trainable(samples)
    assert {s.index for s in kept} == set(range(6)) - masked
    rewards = [s.reward for s in kept]
    mean = sum(rewards) / len(rewards)
    assert episode_advantages(kept) == pytest.approx([r - mean for r in rewards])


def test_filters_count_each_masked_episode_once_under_its_own_reason():
    """All three filters on, and the step-limit episode drifted into two segments (two samples,
    one rollout_id): metrics.json's "filters" counts episodes, each under the limit it hit, and
    every sample of a masked episode carries its reason."""
    episodes = limited_group()
    episodes[3] = episode(0, 3, 0.0, SampleStatus.TRUNCATED, segments=2, exit_status="step_limit")
    apply_limit_filters(episodes, TrajectoryFilters(mask_timeouts=True, mask_step_limit=True, mask_length_limit=True))
    assert mask_counts(episodes) == {"timeout": 1, "step_limit": 1, "length_limit": 2, "zero_std": 0, "stale": 0,
                                     "hack": 0}
    assert [(s.index, s.remove_sample, s.metadata.get("masked_by")) for s in samples_of(episodes)] == [
        (0, False, None), (1, False, None), (2, True, "timeout"), (3, True, "step_limit"), (3, True, "step_limit"),
        (4, True, "length_limit"), (5, True, "length_limit")]


def test_no_filter_by_default_and_infra_failures_stay_aborted():
    episodes = limited_group() + [episode(0, 6, None, SampleStatus.ABORTED)]
    apply_limit_filters(episodes, TrajectoryFilters())
    assert not any(mask_counts(episodes).values())
    assert [s.remove_sample for s in samples_of(episodes)] == [False] * 6 + [True]
    # an infra failure is counted as aborted, not as masked
    assert episodes[-1].masked_by is None and "masked_by" not in episodes[-1].samples[0].metadata


def test_mask_keeps_an_episodes_first_reason_and_knows_every_reason():
    """filters.mask writes every mask (the filters' and the hack monitor's): an episode masked or
    out of training already keeps what it was, and so does a sample (SLiME's, in the hook's
    fully-async rollout); a reason outside MASK_REASONS is a bug, said at once; an episode whose
    samples were built is masked no more (they would not carry it)."""
    masked, aborted = episode(0, 0, 1.0), episode(0, 1, None, SampleStatus.ABORTED)
    assert mask(masked, "timeout") and not mask(masked, "stale") and not mask(aborted, "hack")
    assert masked.masked_by == "timeout" and aborted.masked_by is None
    assert mask_counts([masked, aborted]) == {**dict.fromkeys(MASK_REASONS, 0), "timeout": 1}
    sample = make_sample(1.0)
    assert mask(sample, "stale") and not mask(sample, "hack")
    assert sample.remove_sample and sample.metadata["masked_by"] == "stale"
    with pytest.raises(ValueError, match="unknown mask reason 'judge'"):
        mask(episode(0, 2, 1.0), "judge")
    built = episode(0, 3, 1.0)
    assert not built.samples[0].remove_sample
    with pytest.raises(AssertionError, match="samples were built already"):
        mask(built, "hack")


def test_drop_zero_std_groups_masks_only_groups_without_reward_variance():
    episodes = [
        episode(0, 0, 1.0), episode(0, 1, 0.0),  # varies: kept
        episode(1, 2, 0.0), episode(1, 3, 0.0),  # all equal: dropped
        episode(2, 4, 1.0), episode(2, 5, 1.0),  # all equal: dropped
        episode(3, 6, 1.0), episode(3, 7, 0.0),  # varies only with its masked episode: dropped
    ]
    mask(episodes[7], "timeout")
    assert drop_zero_std_groups(episodes) == 3
    assert [e.index for e in episodes if not e.removed] == [0, 1]
    assert episodes[7].masked_by == "timeout"  # its first reason stays
    assert {e.masked_by for e in episodes[2:7]} == {"zero_std"}


def test_task_stream_draws_each_task_once_per_epoch_and_resumes():
    tasks = [f"t{i}" for i in range(5)]
    stream = TaskStream(tasks, seed=3)
    first = stream.take(3) + stream.take(2)
    assert sorted(first) == tasks  # one epoch: every task once
    again = TaskStream(tasks, seed=3, position=2)
    assert again.take(3) == first[2:5]
    crossing = TaskStream(tasks, seed=3, position=4).take(5)
    assert len(crossing) == len(set(crossing)) == 5  # no repeat inside one draw


# --- wandb names ---------------------------------------------------------------------------------


def test_metric_names_follow_slime():
    record = {"step": 3, "reward_mean": 0.5, "pass_rate": 0.25, "pg_loss": 0.1, "kl": 0.01, "clipfrac": 0.2,
              "skipped": None, "timings": {"rollout_s": 1.0}, "filters": {"zero_std": 2, "timeout": 1},
              "n_groups_zero_std": 1,
              "updates": [{"loss": 0.3}], "eval": {"pass@1": 0.4, "pass@4": 0.7, "reward_mean": 0.45,
                                                   "per_task": {"x": {"pass@1": 0.5}}}}
    names = {wandb_key(p): v for p, v in flatten(record).items()}
    assert names["rollout/raw_reward"] == 0.5
    assert names["passrate/pass@1"] == 0.25
    assert names["train/pg_loss"] == 0.1 and names["train/kl_loss"] == 0.01 and names["train/pg_clipfrac"] == 0.2
    assert names["perf/rollout_time"] == 1.0
    # SLiME's drop_zero_std counts groups dropped; filters count episodes
    assert names["rollout/dynamic_filter/drop_zero_std"] == 1 and names["rollout/filters/zero_std"] == 2
    assert names["rollout/filters/timeout"] == 1
    assert names["eval/heldout"] == 0.45 and names["eval/heldout-pass@1"] == 0.4 and names["eval/heldout-pass@4"] == 0.7
    assert names["eval/heldout/per_task/x/pass@1"] == 0.5
    assert names["train/updates/0/loss"] == 0.3 and names["train/skipped"] == 0.0


@pytest.mark.parametrize("overrides, message", [
    ({"rollout_batch_size": 2}, "rollout_batch_size must be 1..1"),
    ({"eval_tasks": "/nonexistent/heldout"}, "does not exist"),
    ({"eval_n_samples": 0, "eval_tasks": "FIXTURES"}, "eval_n_samples must be >= 1"),
    ({"dynamic_sampling_max_rounds": -1}, "dynamic_sampling_max_rounds must be >= 0"),
])
def test_bad_settings_fail_before_the_model_loads(overrides, message, tmp_path):
    from pathlib import Path

    from slime_harbor.trainers.local import train
    from slime_harbor.trainers.local_config import LocalTrainConfig

    fixtures = Path(__file__).parent / "fixtures" / "tasks"
    overrides = {k: fixtures if v == "FIXTURES" else (Path(v) if k == "eval_tasks" else v) for k, v in overrides.items()}
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        train(LocalTrainConfig(tasks_dir=fixtures, output_dir=tmp_path, **overrides))
    assert not any(tmp_path.iterdir())  # nothing written either
