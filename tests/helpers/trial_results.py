"""Harbor TrialResults with hand-built token streams (Harbor's own models), for the converter: every
expected value is known exactly."""

from datetime import datetime, timezone

from harbor.models.agent.context import AgentContext
from harbor.models.trial.config import TaskConfig, TrialConfig
from harbor.models.trial.result import AgentInfo, ExceptionInfo, TrialResult
from harbor.models.verifier.result import VerifierResult

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


EPISODE_KINDS = ("solved", "failed", "truncated", "drifted", "solved_without_tokens", "environment_start_failed",
                 "broken_verifier")


def converted_episode(kind: str, group_index: int | None = None, index: int | None = None, **grading):
    """An Episode of one kind, through the real converter (trial_to_episode) from a TrialResult
    built here: solved (reward 1), failed (0), truncated (0, the agent stopped at its step limit),
    drifted (reward 0; its tokens drifted at turn 1, so two samples of one episode),
    solved_without_tokens (reward 1, nothing sampled: an oracle), environment_start_failed (the sandbox never started, no tokens: aborted) and broken_verifier
    (the agent ran, the verifier wrote no reward file: failed)."""
    from harbor.models.trial.result import TimingInfo

    from slime_harbor.converter import trial_to_episode

    assert kind in EPISODE_KINDS, kind
    detail = linear_detail()
    if kind == "drifted":
        detail["prompt_token_ids"][1] = P0 + [77] + OBS0
    if kind == "environment_start_failed":
        result = make_result(None, exc_type="EnvironmentStartTimeoutError")
        result.environment_setup = TimingInfo(started_at=datetime.now(timezone.utc))
    elif kind == "broken_verifier":
        result = make_result(detail, exc_type="RewardFileNotFoundError")
    elif kind == "solved_without_tokens":
        result = make_result(None, {"reward": 1.0})
    else:
        result = make_result(detail, {"reward": 1.0 if kind == "solved" else 0.0},
                             exit_status="step_limit" if kind == "truncated" else "submitted")
    return trial_to_episode(result, group_index=group_index, index=index, **grading)


EVAL_BATCH = ["solved", "failed", "drifted", "failed", "failed", "truncated", "environment_start_failed",
              "broken_verifier"]
"""Eight trials of an evaluation, two per prompt row (by index): six scored (one success), one
episode in two segments, two unscored (the sandbox never started; the verifier wrote no reward
file). Nine samples."""


def episodes_by_index(kinds):
    """A stand-in for rollout.run_episode (its call signature) returning, for the trial of index i,
    converted_episode(kinds[i]): the hook's code around the trial runs, the trial does not."""

    async def run_episode(task_dir, cfg, *, group_index, index, **kwargs):
        return converted_episode(kinds[index], group_index, index)

    return run_episode
