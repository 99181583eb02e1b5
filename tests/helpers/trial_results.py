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
