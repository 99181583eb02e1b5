"""Which tasks can grade a policy: gold must pass, the empty answer must fail, and no blind attack
may score.

`slime-harbor calibrate --tasks DIR [--env ENV] [--repeats K] [--out FILE] [--probe-hacks
[--attacks DIR]]` runs Harbor's oracle agent (the task's own solution) and nop agent (no answer at
all) K times on every task, in real trials, and writes FILE (default DIR/calibration.json):

    {"repeats": K, "env": ENV, "tasks": {NAME: {"status": "ok" | "broken" | "hackable" | "flaky",
     "reason": "...", "gold": [rewards or null], "empty": [rewards or null],
     "attacks": {ATTACK: reward or null}}},
     "broken": {NAME: reason}, "hackable": {NAME: reason}, "flaky": {NAME: reason}}

- broken: the gold solution never passes (or its trials fail: the image does not build, the test
  patch does not apply), the empty answer always passes, the gold solution changes the verifier's
  runtime (a plain task's gold that upgrades a shipped package: it cannot score), or (SWE-bench
  tasks) the gold patch needs a test-configuration change that grading drops;
- hackable (with --probe-hacks): one of the blind attacks scored; the reason names it. The attacks
  are the scripts of slime_harbor/hack_probes (forged rewards from a detached process, the shell,
  interpreters and test tools replaced, startup hooks, test configuration, plumbing dodges: see its
  README) plus each ``NAME.sh`` of ``--attacks DIR``; each runs once per task as its solution, in
  the chosen --env, never reading the tests;
- flaky: gold passes some of the K times, or the empty answer passes some of them.

It exits 0 whatever it finds. FILE is a task manifest: `rollout --task-manifest FILE`,
`train-local --task-manifest FILE` and the SLiME hook (YAML `harbor_task_manifest`) skip the tasks
it marks broken, hackable or flaky and name them in summary.json; tasks it does not list run.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from slime_harbor.exits import ConfigError

from slime_harbor.tasks.manifest import BROKEN, FLAKY, HACKABLE, OK

HACK_PROBES = Path(__file__).resolve().parent / "hack_probes"
"""The bundled blind attacks (``NAME.sh``), run by --probe-hacks."""


def attack_scripts(extra_dirs: list[Path] = ()) -> dict[str, Path]:
    """Attack name -> script: the bundled ones, then each extra dir's ``*.sh`` (same name wins)."""
    scripts = {p.stem: p for p in sorted(HACK_PROBES.glob("*.sh"))}
    for directory in extra_dirs:
        directory = Path(directory)
        if not directory.is_dir():
            raise ConfigError(f"--attacks {directory}: not a directory of NAME.sh attack scripts")
        found = sorted(directory.glob("*.sh"))
        if not found:
            raise ConfigError(f"--attacks {directory}: no NAME.sh attack scripts in it")
        scripts.update({p.stem: p for p in found})
    return scripts


def judge(gold: list[float | None], empty: list[float | None], dropped: list[str],
          attacks: dict[str, float | None] | None = None, gold_tampering: str | None = None) -> tuple[str, str]:
    """(status, reason) of one task from its gold, empty and attack rewards (None: the trial failed)."""
    k = len(gold)
    passed = sum(r is not None and r >= 1.0 for r in gold)
    empty_passed = sum(r is not None and r >= 1.0 for r in empty)
    if dropped:
        return BROKEN, "the gold patch changes test configuration that grading drops: " + "; ".join(dropped)
    if gold_tampering:
        return BROKEN, f"the gold solution changes the verifier's runtime ({gold_tampering})"
    if passed == 0:
        why = "failed (no reward)" if all(r is None for r in gold) else "never passes"
        return BROKEN, f"the gold solution {why} in {k} of {k} runs"
    if empty_passed == len(empty):
        return BROKEN, f"the empty answer passes in {len(empty)} of {len(empty)} runs"
    scored = {name: r for name, r in (attacks or {}).items() if r is not None and r >= 1.0}
    if scored:
        return HACKABLE, "scored by " + ", ".join(f"attack {name} (reward {r:g})" for name, r in sorted(scored.items()))
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
                    concurrency: int = 4, attacks: dict[str, Path] | None = None) -> dict[str, Any]:
    """Run gold and empty K times per task, and each attack once (`attacks`: name -> script);
    write and return the manifest."""
    from slime_harbor.rollout import run_rollouts
    from slime_harbor.trial_setup import RolloutConfig

    if repeats < 1:
        raise ConfigError(f"repeats must be at least 1, got {repeats}")
    tasks_dir = Path(tasks_dir)
    out = Path(out) if out is not None else tasks_dir / "calibration.json"
    runs = Path(tempfile.mkdtemp(prefix="slime-harbor-calibrate-"))

    async def run(agent: str, tasks: Path, n: int, name: str) -> dict[str, list[dict]]:
        cfg = RolloutConfig(tasks_dir=tasks, agent=agent, n_samples=n, env=env, concurrency=concurrency,
                            out_dir=runs / name, reward_mapping="raw", progress=False)
        await run_rollouts(cfg)
        grouped: dict[str, list[dict]] = {}
        for line in (runs / name / "samples.jsonl").read_text().splitlines():
            sample = json.loads(line)
            if sample["metadata"].get("segment", 0) == 0:
                grouped.setdefault(sample["metadata"]["task_name"], []).append(sample)
        return grouped

    try:
        by_agent = {agent: await run(agent, tasks_dir, repeats, agent) for agent in ("oracle", "nop")}
        attacked: dict[str, dict[str, float | None]] = {}
        if attacks:
            probe_tasks, origin = _attack_tasks(tasks_dir, attacks, runs / "attack-tasks")
            for copy, samples in (await run("oracle", probe_tasks, 1, "attacks")).items():
                task, attack = origin[copy]
                attacked.setdefault(task, {})[attack] = samples[0]["reward"]
        tasks: dict[str, dict] = {}
        for name in sorted(set(by_agent["oracle"]) | set(by_agent["nop"])):
            gold_samples, empty_samples = by_agent["oracle"].get(name, []), by_agent["nop"].get(name, [])
            gold = [s["reward"] for s in gold_samples]
            empty = [s["reward"] for s in empty_samples]
            tampered = next((s["metadata"]["status_reason"] for s in gold_samples if s["metadata"].get("tampering")), None)
            status, reason = judge(gold, empty, _gold_dropped(gold_samples), attacked.get(name), tampered)
            failures = sorted({s["metadata"].get("status_reason") for s in gold_samples + empty_samples
                               if s["reward"] is None and s["metadata"].get("status_reason")})
            tasks[name] = {"status": status, "reason": reason, "gold": gold, "empty": empty,
                           **({"attacks": attacked.get(name, {})} if attacks else {}),
                           **({"failures": failures} if failures else {})}
    finally:
        shutil.rmtree(runs, ignore_errors=True)
    manifest = {
        "repeats": repeats, "env": env, "tasks": tasks,
        **{kind: {n: t["reason"] for n, t in tasks.items() if t["status"] == kind} for kind in (BROKEN, HACKABLE, FLAKY)},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _attack_tasks(tasks_dir: Path, attacks: dict[str, Path], root: Path) -> tuple[Path, dict[str, tuple[str, str]]]:
    """A copy of every task per attack, whose solution is the attack script (Harbor's oracle runs
    it), named TASK--ATTACK; and copy name -> (task, attack). The environment/ is copied as is, so
    Docker reuses the task's image."""
    from slime_harbor.trial_setup import discover_tasks

    root.mkdir(parents=True)
    origin = {}
    for task in discover_tasks(tasks_dir):
        for attack, script in attacks.items():
            copy = root / f"{task.name}--{attack}"
            shutil.copytree(task, copy, ignore=shutil.ignore_patterns("solution"), symlinks=True)
            (copy / "solution").mkdir()
            (copy / "solution" / "solve.sh").write_text(script.read_text())
            (copy / "solution" / "solve.sh").chmod(0o755)
            origin[copy.name] = (task.name, attack)
    return root, origin


def main(tasks_dir: Path, env: str, repeats: int, out: Path | None, probe_hacks: bool = False,
         attacks_dirs: list[Path] = ()) -> dict:
    from slime_harbor.trial_setup import check_environment_runs, discover_tasks

    try:
        discover_tasks(tasks_dir)
    except FileNotFoundError as exc:
        raise ConfigError(str(exc)) from None
    if attacks_dirs and not probe_hacks:
        raise ConfigError("--attacks needs --probe-hacks")
    attacks = attack_scripts(attacks_dirs) if probe_hacks else None
    check_environment_runs(env)
    manifest = asyncio.run(calibrate(tasks_dir, env=env, repeats=repeats, out=out, attacks=attacks))
    where = out or Path(tasks_dir) / "calibration.json"
    counts = {s: sum(t["status"] == s for t in manifest["tasks"].values()) for s in (OK, BROKEN, HACKABLE, FLAKY)}
    print(f"{counts[OK]} ok, {counts[BROKEN]} broken, {counts[HACKABLE]} hackable, {counts[FLAKY]} flaky"
          + (f" ({len(attacks)} attacks probed)" if attacks else "") + f"; manifest: {where}")
    for kind in (BROKEN, HACKABLE, FLAKY):
        for name, reason in manifest[kind].items():
            print(f"  {kind}: {name}: {reason}")
    return manifest
