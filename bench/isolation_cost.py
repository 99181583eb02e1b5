"""What grading isolation costs: trial wall time with the verifier in the agent's container (shared)
vs in a separate container of the task image (separate), Docker, the same tasks, in one run.

Each task is run in both modes from two copies that differ only in task.toml: the SWE-bench tasks
of examples/harbor/tasks-swe (generated separate; the shared copy drops `environment_mode` and
`artifacts`, and its grader then works on the agent's own /testbed) and, with --plain, bundled plain
tasks (generated shared; the separate copy collects the workdir as an artifact). Harbor's oracle
agent, our Docker environment, one warm-up round (images, imports), then rounds whose mode order
alternates (a shared 2-core machine swings single runs by 20%). Per trial the wall time and the
verifier phase come from Harbor's result.json.

    .venv/bin/python bench/isolation_cost.py [--rounds 3] [--plain fix-sort-key count-errors] [--out DIR]

Prints median trial and verifier seconds per mode and the separate/shared ratio; writes
DIR/isolation_cost.json and DIR/isolation_cost.png (per-task median trial time, both modes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import statistics
import tempfile
from datetime import datetime
from pathlib import Path

from slime_harbor.rollout import run_rollouts
from slime_harbor.run_config import RolloutConfig

ROOT = Path(__file__).resolve().parent.parent
SWE_TASKS = ROOT / "examples" / "harbor" / "tasks-swe"
PLAIN_TASKS = ROOT / "examples" / "harbor" / "tasks"


def set_mode(task: Path, separate: bool) -> None:
    toml = (task / "task.toml").read_text()
    toml = re.sub(r'^artifacts = .*\n', "", toml, flags=re.M)
    toml = re.sub(r'^environment_mode = .*\n', "", toml, flags=re.M)
    if separate:
        workdir = re.search(r'^workdir = "(.*)"', toml, flags=re.M)
        toml = toml.replace('schema_version = "1.4"\n',
                            f'schema_version = "1.4"\nartifacts = ["{workdir.group(1) if workdir else "/app"}"]\n', 1)
        toml = re.sub(r'^\[verifier\]\n', '[verifier]\nenvironment_mode = "separate"\n', toml, count=1, flags=re.M)
    (task / "task.toml").write_text(toml)


def make_copies(root: Path, plain: list[str]) -> dict[str, Path]:
    dirs = {}
    for mode in ("shared", "separate"):
        tasks = root / mode
        sources = [p for p in SWE_TASKS.iterdir() if (p / "task.toml").is_file()]
        sources += [PLAIN_TASKS / name for name in plain]
        for src in sources:
            shutil.copytree(src, tasks / src.name)
            set_mode(tasks / src.name, separate=mode == "separate")
        dirs[mode] = tasks
    return dirs


def trial_times(out: Path) -> list[dict]:
    rows = []
    for result in sorted((out / "trials").glob("*/result.json")):
        r = json.loads(result.read_text())
        seconds = lambda t: (datetime.fromisoformat(t["finished_at"]) - datetime.fromisoformat(t["started_at"])).total_seconds()
        rewards = (r.get("verifier_result") or {}).get("rewards") or {}
        rows.append({"task": r["task_name"], "trial": seconds(r), "verifier": seconds(r["verifier"]) if r.get("verifier") else None,
                     "reward": rewards.get("reward")})
    return rows


async def run_mode(tasks: Path, out: Path, concurrency: int) -> list[dict]:
    cfg = RolloutConfig(tasks_dir=tasks, agent="oracle", n_samples=1, env="docker", concurrency=concurrency,
                        out_dir=out, progress=False)
    await run_rollouts(cfg)
    return trial_times(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--plain", nargs="*", default=["fix-sort-key", "count-errors"], help="bundled plain tasks to add")
    p.add_argument("--concurrency", type=int, default=1, help="1: trials do not compete for the 2 cores")
    p.add_argument("--out", type=Path, default=Path("runs/bench-isolation"))
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    rows: dict[str, list[dict]] = {"shared": [], "separate": []}
    with tempfile.TemporaryDirectory() as tmp:
        dirs = make_copies(Path(tmp), a.plain)
        for mode in ("shared", "separate"):  # warm-up: images, imports, first containers
            asyncio.run(run_mode(dirs[mode], Path(tmp) / f"warm-{mode}", a.concurrency))
        for k in range(a.rounds):
            for mode in (("shared", "separate") if k % 2 == 0 else ("separate", "shared")):
                got = asyncio.run(run_mode(dirs[mode], Path(tmp) / f"{mode}-{k}", a.concurrency))
                rows[mode] += got
    result = {"rounds": a.rounds, "concurrency": a.concurrency, "modes": {}}
    for mode, trials in rows.items():
        bad = [t for t in trials if t["reward"] != 1]
        result["modes"][mode] = {
            "trials": len(trials), "not_resolved": len(bad),
            "median_trial_sec": statistics.median(t["trial"] for t in trials),
            "median_verifier_sec": statistics.median(t["verifier"] for t in trials if t["verifier"] is not None),
            "per_task_median_trial_sec": {task: statistics.median(t["trial"] for t in trials if t["task"] == task)
                                          for task in sorted({t["task"] for t in trials})},
        }
    shared, separate = result["modes"]["shared"], result["modes"]["separate"]
    result["ratio_trial"] = separate["median_trial_sec"] / shared["median_trial_sec"]
    result["ratio_verifier"] = separate["median_verifier_sec"] / shared["median_verifier_sec"]
    (a.out / "isolation_cost.json").write_text(json.dumps(result, indent=2) + "\n")
    for mode in ("shared", "separate"):
        m = result["modes"][mode]
        print(f"{mode:9s} trials={m['trials']:3d} median trial {m['median_trial_sec']:.2f} s, "
              f"verifier {m['median_verifier_sec']:.2f} s, not resolved {m['not_resolved']}")
    print(f"separate/shared: trial {result['ratio_trial']:.2f}x, verifier {result['ratio_verifier']:.2f}x")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        names = list(shared["per_task_median_trial_sec"])
        xs = range(len(names))
        fig, ax = plt.subplots(figsize=(8, 3.5))
        ax.bar([x - 0.2 for x in xs], [shared["per_task_median_trial_sec"][n] for n in names], 0.4, label="shared")
        ax.bar([x + 0.2 for x in xs], [separate["per_task_median_trial_sec"][n] for n in names], 0.4, label="separate")
        ax.set_xticks(list(xs), [n.replace("slime-harbor__", "") for n in names], rotation=20, fontsize=8)
        ax.set_ylabel("median trial wall time (s)")
        ax.set_title(f"verifier isolation cost (Docker, oracle): trial x{result['ratio_trial']:.2f}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(a.out / "isolation_cost.png", dpi=120)
        print(f"figure: {a.out / 'isolation_cost.png'}")
    except ImportError:
        pass


if __name__ == "__main__":
    main()
