"""Errors say whose they are: a task's mistake is its episode's FAILED status with the reason; a
bug of ours (set-up code, the code that reads a finished trial, our agent while Harbor runs it) is
an internal error, its traceback in the trial dir, counted and said loudly, and past a small
budget the run stops. It is never a bad task. The bugs here are injected into our own code (a
method of ours replaced by one that raises), real trials around them."""

from __future__ import annotations

import asyncio
import shutil

import pytest
from helpers.rollout import config

from slime_harbor import rollout as rollout_module
from slime_harbor.rollout import InternalErrorBudgetSpent, run_rollouts
from slime_harbor.samples import read_jsonl


@pytest.fixture(autouse=True)
def fresh_budget(monkeypatch):
    monkeypatch.setattr(rollout_module, "INTERNAL_ERRORS", [])


def test_a_bug_in_our_set_up_code_is_an_internal_error_not_a_bad_task(tmp_path, policy_server, tiny_model_dir,
                                                                       monkeypatch):
    def broken(self, *args, **kwargs):
        raise AttributeError("'NoneType' object has no attribute 'trial_paths'")

    monkeypatch.setattr(rollout_module.Grading, "__init__", broken)
    summary = asyncio.run(run_rollouts(config(tmp_path, policy_server, tiny_model_dir, n_samples=2)))
    assert summary["status_counts"]["failed"] == 2 and len(summary["internal_errors"]) == 2
    for error in summary["errors"].values():
        assert error.startswith("internal error (a slime-harbor bug, not the task's): AttributeError: 'NoneType'")
    for trial_dir in summary["internal_errors"]:
        written = (tmp_path / "out" / "trials").joinpath(trial_dir.rsplit("/", 1)[1], "slime-harbor-error.txt").read_text()
        assert "Traceback" in written and "in broken" in written
    assert all(s.remove_sample and s.reward is None for s in read_jsonl(tmp_path / "out" / "samples.jsonl"))


def test_past_its_budget_a_bug_of_ours_stops_the_run(tmp_path, policy_server, tiny_model_dir, monkeypatch):
    def broken(self, *args, **kwargs):
        raise TypeError("takes 2 positional arguments but 3 were given")

    monkeypatch.setattr(rollout_module.Grading, "__init__", broken)
    monkeypatch.setattr(rollout_module, "INTERNAL_ERROR_BUDGET", 1)
    with pytest.raises(InternalErrorBudgetSpent, match=r"2 internal errors .* more than 1: stopping"):
        asyncio.run(run_rollouts(config(tmp_path, policy_server, tiny_model_dir, n_samples=2, concurrency=1)))


def test_a_bug_in_our_agent_that_harbor_caught_is_an_internal_error(tmp_path, policy_server, tiny_model_dir,
                                                                     monkeypatch):
    """Harbor records an agent's exception as the trial's; one raised in our code (the native
    agent's turn calling what is no function) is ours, not the task's."""
    import slime_harbor.agents.native as native

    monkeypatch.setattr(native, "reply_commands", None)  # the turn's `reply_commands(text)` raises in native.py
    summary = asyncio.run(run_rollouts(config(tmp_path, policy_server, tiny_model_dir, n_samples=1)))
    (error,) = summary["errors"].values()
    assert error.startswith("internal error (a slime-harbor bug, not the task's): TypeError: 'NoneType' object is "
                            "not callable"), error
    assert len(summary["internal_errors"]) == 1


def test_a_malformed_task_is_the_tasks_failure_not_ours(tmp_path, policy_server, tiny_model_dir):
    from slime_harbor.run_config import DEFAULT_TASKS

    tasks = tmp_path / "tasks"
    shutil.copytree(DEFAULT_TASKS / "dedupe-lines", tasks / "dedupe-lines")
    (tasks / "dedupe-lines" / "task.toml").write_text("[agent\ntimeout_sec = 'soon'\n")
    cfg = config(tmp_path, policy_server, tiny_model_dir, tasks_dir=tasks, n_samples=1)
    episode = asyncio.run(rollout_module.run_episode(tasks / "dedupe-lines", cfg, group_index=0, index=0,
                                                     trials_dir=tmp_path / "trials"))
    assert episode.status.value == "failed" and not episode.metadata.get("internal_error")
    assert episode.error.startswith("TOMLDecodeError") and rollout_module.INTERNAL_ERRORS == []


def _raising_in(module, exc: BaseException):
    """A function whose frame is `module`'s own file: a line of our code that raises `exc`, as a
    bug (or a deliberate error) there would."""
    scope = {"exc": exc}
    exec(compile("def raising(*args, **kwargs):\n    raise exc\n", module.__file__, "exec"), scope)
    return scope["raising"]


def test_a_value_error_our_agent_raises_in_a_trial_is_internal(tmp_path, policy_server, tiny_model_dir, monkeypatch):
    """Not only programming-error types: any class the table does not name, raised by our code."""
    import slime_harbor.agents.native as native

    monkeypatch.setattr(native, "reply_commands", _raising_in(native, ValueError("a bug of ours")))
    summary = asyncio.run(run_rollouts(config(tmp_path, policy_server, tiny_model_dir, n_samples=1)))
    (error,) = summary["errors"].values()
    assert error.startswith("internal error (a slime-harbor bug, not the task's): ValueError: a bug of ours"), error
    assert len(summary["internal_errors"]) == 1


def test_a_policy_server_error_in_a_trial_is_the_policys_not_ours(tmp_path, policy_server, tiny_model_dir, monkeypatch):
    import slime_harbor.agents.native as native
    from slime_harbor.policy.client import PolicyServerError

    monkeypatch.setattr(native, "reply_commands", _raising_in(native, PolicyServerError("the policy server said 500")))
    summary = asyncio.run(run_rollouts(config(tmp_path, policy_server, tiny_model_dir, n_samples=1)))
    assert summary["internal_errors"] == [] and rollout_module.INTERNAL_ERRORS == []
    (error,) = summary["errors"].values()
    assert "PolicyServerError" in error and "internal error" not in error, error


def test_a_file_not_found_our_set_up_raises_is_ours_not_the_tasks(tmp_path, policy_server, tiny_model_dir, monkeypatch):
    """FileNotFoundError is a task's mistake only when Harbor raised it reading the task."""
    monkeypatch.setattr(rollout_module.Grading, "__init__",
                        _raising_in(rollout_module, FileNotFoundError(2, "No such file", "/nowhere/ours.json")))
    summary = asyncio.run(run_rollouts(config(tmp_path, policy_server, tiny_model_dir, n_samples=1)))
    (error,) = summary["errors"].values()
    assert error.startswith("internal error (a slime-harbor bug, not the task's): FileNotFoundError"), error


def test_a_missing_task_file_harbor_reads_is_the_tasks(tmp_path, policy_server, tiny_model_dir):
    from slime_harbor.run_config import DEFAULT_TASKS

    tasks = tmp_path / "tasks"
    shutil.copytree(DEFAULT_TASKS / "dedupe-lines", tasks / "dedupe-lines")
    (tasks / "dedupe-lines" / "task.toml").unlink()
    cfg = config(tmp_path, policy_server, tiny_model_dir, tasks_dir=tasks, n_samples=1)
    episode = asyncio.run(rollout_module.run_episode(tasks / "dedupe-lines", cfg, group_index=0, index=0,
                                                     trials_dir=tmp_path / "trials"))
    assert episode.status.value == "failed" and not episode.metadata.get("internal_error"), episode.error
    assert rollout_module.INTERNAL_ERRORS == []
