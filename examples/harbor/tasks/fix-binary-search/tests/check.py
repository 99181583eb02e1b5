"""Calls find_index from /app/search.py, in a separate process, on hidden sequences.

The sequences count their element reads, so a linear scan fails the O(log n) bound.
"""

import json
import math
import random
import subprocess
import sys
import tempfile

RUNNER = """
import importlib.util, json, sys

class CountingSequence:
    # Only len() and indexing, so list methods such as .index() are not available.
    def __init__(self, values):
        self._values = values
        self.reads = 0
    def __len__(self):
        return len(self._values)
    def __getitem__(self, i):
        if isinstance(i, slice):
            raise TypeError("slicing is not supported")
        self.reads += 1
        return self._values[i]

spec = importlib.util.spec_from_file_location("search", "/app/search.py")
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
results = []
for values, target in json.load(open(sys.argv[1])):
    items = CountingSequence(values)
    try:
        results.append([module.find_index(items, target), items.reads])
    except Exception as e:
        results.append([repr(e), items.reads])
json.dump(results, open(sys.argv[2], "w"))
"""


def read_budget(n: int) -> int:
    """Generous for any binary search (two reads per halving), far below n for large n."""
    return 4 * (math.ceil(math.log2(n + 1)) + 1)


def main() -> int:
    rng = random.Random(13)
    cases = [[[5], 5], [[5], 4], [[], 1], [[1, 3], 3], [[1, 3], 1], [[1, 3], 2]]
    for _ in range(80):
        values = sorted(rng.sample(range(-1000, 1000), rng.randint(0, 30)))
        target = rng.choice(values) if values and rng.random() < 0.7 else rng.randint(-1001, 1001)
        cases.append([values, target])
    big = list(range(0, 40000, 2))
    cases += [[big, t] for t in (0, 39998, 20000, 12345, 77, -1, 40001)]
    with tempfile.TemporaryDirectory() as tmp:
        cases_path, out_path = f"{tmp}/cases.json", f"{tmp}/out.json"
        json.dump(cases, open(cases_path, "w"))
        try:
            subprocess.run([sys.executable, "-c", RUNNER, cases_path, out_path], timeout=30, check=True)
            results = json.load(open(out_path))
        except Exception as e:
            print(f"could not run find_index: {type(e).__name__}")
            return 1
    failures = 0
    for (values, target), (index, reads) in zip(cases, results):
        want = values.index(target) if target in values else -1
        if index != want or reads > read_budget(len(values)):
            failures += 1
            if failures <= 5:
                shown = values if len(values) <= 30 else f"<{len(values)} values>"
                print(f"find_index({shown}, {target}): expected {want} within {read_budget(len(values))} reads,"
                      f" got {index!r} after {reads} reads")
    print(f"{len(cases) - failures}/{len(cases)} cases passed")
    return 1 if failures or len(results) != len(cases) else 0


if __name__ == "__main__":
    sys.exit(main())
