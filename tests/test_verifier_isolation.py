"""A plain Harbor task's verifier (shared mode: it runs in the agent's sandbox) starts clean (issue 15).

Real Harbor trials on both our sandboxes (bubblewrap; Docker, skipped when no daemon answers):
the oracle agent of a task whose "solution" plants a file in /logs/verifier, leaves a setsid
daemon and (where tmux exists: the bubblewrap sandbox uses the host's) a tmux server that keep
writing a passing reward.json / reward.txt. The task's test.sh, like a careless one, does not
remove them: it waits, records what it sees, and writes reward 0. Before the fix the daemon's
reward.json won (+1); now every agent process is gone and /logs/verifier is empty before the
verifier starts, so the trial scores -1 (pm1). The same task in separate mode scores -1 too.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from slime_harbor.rollout import run_rollouts
from slime_harbor.run_config import RolloutConfig
from helpers.docker import docker_skip_reason
from helpers.tasks import TASK_TOML

SOLVE = r"""#!/bin/bash
# attack: leave a reward where the verifier will find it, and processes that keep writing one
mkdir -p /logs/verifier
echo planted > /logs/verifier/planted
setsid nohup sh -c 'while true; do echo "{\"reward\": 1}" > /logs/verifier/reward.json; sleep 0.05; done' >/dev/null 2>&1 &
if command -v tmux >/dev/null; then
    tmux new-session -d -s agent 'while true; do echo 1 > /logs/verifier/reward.txt; sleep 0.05; done'
fi
sleep 0.5
"""
TEST = r"""#!/bin/bash
# a careless verifier: it neither removes reward files nor expects anyone else to write them
ls -A /logs/verifier > /tmp/seen-at-start
sleep 1
cp /tmp/seen-at-start /logs/verifier/seen-at-start.txt
for p in /proc/[0-9]*; do tr '\0' ' ' < "$p/cmdline" 2>/dev/null; echo; done > /logs/verifier/processes.txt
echo 0 > /logs/verifier/reward.txt
"""


def write_task(root: Path, name: str, separate: bool) -> Path:
    task = root / name
    (task / "environment").mkdir(parents=True)
    (task / "environment" / "Dockerfile").write_text("FROM python:3.11-slim\nWORKDIR /app\n")
    (task / "instruction.md").write_text("Do nothing.\n")
    (task / "task.toml").write_text(TASK_TOML.format(
        extra_top='artifacts = ["/app"]\n' if separate else "",
        extra_verifier='environment_mode = "separate"\n' if separate else ""))
    for rel, text in (("solution/solve.sh", SOLVE), ("tests/test.sh", TEST)):
        (task / rel).parent.mkdir(parents=True, exist_ok=True)
        (task / rel).write_text(text)
        (task / rel).chmod(0o755)
    return task


@pytest.mark.slow
@pytest.mark.parametrize("env", ["local", "docker"])
def test_agent_processes_and_files_do_not_reach_the_verifier(env, tmp_path):
    if env == "docker" and (why := docker_skip_reason()):
        pytest.skip(why)
    write_task(tmp_path / "tasks", "leaves-daemons", separate=False)
    write_task(tmp_path / "tasks", "leaves-daemons-separate", separate=True)
    out = tmp_path / "out"
    cfg = RolloutConfig(tasks_dir=tmp_path / "tasks", agent="oracle", n_samples=1, env=env, concurrency=2,
                        out_dir=out, reward_mapping="pm1", progress=False)
    asyncio.run(run_rollouts(cfg))
    samples = {s["metadata"]["task_name"]: s for s in map(json.loads, (out / "samples.jsonl").read_text().splitlines())}
    for name, sample in samples.items():
        verifier = Path(sample["metadata"]["trial_dir"]) / "verifier"
        files = {p.name: p.read_text() for p in verifier.iterdir() if p.is_file()}
        detail = (name, sample["metadata"]["status_reason"], files)
        assert sample["status"] == "completed" and sample["reward"] == -1.0, detail
        assert sample["metadata"]["raw_rewards"] == {"reward": 0}, detail
        # /logs/verifier held nothing but Harbor's own log of this test.sh when the verifier began
        assert files["seen-at-start.txt"].split() in ([], ["test-stdout.txt"]), detail
        assert "while true" not in files["processes.txt"], detail
    if env == "docker":  # the separate verifier's container came from the agent's image (one build, one tag)
        from slime_harbor.environments.docker_images import image_builds

        assert len([tag for tag in image_builds if "/leaves-daemons-separate:" in tag]) == 1


def test_hard_timeout_counts_the_separate_verifier_environment_start(tmp_path):
    from slime_harbor.trial_setup import hard_timeout_sec

    shared = write_task(tmp_path, "shared", separate=False)
    separate = write_task(tmp_path, "separate", separate=True)
    build = 300.0  # TASK_TOML's build_timeout_sec: the verifier's environment starts under it too
    assert hard_timeout_sec(separate, 1.0) == hard_timeout_sec(shared, 1.0) + build
    assert hard_timeout_sec(separate, 2.0) == hard_timeout_sec(shared, 2.0) + 2 * build


@pytest.mark.slow
@pytest.mark.parametrize("env", ["local", "docker"])
def test_separate_verifier_environment_is_torn_down_when_cancelled(env, tmp_path):
    """A trial cancelled while its separate verifier runs leaves no container or sandbox behind."""
    if env == "docker" and (why := docker_skip_reason()):
        pytest.skip(why)
    import time

    from slime_harbor.rollout import run_episode

    task = write_task(tmp_path / "tasks", "slow-verifier", separate=True)
    (task / "tests" / "test.sh").write_text("#!/bin/bash\ntouch /logs/verifier/started\nsleep 300\n")
    cfg = RolloutConfig(tasks_dir=tmp_path / "tasks", agent="oracle", n_samples=1, env=env, progress=False)
    trials = tmp_path / "trials"

    async def cancel_during_verification():
        episode = asyncio.ensure_future(run_episode(task, cfg, group_index=0, index=0, trials_dir=trials))
        deadline = time.monotonic() + 120
        while not list(trials.glob("*/verifier/started")):
            assert time.monotonic() < deadline and not episode.done(), "the verifier never started"
            await asyncio.sleep(0.2)
        episode.cancel()
        with pytest.raises(asyncio.CancelledError):
            await episode

    asyncio.run(cancel_during_verification())
    [trial_dir] = [p for p in trials.iterdir() if p.is_dir()]
    if env == "docker":
        from slime_harbor.environments.docker_images import docker_client, LABEL

        left = docker_client().api.containers(all=True, filters={"label": f"{LABEL}.run"})
        assert not [c for c in left if c["Labels"].get(f"{LABEL}.trial", "").startswith(trial_dir.name)], left
    else:
        from slime_harbor.environments.bubblewrap_host import default_sandbox_root

        base = Path(default_sandbox_root())
        assert not [p for p in base.iterdir() if p.name.startswith(trial_dir.name)] if base.exists() else True
