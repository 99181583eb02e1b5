"""Runs /app/top_words.sh on hidden texts and compares with a reference count."""

import random
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

VOCABULARY = ["alpha", "beta", "gamma", "delta", "Echo", "fox", "GOLF", "hotel", "india", "juliet",
              "kilo", "lima", "mike", "x", "it's", "e-mail", "r2d2", "naïve"]
SEPARATORS = [" ", "  ", "\n", ", ", ". ", "! ", "\t", " -- ", "; "]


def expected_lines(text: str, n: int) -> list[str]:
    counts = Counter(word.lower() for word in re.findall(r"[A-Za-z]+", text))
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return [f"{count} {word}" for word, count in ranked[:n]]


def make_text(rng: random.Random, n_words: int) -> str:
    # Skewed weights give a clear head and many ties in the tail.
    weights = [1 / (i + 1) for i in range(len(VOCABULARY))]
    words = rng.choices(VOCABULARY, weights=weights, k=n_words)
    return "".join(w + rng.choice(SEPARATORS) for w in words)


def main() -> int:
    rng = random.Random(5)
    cases = [(make_text(rng, size), n) for size, n in ((0, 3), (1, 5), (30, 3), (200, 10), (2000, 5), (500, 50))]
    cases.append(("b a c b a c d", 2))  # a two-way tie for the top place
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i, (text, n) in enumerate(cases):
            path = Path(tmp) / f"text {i}.txt"
            path.write_text(text)
            want = expected_lines(text, n)
            try:
                run = subprocess.run(["/app/top_words.sh", str(path), str(n)],
                                     capture_output=True, text=True, timeout=20)
                got = [line.strip() for line in run.stdout.strip().splitlines()]
            except Exception as e:
                got = [f"<{e!r}>"]
            if got != want:
                failures += 1
                print(f"case {i} (N={n}): expected {want}, got {got}")
    print(f"{len(cases) - failures}/{len(cases)} cases passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
