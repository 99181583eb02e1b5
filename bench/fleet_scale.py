"""Fleet scale: the control plane's cost per trial as trials in flight grow, on a local Ray cluster.

Real rollouts (`run_rollout_episodes`, fleet ray) of a scripted gateway agent (`--turns` chat calls
through its trial's gateway session, one sandbox command after each) in a stub sandbox (host
processes, no container) against a stub engine with a fixed latency per token: bench/fleet_stubs.py.
So what is measured is ours and Harbor's: the runner, the fleet, the gateway, the trial, grading
and conversion. Each case runs `in_flight` trials at once (groups of 4) on `workers` rollout
workers, one per node of a two-node Ray cluster on 127.0.0.1, and prints one line:

    workers=W in_flight=N trials_per_min=X cpu_s_per_trial=C mem_per_trial_kb=M loop_lag_p99_ms=L p99_added_ms=B lost=0 duplicated=0

cpu_s_per_trial: CPU seconds of the caller and the workers (not the stub engine, not the sandbox
commands) over the trials, after a warm-up round on every worker. mem_per_trial_kb: the peak growth
of their resident memory over the case, per trial in flight. loop_lag_p99_ms: how late a 10 ms
timer fires in the workers' event loops (where the trials and the gateways run) over the case's
first 20 s, p99. p99_added_ms: a gateway call's time seen by the agent
less the stub's own delay, p99. lost / duplicated: episodes missing or twice, by place in group.

    PYTHONPATH=$PWD .venv/bin/python bench/fleet_scale.py [--in-flight 256 1024 4096] [--workers 1 2]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(BENCH), os.environ.get("PYTHONPATH")]))
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # every Ray address on 127.0.0.1 (tests/test_fleet.py)

GROUP = 4
TASK_TOML = """version = "1.0"
[verifier]
timeout_sec = 120
[agent]
timeout_sec = 600
[environment]
build_timeout_sec = 60
"""


def write_tasks(root: Path, n_tasks: int) -> Path:
    for k in range(n_tasks):
        task = root / f"stub-task-{k:05d}"
        (task / "tests").mkdir(parents=True)
        (task / "environment").mkdir()
        (task / "solution").mkdir()
        (task / "task.toml").write_text(TASK_TOML)
        (task / "instruction.md").write_text("List the files.\n")
        (task / "environment" / "Dockerfile").write_text("FROM stub\n")
        # STUB_ROOT: the stub sandbox's dir on the host (its commands are host processes)
        (task / "tests" / "test.sh").write_text('#!/bin/bash\necho 1 > "$STUB_ROOT/logs/verifier/reward.txt"\n')
        (task / "solution" / "solve.sh").write_text("#!/bin/bash\ntrue\n")
    return root


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_usage(pids: list[int]) -> tuple[float, int]:
    """CPU seconds (user + system, without children) and resident bytes of `pids` together."""
    import psutil

    cpu = rss = 0
    for pid in pids:
        try:
            p = psutil.Process(pid)
            times = p.cpu_times()
            cpu += times.user + times.system
            rss += p.memory_info().rss
        except psutil.Error:
            pass
    return cpu, rss


def worker_pids() -> list[int]:
    import psutil

    return [p.pid for p in psutil.process_iter(["cmdline"])
            if any("RolloutWorker" in part for part in (p.info["cmdline"] or []))]


async def lag_probe(samples: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        t = time.perf_counter()
        await asyncio.sleep(0.01)
        samples.append((time.perf_counter() - t - 0.01) * 1000)


def worker_loop_lag(seconds: float) -> list[float]:
    """Timer lateness (ms) in each live rollout worker's event loop over `seconds` (a probe task
    sent to every worker actor; the workers' loops run the trials and the gateways)."""
    import ray

    from slime_harbor.fleet import live_workers

    refs = [worker.run.remote("lag", _lag_attempt, seconds, "", 0, 0, "") for worker in live_workers()]
    lags = []
    for _, episode in ray.get(refs):
        lags += episode.metadata["lags"]
    return lags


async def _lag_attempt(seconds, *_):
    """Runs in a worker as if an attempt: a bare probe of its event loop."""
    from types import SimpleNamespace

    lags: list[float] = []
    stop = asyncio.Event()
    probe = asyncio.ensure_future(lag_probe(lags, stop))
    await asyncio.sleep(seconds)
    stop.set()
    await probe
    return SimpleNamespace(metadata={"lags": lags})


def reply_ids(model_dir: str) -> list[int]:
    from transformers import AutoTokenizer

    from fleet_stubs import REPLY

    return AutoTokenizer.from_pretrained(model_dir).encode(REPLY, add_special_tokens=False)


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98] if len(values) >= 2 else (values[0] if values else 0.0)


async def run_case(args, in_flight: int, workers: int, cluster, model_dir: str, stub_url: str, out: Path) -> str:
    import ray

    from slime_harbor.fleet import close_fleets, ray_fleet
    from slime_harbor.policy.sampling import SamplingParams
    from slime_harbor.rollout import run_rollout_episodes
    from slime_harbor.run_config import RolloutConfig

    tasks = write_tasks(out / "tasks", in_flight // GROUP)
    close_fleets()
    cfg = RolloutConfig(
        tasks_dir=write_tasks(out / "warm-up", workers), out_dir=out / "warm-up-run",
        agent="fleet_stubs:ScriptedGatewayAgent", env="fleet_stubs:StubSandbox", policy_url=stub_url, model_dir=model_dir, n_samples=GROUP, concurrency=in_flight,
        step_limit=args.turns + 1, sampling=SamplingParams(max_new_tokens=16), progress=False,
        agent_kwargs={"turns": args.turns}, impossible_twin="off", grader_watch="off",
        fleet="ray", ray_address=cluster.address, env_start_retries=0)
    fleet = ray_fleet(cfg)
    for node in list(fleet.workers)[workers:]:  # this case's workers only
        ray.kill(fleet.workers.pop(node))
        fleet.in_flight.pop(node)
    # A warm-up round first, on every worker: imports, the gateway, the tokenizer are not per-trial costs.
    await run_rollout_episodes(cfg)
    cfg = dataclasses.replace(cfg, tasks_dir=tasks, out_dir=out / "run")
    pids = [os.getpid()] + worker_pids()
    cpu0, rss0 = process_usage(pids)
    peak = [rss0]
    done = asyncio.Event()

    async def watch_memory() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], process_usage(pids)[1])
            await asyncio.sleep(0.5)

    watcher = asyncio.ensure_future(watch_memory())
    started = time.monotonic()
    lags_ref = asyncio.get_running_loop().run_in_executor(None, worker_loop_lag, 20.0)
    rollouts = await run_rollout_episodes(cfg)
    wall = time.monotonic() - started
    done.set()
    await watcher
    lags = await lags_ref
    cpu1, _ = process_usage(pids)
    episodes = rollouts.episodes
    failed = [e for e in episodes if e.status.value not in ("completed", "truncated")]
    assert not failed, f"{len(failed)} trials not scored, e.g. {failed[0].error}"  # the figures are of real trials
    places = Counter((e.task_name, e.index) for e in episodes if e.samples)
    lost = in_flight - len(places)
    duplicated = sum(n - 1 for n in places.values() if n > 1)
    stub_delay = args.ms_per_token * len(reply_ids(model_dir)) / 1000
    added = [(seconds - stub_delay) * 1000 for seen in (out / "run" / "trials").rglob("call_seconds.json")
             for seconds in json.loads(seen.read_text())]
    return (f"workers={workers} in_flight={in_flight} trials_per_min={in_flight / wall * 60:.0f} "
            f"cpu_s_per_trial={(cpu1 - cpu0) / in_flight:.3f} mem_per_trial_kb={(peak[0] - rss0) / 1024 / in_flight:.0f} "
            f"loop_lag_p99_ms={p99(lags):.1f} p99_added_ms={p99(added):.1f} lost={lost} duplicated={duplicated}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--in-flight", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--ms-per-token", type=float, default=2.0)
    args = parser.parse_args()

    import ray
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    from slime_harbor.fleet import close_fleets
    from slime_harbor.policy.tiny_model import ensure_tiny_model

    model_dir = str(ensure_tiny_model())
    port = free_port()
    stub = subprocess.Popen([sys.executable, "-c", "import sys; from fleet_stubs import stub_engine_main; "
                             f"stub_engine_main({model_dir!r}, {port}, {args.ms_per_token})"])
    ray_constants.ENABLE_RAY_CLUSTER = False
    node = {"num_cpus": 1, "resources": {"rollout": 1}, "object_store_memory": 100 * 1024 * 1024}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    cluster.add_node(**node)
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        import httpx

        for _ in range(100):
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        for in_flight in args.in_flight:
            for workers in args.workers:
                with tempfile.TemporaryDirectory() as tmp:
                    line = asyncio.run(run_case(args, in_flight, workers, cluster, model_dir,
                                                f"http://127.0.0.1:{port}", Path(tmp)))
                print(line, flush=True)
    finally:
        close_fleets()
        ray.shutdown()
        cluster.shutdown()
        stub.kill()


if __name__ == "__main__":
    main()
