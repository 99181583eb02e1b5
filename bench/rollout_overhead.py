"""Rollout overhead: our runner vs Harbor's own Job runner on the same tasks, agent and sandbox.

Both run real Harbor Trials with the same AgentConfig and EnvironmentConfig (built by
slime_harbor.rollout), the same number of trials and the same concurrency; the ratio of wall
times is the cost (or saving) of our orchestration: sample conversion, streaming JSONL, progress.

    .venv/bin/python bench/rollout_overhead.py [--agent oracle] [--n-samples 2] [--concurrency 4]

Rounds alternate Harbor/ours and the medians are compared, since a shared 2-core machine makes
single runs swing by 20%. Prints both wall times and ours/harbor (target <= 1.0).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import statistics
import tempfile
import time
from pathlib import Path

from slime_harbor.policy.server import policy_endpoint
from slime_harbor.rollout import DEFAULT_TASKS, RolloutConfig, agent_config, discover_tasks, environment_config, run_rollouts


async def harbor_job(cfg: RolloutConfig, jobs_dir: Path) -> tuple[float, int]:
    from harbor.job import Job
    from harbor.models.job.config import JobConfig
    from harbor.models.trial.config import TaskConfig

    tasks = discover_tasks(cfg.tasks_dir, cfg.task_names)
    config = JobConfig(
        job_name="overhead",
        jobs_dir=jobs_dir,
        n_attempts=cfg.n_samples,
        n_concurrent_trials=cfg.concurrency,
        quiet=True,
        timeout_multiplier=cfg.timeout_multiplier,
        agents=[agent_config(cfg)],
        environment=environment_config(cfg.env),
        tasks=[TaskConfig(path=t.resolve()) for t in tasks],
    )
    started = time.monotonic()
    job = await Job.create(config)
    result = await job.run()
    seconds = time.monotonic() - started
    n = len(getattr(result, "trial_results", []) or [])
    return seconds, n


async def ours(cfg: RolloutConfig) -> tuple[float, int]:
    started = time.monotonic()
    summary = await run_rollouts(cfg)
    return time.monotonic() - started, summary["n_trials"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--agent", default="oracle")
    p.add_argument("--tasks", type=Path, default=DEFAULT_TASKS)
    p.add_argument("--n-samples", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--step-limit", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds; medians are reported")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = RolloutConfig(
            tasks_dir=a.tasks, agent=a.agent, n_samples=a.n_samples, concurrency=a.concurrency,
            step_limit=a.step_limit, max_new_tokens=a.max_new_tokens, out_dir=Path(tmp) / "ours", progress=False,
        )
        with policy_endpoint(cfg) as cfg:
            # Warm both paths once (imports, first sandbox) so neither pays start-up alone.
            warm = dataclasses.replace(cfg, n_samples=1, task_names=[discover_tasks(cfg.tasks_dir)[0].name],
                                       out_dir=Path(tmp) / "warm")
            asyncio.run(ours(warm))
            theirs, mine = [], []
            for r in range(a.rounds):
                theirs_s, theirs_n = asyncio.run(harbor_job(cfg, Path(tmp) / f"jobs{r}"))
                ours_s, ours_n = asyncio.run(ours(dataclasses.replace(cfg, out_dir=Path(tmp) / f"ours{r}")))
                theirs.append(theirs_s)
                mine.append(ours_s)
                print(f"round {r}: harbor {theirs_s:.1f}s, ours {ours_s:.1f}s")
    theirs_s, ours_s = statistics.median(theirs), statistics.median(mine)
    print(f"agent={a.agent} tasks={a.tasks.name} trials per round: ours {ours_n}, harbor {theirs_n}, "
          f"concurrency {a.concurrency}, rounds {a.rounds}")
    print(f"harbor Job runner (median): {theirs_s:.1f}s")
    print(f"slime-harbor runner (median): {ours_s:.1f}s")
    print(f"wall-time ratio ours/harbor: {ours_s / theirs_s:.2f} (target <= 1.0)")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
