"""What the impossible twin costs a step: its wall time with --impossible-twin on vs off, at a realistic
pass rate, over the bundled SWE-bench-format instances (Docker) and plain tasks (Docker and
bubblewrap), in one run.

A step here is what a GRPO step samples: every task's group of --group trials, --concurrency at a
time; its wall time is rollout's own (summary.json wall_seconds: the twins' one-off build and gold
check at the run's start are left out, and printed apart). The trials' agent (BenchAgent below, a
host-side Harbor agent) takes an agent's time, drawn per trial around --agent-seconds (half to one
and a half times it; the demo's mini-swe-agent trials spent 39.5 s in the agent, docs/benchmarks.md),
and then applies the task's gold solution with probability --pass-rate, else nothing: the same
trials, sleeps and passes in both modes of a round (seeded by the round). Each round runs the step
with the twin on and off, the order alternating (a shared 2-core machine swings single runs). It
prints, per environment, the median step wall time off and on, the added share (the median over
rounds of on / off, each round's pair the same trials; target: under 15%), the twin's seconds per
step and per passing trial, and the share of passing trials graded on a twin, and writes
OUT/twin_cost.json.

    .venv/bin/python bench/twin_cost.py [--rounds 2] [--group 4] [--pass-rate 0.5] [--agent-seconds 30]
        [--envs docker local] [--plain config-parser fix-sort-key] [--out runs/bench-twin]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
import re
import shlex
import statistics
import sys
from pathlib import Path

from harbor.agents.base import BaseAgent

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from anywhere

from slime_harbor.rollout import run_rollouts  # noqa: E402
from slime_harbor.run_config import policy_endpoint, RolloutConfig

SWE_TASKS = ROOT / "examples" / "harbor" / "tasks-swe"
PLAIN_TASKS = ROOT / "examples" / "harbor" / "tasks"
AGENT = "twin_cost:BenchAgent"


class BenchAgent(BaseAgent):
    """An agent's time in the sandbox, then the task's gold (pass_rate of the trials) or nothing.
    Which, and how long, is drawn from (seed, the trial's task and index): the same in both modes."""

    def __init__(self, logs_dir, model_name=None, api_base=None, pass_rate: float = 0.5, agent_seconds: float = 30.0,
                 seed: int = 0, **kwargs):
        super().__init__(logs_dir, model_name=model_name, **kwargs)
        self.pass_rate, self.agent_seconds, self.seed = pass_rate, agent_seconds, seed

    @staticmethod
    def name() -> str:
        return "twin-cost-bench-agent"

    def version(self) -> str:
        return "0"

    async def setup(self, environment) -> None:
        pass

    async def run(self, instruction, environment, context) -> None:
        trial = Path(self.logs_dir).parent  # <trials>/<task>__g<group>_<index>__<id>/agent
        task = Path(json.loads((trial / "config.json").read_text())["task"]["path"])
        key = f"{self.seed}:{task.name}:{re.search(r'__(g\d+_\d+)__', trial.name).group(1)}"  # group and index
        draw = random.Random(hashlib.sha256(key.encode()).digest())
        seconds = self.agent_seconds * draw.uniform(0.5, 1.5)
        solve = "true"
        if draw.random() < self.pass_rate:
            await environment.upload_dir(task / "solution", "/solution")
            solve = "bash /solution/solve.sh"
        done = await environment.exec(f"sleep {seconds:.2f}; {solve} > /dev/null 2>&1; rm -rf /solution", user="root")
        context.metadata = {"exit_status": "submitted", "bench_seconds": seconds, "return_code": done.return_code}


def task_dir(names: list[str], env: str, out: Path) -> tuple[Path, list[str]]:
    """One tasks dir holding the SWE instances (Docker only) and the plain tasks, as links."""
    root = out / f"tasks-{env}"
    root.mkdir(parents=True, exist_ok=True)
    chosen = [p for p in SWE_TASKS.iterdir() if (p / "task.toml").is_file()] if env == "docker" else []
    chosen += [PLAIN_TASKS / n for n in names]
    for task in chosen:
        if not (root / task.name).exists():
            (root / task.name).symlink_to(task)
    return root, sorted(t.name for t in chosen)


async def step(env: str, tasks: Path, names: list[str], twin: str, a, seed: int, out: Path) -> dict:
    cfg = RolloutConfig(tasks_dir=tasks, task_names=names, agent=AGENT, env=env, n_samples=a.group,
                        concurrency=a.concurrency, impossible_twin=twin, out_dir=out, progress=False,
                        agent_kwargs={"pass_rate": a.pass_rate, "agent_seconds": a.agent_seconds, "seed": seed})
    with policy_endpoint(cfg) as cfg:  # a gateway agent needs a policy behind its gateway; this one never calls it
        summary = await run_rollouts(cfg)
    return {k: summary.get(k) for k in ("wall_seconds", "pass_rate", "n_scored", "n_trials", "time/twin_s",
                                        "twin_coverage", "hack/twin_errors", "hack/passes_impossible")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--group", type=int, default=4, help="trials per task per step (the GRPO group)")
    p.add_argument("--pass-rate", type=float, default=0.5)
    p.add_argument("--agent-seconds", type=float, default=30.0, help="the agent's mean time in the sandbox per trial")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--envs", nargs="+", default=["docker", "local"])
    p.add_argument("--plain", nargs="*", default=["config-parser", "fix-sort-key"],
                   help="bundled plain tasks (config-parser has a twin; most have none, and cost nothing)")
    p.add_argument("--out", type=Path, default=Path("runs/bench-twin"))
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    result = {"settings": {k: v for k, v in vars(a).items() if k != "out"}, "envs": {}}
    for env in a.envs:
        tasks, names = task_dir(a.plain, env, a.out)
        # warm-up: images, imports, each twin built and gold-checked once (the one-off cost, timed apart)
        warm = asyncio.run(step(env, tasks, names, "on", a, -1, a.out / f"{env}-warm"))
        runs: dict[str, list[dict]] = {"off": [], "on": []}
        for k in range(a.rounds):
            for twin in (("on", "off") if k % 2 == 0 else ("off", "on")):
                got = asyncio.run(step(env, tasks, names, twin, a, k, a.out / f"{env}-{twin}-{k}"))
                runs[twin].append(got)
                print(f"{env} round {k} twin {twin}: step {got['wall_seconds']:.1f} s, pass rate {got['pass_rate']}, "
                      f"twin {got.get('time/twin_s') or 0:.1f} s", file=sys.stderr)
        off = statistics.median(r["wall_seconds"] for r in runs["off"])
        on = statistics.median(r["wall_seconds"] for r in runs["on"])
        # paired by round (the same trials, sleeps and passes): the machine's load drifts between rounds
        ratios = [b["wall_seconds"] / a["wall_seconds"] for a, b in zip(runs["off"], runs["on"])]
        passing = [(r["pass_rate"] or 0) * (r["n_scored"] or 0) for r in runs["on"]]
        result["envs"][env] = {
            "tasks": names, "warm_up_step_s": warm["wall_seconds"],
            "median_step_s": {"off": off, "on": on}, "added": statistics.median(ratios) - 1,
            "added_per_round": [x - 1 for x in ratios],
            "twin_s_per_passing_trial": sum(r.get("time/twin_s") or 0.0 for r in runs["on"]) / max(sum(passing), 1),
            "twin_s_per_step": statistics.median(r.get("time/twin_s") or 0.0 for r in runs["on"]),
            "twin_coverage": [r.get("twin_coverage") for r in runs["on"]],
            "twin_errors": sum(r.get("hack/twin_errors") or 0 for r in runs["on"]),
            "passes_impossible": sum(r.get("hack/passes_impossible") or 0 for r in runs["on"]),
            "pass_rate": [r["pass_rate"] for r in runs["on"] + runs["off"]], "runs": runs,
        }
    (a.out / "twin_cost.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"impossible twin cost per step ({a.group} trials per task, pass rate {a.pass_rate}, agent "
          f"~{a.agent_seconds:g} s, concurrency {a.concurrency}, {a.rounds} rounds; target: under 15%)")
    for env, r in result["envs"].items():
        print(f"  {env:6s} {len(r['tasks'])} tasks ({', '.join(r['tasks'])}): median step {r['median_step_s']['off']:.1f} s "
              f"off, {r['median_step_s']['on']:.1f} s on; added {r['added']:+.1%} (median of the rounds' "
              f"{', '.join(f'{x:+.1%}' for x in r['added_per_round'])}); twin {r['twin_s_per_step']:.1f} s of trial time "
              f"per step ({r['twin_s_per_passing_trial']:.2f} s per passing trial), passing trials graded on a twin "
              f"{', '.join(f'{c:.2f}' for c in r['twin_coverage'] if c is not None)}, twin errors {r['twin_errors']}, "
              f"passes_impossible {r['passes_impossible']}")
    print(f"written: {a.out / 'twin_cost.json'}  (command: {' '.join(shlex.quote(x) for x in sys.argv)})")


if __name__ == "__main__":
    main()
