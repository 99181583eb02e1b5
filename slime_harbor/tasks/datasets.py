"""Harbor datasets named from a registry (`terminal-bench@2.0`, as `harbor run -d` takes them),
wherever a tasks dir is taken: `--tasks NAME[@VERSION]`, the SLiME hook's `harbor_tasks`.

What this module owns: telling a dataset name from a tasks dir, and the tasks dir a dataset
becomes. What it leaves to Harbor: reading the registry (`--registry-path FILE`, `--registry-url
URL`, else Harbor's own), picking the version, filtering by task name (glob patterns, as
`harbor run -i / -x`) and downloading. The dataset is resolved by the `DatasetConfig` that
`harbor run -d NAME@VERSION` builds and downloaded by `JobPlan.cache_tasks`, as `harbor run` does,
into Harbor's cache layout under ours ($SLIME_HARBOR_CACHE/harbor-tasks). The tasks dir handed to
the rest of the code is $SLIME_HARBOR_CACHE/datasets/<NAME[@VERSION]>-<digest>/, one link per
chosen task (named as the task) into that download.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import os
import re
import subprocess
from fnmatch import fnmatch
from pathlib import Path

from slime_harbor.exits import ConfigError, one_line
from slime_harbor.cache import cache_dir
from slime_harbor.tasks.task_dir import discover_tasks

DATASET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(@[A-Za-z0-9][A-Za-z0-9._+-]*)?")
"""NAME or NAME@VERSION of a dataset in a Harbor registry (Harbor's `org/name` packages are not
taken here: a name with a slash is a path)."""


def is_dataset_name(tasks: str | Path) -> bool:
    """Whether `tasks` names a Harbor dataset: no such path exists, and it reads NAME[@VERSION]."""
    return not Path(tasks).exists() and DATASET_NAME.fullmatch(str(tasks)) is not None


def select_tasks(tasks: str | Path, include: list[str] | None = None, exclude: list[str] | None = None,
                 registry_path: Path | None = None, registry_url: str | None = None) -> tuple[Path, list[str] | None]:
    """--tasks and its filters -> the (tasks dir, task names) a RolloutConfig takes.

    A directory works as it always has: `include` are dir names, passed on as they are;
    `exclude` (dir names too) turns into the list of the names left. A dataset name is resolved,
    filtered (`include` / `exclude` are Harbor's glob patterns) and downloaded: its tasks dir holds
    exactly the chosen tasks. Anything that cannot be resolved is a ConfigError (one line)."""
    if not is_dataset_name(tasks):
        if registry_path is not None or registry_url is not None:
            raise ConfigError(f"--registry-path / --registry-url name where a dataset is found, but {tasks} is a "
                              "path, not a dataset NAME[@VERSION]")
        if not exclude:
            return Path(tasks), include
        try:
            return Path(tasks), [p.name for p in discover_tasks(Path(tasks), include, exclude)]
        except FileNotFoundError as exc:
            raise ConfigError(str(exc)) from None
    return download_dataset(str(tasks), include, exclude, registry_path, registry_url), None


def download_dataset(name_version: str, include: list[str] | None = None, exclude: list[str] | None = None,
                     registry_path: Path | None = None, registry_url: str | None = None) -> Path:
    """Resolve NAME[@VERSION] in the registry, keep the tasks the filters choose, download them
    (already downloaded pinned commits are reused) and return a tasks dir holding exactly them."""
    from harbor.job_plan import JobPlan
    from harbor.models.job.config import DatasetConfig

    name, _, version = name_version.partition("@")
    where = registry_path or registry_url or "Harbor's registry"
    if registry_path is not None and not Path(registry_path).exists():
        raise ConfigError(f"--registry-path {registry_path} does not exist")

    def dataset(**filters) -> DatasetConfig:
        return DatasetConfig(name=name, version=version or None, registry_path=registry_path,
                             registry_url=registry_url, download_dir=cache_dir() / "harbor-tasks", **filters)

    try:
        every = _run(dataset().get_task_configs())
    except Exception as exc:  # unknown name or version, a registry file that does not parse, no network
        raise ConfigError(f"{name_version} is neither a directory nor a dataset in {where}: {one_line(exc)}") from None
    names = [config.get_task_id().get_name() for config in every]
    # Harbor drops an include pattern or an exclusion that matches nothing without a word (a typo
    # would train on the task meant to be left out): each one must name a task of the dataset.
    unmatched = [p for p in [*(include or []), *(exclude or [])] if not any(fnmatch(n, p) for n in names)]
    if unmatched:
        raise ConfigError(f"dataset {name_version} has no task matching {', '.join(unmatched)} "
                          f"(its {len(names)} tasks: {', '.join(sorted(names)[:8])}{', ...' if len(names) > 8 else ''})")
    chosen = _run(dataset(task_names=include, exclude_task_names=exclude).get_task_configs()) if include or exclude else every
    if not chosen:
        raise ConfigError(f"dataset {name_version}: every task is excluded")
    try:
        downloads = _run(JobPlan.cache_tasks(chosen))
    except Exception as exc:  # git cannot reach or check out the task's repository or commit
        raise ConfigError(f"dataset {name_version}: download failed: {_why(exc)}") from None
    paths = {config.get_task_id().get_name(): downloads[config.get_task_id()].path for config in chosen}
    if len(paths) < len(chosen):
        raise ConfigError(f"dataset {name_version} has two tasks of one name; choose among them with --exclude-task-name")
    return _tasks_dir(name_version, paths)


def _tasks_dir(name_version: str, paths: dict[str, Path]) -> Path:
    """A dir of links named as the tasks, one per download; its name says which downloads, so a
    dataset chosen or pinned otherwise gets another dir and none is ever half-rewritten for it."""
    digest = hashlib.sha256("\n".join(f"{n}={p}" for n, p in sorted(paths.items())).encode()).hexdigest()[:12]
    root = cache_dir() / "datasets" / f"{name_version}-{digest}"
    root.mkdir(parents=True, exist_ok=True)
    for task_name, path in paths.items():
        link = root / task_name
        if link.is_symlink() and link.resolve() == path.resolve():
            continue
        staged = root / f".{task_name}.{os.getpid()}"  # replaced in one step: a concurrent reader sees old or new
        staged.unlink(missing_ok=True)
        staged.symlink_to(path.resolve(), target_is_directory=True)
        staged.replace(link)
    return root


def _run(coroutine):
    """Harbor's resolution is async and our callers are not, some of them inside an event loop (the
    SLiME hook): run it on a loop of its own in a worker thread."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def _why(exc: BaseException) -> str:
    """One line for a failed download: git's own last words where git failed."""
    if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        return _why(exc.exceptions[0])
    if isinstance(exc, subprocess.CalledProcessError) and exc.stderr:
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr
        lines = [line for line in stderr.splitlines() if line.strip()]
        return f"{' '.join(map(str, exc.cmd[:2]))}: {lines[-1].strip() if lines else exc.returncode}"
    return one_line(exc)
