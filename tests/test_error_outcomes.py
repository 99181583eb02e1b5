"""What happens to an episode is the errors table's second column (error_kinds.ERRORS), row by row,
and each outcome with its error raised where it really arises in a real Harbor trial: a verifier
that writes no reward (FAILED), a Dockerfile that does not build (FAILED, not retried), a gateway
the sandbox cannot reach (infrastructure: retried), the Docker exec server killed mid-trial
(ABORTED: retried)."""

from __future__ import annotations

import asyncio
import shutil
from datetime import datetime, timezone
from pathlib import Path

import pytest
from helpers.docker import needs_docker
from helpers.rollout import config
from helpers.trial_results import linear_detail, make_result

from slime_harbor import error_kinds
from slime_harbor.episode import episode_end
from slime_harbor.error_kinds import FAILED, INFRASTRUCTURE, RETRIED, SCORED, TASK
from slime_harbor.retries import RetryBudget
from slime_harbor.run_config import DEFAULT_TASKS, RolloutConfig
from slime_harbor.samples import SampleStatus

STATUS_OF = {RETRIED: {SampleStatus.ABORTED}, FAILED: {SampleStatus.FAILED},
             SCORED: {SampleStatus.COMPLETED, SampleStatus.TRUNCATED}}


@pytest.mark.parametrize("name", sorted(error_kinds.ERRORS))
def test_every_rows_outcome_is_the_episodes_status(name):
    """Recorded by Harbor after the agent ran (a verifier's reward or none): the row decides."""
    outcome = error_kinds.ERRORS[name].outcome
    exc_type = name.rsplit(":", 1)[1]
    for rewards in (None, {"reward": 0.0}):
        ended = episode_end(make_result(linear_detail(), rewards, exc_type=exc_type))
        expected = STATUS_OF[outcome] if rewards is not None or outcome != SCORED else {SampleStatus.FAILED}
        assert ended.status in expected, (name, rewards, ended)
        assert (ended.reward is not None) == (ended.status in STATUS_OF[SCORED])


def test_an_unnamed_error_fails_unless_the_sandbox_was_starting_or_the_episode_at_a_limit():
    from harbor.models.trial.result import TimingInfo

    assert error_kinds.row_of_name("SomeLibraryError") is None and error_kinds.UNNAMED_OUTCOME == FAILED
    assert episode_end(make_result(linear_detail(), {"reward": 1.0}, exc_type="SomeLibraryError")).status \
        == SampleStatus.FAILED
    at_limit = make_result(linear_detail(), {"reward": 0.0}, exc_type="SomeLibraryError", exit_status="step_limit")
    assert episode_end(at_limit).status == SampleStatus.TRUNCATED
    starting = make_result(None, exc_type="SomeLibraryError")
    starting.environment_setup = TimingInfo(started_at=datetime.now(timezone.utc))
    assert (episode_end(starting).status, episode_end(starting).environment_start_failed) == (SampleStatus.ABORTED, True)
    # A row that fails is never a start that failed, even while the sandbox was starting.
    building = make_result(None, exc_type="SandboxBuildFailedError")
    building.environment_setup = TimingInfo(started_at=datetime.now(timezone.utc))
    assert (episode_end(building).status, episode_end(building).environment_start_failed) == (SampleStatus.FAILED, False)


def test_the_errors_that_were_failed_after_the_sandbox_started_are_now_retried():
    """Infrastructure in the first column and absent from episode.py's old name lists: once the
    sandbox had started, they ended FAILED and never ran again."""
    for exc_type in ("ExecServerError", "DockerUnavailableError", "GatewayReachError", "InfraFailure"):
        assert error_kinds.kind_of_name(exc_type) == INFRASTRUCTURE
        assert episode_end(make_result(linear_detail(), None, exc_type=exc_type)).status == SampleStatus.ABORTED


# --- each outcome where it arises, in real trials ------------------------------------------------


def copy_task(tmp_path: Path, name: str = "dedupe-lines") -> Path:
    task = tmp_path / "tasks" / name
    shutil.copytree(DEFAULT_TASKS / name, task)
    return task


def run_once(task: Path, cfg: RolloutConfig, tmp_path: Path):
    """One episode through rollout.run_episode with a retry budget, as every runner runs it."""
    from slime_harbor.rollout import run_episode

    return asyncio.run(run_episode(task, cfg, group_index=0, index=0, trials_dir=tmp_path / "trials",
                                   retry_budget=RetryBudget()))


def retrying(**overrides) -> RolloutConfig:
    """One rerun at most, none of the environment's own start retries, no waiting."""
    return RolloutConfig(**{"agent": "oracle", "n_samples": 1, "progress": False, "max_retries_per_task": 1,
                            "retry_backoff_sec": 0.0, "env_start_retries": 0, **overrides})


def test_a_verifier_that_writes_no_reward_fails_and_is_not_retried(tmp_path):
    """Harbor's RewardFileNotFoundError, raised by Harbor's verifier after a real oracle trial."""
    task = copy_task(tmp_path)
    (task / "tests" / "test.sh").write_text("#!/bin/bash\necho 'checked, but wrote no reward'\n")
    episode = run_once(task, retrying(), tmp_path)
    assert episode.status == SampleStatus.FAILED and episode.reward is None, episode.error
    assert episode.metadata["exception_type"] == "RewardFileNotFoundError"
    assert error_kinds.ERRORS["harbor.verifier.verifier:RewardFileNotFoundError"] == (TASK, FAILED)
    assert episode.metadata["retries"] == 0 and not episode.metadata.get("retry_budget_spent")
    assert not episode.metadata.get("internal_error")


def test_a_dockerfile_that_does_not_build_fails_and_is_not_retried(tmp_path):
    """The bubblewrap sandbox replays the task's Dockerfile: a RUN that exits 7 fails the build."""
    task = copy_task(tmp_path)
    dockerfile = task / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + "RUN echo the-build-breaks && exit 7\n")
    episode = run_once(task, retrying(env_start_retries=2), tmp_path)
    assert episode.status == SampleStatus.FAILED and episode.reward is None, episode.error
    assert error_kinds.row_of_name(episode.metadata["exception_type"]).outcome == FAILED, episode.metadata
    assert episode.metadata["env_start_attempts"] == 1 and episode.metadata["retries"] == 0
    assert not episode.end.environment_start_failed and not episode.metadata.get("internal_error")


def test_a_gateway_the_sandbox_cannot_reach_is_infrastructure_and_retried(tmp_path, policy_server, tiny_model_dir,
                                                                         monkeypatch):
    """gateway_reach's helper, which opens the gateway's port inside the sandbox's network, reports
    the failure a refused namespace join gives; the real GatewayReachError follows in a real
    bubblewrap trial of a gateway agent, and the task runs again once (its budget), then FAILED."""
    from slime_harbor.environments import gateway_reach

    monkeypatch.setattr(gateway_reach, "_HELPER", (
        "import socket, sys\n"
        "socket.socket(fileno=int(sys.argv[1])).sendall(b'PermissionError: [Errno 1] Operation not permitted')\n"))
    task = copy_task(tmp_path)
    cfg = config(tmp_path, policy_server, tiny_model_dir, tasks_dir=task.parent, agent="terminus-2", n_samples=1,
                 max_retries_per_task=1, retry_backoff_sec=0.0, env_start_retries=0)
    episode = run_once(task, cfg, tmp_path)
    assert episode.metadata["exception_type"] == "GatewayReachError", episode.error
    assert error_kinds.kind_of_name("GatewayReachError") == INFRASTRUCTURE
    # Aborted (only an aborted episode spends the budget), run again, aborted again: FAILED at last.
    assert episode.metadata["retries"] == 1 and episode.metadata["retry_budget_spent"], episode.metadata
    assert episode.status == SampleStatus.FAILED and "Operation not permitted" in episode.error
    assert len(list((tmp_path / "trials").iterdir())) == 2 and not episode.metadata.get("internal_error")


KILL_EXEC_SERVERS = (  # as tests/test_docker_env.py's test_killed_exec_servers_are_replaced
    "for p in /proc/[0-9]*; do case \"$(tr '\\0' ' ' < $p/cmdline 2>/dev/null)\" in "
    "*slime-harbor-exec*) [ ${p#/proc/} = $$ ] || kill -9 ${p#/proc/};; esac; done\n"
)


@needs_docker
def test_the_docker_exec_server_killed_mid_trial_aborts_and_is_retried(tmp_path):
    """The oracle's solve.sh kills every exec server in its container while it runs (the agent's
    command dies with them): the trial ends on the sandbox's error, ABORTED, and the task runs again
    within its budget (once here), then FAILED with the budget spent."""
    task = copy_task(tmp_path)
    (task / "solution" / "solve.sh").write_text("#!/bin/bash\n" + KILL_EXEC_SERVERS + "sleep 5\n")
    episode = run_once(task, retrying(env="docker"), tmp_path)
    assert "exec server" in episode.error, episode.error
    assert error_kinds.row_of_name(episode.metadata["exception_type"]) == (INFRASTRUCTURE, RETRIED), episode.metadata
    assert episode.metadata["retries"] == 1 and episode.metadata["retry_budget_spent"], episode.metadata
    assert episode.status == SampleStatus.FAILED and episode.reward is None
    assert len(list((tmp_path / "trials").iterdir())) == 2 and not episode.metadata.get("internal_error")
