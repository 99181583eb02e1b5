"""Runs /app/sum_column.sh on hidden CSV files whose headers are numbers."""

import random
import subprocess
import sys
import tempfile
from pathlib import Path


def make_csv(rng: random.Random, n_rows: int, n_cols: int) -> list[list[int | str]]:
    header = [str(2000 + c) for c in range(n_cols)]  # numeric headers: summing them shows
    rows = [[rng.randint(-500, 999) for _ in range(n_cols)] for _ in range(n_rows)]
    return [header, *rows]


def main() -> int:
    rng = random.Random(3)
    tables = [make_csv(rng, n, c) for n, c in ((0, 3), (1, 1), (4, 3), (25, 5), (200, 4))]
    failures = total = 0
    with tempfile.TemporaryDirectory() as tmp:
        for t, table in enumerate(tables):
            path = Path(tmp) / f"table{t}.csv"
            path.write_text("".join(",".join(map(str, row)) + "\n" for row in table))
            for column in range(1, len(table[0]) + 1):
                total += 1
                expected = sum(int(row[column - 1]) for row in table[1:])
                try:
                    run = subprocess.run(["bash", "/app/sum_column.sh", str(path), str(column)],
                                         capture_output=True, text=True, timeout=10)
                    got = run.stdout.strip()
                except Exception as e:
                    got = f"<{e!r}>"
                if got != str(expected):
                    failures += 1
                    print(f"table {t} ({len(table) - 1} rows) column {column}: expected {expected}, got {got!r}")
    print(f"{total - failures}/{total} cases passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
