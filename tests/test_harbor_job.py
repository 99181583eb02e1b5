"""Rollout outputs as Harbor job dirs, read back by Harbor's own models and viewer, and the page
`slime-harbor view` serves, rendered by a real headless Chromium."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slime_harbor.rollout import run_rollouts
from slime_harbor.run_config import DEFAULT_TASKS, RolloutConfig
from slime_harbor.samples import SampleStatus

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def tasks_with_a_failing_verifier(tmp_path: Path) -> Path:
    """dedupe-lines, and a copy whose verifier writes no reward file (Harbor: RewardFileNotFoundError)."""
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    shutil.copytree(DEFAULT_TASKS / "dedupe-lines", tasks / "dedupe-lines")
    broken = Path(shutil.copytree(DEFAULT_TASKS / "dedupe-lines", tasks / "no-reward"))
    (broken / "tests" / "test.sh").write_text("#!/bin/bash\necho checked\n")
    return tasks


def test_rollout_writes_a_harbor_job_dir(tmp_path):
    from harbor.models.job.config import JobConfig
    from harbor.models.job.result import JobResult
    from harbor.viewer.scanner import JobScanner

    cfg = RolloutConfig(tasks_dir=tasks_with_a_failing_verifier(tmp_path), agent="oracle", n_samples=2,
                        concurrency=4, out_dir=tmp_path / "out", progress=False)
    summary = asyncio.run(run_rollouts(cfg))
    job_dir = cfg.out_dir / "trials"
    config = JobConfig.model_validate_json((job_dir / "config.json").read_text())
    assert config.n_concurrent_trials == 4 and len(config.tasks) == 2 and config.agents[0].name == "oracle"
    result = JobResult.model_validate_json((job_dir / "result.json").read_text())
    assert result.n_total_trials == 4 and result.finished_at is not None
    stats = result.stats
    counts = (stats.n_completed_trials, stats.n_errored_trials, stats.n_pending_trials, stats.n_running_trials)
    assert counts == (4, 2, 0, 0)
    (evals,) = stats.evals.values()
    assert evals.metrics == [{"mean": 0.5}]  # Harbor's Mean: a trial without reward counts 0
    assert set(evals.exception_stats) == {"RewardFileNotFoundError"}
    assert summary["status_counts"]["failed"] == 2 and summary["status_counts"]["completed"] == 2
    # What Harbor's viewer reads: the job and each of its trials.
    scanner = JobScanner(cfg.out_dir)
    assert scanner.list_jobs() == ["trials"]
    trials = scanner.list_trials("trials")
    assert len(trials) == 4 and all(scanner.get_trial_result("trials", t) for t in trials)
    assert (cfg.out_dir / "samples.jsonl").is_file() and (cfg.out_dir / "summary.json").is_file()
    # An output made before rollouts wrote these files: `view` backfills the same job result.
    from slime_harbor.harbor_job import HarborJob

    for name in ("config.json", "result.json"):
        (job_dir / name).unlink()
    HarborJob.backfill(cfg.out_dir)
    again = JobResult.model_validate_json((job_dir / "result.json").read_text())
    assert again.stats.model_dump() == result.stats.model_dump() and again.started_at < result.finished_at
    assert JobConfig.model_validate_json((job_dir / "config.json").read_text()).tasks == config.tasks


def test_our_verdict_reaches_a_trial_harbor_saw_no_error_in(tmp_path):
    """An episode we count aborted while Harbor recorded no exception (a SLiME abort ends the
    agent quietly): its result.json gets our reason, so the viewer shows it as an error."""
    from harbor.models.trial.result import TrialResult

    from slime_harbor.harbor_job import mark_verdict

    cfg = RolloutConfig(task_names=["dedupe-lines"], agent="oracle", n_samples=1, out_dir=tmp_path / "out",
                        progress=False)
    asyncio.run(run_rollouts(cfg))
    (trial_dir,) = [p for p in (cfg.out_dir / "trials").iterdir() if p.is_dir()]
    assert TrialResult.model_validate_json((trial_dir / "result.json").read_text()).exception_info is None
    mark_verdict(trial_dir, SampleStatus.ABORTED, "generation aborted by SLiME")
    info = TrialResult.model_validate_json((trial_dir / "result.json").read_text()).exception_info
    assert info.exception_type == "SlimeHarborAborted" and "generation aborted by SLiME" in info.exception_message
    assert "slime-harbor: aborted: generation aborted by SLiME" in (trial_dir / "exception.txt").read_text()
    # Harbor's own exception info is kept; the verdict is added to exception.txt only.
    before = (trial_dir / "result.json").read_text()
    (trial_dir / "exception.txt").write_text("Traceback: Harbor's own\n")
    mark_verdict(trial_dir, SampleStatus.FAILED, "x")
    assert (trial_dir / "result.json").read_text() == before
    assert (trial_dir / "exception.txt").read_text().startswith("slime-harbor: failed: x")
    assert "Traceback: Harbor's own" in (trial_dir / "exception.txt").read_text()
    text = (trial_dir / "exception.txt").read_text()
    mark_verdict(trial_dir, SampleStatus.COMPLETED, None)
    assert (trial_dir / "exception.txt").read_text() == text and (trial_dir / "result.json").read_text() == before


def test_view_refuses_a_dir_that_is_not_a_rollout_output(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "slime_harbor.cli", "view", str(tmp_path)], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "not a rollout output" in proc.stderr


def chromium(*args: str, url: str) -> str:
    proc = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--virtual-time-budget=20000", *args, url], capture_output=True, text=True, timeout=180)
    return proc.stdout


@pytest.mark.slow  # a native-agent rollout on the tiny model, then three page loads: ~50 s on 2 shared cores
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (Debian package `chromium`)")
def test_viewer_page_lists_our_trials_and_a_native_trajectory(tmp_path):
    """A real native-agent rollout (tiny model), `slime-harbor view OUT`, and the page as Chromium
    renders it: the job's counts, every trial with its reward or error, and a trial's trajectory."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    out = tmp_path / "out"
    rollout = subprocess.run(
        [sys.executable, "-m", "slime_harbor.cli", "rollout", "--agent", "native", "--tasks",
         str(tasks_with_a_failing_verifier(tmp_path)), "--n-samples", "1", "--step-limit", "2",
         "--max-new-tokens", "16", "--out", str(out), "--no-progress"],
        capture_output=True, text=True, env=env, timeout=400)
    assert rollout.returncode == 0, rollout.stderr[-3000:]
    trials = sorted(p.name for p in (out / "trials").iterdir() if p.is_dir())
    assert len(trials) == 2
    viewer = subprocess.Popen([sys.executable, "-m", "slime_harbor.cli", "view", str(out)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = viewer.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+/", line).group(0)
        for _ in range(100):  # up once the port answers
            if subprocess.run(["curl", "-sf", url + "api/health"], capture_output=True).returncode == 0:
                break
            time.sleep(0.2)
        listing = chromium("--dump-dom", url=url + "jobs/trials?tab=results")
        for name in trials:
            assert name in listing
        assert "2/2 trials completed" in listing and "RewardFileNotFoundError" in listing
        native = next(t for t in trials if t.startswith("dedupe-lines"))
        page = chromium("--dump-dom", url=f"{url}jobs/trials/trials/{native}")
        assert "Trajectory" in page and "You are a coding agent" in page  # our agent's system prompt, step 1
        steps = len(json.loads((out / "trials" / native / "agent" / "trajectory.json").read_text())["steps"])
        assert f"{steps} steps" in page
        failed = next(t for t in trials if t.startswith("no-reward"))
        reason = chromium("--dump-dom", url=f"{url}jobs/trials/trials/{failed}?tab=exception")
        assert "slime-harbor: failed: RewardFileNotFoundError" in reason  # our status and why, on its page
        chromium("--window-size=1400,1100", "--screenshot=/tmp/slime_harbor_viewer_rollouts.png",
                 url=url + "jobs/trials?tab=results")
        chromium("--window-size=1400,1100", "--screenshot=/tmp/slime_harbor_viewer_trial.png",
                 url=f"{url}jobs/trials/trials/{native}")
        assert Path("/tmp/slime_harbor_viewer_trial.png").stat().st_size > 10_000
    finally:
        viewer.send_signal(signal.SIGTERM)
        try:
            viewer.wait(timeout=30)
        finally:
            if viewer.poll() is None:
                viewer.kill()
    assert viewer.returncode == 143
