"""What a bubblewrap sandbox costs to start, and what checking the verifier's runtime costs.

Starts and stops N sandboxes one after another on a bundled task (its Dockerfile replayed, as in a
trial) and prints the median and p90 of start() and stop(); with --check, also of the check run
before a plain task's verifier (agent_changes + runtime_index + verifier_runtime.tampering, after
one command that changes a few files). Run it on two checkouts to compare them, e.g. the commit
before the overlays:

    .venv/bin/python bench/sandbox_start.py [--n 30] [--task fix-sort-key] [--check]
    git worktree add /tmp/before <commit> && PYTHONPATH=/tmp/before .venv/bin/python bench/sandbox_start.py
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from harbor.models.task.config import EnvironmentConfig
from harbor.models.trial.paths import TrialPaths

import slime_harbor
from slime_harbor.environments.bubblewrap import BubblewrapEnvironment

TASKS = Path(__file__).resolve().parent.parent / "examples" / "harbor" / "tasks"


def line(name: str, seconds: list[float]) -> str:
    ms = sorted(s * 1000 for s in seconds)
    return f"{name:>8}: median {statistics.median(ms):6.1f} ms   p90 {ms[int(0.9 * (len(ms) - 1))]:6.1f} ms   (n={len(ms)})"


async def main(n: int, task: str, check: bool) -> None:
    env_dir = TASKS / task / "environment"
    starts, stops, checks = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(n + 1):  # the first is a warm-up (the /etc copy, the host's runtime index)
            paths = TrialPaths(Path(tmp) / f"trial-{i}")
            paths.mkdir()
            env = BubblewrapEnvironment(env_dir, task, f"bench-{i}", paths, EnvironmentConfig(workdir="/app"))
            t0 = time.perf_counter()
            await env.start(False)
            t1 = time.perf_counter()
            if check:
                from slime_harbor.verifier_runtime import tampering

                await env.exec("echo x > /app/out.txt; mkdir -p /root/.cache/x; echo y > /tmp/y")
                c0 = time.perf_counter()
                found = tampering(await env.agent_changes(), await env.runtime_index(), workdir="/app")
                c1 = time.perf_counter()
                assert not found, found
            t2 = time.perf_counter()
            await env.stop(True)
            t3 = time.perf_counter()
            if i:
                starts.append(t1 - t0)
                stops.append(t3 - t2)
                if check:
                    checks.append(c1 - c0)
    print(f"bubblewrap sandbox, task {task}, code at {Path(slime_harbor.__file__).parent.parent}")
    print(line("start", starts))
    print(line("stop", stops))
    if checks:
        print(line("check", checks))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=30)
    p.add_argument("--task", default="fix-sort-key")
    p.add_argument("--check", action="store_true", help="also time the check before a plain task's verifier")
    a = p.parse_args()
    asyncio.run(main(a.n, a.task, a.check))
