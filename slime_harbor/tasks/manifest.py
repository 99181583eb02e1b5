"""A `slime-harbor calibrate` manifest, read: which tasks a run skips, and why.

`calibrate` (slime_harbor/calibrate.py) writes it; `rollout`, `train-local` and the SLiME hook read
it here (`--task-manifest`, `harbor_task_manifest`), without importing the calibration itself.
"""

from __future__ import annotations

import json
from pathlib import Path

from slime_harbor.exits import ConfigError

OK, BROKEN, FLAKY, HACKABLE = "ok", "broken", "flaky", "hackable"
SKIPPED = (BROKEN, HACKABLE, FLAKY)


def load_manifest(path: Path | str) -> dict[str, str]:
    """Task name -> why it is skipped (broken, hackable or flaky), from a calibrate manifest; ConfigError
    (one line) when the file is missing or not a manifest."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"task manifest {path} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"task manifest {path} is not JSON: {exc}") from None
    tasks = data.get("tasks") if isinstance(data, dict) else None
    if not isinstance(tasks, dict) or not all(isinstance(t, dict) and "status" in t for t in tasks.values()):
        raise ConfigError(f"task manifest {path} is not a calibrate manifest (no 'tasks' with a status each)")
    return {name: f"{t['status']}: {t.get('reason', '')}" for name, t in tasks.items()
            if t["status"] in SKIPPED}


def apply_manifest(tasks: list[Path], manifest: Path | str | None) -> tuple[list[Path], dict[str, str]]:
    """(the tasks to run, skipped task name -> reason). No manifest: every task runs."""
    if manifest is None:
        return list(tasks), {}
    skip = load_manifest(manifest)
    kept = [t for t in tasks if Path(t).name not in skip]
    return kept, {Path(t).name: skip[Path(t).name] for t in tasks if Path(t).name in skip}


def task_watch_mode(manifest: Path | str | None, task_name: str) -> tuple[str | None, str | None]:
    """(mode, reason) of a task's grading watch, as its manifest entry records it under
    ``grader_watch`` ({"mode": "files" | "off", "reason": ...}; calibrate writes "files" for a task
    whose own code inspects frames); (None, None): watched whole."""
    if manifest is None:
        return None, None
    try:
        entry = json.loads(Path(manifest).read_text())["tasks"].get(task_name) or {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None, None  # load_manifest has refused a bad manifest in one line before any trial
    watch = entry.get("grader_watch") if isinstance(entry, dict) else None
    if not isinstance(watch, dict) or watch.get("mode") not in ("files", "off"):
        return None, None
    return watch["mode"], str(watch.get("reason") or "the task's manifest says so")
