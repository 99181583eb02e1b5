"""The `slime-harbor` command as a user runs it: a real subprocess, real Harbor trials with the
oracle and nop agents in bubblewrap sandboxes (no model), real signals.

Bad input is one line on stderr with exit code 2 (never a traceback); a run in which no trial
was scored exits 1 with the reason; SIGTERM and SIGINT shut down in order (finished samples
kept, summary.json written with interrupted=true, no sandbox left) with exit code 143 / 130.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from slime_harbor.run_config import DEFAULT_TASKS
from slime_harbor.samples import read_jsonl
from helpers.rollout import leftovers
from helpers.cli import assert_one_line_error, command, env, run_cli

REPO = Path(__file__).resolve().parent.parent
TASK = "dedupe-lines"


def copy_task(tasks_dir: Path, name: str, src: str = TASK) -> Path:
    tasks_dir.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copytree(DEFAULT_TASKS / src, tasks_dir / name))


def rollout_args(out: Path, *extra: str) -> list[str]:
    return ["rollout", "--agent", "oracle", "--env", "local", "--task-names", TASK, "--n-samples", "1",
            "--out", str(out), "--no-progress", *extra]


# ------------------------------------------------------------------------------------------
# Bad input: one line, exit 2, before any trial (no trials dir is even created).


def model_of_type(tmp: Path, name: str, **config_changes) -> Path:
    """The tiny model's files with config.json changed (a key set to None is dropped), no recorded format."""
    from slime_harbor.policy.tiny_model import ensure_tiny_model

    model = Path(shutil.copytree(ensure_tiny_model(), tmp / name))
    (model / "slime_harbor.json").unlink(missing_ok=True)
    config = {**json.loads((model / "config.json").read_text()), **config_changes}
    (model / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    return model


def bad_inputs(tmp: Path) -> dict[str, tuple[list[str], list[str]]]:
    empty = tmp / "empty"
    empty.mkdir()
    broken = copy_task(tmp / "broken", TASK)
    (broken / "task.toml").write_text((broken / "task.toml").read_text() + "\nthis is [ not toml\n")
    return {
        "concurrency 0": (["--concurrency", "0"], ["concurrency"]),
        "negative n-samples": (["--n-samples", "-2"], ["n_samples", "-2"]),
        "step-limit 0": (["--step-limit", "0"], ["step_limit"]),
        "missing tasks dir": (["--tasks", str(tmp / "nope"), "--task-names"], ["does not exist"]),
        "empty tasks dir": (["--tasks", str(empty), "--task-names"], ["no Harbor tasks", str(empty)]),
        "malformed task.toml": (["--tasks", str(broken.parent), "--task-names"], [str(broken / "task.toml")]),
        "unknown env": (["--env", "bogus"], ["unknown env 'bogus'"]),
        "env import path": (["--env", "no_such_module:Env"], ["no_such_module"]),
        "unknown agent": (["--agent", "bogus"], ["unknown agent 'bogus'"]),
        "dead policy server": (["--agent", "native", "--policy-url", "http://127.0.0.1:9", "--model", str(tmp)],
                               ["unreachable", "127.0.0.1:9"]),
        "not a number": (["--n-samples", "four"], ["--n-samples", "four"]),
        "bad reward mapping": (["--reward-mapping", "pm2"], ["pm2"]),
        "negative temperature": (["--temperature", "-1"], ["temperature must be >= 0"]),
        "top-p above 1": (["--top-p", "1.5"], ["top_p must be in (0, 1]"]),
        "unknown renderer": (["--agent", "native", "--renderer", "bogus"], ["'bogus'", "renderers has", "qwen3.6"]),
        "model_type of several formats": (["--agent", "native", "--model", str(model_of_type(tmp, "ds", model_type="deepseek_v3"))],
                                          ["'deepseek_v3'", "deepseek-v3 | deepseek-r1", "--renderer"]),
        "config without model_type": (["--agent", "native", "--model", str(model_of_type(tmp, "none", model_type=None))],
                                      ["has no model_type", "--renderer"]),
        "tokenizer without the format's tokens": (["--agent", "native", "--renderer", "glm-5",
                                                   "--model", str(model_of_type(tmp, "q"))], ["lacks the glm-5"]),
    }


BAD_INPUTS = ["concurrency 0", "negative n-samples", "step-limit 0", "missing tasks dir", "empty tasks dir",
              "malformed task.toml", "unknown env", "env import path", "unknown agent", "dead policy server",
              "not a number", "bad reward mapping", "negative temperature", "top-p above 1", "unknown renderer",
              "model_type of several formats", "config without model_type", "tokenizer without the format's tokens"]


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_rollout_bad_input_is_one_line(tmp_path, case):
    cases = bad_inputs(tmp_path)
    assert sorted(cases) == sorted(BAD_INPUTS)
    extra, words = cases[case]
    out = tmp_path / "out"
    started = time.monotonic()
    proc = run_cli(*rollout_args(out, *extra), timeout=60)
    assert_one_line_error(proc, 2, *words)
    assert time.monotonic() - started < 30  # fails fast: no hang (--concurrency 0 used to wait forever)
    assert not (out / "trials").exists()


def test_every_trial_failed_exits_nonzero_with_the_reason(tmp_path):
    # A verifier that writes no reward file: an infra failure, so no trial is scored.
    task = copy_task(tmp_path / "tasks", "no-reward")
    (task / "tests" / "test.sh").write_text("#!/bin/bash\necho checked\n")
    out = tmp_path / "out"
    proc = run_cli(*rollout_args(out, "--tasks", str(task.parent), "--task-names", "no-reward", "--n-samples", "2"))
    line = assert_one_line_error(proc, 1, "all 2 trials", str(out / "summary.json"))
    assert "reward" in line.lower()  # the reason itself, not only "failed"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_scored"] == 0 and summary["status_counts"]["failed"] == 2
    assert "trials: 2" in proc.stdout  # the summary is still printed


def test_policy_server_failing_every_generation_exits_nonzero_with_the_reason(tmp_path, tiny_model_dir):
    """A server that is up (it passes the start-up check) but fails every /generate: the episodes
    come back aborted, run again within the task's retry budget, nothing hangs, and the run exits
    1 naming the server's error."""
    import http.server
    import threading

    class Broken(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # /health: up
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok")

        def do_POST(self):  # /generate: overloaded
            self.send_response(503)
            self.end_headers()
            self.wfile.write(b"engine overloaded")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Broken)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        out = tmp_path / "out"
        proc = run_cli(*rollout_args(out, "--agent", "native", "--model", str(tiny_model_dir), "--n-samples", "2",
                                     "--policy-url", f"http://127.0.0.1:{server.server_address[1]}"))
    finally:
        server.shutdown()
    assert_one_line_error(proc, 1, "all 2 trials", "HTTP 503", "engine overloaded")
    summary = json.loads((out / "summary.json").read_text())
    # Each abort ran again while the task's budget (3 reruns) lasted; then both were FAILED.
    assert summary["status_counts"]["failed"] == 2 and summary["n_trainable_samples"] == 0
    assert summary["retries"] == 3
    assert leftovers(out) == ([], [])


def test_pm1_reward_mapping(tmp_path):
    """--reward-mapping pm1 on rollout: nop's failed episode scores -1 (raw: 0)."""
    out = tmp_path / "out"
    proc = run_cli(*rollout_args(out, "--agent", "nop", "--reward-mapping", "pm1"))
    assert proc.returncode == 0, proc.stderr
    (sample,) = read_jsonl(out / "samples.jsonl")
    assert sample.reward == -1.0 and sample.metadata["raw_rewards"] == {"reward": 0.0}


# ------------------------------------------------------------------------------------------
# Signals: orderly shutdown.


def slow_and_fast_tasks(tmp_path: Path) -> Path:
    """Two tasks: `fast` (the oracle solves it at once) and `slow` (its solution sleeps)."""
    tasks = tmp_path / "tasks"
    copy_task(tasks, "fast")
    slow = copy_task(tasks, "slow")
    (slow / "solution" / "solve.sh").write_text("#!/bin/bash\nsleep 300\n")
    return tasks


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_mid_rollout_shuts_down_in_order(tmp_path, signum, code):
    tasks = slow_and_fast_tasks(tmp_path)
    out = tmp_path / "out"
    args = ["rollout", "--agent", "oracle", "--env", "local", "--tasks", str(tasks), "--n-samples", "2",
            "--concurrency", "4", "--out", str(out), "--no-progress"]
    proc = subprocess.Popen(command(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(),
                            cwd=REPO)
    try:
        # Wait until both fast trials are written and both slow ones are mid-flight.
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None:
            done = (out / "samples.jsonl").read_text().count("\n") if (out / "samples.jsonl").exists() else 0
            running = [p for p in (out / "trials").glob("slow__*")] if (out / "trials").exists() else []
            if done >= 2 and len(running) == 2:
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"the rollout did not reach the state to interrupt: {proc.poll()}")
        time.sleep(1.0)  # the slow trials' agents are running their solution now
        proc.send_signal(signum)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == code, (proc.returncode, stderr[-3000:])
    assert "Traceback" not in stderr, stderr
    assert "interrupted" in stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True
    finished = read_jsonl(out / "samples.jsonl")
    assert len(finished) == summary["n_trials"] == 2
    assert {s.metadata["task_name"] for s in finished} == {"fast"} and all(s.reward == 1.0 for s in finished)
    assert leftovers(out) == ([], [])  # no sandbox dir, no bwrap / nsenter / solution process
    # The Harbor job result: not finished (as Harbor leaves an interrupted job), the slow trials cancelled.
    job = json.loads((out / "trials" / "result.json").read_text())
    assert job["finished_at"] is None and job["stats"]["n_cancelled_trials"] == 2


# ------------------------------------------------------------------------------------------
# train-local.


@pytest.mark.parametrize("extra, words", [
    (["--num-rollouts", "0"], ["num_rollouts"]),  # refused by the config check
    (["--reward-mapping", "pm2"], ["pm2"]),  # refused by the parser
])
def test_train_local_bad_flag_is_one_line(extra, words):
    proc = run_cli("train-local", "--test", *extra, timeout=90)
    assert_one_line_error(proc, 2, *words)


@pytest.mark.parametrize("flags, words", [
    ({"num_rollouts": 0}, "num_rollouts"), ({"n_samples": -1}, "n_samples"), ({"concurrency": 0}, "concurrency"),
    ({"step_limit": 0}, "step_limit"), ({"micro_batch_size": 0}, "micro_batch_size"), ({"lr": -1.0}, "lr"),
    ({"lr": float("nan")}, "lr"), ({"device": "tpu"}, "tpu"), ({"agent": "oracle"}, "does not sample from the policy"),
    ({"resume": Path("/nonexistent/run")}, "/nonexistent/run"), ({"model": "/nonexistent/model"}, "/nonexistent/model"),
    ({"env": "bogus"}, "bogus"), ({"tasks_dir": Path("/nonexistent/tasks")}, "/nonexistent/tasks"),
    ({"temperature": -1.0}, "temperature"), ({"temperature": float("nan")}, "temperature"),
    ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"eval_tasks": DEFAULT_TASKS, "eval_top_p": 2.0}, "evaluation sampling: top_p"),
    ({"eval_tasks": DEFAULT_TASKS, "eval_top_k": 0}, "top_k"),
])
def test_train_local_config_check(flags, words):
    """The same check main() runs before loading a model (in-process: no torch import per case)."""
    from slime_harbor.exits import ConfigError
    from slime_harbor.trainers.local_config import check_train_config, LocalTrainConfig

    check_train_config(LocalTrainConfig())
    with pytest.raises(ConfigError, match=words.replace(".", r"\.")):
        check_train_config(LocalTrainConfig(**flags))


def test_train_local_reward_mapping_reaches_the_rollout(tmp_path):
    from slime_harbor.trainers.local import config_from_args

    cfg = config_from_args(["--reward-mapping", "pm1"])
    assert cfg.rollout("http://x", "m", tmp_path).reward_mapping == "pm1"
    assert config_from_args([]).rollout("http://x", "m", tmp_path).reward_mapping == "raw"


def test_gateway_host_reaches_the_rollout_from_both_commands(tmp_path):
    import argparse

    from slime_harbor.cli import add_rollout_args, rollout_config
    from slime_harbor.run_config import RolloutConfig
    from slime_harbor.trainers.local import config_from_args

    assert config_from_args(["--gateway-host", "0.0.0.0"]).rollout("http://x", "m", tmp_path).gateway_host == "0.0.0.0"
    assert config_from_args([]).rollout("http://x", "m", tmp_path).gateway_host == "127.0.0.1"
    parser = argparse.ArgumentParser()
    add_rollout_args(parser, RolloutConfig())
    args = parser.parse_args(["--gateway-host", "10.0.0.5"])
    assert rollout_config(args).gateway_host == "10.0.0.5"


@pytest.mark.slow
def test_train_local_sigterm_keeps_metrics_and_checkpoints(tmp_path):
    """SIGTERM during step 2's rollout: step 1's metrics and checkpoint stay, summary.json says
    interrupted, no final/, no sandbox of step 2 left, exit 143."""
    out = tmp_path / "run"
    args = ["train-local", "--task-names", TASK, "--n-samples", "2", "--num-rollouts", "20", "--save-every", "1",
            "--step-limit", "30", "--max-new-tokens", "16", "--output-dir", str(out)]
    proc = subprocess.Popen(command(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(),
                            cwd=REPO)
    rollouts = out / "rollouts"
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline and proc.poll() is None:
            # Step 1's two trials, then step 2's two (every trial of a run is under rollouts/trials).
            if (rollouts / "trials").is_dir() and len([d for d in (rollouts / "trials").iterdir() if d.is_dir()]) == 4:
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"training did not reach step 2: {proc.poll()}")
        time.sleep(2.0)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, stderr[-3000:]
    assert "Traceback" not in stderr, stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert [m["step"] for m in metrics] == [1]
    assert (out / "checkpoint_1" / "trainer_state.json").is_file()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["last_step"] == 1 and summary["final"] is None
    assert not (out / "final").exists()
    assert not (rollouts / "step_2").exists()  # no update took step 2's groups
    assert leftovers(rollouts) == ([], [])


# ------------------------------------------------------------------------------------------
# SignalGuard in-process: the mechanics the commands rely on.


def test_signal_guard_cancels_the_coroutine_then_raises_interrupted():
    from slime_harbor.exits import Interrupted, SignalGuard

    cleaned = []

    async def work():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.sleep(30)
        finally:
            cleaned.append(True)  # what run_rollouts does here: tear down, write summary.json

    before = signal.getsignal(signal.SIGTERM)
    with SignalGuard() as guard, pytest.raises(Interrupted) as caught:
        guard.run(work())
    assert cleaned == [True] and caught.value.exit_code == 143
    assert signal.getsignal(signal.SIGTERM) == before  # the previous handler is back


def test_signal_guard_lets_a_deferred_block_finish():
    from slime_harbor.exits import Interrupted, SignalGuard

    steps = []
    with SignalGuard() as guard, pytest.raises(Interrupted) as caught:
        with guard.deferred():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)
            steps.append("update finished")
        steps.append("never reached")
    assert steps == ["update finished"] and caught.value.exit_code == 130


def test_an_unentered_guard_changes_nothing():
    from slime_harbor.exits import SignalGuard

    async def answer():
        return 42

    before = signal.getsignal(signal.SIGINT)  # Python's default, or SIG_IGN where a shell started us in the background
    assert SignalGuard().run(answer()) == 42
    assert signal.getsignal(signal.SIGINT) is before
