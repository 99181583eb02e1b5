"""Rollout overhead: our runner vs Harbor's own Job runner on the same tasks, agent and concurrency.

Both run real Harbor Trials with the same AgentConfig (built by slime_harbor.rollout), the same
number of trials and the same concurrency. With ``--env local`` (or any other env) both use the
same environment, so the ratio of wall times is the cost (or saving) of our orchestration:
sample conversion, streaming JSONL, progress. With ``--env docker`` each side uses its own
Docker environment: ours (`slime_harbor.environments.docker`, Engine API + exec server) against
Harbor's (`docker compose` per call), on public-network copies of the tasks (Harbor's no-network
mode needs an egress-control image that cannot be pulled here; ours then uses the host network).

    .venv/bin/python bench/rollout_overhead.py [--env local|docker] [--agent oracle] [--n-samples 2]

Both paths are warmed once (imports, first sandbox, images) before timing, and their order
alternates between rounds (a shared 2-core machine makes single runs swing by 20%); medians are
compared. Prints both wall times and ours/harbor (target <= 1.0 for the same env, <= 0.2 for
--env docker).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import re
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from slime_harbor.run_config import policy_endpoint
from slime_harbor.policy.sampling import SamplingParams
from slime_harbor.rollout import run_rollouts
from slime_harbor.tasks.task_dir import discover_tasks
from slime_harbor.agents.placement import agent_config
from slime_harbor.run_config import DEFAULT_TASKS, RolloutConfig
from slime_harbor.trial_setup import environment_config

HARBOR_ENV = {"docker": "harbor-docker"}
"""Harbor's side of an --env whose two sides differ (else both use the same environment)."""


async def harbor_job(cfg: RolloutConfig, env: str, jobs_dir: Path) -> tuple[float, int]:
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
        environment=environment_config(env),
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


def public_copies(tasks: list[Path], root: Path) -> Path:
    for task in tasks:
        dest = root / task.name
        shutil.copytree(task, dest)
        toml = (dest / "task.toml").read_text()
        if re.search(r"network_mode\s*=", toml):
            toml = re.sub(r'network_mode\s*=\s*"[a-z-]+"', 'network_mode = "public"', toml)
        else:
            toml = toml.replace("[environment]", '[environment]\nnetwork_mode = "public"', 1)
        (dest / "task.toml").write_text(toml)
    return root


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--agent", default="oracle")
    p.add_argument("--env", default="local", help="local | docker (ours vs Harbor's) | any rollout --env")
    p.add_argument("--tasks", type=Path, default=DEFAULT_TASKS)
    p.add_argument("--task-names", nargs="*", default=None, help="only these tasks (default: all)")
    p.add_argument("--n-samples", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--step-limit", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3, help="rounds, alternating which side runs first; medians are reported")
    a = p.parse_args()
    harbor_env = HARBOR_ENV.get(a.env, a.env)
    with tempfile.TemporaryDirectory() as tmp:
        tasks_dir = a.tasks
        if a.env == "docker":
            tasks_dir = public_copies(discover_tasks(a.tasks, a.task_names), Path(tmp) / "tasks")
        cfg = RolloutConfig(
            tasks_dir=tasks_dir, task_names=a.task_names, agent=a.agent, n_samples=a.n_samples,
            concurrency=a.concurrency, env=a.env, step_limit=a.step_limit,
            sampling=SamplingParams(max_new_tokens=a.max_new_tokens),
            out_dir=Path(tmp) / "ours", progress=False,
        )  # fmt: skip
        with policy_endpoint(cfg) as cfg:
            # Warm both paths (imports, first sandbox, images) so neither pays start-up alone.
            warm = dataclasses.replace(cfg, n_samples=1, out_dir=Path(tmp) / "warm")
            asyncio.run(ours(warm))
            asyncio.run(harbor_job(warm, harbor_env, Path(tmp) / "warm-jobs"))
            theirs, mine = [], []
            for r in range(a.rounds):
                run_ours = lambda: asyncio.run(ours(dataclasses.replace(cfg, out_dir=Path(tmp) / f"ours{r}")))  # noqa: E731
                run_theirs = lambda: asyncio.run(harbor_job(cfg, harbor_env, Path(tmp) / f"jobs{r}"))  # noqa: E731
                if r % 2 == 0:
                    (theirs_s, theirs_n), (ours_s, ours_n) = run_theirs(), run_ours()
                else:
                    (ours_s, ours_n), (theirs_s, theirs_n) = run_ours(), run_theirs()
                theirs.append(theirs_s)
                mine.append(ours_s)
                first = "harbor" if r % 2 == 0 else "ours"
                print(f"round {r} ({first} first): harbor {theirs_s:.1f}s, ours {ours_s:.1f}s", flush=True)
    theirs_s, ours_s = statistics.median(theirs), statistics.median(mine)
    target = 0.2 if harbor_env != a.env else 1.0
    print(f"agent={a.agent} env: ours {a.env}, harbor {harbor_env}; tasks={a.tasks.name}"
          f"{' ' + ','.join(a.task_names) if a.task_names else ''}; trials per round: ours {ours_n}, "
          f"harbor {theirs_n}; concurrency {a.concurrency}; rounds {a.rounds}")
    print(f"harbor Job runner (median): {theirs_s:.1f}s")
    print(f"slime-harbor runner (median): {ours_s:.1f}s")
    print(f"wall-time ratio ours/harbor: {ours_s / theirs_s:.2f} (target <= {target})")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
