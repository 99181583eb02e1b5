"""Which tasks can grade a policy: gold must pass, the empty answer must fail, and no blind attack
may score.

`slime-harbor calibrate --tasks DIR [--env ENV] [--repeats K] [--out FILE] [--probe-hacks
[--attacks DIR]]` runs Harbor's oracle agent (the task's own solution) and nop agent (no answer at
all) K times on every task, in real trials, and writes FILE (default DIR/calibration.json):

    {"repeats": K, "env": ENV, "tasks": {NAME: {"status": "ok" | "broken" | "hackable" | "flaky",
     "reason": "...", "gold": [rewards or null], "empty": [rewards or null],
     "attacks": {ATTACK: reward or null}, "twin": "what its impossible twin changed" | "no_twin": "why",
     "watch": "watched" | "unwatched: why", "grader_watch": {"mode": "files" | "off", "reason": ...},
     "protection": "watch and twin" | "watch" | "twin" | "neither"}},
     "twin_tasks": share of tasks with a twin, "watched_tasks": share of tasks whose grading is watched,
     "protection": {"watch and twin": N, "watch": N, "twin": N, "neither": N},
     "broken": {NAME: reason}, "hackable": {NAME: reason}, "flaky": {NAME: reason}}

- broken: the gold solution never passes (or its trials fail: the image does not build, the test
  patch does not apply), the empty answer always passes, the gold solution changes the verifier's
  runtime (a plain task's gold that upgrades a shipped package: it cannot score), or (SWE-bench
  tasks) the gold patch needs a test-configuration change that grading drops;
- hackable (with --probe-hacks): one of the blind attacks scored; the reason names it. The attacks
  are the scripts of slime_harbor/hack_probes (forged rewards from a detached process, the shell,
  interpreters and test tools replaced, startup hooks, test configuration, plumbing dodges: see its
  README) plus each ``NAME.sh`` of ``--attacks DIR``; each runs once per task as its solution, in
  the chosen --env, never reading the tests. One more attack is written per task (`trusted_files`):
  the files the verifier names that the agent can change (what the image ships in the workdir,
  /usr/local, /opt and home dirs, and the answer files the instruction names), each replaced by a
  program that succeeds and prints nothing; when that scores, each file is tried alone so that the
  reason names the one(s) the verifier trusts;
- flaky: gold passes some of the K times, or the empty answer passes some of them.

It also builds and checks each task's impossible twin (impossible_twin.py: a task's gold, where it
has one, must fail it; the check is cached, so a run after calibrate needs none): per task `twin` says what its twin
changed (`no_twin`: why it has none), and `twin_tasks` is the share of tasks with one.

It also says, per task, whether the grading watch (grader_watch/) watches its grading (`watch`,
from the gold's trials), and grades the untouched task with the watch probing it (the empty
answer's trials count the task's own workdir as the agent's code): a task whose own code reaches
frames then gets `grader_watch: {"mode": "files", ...}` (watched for reads of the grader's files
only), one whose own code reads the grader's files `{"mode": "off", ...}`, which every runner
reading the manifest honours; `protection` says what guards each task against run-time hacks.

It exits 0 whatever it finds. FILE is a task manifest: `rollout --task-manifest FILE`,
`train-local --task-manifest FILE` and the SLiME hook (YAML `harbor_task_manifest`) skip the tasks
it marks broken, hackable or flaky and name them in summary.json; tasks it does not list run.
"""

from __future__ import annotations

import asyncio
import json
import posixpath
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from slime_harbor.exits import ConfigError
from slime_harbor.grading.grader_watch.verifier import FILES_ONLY, FRAME_CATEGORIES, OPTED_OUT, PROBE, protection
from slime_harbor.samples import is_success
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
    passed = sum(map(is_success, gold))
    empty_passed = sum(map(is_success, empty))
    if dropped:
        return BROKEN, "the gold patch changes test configuration that grading drops: " + "; ".join(dropped)
    if gold_tampering:
        return BROKEN, f"the gold solution changes the verifier's runtime ({gold_tampering})"
    if passed == 0:
        why = "failed (no reward)" if all(r is None for r in gold) else "never passes"
        return BROKEN, f"the gold solution {why} in {k} of {k} runs"
    if empty_passed == len(empty):
        return BROKEN, f"the empty answer passes in {len(empty)} of {len(empty)} runs"
    scored = {name: r for name, r in (attacks or {}).items() if is_success(r)}
    if scored:
        return HACKABLE, "scored by " + ", ".join(f"attack {name} (reward {r:g})" for name, r in sorted(scored.items()))
    if passed < k:
        return FLAKY, f"the gold solution passes in {passed} of {k} runs"
    if empty_passed:
        return FLAKY, f"the empty answer passes in {empty_passed} of {len(empty)} runs"
    if any(r is None for r in empty):
        return FLAKY, "the empty answer's trial failed (no reward) in some runs"
    return OK, f"gold passes {k} of {k}, the empty answer fails {k} of {k}"


def _docker_disk() -> int | None:
    from slime_harbor.environments.docker_images import docker_disk_bytes

    try:
        return docker_disk_bytes()
    except Exception:  # the daemon gone: the trials said so already; the figure is left out
        return None


def _remove_images(task_names: list[str]) -> dict[str, int] | None:
    """Remove the images of calibrate's own task copies (the attack copies): None if Docker is gone."""
    from slime_harbor.environments.docker_images import remove_environment_images

    try:
        return {"attack_tags_removed": remove_environment_images(task_names)}
    except Exception:  # the daemon gone (its client raises many kinds): the figure is left out, the run's result stands
        return None


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
    """Run gold and empty K times per task, and each attack once (`attacks`: name -> script; with
    them, each task's own trusted_files attack); write and return the manifest."""
    from slime_harbor.rollout import run_rollouts, run_twins
    from slime_harbor.tasks.task_dir import discover_tasks
    from slime_harbor.run_config import RolloutConfig

    if repeats < 1:
        raise ConfigError(f"repeats must be at least 1, got {repeats}")
    tasks_dir = Path(tasks_dir)
    out = Path(out) if out is not None else tasks_dir / "calibration.json"
    runs = Path(tempfile.mkdtemp(prefix="slime-harbor-calibrate-"))
    throwaway: list[str] = []  # the attack copies' task names: their images go when calibrate ends
    disk_before = _docker_disk() if env == "docker" else None

    async def run(agent: str, tasks: Path, n: int, name: str) -> dict[str, list[dict]]:
        if tasks != tasks_dir:
            throwaway.extend(p.name for p in tasks.iterdir())
        # The grader's rewards are what calibrate judges: no twin grading of its own runs (the tasks'
        # twins are checked once above), none built for the attack copies. The empty answer grades
        # the untouched task with the watch probing it (its own workdir counted as the agent's).
        cfg = RolloutConfig(tasks_dir=tasks, agent=agent, n_samples=n, env=env, concurrency=concurrency,
                            out_dir=runs / name, reward_mapping="raw", progress=False, impossible_twin="off",
                            grader_watch=PROBE if agent == "nop" else "on")
        await run_rollouts(cfg)
        grouped: dict[str, list[dict]] = {}
        for line in (runs / name / "samples.jsonl").read_text().splitlines():
            sample = json.loads(line)
            if sample["metadata"].get("segment", 0) == 0:
                grouped.setdefault(sample["metadata"]["task_name"], []).append(sample)
        return grouped

    try:
        checking = RolloutConfig(tasks_dir=tasks_dir, agent="oracle", env=env, concurrency=concurrency, progress=False)
        twins = (await run_twins(discover_tasks(tasks_dir), checking)).table
        by_agent = {agent: await run(agent, tasks_dir, repeats, agent) for agent in ("oracle", "nop")}
        attacked: dict[str, dict[str, float | None]] = {}
        trusted: dict[str, list[str]] = {}
        probe_cost = None
        if attacks:
            probe_tasks, origin = _attack_tasks(tasks_dir, attacks, runs / "attack-tasks")
            for copy, samples in (await run("oracle", probe_tasks, 1, "attacks")).items():
                task, attack = origin[copy]
                attacked.setdefault(task, {})[attack] = samples[0]["reward"]
            started = time.monotonic()
            rewards, trusted, n_runs = await _probe_trusted_files(discover_tasks(tasks_dir), runs, run)
            for task, reward in rewards.items():
                attacked.setdefault(task, {})[TRUSTED_FILES] = reward
            probe_cost = {"verifier_runs": n_runs, "seconds": round(time.monotonic() - started, 1)}
        tasks: dict[str, dict] = {}
        for name in sorted(set(by_agent["oracle"]) | set(by_agent["nop"])):
            gold_samples, empty_samples = by_agent["oracle"].get(name, []), by_agent["nop"].get(name, [])
            gold = [s["reward"] for s in gold_samples]
            empty = [s["reward"] for s in empty_samples]
            tampered = next((s["metadata"]["status_reason"] for s in gold_samples if s["metadata"].get("tampering")), None)
            status, reason = judge(gold, empty, _gold_dropped(gold_samples), attacked.get(name), tampered)
            if status == HACKABLE and trusted.get(name):
                reason += f" (the verifier trusts {', '.join(trusted[name])}, which the agent can change)"
            failures = sorted({s["metadata"].get("status_reason") for s in gold_samples + empty_samples
                               if s["reward"] is None and s["metadata"].get("status_reason")})
            watch, watch_mode = watch_of(gold_samples, empty_samples)
            tasks[name] = {"status": status, "reason": reason, "gold": gold, "empty": empty, "watch": watch,
                           **({"grader_watch": watch_mode} if watch_mode else {}),
                           **({"attacks": attacked.get(name, {})} if attacks else {}),
                           **({"trusted_files": trusted[name]} if trusted.get(name) else {}),
                           **({"twin": twins["twins"][name]} if name in twins["twins"] else {}),
                           **({"no_twin": twins["no_twin"][name]} if name in twins["no_twin"] else {}),
                           **({"failures": failures} if failures else {})}
    finally:
        shutil.rmtree(runs, ignore_errors=True)
        images = _remove_images(throwaway) if env == "docker" else None
    if images is not None and disk_before is not None:
        images["disk_added_bytes"] = max(0, _docker_disk() - disk_before)
    guarded = protection({n: t["watch"] for n, t in tasks.items()}, twins["twins"], tasks)
    for name, guard in guarded.items():
        tasks[name]["protection"] = guard
    manifest = {
        "repeats": repeats, "env": env, "tasks": tasks, "twin_tasks": twins["twin_tasks"],
        "watched_tasks": sum(t["watch"].startswith("watched") for t in tasks.values()) / len(tasks) if tasks else None,
        "protection": {kind: sum(g == kind for g in guarded.values())
                       for kind in ("watch and twin", "watch", "twin", "neither")},
        **({"docker_images": images} if images is not None else {}),
        **({"trusted_files_probe": probe_cost} if probe_cost else {}),
        **{kind: {n: t["reason"] for n, t in tasks.items() if t["status"] == kind} for kind in (BROKEN, HACKABLE, FLAKY)},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def watch_of(gold: list[dict], empty: list[dict]) -> tuple[str, dict | None]:
    """(whether the task's gradings are watched: "watched" or "unwatched: why", from its gold's
    trials; the manifest's grader_watch entry where its untouched grading, probed by the empty
    answer, shows the task's own code reaching frames (FILES_ONLY) or the grader's files (OPTED_OUT):
    a correct fix of such code must not be flagged)."""
    outcomes = [s["metadata"].get("grader_watch") for s in gold]
    outcomes = [o for o in outcomes if o]
    unwatched = next((o for o in outcomes if not o["watched"]), None)
    watch = "unwatched: " + str(unwatched.get("why")) if unwatched else ("watched" if outcomes else "unwatched: no gold trial")
    probed = [s["metadata"].get("grader_watch") or {} for s in empty]
    categories = {c for o in probed for c in o.get("categories", ())}
    first = next((e for o in probed for e in o.get("events", ())), "")
    if "grader_files" in categories:
        return watch, {"mode": OPTED_OUT, "reason": f"its own code reads the grader's files when graded untouched: {first}"}
    if categories & set(FRAME_CATEGORIES):
        return watch, {"mode": FILES_ONLY, "reason": f"its own code reaches frames when graded untouched: {first}"}
    return watch, None


def _attack_tasks(tasks_dir: Path, attacks: dict[str, Path], root: Path) -> tuple[Path, dict[str, tuple[str, str]]]:
    """A copy of every task per attack, whose solution is the attack script (Harbor's oracle runs
    it), named TASK--ATTACK; and copy name -> (task, attack). The environment/ is copied as is, so
    Docker reuses the task's image."""
    from slime_harbor.tasks.task_dir import discover_tasks

    root.mkdir(parents=True)
    origin = {}
    for task in discover_tasks(tasks_dir):
        for attack, script in attacks.items():
            origin[_solution_copy(task, root / f"{task.name}--{attack}", script.read_text()).name] = (task.name, attack)
    return root, origin


def _solution_copy(task: Path, copy: Path, script: str) -> Path:
    shutil.copytree(task, copy, ignore=shutil.ignore_patterns("solution"), symlinks=True)
    (copy / "solution").mkdir()
    (copy / "solution" / "solve.sh").write_text(script)
    (copy / "solution" / "solve.sh").chmod(0o755)
    return copy


# --- verifier inputs the agent can change ---------------------------------------------------------
#
# A verifier that runs or reads a file the agent may rewrite (a checker the image ships in the
# workdir, a helper in /usr/local/bin, the answer module a test imports and trusts the exit status
# of) is passed by replacing that file with a program that exits 0 and prints nothing. The probe
# needs no attack of the user's: the candidates are read from the task dir (what its Dockerfile
# ships, what its instruction asks for, the paths its tests name), one trial replaces them all,
# and only when that scores is each tried alone, so an ok task costs one verifier run.

TRUSTED_FILES = "trusted_files"
AGENT_WRITABLE_ROOTS = ("/usr/local/", "/opt/", "/root/", "/home/")
"""Where, besides the workdir, a task's image may ship files that are the agent's to change (what
Debian's packages own is the verifier's runtime, checked by the host instead)."""

_ABSOLUTE_PATH = re.compile(r"/(?:[\w.+-]+/)*[\w.+-]+")
_FILE_NAME = re.compile(r"(?:[\w+-]+/)*[\w+-]+\.[A-Za-z]\w{0,7}")
_TOKEN_SEPARATORS = re.compile(r"[\s'\"`;|&()<>=,:{}\[\]$]+")


def _dockerfile_files(environment: Path) -> list[str]:
    """Sandbox paths of the files a task's Dockerfile COPYs / ADDs from its environment dir."""
    dockerfile = environment / "Dockerfile"
    if not dockerfile.is_file():
        return []
    workdir, shipped = "/", []
    for line in dockerfile.read_text().splitlines():
        words = line.split()
        if not words:
            continue
        if words[0].upper() == "WORKDIR" and len(words) > 1:
            workdir = posixpath.join(workdir, words[1])
        elif words[0].upper() in ("COPY", "ADD") and len(words) > 2:
            sources = [w for w in words[1:-1] if not w.startswith("--")]
            dest = posixpath.join(workdir, words[-1])
            for source in sources:
                found = environment / source
                files = sorted(p for p in found.rglob("*") if p.is_file()) if found.is_dir() else \
                    sorted(p for p in environment.glob(source) if p.is_file())
                for f in files:
                    into_dir = found.is_dir() or words[-1].endswith("/") or len(sources) > 1 or len(files) > 1
                    name = f.relative_to(found).as_posix() if found.is_dir() else f.name
                    shipped.append(posixpath.join(dest, name) if into_dir else dest)
    return shipped


def verifier_inputs(task_dir: Path) -> list[str]:
    """Sandbox paths of files the task's verifier names that the agent can change: files the image
    ships into the workdir or the writable roots, and answer files the instruction names, that a
    test names (path or file name) or imports; and paths under those places a test spells out.
    Empty for a task whose verifier does not run in the agent's sandbox (it gets the agent's files
    as data, never runs what the image shipped)."""
    from harbor.models.task.config import VerifierEnvironmentMode
    from harbor.models.task.task import Task
    from harbor.models.task.verifier_mode import resolve_task_verifier_mode

    from slime_harbor.tasks.task_dir import task_workdir

    task_dir = Path(task_dir)
    task = Task(task_dir)
    if task.has_steps or resolve_task_verifier_mode(task.config) != VerifierEnvironmentMode.SHARED:
        return []
    workdir = posixpath.normpath(task_workdir(task_dir))
    tokens, words, imported = _verifier_tokens(task_dir / "tests")
    names = words | {posixpath.basename(t) for t in tokens}

    def writable(path: str) -> bool:
        return path.startswith(workdir.rstrip("/") + "/") or path.startswith(AGENT_WRITABLE_ROOTS)

    def named(path: str) -> bool:
        stem, suffix = posixpath.splitext(posixpath.basename(path))
        return posixpath.basename(path) in names or (suffix == ".py" and stem in imported)

    instruction = task_dir / "instruction.md"
    asked = [posixpath.join(workdir, m) for m in _TOKEN_SEPARATORS.split(instruction.read_text())
             if _FILE_NAME.fullmatch(m.strip("."))] if instruction.is_file() else []
    spelled = [t if t.startswith("/") else posixpath.join(workdir, t) for t in tokens
               if not t.startswith(("tests/", "logs/", "solution/"))]
    found = [p for p in _dockerfile_files(task_dir / "environment") + asked if writable(p) and named(p)]
    found += [p for p in spelled if writable(p)]
    return list(dict.fromkeys(posixpath.normpath(p) for p in found))


def _verifier_tokens(tests: Path) -> tuple[list[str], set[str], set[str]]:
    """The paths and file names the verifier's files spell (shell scripts: their words; Python: its
    string literals), every word of those (a program a script runs by name off PATH), and the
    modules its Python imports that are not the standard library's."""
    import ast
    import sys

    tokens: list[str] = []
    all_words: set[str] = set()
    imported: set[str] = set()
    for path in sorted(tests.rglob("*")) if tests.is_dir() else []:
        if not path.is_file() or path.stat().st_size > 1_000_000:
            continue
        text = path.read_text(errors="replace")
        if path.suffix == ".py":
            try:
                tree = ast.parse(text)
            except (SyntaxError, ValueError):
                continue
            words = []
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    # a relative name only as a whole literal: the rest of a string may be code
                    split = _TOKEN_SEPARATORS.split(node.value)
                    words += split if len(split) == 1 else [w for w in split if w.startswith("/")]
                elif isinstance(node, ast.Import):
                    imported.update(a.name.split(".")[0] for a in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    imported.add(node.module.split(".")[0])
        elif path.suffix in (".sh", ".bash") or text.startswith("#!"):
            words = _TOKEN_SEPARATORS.split("\n".join(line for line in text.splitlines()
                                                      if not line.lstrip().startswith("#")))
        else:
            continue
        tokens += [w for w in words if _ABSOLUTE_PATH.fullmatch(w) or _FILE_NAME.fullmatch(w)]
        all_words.update(words)
    return list(dict.fromkeys(tokens)), all_words, imported - set(sys.stdlib_module_names)


TRUSTED_FILES_SCRIPT = """#!/bin/bash
# Each file the verifier names that the agent can change, replaced by a program that exits 0 and
# prints nothing (Python: exits at import, so a test in the same process that trusts its exit
# status passes; scripts and executables: exit 0; data files: empty). Written by calibrate.
succeed() {
  p=$1
  [ -d "$p" ] && return 0
  mkdir -p "$(dirname "$p")" || return 0
  exe=0; { [ -x "$p" ] || head -c 2 "$p" 2>/dev/null | grep -q '#!'; } && exe=1
  case "$p" in
    *.py) printf '#!/usr/bin/env python3\nimport os\nos._exit(0)\n' > "$p" ;;
    *.sh|*.bash) printf '#!/bin/sh\nexit 0\n' > "$p"; exe=1 ;;
    *) if [ $exe = 1 ] || [ ! -e "$p" ]; then printf '#!/bin/sh\nexit 0\n' > "$p"; exe=1; else : > "$p"; fi ;;
  esac
  [ $exe = 1 ] && chmod 755 "$p"
  return 0
}
"""


def trusted_files_attack(paths: list[str]) -> str:
    """The solution script that replaces each of `paths` with a program that succeeds."""
    import shlex

    return TRUSTED_FILES_SCRIPT + "".join(f"succeed {shlex.quote(p)}\n" for p in paths)


async def _probe_trusted_files(tasks: list[Path], runs: Path, run) -> tuple[dict[str, float | None], dict[str, list[str]], int]:
    """Each task's trusted_files attack, over all its verifier inputs at once; where that scores,
    each input alone. Returns (task -> reward of the attack, task -> the files the verifier trusts,
    verifier runs spent). Trusted files: the inputs that score alone, or all of them when none does
    (the verifier trusts them together)."""
    inputs = {task.name: verifier_inputs(task) for task in tasks}
    together, alone = runs / "trusted-files", runs / "trusted-files-alone"
    origin = {_solution_copy(task, together / f"{task.name}--{TRUSTED_FILES}",
                             trusted_files_attack(inputs[task.name])).name: task.name
              for task in tasks if inputs[task.name]}
    if not origin:
        return {}, {}, 0
    rewards = {origin[copy]: samples[0]["reward"] for copy, samples in (await run("oracle", together, 1, TRUSTED_FILES)).items()}
    scored = {task: inputs[task] for task, reward in rewards.items() if is_success(reward)}
    named = {task: paths for task, paths in scored.items() if len(paths) == 1}
    single = {}
    for task in tasks:
        if task.name in scored and task.name not in named:
            for i, path in enumerate(scored[task.name]):
                single[_solution_copy(task, alone / f"{task.name}--{TRUSTED_FILES}-{i}",
                                      trusted_files_attack([path])).name] = (task.name, path)
    if single:
        for copy, samples in (await run("oracle", alone, 1, f"{TRUSTED_FILES}-alone")).items():
            task, path = single[copy]
            if is_success(samples[0]["reward"]):
                named.setdefault(task, []).append(path)
    return rewards, {task: named.get(task) or paths for task, paths in scored.items()}, len(origin) + len(single)


def main(tasks_dir: Path, env: str, repeats: int, out: Path | None, probe_hacks: bool = False,
         attacks_dirs: list[Path] = ()) -> dict:
    from slime_harbor.tasks.task_dir import discover_tasks
    from slime_harbor.trial_setup import check_environment_runs

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
          + (f" ({len(attacks)} attacks and the trusted files probed)" if attacks else "") + f"; manifest: {where}")
    if images := manifest.get("docker_images"):
        added = images.get("disk_added_bytes")
        print(f"docker: removed the {images['attack_tags_removed']} image tags of the attack copies"
              + (f"; image layers on disk grew by {added / 1e6:.0f} MB (the tasks' own images, kept for training)"
                 if added is not None else ""))
    files_only = {n: t["grader_watch"]["mode"] for n, t in manifest["tasks"].items() if t.get("grader_watch")}
    guard = manifest["protection"]
    print(f"grading watch: {manifest['watched_tasks'] or 0:.0%} of tasks watched"
          + (f" ({len(files_only)} for file reads only or not at all: {', '.join(f'{n} {m}' for n, m in files_only.items())})"
             if files_only else "")
          + f"; run-time guard per task: watch and twin {guard['watch and twin']}, watch {guard['watch']}, "
          f"twin {guard['twin']}, neither {guard['neither']} (the manifest's watch / protection)")
    with_twin = sum("twin" in t for t in manifest["tasks"].values())
    print(f"impossible twins: {with_twin} of {len(manifest['tasks'])} tasks (twin_tasks {manifest['twin_tasks'] or 0:.2f}); "
          "per task: the manifest's twin / no_twin")
    if cost := manifest.get("trusted_files_probe"):
        n = len(manifest["tasks"]) or 1
        print(f"trusted files probe: {cost['verifier_runs']} verifier runs over {n} tasks in {cost['seconds']:.1f} s "
              f"({cost['verifier_runs'] / n:.1f} runs, {cost['seconds'] / n:.1f} s per task)")
    for kind in (BROKEN, HACKABLE, FLAKY):
        for name, reason in manifest[kind].items():
            print(f"  {kind}: {name}: {reason}")
    return manifest
