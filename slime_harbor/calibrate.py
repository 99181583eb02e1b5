"""Which tasks can grade a policy: gold must pass and the empty answer must fail, every time.

`slime-harbor calibrate --tasks DIR [--env ENV] [--repeats K] [--out FILE]` runs Harbor's oracle
agent (the task's own solution) and nop agent (no answer at all) K times on every task, in real
trials, and writes FILE (default DIR/calibration.json):

    {"repeats": K, "env": ENV, "tasks": {NAME: {"status": "ok" | "broken" | "flaky",
     "reason": "...", "gold": [rewards or null], "empty": [rewards or null]}},
     "broken": {NAME: reason}, "flaky": {NAME: reason}}

- broken: the gold solution never passes (or its trials fail: the image does not build, the test
  patch does not apply), the empty answer always passes, or (SWE-bench tasks) the gold patch
  needs a test-configuration change that grading drops;
- flaky: gold passes some of the K times, or the empty answer passes some of them.

It exits 0 whatever it finds. FILE is a task manifest: `rollout --task-manifest FILE`,
`train-local --task-manifest FILE` and the SLiME hook (YAML `harbor_task_manifest`) skip the tasks
it marks broken or flaky and name them in summary.json; tasks it does not list run.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from slime_harbor.exits import ConfigError

from slime_harbor.tasks.manifest import BROKEN, FLAKY, OK, apply_manifest, load_manifest  # noqa: F401 (re-exported)


def judge(gold: list[float | None], empty: list[float | None], dropped: list[str]) -> tuple[str, str]:
    """(status, reason) of one task from its gold and empty rewards (None: the trial failed)."""
    k = len(gold)
    passed = sum(r is not None and r >= 1.0 for r in gold)
    empty_passed = sum(r is not None and r >= 1.0 for r in empty)
    if dropped:
        return BROKEN, "the gold patch changes test configuration that grading drops: " + "; ".join(dropped)
    if passed == 0:
        why = "failed (no reward)" if all(r is None for r in gold) else "never passes"
        return BROKEN, f"the gold solution {why} in {k} of {k} runs"
    if empty_passed == len(empty):
        return BROKEN, f"the empty answer passes in {len(empty)} of {len(empty)} runs"
    if passed < k:
        return FLAKY, f"the gold solution passes in {passed} of {k} runs"
    if empty_passed:
        return FLAKY, f"the empty answer passes in {empty_passed} of {len(empty)} runs"
    if any(r is None for r in empty):
        return FLAKY, "the empty answer's trial failed (no reward) in some runs"
    return OK, f"gold passes {k} of {k}, the empty answer fails {k} of {k}"


def _gold_dropped(samples: list[dict]) -> list[str]:
    """What SWE-bench grading dropped from the gold patch (its report.json), over the gold runs."""
    dropped: list[str] = []
    for s in samples:
        report = Path(s["metadata"].get("trial_dir") or "/nonexistent") / "verifier" / "report.json"
        if report.is_file():
            for item in json.loads(report.read_text()).get("dropped_from_patch") or []:
                if item not in dropped:
                    dropped.append(item)
    return dropped


async def calibrate(tasks_dir: Path, env: str = "local", repeats: int = 3, out: Path | None = None,
                    concurrency: int = 4) -> dict[str, Any]:
    """Run gold and empty K times per task; write and return the manifest."""
    from slime_harbor.rollout import RolloutConfig, run_rollouts

    if repeats < 1:
        raise ConfigError(f"repeats must be at least 1, got {repeats}")
    tasks_dir = Path(tasks_dir)
    out = Path(out) if out is not None else tasks_dir / "calibration.json"
    runs = Path(tempfile.mkdtemp(prefix="slime-harbor-calibrate-"))
    try:
        by_agent: dict[str, dict[str, list[dict]]] = {}
        for agent in ("oracle", "nop"):
            cfg = RolloutConfig(tasks_dir=tasks_dir, agent=agent, n_samples=repeats, env=env, concurrency=concurrency,
                                out_dir=runs / agent, reward_mapping="raw", progress=False)
            await run_rollouts(cfg)
            grouped: dict[str, list[dict]] = {}
            for line in (runs / agent / "samples.jsonl").read_text().splitlines():
                sample = json.loads(line)
                if sample["metadata"].get("segment", 0) == 0:
                    grouped.setdefault(sample["metadata"]["task_name"], []).append(sample)
            by_agent[agent] = grouped
        tasks: dict[str, dict] = {}
        for name in sorted(set(by_agent["oracle"]) | set(by_agent["nop"])):
            gold_samples, empty_samples = by_agent["oracle"].get(name, []), by_agent["nop"].get(name, [])
            gold = [s["reward"] for s in gold_samples]
            empty = [s["reward"] for s in empty_samples]
            status, reason = judge(gold, empty, _gold_dropped(gold_samples))
            failures = sorted({s["metadata"].get("status_reason") for s in gold_samples + empty_samples
                               if s["reward"] is None and s["metadata"].get("status_reason")})
            tasks[name] = {"status": status, "reason": reason, "gold": gold, "empty": empty,
                           **({"failures": failures} if failures else {})}
    finally:
        shutil.rmtree(runs, ignore_errors=True)
    manifest = {
        "repeats": repeats, "env": env, "tasks": tasks,
        "broken": {n: t["reason"] for n, t in tasks.items() if t["status"] == BROKEN},
        "flaky": {n: t["reason"] for n, t in tasks.items() if t["status"] == FLAKY},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def main(tasks_dir: Path, env: str, repeats: int, out: Path | None) -> dict:
    from slime_harbor.rollout import check_environment_runs, discover_tasks

    try:
        discover_tasks(tasks_dir)
    except FileNotFoundError as exc:
        raise ConfigError(str(exc)) from None
    check_environment_runs(env)
    manifest = asyncio.run(calibrate(tasks_dir, env=env, repeats=repeats, out=out))
    where = out or Path(tasks_dir) / "calibration.json"
    counts = {s: sum(t["status"] == s for t in manifest["tasks"].values()) for s in (OK, BROKEN, FLAKY)}
    print(f"{counts[OK]} ok, {counts[BROKEN]} broken, {counts[FLAKY]} flaky; manifest: {where}")
    for kind in ("broken", "flaky"):
        for name, reason in manifest[kind].items():
            print(f"  {kind}: {name}: {reason}")
    return manifest
