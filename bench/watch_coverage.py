"""How much of a task set the grading watch covers (issue 46), read from the tasks' files alone: no
trial runs, no image is built, no gold is checked.

Two watches look at a passing trial's run time:

  watched  the run-time audit (flag reads_grader) can watch the grading: the verifier runs Python
           3.8 or newer (audit hooks came in 3.8): an SWE-bench-format task (tests/instance.json,
           graded by Python), or a tests/test.sh that runs python, pytest, `uv run`, uvx or a .py
           file, in an image whose Dockerfile does not pin a Python older than 3.8
  twin     the impossible twin's builder (slime_harbor.grading.impossible_twin, as a run calls it before
           its gold check: a canary has none, a multi-step task none, else build_twin) builds one

Per task a row (yes, or why not), then totals: the share watched, with a twin, with either, with
neither, and the reasons counted. The builder is called as it is, so a better builder shows here
on the next run.

    .venv/bin/python bench/watch_coverage.py [DIR ...] [--json OUT.json]

DIR is a task dir or a dir of tasks (default: the bundled plain tasks and SWE-bench-format
instances).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from anywhere

from slime_harbor.grading import impossible_twin as it  # noqa: E402
from slime_harbor.tasks.task_dir import discover_tasks, is_canary  # noqa: E402

BUNDLED = (ROOT / "examples" / "harbor" / "tasks", ROOT / "examples" / "harbor" / "tasks-swe")
OLDEST_AUDITED_PYTHON = (3, 8)

# A shell word that starts Python: python, python3.11, pytest, py.test, `uv run`, uvx, or a .py file
_RUNS_PYTHON = re.compile(r"(?<![\w.-])(?:python[\d.]*|pytest|py\.test|uvx|uv\s+run|[\w./-]+\.py)(?![\w-])")
_PYTHON_IMAGE = re.compile(r"^\s*FROM\s+(?:--\S+\s+)*(?:\S+/)?python:(\d+)(?:\.(\d+))?", re.M | re.I)


@dataclass(frozen=True)
class Coverage:
    """One task's coverage: each watch's answer, and why not where it is no."""

    task: str
    watched: bool
    twin: bool
    why_not_watched: str = ""
    why_no_twin: str = ""


def _shell_text(script: Path) -> str:
    """A shell script's text without its comments, with the tests/ scripts it names (one level)."""
    def code(path: Path) -> str:
        return "\n".join(line.partition("#")[0] if not line.startswith("#!") else ""
                         for line in path.read_text(errors="replace").splitlines())

    text = code(script)
    others = [p for p in script.parent.rglob("*.sh") if p != script and p.name in text]
    return "\n".join([text, *map(code, others)])


def watched(task_dir: Path) -> str:
    """"" when the run-time audit can watch the task's grading, else why not."""
    if (task_dir / "tests" / "instance.json").is_file():
        return ""  # SWE-bench format: graded by Python in its grading container
    script = task_dir / "tests" / "test.sh"
    if not script.is_file():
        return "no tests/test.sh"
    text = _shell_text(script)
    if re.search(r"(?<![\w.-])python2(?:\.\d+)?(?![\w.-])", text):
        return "Python 2 in the verifier"
    if not _RUNS_PYTHON.search(text):
        return "no Python in the verifier"
    for dockerfile in (task_dir / "environment" / "Dockerfile", task_dir / "tests" / "Dockerfile"):
        pins = _PYTHON_IMAGE.findall(dockerfile.read_text(errors="replace")) if dockerfile.is_file() else []
        versions = [(int(major), int(minor or 0)) for major, minor in pins]
        if versions and versions[-1] < OLDEST_AUDITED_PYTHON:  # the last FROM is the image that runs
            return f"Python older than 3.8 in the image (python:{'.'.join(map(str, versions[-1]))})"
    return ""


def twin(task_dir: Path, scratch: Path) -> str:
    """"" when the impossible twin's builder builds a twin of the task, else why not (its own words)."""
    if is_canary(task_dir.name):
        return "a canary"
    try:
        if it.twin_mode(task_dir) is None:
            return "a multi-step task"
    except Exception as error:  # Harbor cannot load the task: a run would give it no twin either
        return f"the task does not load ({type(error).__name__})"
    built = it.build_twin(task_dir, scratch)
    return "" if isinstance(built, it.Twin) else built.why.removeprefix("no twin: ")


def coverage(task_dir: Path) -> Coverage:
    with tempfile.TemporaryDirectory(prefix="watch-coverage-") as scratch:
        why_no_twin = twin(task_dir, Path(scratch))
    why_not_watched = watched(task_dir)
    return Coverage(task_dir.name, not why_not_watched, not why_no_twin, why_not_watched, why_no_twin)


def task_dirs(paths: list[Path]) -> list[Path]:
    """The task dirs of each path: the path itself when it is one, else the tasks in it."""
    found = []
    for path in paths:
        found += [path] if (path / "task.toml").is_file() else discover_tasks(path)
    return found


def totals(rows: list[Coverage]) -> dict:
    n = len(rows)

    def share(count: int) -> float:
        return round(count / n, 4) if n else 0.0

    counts = {"watched": sum(r.watched for r in rows), "twin": sum(r.twin for r in rows),
              "either": sum(r.watched or r.twin for r in rows), "both": sum(r.watched and r.twin for r in rows),
              "neither": sum(not (r.watched or r.twin) for r in rows)}
    return {"tasks": n, **counts, **{f"share_{k}": share(v) for k, v in counts.items()},
            "why_not_watched": dict(Counter(r.why_not_watched for r in rows if not r.watched).most_common()),
            "why_no_twin": dict(Counter(r.why_no_twin for r in rows if not r.twin).most_common())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="*", type=Path, help="task dirs or dirs of tasks (default: the bundled tasks)")
    parser.add_argument("--json", type=Path, help="also write the rows and totals here")
    args = parser.parse_args(argv)
    try:
        dirs = task_dirs(args.dirs or list(BUNDLED))
    except FileNotFoundError as error:
        print(f"watch_coverage: error: {error}", file=sys.stderr)
        return 2
    rows = [coverage(d) for d in dirs]
    width = max(len(r.task) for r in rows)
    print(f"{'task':<{width}}  watched  twin")
    for r in rows:
        row = f"{r.task:<{width}}  {'yes' if r.watched else 'no':<7}  {'yes' if r.twin else 'no':<4}"
        print("  ".join([row, *(w for w in (r.why_not_watched, r.why_no_twin) if w)]).rstrip())
    summary = totals(rows)
    print(f"\n{summary['tasks']} tasks: watched {summary['watched']} ({summary['share_watched']:.1%}), "
          f"twin {summary['twin']} ({summary['share_twin']:.1%}), either {summary['either']} "
          f"({summary['share_either']:.1%}), neither {summary['neither']} ({summary['share_neither']:.1%})")
    for title, key in (("not watched", "why_not_watched"), ("no twin", "why_no_twin")):
        for why, count in summary[key].items():
            print(f"  {title} {count:>5}  {why}")
    if args.json:
        args.json.write_text(json.dumps({"dirs": [str(d) for d in (args.dirs or BUNDLED)], "totals": summary,
                                         "tasks": [asdict(r) for r in rows]}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
