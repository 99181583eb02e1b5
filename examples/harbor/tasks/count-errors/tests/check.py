"""Runs /app/count_errors.sh on log files the agent has never seen."""

import random
import subprocess
import sys
import tempfile
from pathlib import Path

SCRIPT = "/app/count_errors.sh"
LEVELS = ["INFO", "WARN", "DEBUG", "ERROR", "error", "Error", "ERRORS", "xERRORx"]


def make_log(rng: random.Random, n_lines: int) -> str:
    lines = []
    for i in range(n_lines):
        level = rng.choice(LEVELS)
        lines.append(f"2024-06-{1 + i % 28:02d} 12:{i % 60:02d}:00 {level} event {rng.randint(0, 999)}")
    return "\n".join(lines) + ("\n" if lines else "")


def main() -> int:
    rng = random.Random(20240601)
    logs = [make_log(rng, n) for n in (0, 1, 5, 37, 400)]
    logs.append("no errors at all\nerror only lowercase\n")
    logs.append("ERROR without trailing newline")
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i, text in enumerate(logs):
            path = Path(tmp) / f"app log {i}.log"  # a space in the name checks quoting
            path.write_text(text)
            expected = sum("ERROR" in line for line in text.splitlines())
            try:
                run = subprocess.run([SCRIPT, str(path)], capture_output=True, text=True, timeout=10)
                got = run.stdout.strip()
            except Exception as e:  # missing, not executable, hung
                got = f"<{e!r}>"
            if got != str(expected):
                print(f"case {i}: expected {expected}, got {got!r}")
                failures += 1
    print(f"{len(logs) - failures}/{len(logs)} cases passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
