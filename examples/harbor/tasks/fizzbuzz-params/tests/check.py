"""Runs /app/fizzbuzz.py with hidden parameters."""

import random
import subprocess
import sys


def expected(n: int, a: int, b: int) -> list[str]:
    lines = []
    for i in range(1, n + 1):
        if i % a == 0 and i % b == 0:
            lines.append("FizzBuzz")
        elif i % a == 0:
            lines.append("Fizz")
        elif i % b == 0:
            lines.append("Buzz")
        else:
            lines.append(str(i))
    return lines


def main() -> int:
    rng = random.Random(15)
    cases = [(15, 3, 5), (0, 2, 3), (1, 1, 1), (10, 4, 4), (12, 6, 4)]
    cases += [(rng.randint(1, 120), rng.randint(1, 12), rng.randint(1, 12)) for _ in range(15)]
    failures = 0
    for n, a, b in cases:
        try:
            run = subprocess.run([sys.executable, "/app/fizzbuzz.py", str(n), str(a), str(b)],
                                 capture_output=True, text=True, timeout=10)
            got = run.stdout.splitlines()
        except Exception as e:
            got = [f"<{e!r}>"]
        if [line.strip() for line in got] != expected(n, a, b):
            failures += 1
            print(f"fizzbuzz {n} {a} {b}: expected {expected(n, a, b)[:20]}..., got {got[:20]}...")
    print(f"{len(cases) - failures}/{len(cases)} cases passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
