"""Runs /app/dedupe.sh on hidden files and compares with first-occurrence order."""

import random
import subprocess
import sys
import tempfile
from pathlib import Path

LINES = ["apple", "Apple", "apple ", " apple", "", "banana split", "cherry", "12", "012", "é"]


def expected(lines: list[str]) -> list[str]:
    return list(dict.fromkeys(lines))


def main() -> int:
    rng = random.Random(8)
    cases = [[], ["only"], ["b", "a", "b", "c", "a"]]
    cases += [rng.choices(LINES, k=rng.randint(1, 60)) for _ in range(8)]
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i, lines in enumerate(cases):
            path = Path(tmp) / f"input {i}.txt"
            path.write_text("".join(line + "\n" for line in lines))
            try:
                run = subprocess.run(["/app/dedupe.sh", str(path)], capture_output=True, text=True, timeout=10)
                got = run.stdout.split("\n")
                got = got[:-1] if got and got[-1] == "" else got  # the final newline
            except Exception as e:
                got = [f"<{e!r}>"]
            if got != expected(lines):
                failures += 1
                print(f"case {i}: input {lines}\n  expected {expected(lines)}\n  got      {got}")
    print(f"{len(cases) - failures}/{len(cases)} cases passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
