"""The `slime-harbor` command as a subprocess, and its one-line errors; a Python child killed
without teardown."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "slime_harbor.cli", *args]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(command(*args), capture_output=True, text=True, env=env(), timeout=timeout, cwd=REPO)


def assert_one_line_error(proc: subprocess.CompletedProcess, code: int, *words: str) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert "error:" in lines[0]
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def first_line_then_sigkill(script: str) -> str:
    """Run `script` in a Python child on the repo, read the first line it prints, then SIGKILL it
    (no teardown, no atexit): what a killed run leaves behind. Returns that line, stripped."""
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        return proc.stdout.readline().strip()
    finally:
        proc.kill()
        proc.wait()
