"""bench/watch_coverage.py over task dirs written here, one per reason, run as the script it is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from helpers.cli import assert_one_line_error

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench" / "watch_coverage.py"
TASK_TOML = '[verifier]\ntimeout_sec = 60.0\n\n[agent]\ntimeout_sec = 60.0\n\n[environment]\nworkdir = "/app"\n'
ASSERTING_TEST = "from answer import answer\n\n\ndef test_answer():\n    assert answer(6) == 42\n"


def write_task(root: Path, name: str, test_sh: str, image: str = "python:3.11-slim",
               tests: dict[str, str] | None = None) -> Path:
    task = root / name
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "task.toml").write_text(TASK_TOML)
    (task / "instruction.md").write_text("Write answer(n) in /app/answer.py.\n")
    (task / "environment" / "Dockerfile").write_text(f"FROM {image}\nWORKDIR /app\n")
    (task / "tests" / "test.sh").write_text("#!/bin/bash\n# graded by python? only if the code says so\n" + test_sh)
    for rel, text in (tests or {}).items():
        (task / "tests" / rel).write_text(text)
    return task


def run_bench(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH), *argv], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_each_task_is_watched_or_given_a_twin_or_told_why_not(tmp_path):
    tasks = tmp_path / "tasks"
    write_task(tasks, "pytest-asserts", "pytest /tests/test_outputs.py -rA\n", tests={"test_outputs.py": ASSERTING_TEST})
    write_task(tasks, "uv-run", "cd /tests && uv run --with pytest pytest test_x.py\n",
               tests={"test_x.py": "def test_x():\n    assert len([1]) == 1\n"})
    write_task(tasks, "script-file", "bash /tests/run.sh\n", tests={"run.sh": "/tests/check.py && echo 1\n"})
    write_task(tasks, "shell-only", "grep -q hello /app/out.txt && echo 1 > /logs/verifier/reward.txt\n")
    write_task(tasks, "old-image", "python /tests/check.py\n", image="python:3.7-slim",
               tests={"check.py": "assert open('/app/out').read() == 'x'\n"})
    write_task(tasks, "python-two", "python2 /tests/check.py\n", tests={"check.py": "assert 1 == 1\n"})
    write_task(tasks, "canary--pytest-asserts", "pytest /tests/test_outputs.py\n", tests={"test_outputs.py": ASSERTING_TEST})
    out = tmp_path / "coverage.json"
    proc = run_bench(str(tasks), str(ROOT / "examples" / "harbor" / "tasks-swe"), "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    rows = {row["task"]: row for row in json.loads(out.read_text())["tasks"]}
    expected = {  # task: (why not watched, why no twin: a word of it)
        "pytest-asserts": ("", ""),
        "uv-run": ("", "compare no computed value"),  # len(...) == 1 is a count, never made impossible
        "script-file": ("", "compare no computed value"),  # test.sh's own script names the .py file
        "shell-only": ("no Python in the verifier", "compare no computed value"),
        "old-image": ("Python older than 3.8 in the image (python:3.7)", ""),
        "python-two": ("Python 2 in the verifier", "compare no computed value"),
        "canary--pytest-asserts": ("", "a canary"),
        "slime-harbor__intervals-3": ("", ""), "slime-harbor__textkit-2": ("", ""), "slime-harbor__tinycalc-1": ("", ""),
    }
    for name, (why_not_watched, why_no_twin) in expected.items():
        row = rows[name]
        assert row["why_not_watched"] == why_not_watched and row["watched"] == (not why_not_watched), row
        assert why_no_twin in row["why_no_twin"] and row["twin"] == (not why_no_twin), row
    totals = json.loads(out.read_text())["totals"]
    assert totals["tasks"] == 10 and totals["watched"] == 7 and totals["twin"] == 5
    assert totals["either"] == 8 and totals["neither"] == 2 and totals["share_neither"] == 0.2
    assert "10 tasks: watched 7 (70.0%), twin 5 (50.0%), either 8 (80.0%), neither 2 (20.0%)" in proc.stdout


def test_the_bundled_tasks_are_the_default(tmp_path):
    proc = run_bench("--json", str(tmp_path / "bundled.json"))
    assert proc.returncode == 0, proc.stderr
    totals = json.loads((tmp_path / "bundled.json").read_text())["totals"]
    assert totals["tasks"] == 17 and totals["watched"] == 17 and totals["twin"] >= 4


def test_a_dir_without_tasks_is_one_line(tmp_path):
    assert_one_line_error(run_bench(str(tmp_path / "missing")), 2, "does not exist")
    (tmp_path / "empty").mkdir()
    assert_one_line_error(run_bench(str(tmp_path / "empty")), 2, "no Harbor tasks")
