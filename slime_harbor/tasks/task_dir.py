"""A Harbor task dir, as the rest of the package reads it: which dirs of a tasks dir are tasks,
where a task's agent works, and which tasks are canaries (impossible variants: canaries.py writes
them under CANARY_PREFIX; the runners, the twins and train-local's checks tell them by it). Below everything that runs trials (trial_setup, the hack monitor,
calibrate, the canaries), so each reads these facts here instead of parsing task.toml again."""

from __future__ import annotations

import tomllib
from pathlib import Path

CANARY_PREFIX = "canary--"
"""Every canary's task name starts with it, so a canary is never mistaken for its task."""


def is_canary(task_name: str) -> bool:
    return task_name.startswith(CANARY_PREFIX)


def discover_tasks(tasks_dir: Path, names: list[str] | None = None, exclude: list[str] | None = None) -> list[Path]:
    """The task dirs (dirs with task.toml) in `tasks_dir`: only `names` if given, less `exclude`;
    a name in either that is not a task there is a FileNotFoundError (a typo never runs everything)."""
    tasks_dir = Path(tasks_dir)
    if not tasks_dir.is_dir():
        raise FileNotFoundError(f"tasks dir {tasks_dir} does not exist")
    tasks = sorted(p for p in tasks_dir.iterdir() if (p / "task.toml").is_file())
    missing = (set(names or []) | set(exclude or [])) - {p.name for p in tasks}
    if missing:
        raise FileNotFoundError(f"tasks not found in {tasks_dir}: {sorted(missing)}")
    if names:
        tasks = [p for p in tasks if p.name in names]
    tasks = [p for p in tasks if p.name not in (exclude or [])]
    if not tasks:
        raise FileNotFoundError(f"no Harbor tasks (dirs with task.toml) in {tasks_dir}")
    return tasks


def task_workdir(task_dir: Path, default: str = "/app") -> str:
    """Where the task's agent works: task.toml's [environment] workdir, else `default` (/app, the
    bundled tasks' and families'; a SWE-bench-format task's reader passes /testbed)."""
    try:
        config = tomllib.loads((Path(task_dir) / "task.toml").read_text())
    except (OSError, ValueError):
        return default
    return (config.get("environment") or {}).get("workdir") or default

