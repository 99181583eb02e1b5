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
from collections import Counter
from pathlib import Path

import pytest

from slime_harbor.environments.bubblewrap import BubblewrapEnvironment
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


class CountingSandbox(BubblewrapEnvironment):
    """Our bubblewrap sandbox, counting how often a trial reads what its agent changed (harbor
    imports it as "test_verifier_isolation:CountingSandbox")."""

    reads: Counter = Counter()

    async def agent_changes(self):
        self.reads["agent_changes"] += 1
        return await super().agent_changes()

    async def changed_file_text(self, path: str):
        self.reads[path] += 1
        return await super().changed_file_text(path)


LEAVES_FILES = r"""#!/bin/bash
# a solution the hack monitor reads (it ends the process where it is imported) and a pyproject.toml
# both the verifier's checks and the monitor read
printf 'import sys\nsys.exit(0)\n' > /app/solution.py
printf '[project]\nname = "solution"\n' > /app/pyproject.toml
"""


@pytest.mark.slow
def test_what_the_agent_changed_is_read_once_for_the_checks_and_the_monitor(tmp_path, monkeypatch):
    """Isolation's checks and the hack monitor read one reading of the agent's changes (issue 43):
    agent_changes once per trial, a file both need read once; before, each read its own."""
    from slime_harbor.rollout import run_episode

    monkeypatch.setattr(CountingSandbox, "reads", Counter())
    task = write_task(tmp_path / "tasks", "leaves-files", separate=False)
    (task / "solution" / "solve.sh").write_text(LEAVES_FILES)
    (task / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    cfg = RolloutConfig(tasks_dir=task.parent, agent="oracle", n_samples=1, env="test_verifier_isolation:CountingSandbox",
                        progress=False)
    episode = asyncio.run(run_episode(task, cfg, group_index=0, index=0, trials_dir=tmp_path / "trials"))
    assert episode.status.value == "completed" and episode.reward == 1.0, episode.end
    assert "early_exit" in episode.metadata["hack_flags"], episode.metadata  # the monitor read solution.py
    assert CountingSandbox.reads == {"agent_changes": 1, "/app/solution.py": 1, "/app/pyproject.toml": 1}


def test_our_sandboxes_declare_every_ability_the_code_asks_for():
    """What trial_setup, isolation, the hack monitor and the twins ask an environment for is declared
    (environments/abilities.py) by both our sandboxes; an environment with the same methods that
    declares nothing is not taken for one, and a run checks twins only where its sandbox keeps state."""
    from slime_harbor.environments import abilities
    from slime_harbor.environments.docker import DockerEnvironment
    from slime_harbor.trial_setup import environment_keeps_state

    asked = (abilities.InstallsAgents, abilities.EndsAgentProcesses, abilities.ReportsAgentChanges, abilities.KeepsState)
    for sandbox in (BubblewrapEnvironment, DockerEnvironment):
        assert all(issubclass(sandbox, ability) for ability in asked), sandbox
        assert not sandbox.__abstractmethods__, sandbox
    assert environment_keeps_state("local") and environment_keeps_state("docker")
    assert not environment_keeps_state("harbor-docker") and not environment_keeps_state("daytona")

    class LooksLikeOne:  # every method, no declaration
        agent_changes = runtime_index = changed_file_text = end_agent_processes = keep_state = install_agents = None

    assert not any(isinstance(LooksLikeOne(), ability) for ability in asked)
