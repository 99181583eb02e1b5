"""Exec latency and start-to-ready time: our DockerEnvironment vs Harbor's own docker environment.

Both run the same task (a copy of a bundled task with network_mode = "public": Harbor's
no-network mode needs an egress-control image that cannot be pulled here), both with a warm image
cache (one untimed start/stop of each first). Per environment: `--starts` timed start() calls
(start-to-ready: image check/build step, container up, a first command run), then `--n`
small execs (`echo hi`) on each of two running environments, alternating between them so that
both see the same load on a shared machine.

    .venv/bin/python bench/sandbox_exec.py [--task dedupe-lines] [--n 200] [--starts 3]

Prints median exec latency of each, the ratio ours/harbor (target <= 0.2) and median start times.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from slime_harbor.run_config import DEFAULT_TASKS


def public_copy(task: str, root: Path) -> Path:
    dest = root / task
    shutil.copytree(DEFAULT_TASKS / task, dest)
    toml = (dest / "task.toml").read_text()
    (dest / "task.toml").write_text(re.sub(r'network_mode = "[a-z-]+"', 'network_mode = "public"', toml))
    return dest


def make(kind: str, task_dir: Path, root: Path):
    from harbor.models.task.task import Task
    from harbor.models.trial.paths import TrialPaths

    if kind == "ours":
        from slime_harbor.environments.docker import DockerEnvironment
    else:
        from harbor.environments.docker.docker import DockerEnvironment
    task = Task(task_dir)
    paths = TrialPaths(root / f"{kind}-{uuid.uuid4().hex[:6]}")
    paths.mkdir()
    return DockerEnvironment(
        environment_dir=task.paths.environment_dir, environment_name=task_dir.name,
        session_id=f"bench-{kind}-{uuid.uuid4().hex[:6]}__env", trial_paths=paths,
        task_env_config=task.config.environment,
    )  # fmt: skip


async def start_times(kind: str, task_dir: Path, root: Path, starts: int) -> list[float]:
    """Seconds from start() until a first command has run, after one untimed warm-up start."""
    times = []
    for i in range(starts + 1):
        env = make(kind, task_dir, root)
        began = time.perf_counter()
        await env.start(force_build=False)
        result = await env.exec("echo ready")
        if i > 0:
            times.append(time.perf_counter() - began)
        assert (result.stdout or "").strip() == "ready", result
        await env.stop(delete=True)
    return times


async def exec_latencies(task_dir: Path, root: Path, n: int) -> dict[str, list[float]]:
    """Both environments up at once; their execs alternate, so both see the same machine load."""
    envs = {kind: make(kind, task_dir, root) for kind in ("ours", "harbor")}
    latencies: dict[str, list[float]] = {kind: [] for kind in envs}
    try:
        for env in envs.values():
            await env.start(force_build=False)
        for i in range(n):
            order = list(envs) if i % 2 == 0 else list(reversed(envs))
            for kind in order:
                began = time.perf_counter()
                result = await envs[kind].exec("echo hi")
                latencies[kind].append(time.perf_counter() - began)
                assert result.return_code == 0 and (result.stdout or "").strip() == "hi", result
    finally:
        for env in envs.values():
            await env.stop(delete=True)
    return latencies


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="dedupe-lines")
    p.add_argument("--n", type=int, default=200, help="sequential execs per environment")
    p.add_argument("--starts", type=int, default=3, help="timed start() calls per environment")
    a = p.parse_args()
    from slime_harbor.environments.docker_images import check_docker

    check_docker()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        task_dir = public_copy(a.task, root / "tasks")
        ours_start = asyncio.run(start_times("ours", task_dir, root, a.starts))
        theirs_start = asyncio.run(start_times("harbor", task_dir, root, a.starts))
        latencies = asyncio.run(exec_latencies(task_dir, root, a.n))
        ours, theirs = latencies["ours"], latencies["harbor"]
    ms = lambda xs: statistics.median(xs) * 1000  # noqa: E731
    print(f"task {a.task}: {a.n} `echo hi` execs per environment (alternating between them), {a.starts} timed starts")
    print(f"harbor docker environment (docker compose exec): median {ms(theirs):.1f} ms/exec "
          f"(p90 {statistics.quantiles(theirs, n=10)[-1] * 1000:.1f}), start-to-ready median {ms(theirs_start):.0f} ms")
    print(f"slime-harbor DockerEnvironment (exec server):     median {ms(ours):.1f} ms/exec "
          f"(p90 {statistics.quantiles(ours, n=10)[-1] * 1000:.1f}), start-to-ready median {ms(ours_start):.0f} ms")
    print(f"exec latency ratio ours/harbor: {ms(ours) / ms(theirs):.3f} (target <= 0.2)")
    print(f"start-to-ready ratio ours/harbor: {ms(ours_start) / ms(theirs_start):.3f}")


if __name__ == "__main__":
    main()
