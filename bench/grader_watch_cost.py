"""What the grading watch adds to a verifier's time: every bundled task's gold (Harbor's oracle) graded
with --grader-watch on vs off, in bubblewrap and Docker (the SWE-bench-format instances in Docker
only), in one run.

A verifier's time is Harbor's own measure of it (each trial's result.json: verifier.finished_at -
started_at), which holds everything the watch adds: the hook and its config written to the watch
dir, the report socket, every Python process of the grading loading the hook and reporting, the
report read. Each round grades every task once with the watch on and once off, the order
alternating (a shared 2-core machine swings single runs); a round's figure is the sum of its
verifier seconds. It prints, per environment, the median summed verifier time off and on and the
added share (the median over rounds of on / off; target: under 5%), the share of verifications
watched, and writes OUT/grader_watch_cost.json.

    .venv/bin/python bench/grader_watch_cost.py [--rounds 3] [--envs local docker] [--out runs/bench-watch]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import statistics
import sys
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from anywhere

from slime_harbor.rollout import run_rollouts  # noqa: E402
from slime_harbor.run_config import RolloutConfig  # noqa: E402

PLAIN_TASKS = ROOT / "examples" / "harbor" / "tasks"
SWE_TASKS = ROOT / "examples" / "harbor" / "tasks-swe"


def task_dir(env: str, out: Path) -> Path:
    """One tasks dir holding the plain tasks and (Docker only) the SWE instances, as links."""
    root = out / f"tasks-{env}"
    root.mkdir(parents=True, exist_ok=True)
    chosen = [p for p in PLAIN_TASKS.iterdir() if (p / "task.toml").is_file()]
    if env == "docker":
        chosen += [p for p in SWE_TASKS.iterdir() if (p / "task.toml").is_file()]
    for task in chosen:
        if not (root / task.name).exists():
            (root / task.name).symlink_to(task)
    return root


def verifier_seconds(trials: Path) -> dict[str, float]:
    """Task name -> its verifier's seconds, from each trial's result.json."""
    found = {}
    for result in trials.glob("*/result.json"):
        data = json.loads(result.read_text())
        timing = data.get("verifier") or {}
        if timing.get("started_at") and timing.get("finished_at"):
            seconds = (datetime.fromisoformat(timing["finished_at"]) - datetime.fromisoformat(timing["started_at"]))
            found[data.get("task_name") or result.parent.name.split("__")[0]] = seconds.total_seconds()
    return found


async def grade(env: str, tasks: Path, watch: str, concurrency: int, out: Path) -> dict:
    cfg = RolloutConfig(tasks_dir=tasks, agent="oracle", env=env, n_samples=1, concurrency=concurrency,
                        impossible_twin="off", grader_watch=watch, out_dir=out, progress=False)
    summary = await run_rollouts(cfg)
    seconds = verifier_seconds(out / "trials")
    return {"verifier_s": sum(seconds.values()), "per_task": seconds, "pass_rate": summary.get("pass_rate"),
            "watched": summary.get("grader_watch/watched"), "unwatched": summary.get("grader_watch/unwatched"),
            "reads_grader": summary.get("hack/reads_grader", 0), "watch_s": summary.get("time/watch_s")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--envs", nargs="+", default=["local", "docker"])
    p.add_argument("--out", type=Path, default=Path("runs/bench-watch"))
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    result = {"settings": {k: v for k, v in vars(a).items() if k != "out"}, "envs": {}}
    for env in a.envs:
        tasks = task_dir(env, a.out)
        asyncio.run(grade(env, tasks, "on", a.concurrency, a.out / f"{env}-warm"))  # images built, imports warm
        runs: dict[str, list[dict]] = {"off": [], "on": []}
        for k in range(a.rounds):
            for watch in (("on", "off") if k % 2 == 0 else ("off", "on")):
                got = asyncio.run(grade(env, tasks, watch, a.concurrency, a.out / f"{env}-{watch}-{k}"))
                runs[watch].append(got)
                print(f"{env} round {k} watch {watch}: verifiers {got['verifier_s']:.1f} s, pass rate {got['pass_rate']}",
                      file=sys.stderr)
        ratios = [b["verifier_s"] / a_["verifier_s"] for a_, b in zip(runs["off"], runs["on"])]
        on = runs["on"]
        result["envs"][env] = {
            "tasks": len(on[0]["per_task"]),
            "median_verifier_s": {w: statistics.median(r["verifier_s"] for r in runs[w]) for w in ("off", "on")},
            "added": statistics.median(ratios) - 1, "added_per_round": [x - 1 for x in ratios],
            "watched": [r["watched"] for r in on], "unwatched": [r["unwatched"] for r in on],
            "reads_grader": sum(r["reads_grader"] for r in on), "runs": runs,
        }
    (a.out / "grader_watch_cost.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"grading watch cost: every bundled gold graded with the watch on vs off, {a.rounds} rounds; target: under 5%")
    for env, r in result["envs"].items():
        print(f"  {env:6s} {r['tasks']} tasks: summed verifier time {r['median_verifier_s']['off']:.1f} s off, "
              f"{r['median_verifier_s']['on']:.1f} s on; added {r['added']:+.1%} (rounds: "
              f"{', '.join(f'{x:+.1%}' for x in r['added_per_round'])}); watched {r['watched']}, unwatched "
              f"{r['unwatched']}, reads_grader on a gold {r['reads_grader']}")
    print(f"written: {a.out / 'grader_watch_cost.json'}  (command: {' '.join(shlex.quote(x) for x in sys.argv)})")


if __name__ == "__main__":
    main()
