"""Converter: turn alignment, masking, drift splitting and status classification.

Uses Harbor's real TrialResult / AgentContext models; the token streams are hand-built so every
expected value is known exactly."""

from datetime import datetime, timezone

import pytest
from harbor.models.agent.context import AgentContext
from harbor.models.trial.config import TaskConfig, TrialConfig
from harbor.models.trial.result import AgentInfo, ExceptionInfo, TrialResult
from harbor.models.verifier.result import VerifierResult

from slime_harbor.converter import classify, split_into_segments, trial_to_samples
from slime_harbor.samples import SampleStatus, TrainingSample, read_jsonl, write_jsonl

P0 = [1, 2, 3]
C0, L0 = [10, 11], [-0.1, -0.2]
OBS0 = [90, 91, 92]
C1, L1 = [12], [-0.3]


def linear_detail():
    return {
        "prompt_token_ids": [P0, P0 + C0 + OBS0],
        "completion_token_ids": [C0, C1],
        "logprobs": [L0, L1],
    }


def make_result(detail=None, rewards=None, exc_type=None, exit_status="submitted"):
    ctx = AgentContext(
        rollout_details=[detail] if detail else None,
        metadata={"exit_status": exit_status, "turns": len(detail["completion_token_ids"]) if detail else 0},
    )
    exc = None
    if exc_type:
        exc = ExceptionInfo(
            exception_type=exc_type, exception_message="boom", exception_traceback="", occurred_at=datetime.now(timezone.utc)
        )
    return TrialResult(
        task_name="t",
        trial_name="t__1",
        trial_uri="file:///tmp/trials/t__1",
        task_id={"path": "/tmp/t"},
        task_checksum="x",
        config=TrialConfig(task=TaskConfig(path="/tmp/t")),
        agent_info=AgentInfo(name="native", version="0"),
        agent_result=ctx,
        verifier_result=VerifierResult(rewards=rewards) if rewards is not None else None,
        exception_info=exc,
    )


def test_linear_episode_is_one_sample_with_observations_masked():
    segments, drift = split_into_segments(linear_detail())
    assert drift == 0 and len(segments) == 1
    seg = segments[0]
    assert seg.prompt_ids == P0
    assert seg.response_ids == C0 + OBS0 + C1
    assert seg.loss_mask == [1, 1, 0, 0, 0, 1]
    assert seg.logprobs == L0 + [0.0, 0.0, 0.0] + L1


def test_drift_splits_into_samples_sharing_rollout_id():
    detail = linear_detail()
    # Turn 1's prompt re-tokenized the first completion differently ([10, 11] -> [77]).
    detail["prompt_token_ids"][1] = P0 + [77] + OBS0
    samples = trial_to_samples(make_result(detail, {"reward": 1.0}), group_index=0, index=5)
    assert len(samples) == 2
    assert {s.rollout_id for s in samples} == {5}
    assert samples[0].tokens == P0 + C0 and samples[0].loss_mask == [1, 1]
    assert samples[1].tokens == P0 + [77] + OBS0 + C1 and samples[1].response_length == 1
    assert all(s.metadata["drift_count"] == 1 for s in samples)
    for s in samples:
        s.check()


def test_mismatched_logprobs_are_rejected():
    detail = linear_detail()
    detail["logprobs"][0] = [-0.1]
    with pytest.raises(ValueError, match="logprobs"):
        split_into_segments(detail)


@pytest.mark.parametrize(
    "kwargs, status, removed",
    [
        (dict(rewards={"reward": 1.0}), SampleStatus.COMPLETED, False),
        (dict(rewards={"reward": 0.0}, exit_status="step_limit"), SampleStatus.TRUNCATED, False),
        (dict(rewards={"reward": 0.0}, exc_type="AgentTimeoutError"), SampleStatus.TRUNCATED, False),
        (dict(rewards=None, exc_type="RewardFileNotFoundError"), SampleStatus.FAILED, True),
        (dict(rewards=None, exc_type="PolicyServerError"), SampleStatus.ABORTED, True),
        (dict(rewards=None, exc_type="CancelledError"), SampleStatus.ABORTED, True),
        (dict(rewards={"reward": 1.0}, exit_status="aborted"), SampleStatus.ABORTED, True),
    ],
)
def test_status_and_removal(kwargs, status, removed):
    samples = trial_to_samples(make_result(linear_detail(), **kwargs), group_index=0, index=0)
    assert samples[0].status == status
    assert samples[0].remove_sample is removed
    if removed:
        # Infra failures never carry a reward that could be trained as a penalty.
        assert samples[0].reward is None
    else:
        assert samples[0].reward == kwargs["rewards"]["reward"]


def test_reward_mapping_and_multi_key_rewards():
    result = make_result(linear_detail(), {"reward": 0.0})
    assert trial_to_samples(result, reward_mapping="pm1")[0].reward == -1.0
    assert classify(make_result(linear_detail(), {"a": 1.0, "b": 0.0}))[1] == 0.5
    with pytest.raises(ValueError):
        trial_to_samples(result, reward_mapping="bogus")


def test_agent_without_tokens_reports_reward_but_is_not_trained():
    samples = trial_to_samples(make_result(None, {"reward": 1.0}), group_index=1, index=4)
    assert len(samples) == 1
    s = samples[0]
    assert s.reward == 1.0 and s.status == SampleStatus.COMPLETED and s.remove_sample
    assert s.tokens == [] and s.response_length == 0


def test_jsonl_round_trip(tmp_path):
    samples = trial_to_samples(make_result(linear_detail(), {"reward": 1.0}), group_index=0, index=0)
    write_jsonl(tmp_path / "s.jsonl", samples)
    back = read_jsonl(tmp_path / "s.jsonl")
    assert back == samples
    assert isinstance(back[0], TrainingSample) and back[0].status is SampleStatus.COMPLETED
