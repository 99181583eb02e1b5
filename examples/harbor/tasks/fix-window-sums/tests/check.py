"""Calls window_sums from /app/windows.py, in a separate process, on hidden inputs."""

import json
import random
import subprocess
import sys
import tempfile

RUNNER = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("windows", "/app/windows.py")
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
results = []
for values, k in json.load(open(sys.argv[1])):
    try:
        results.append(module.window_sums(values, k))
    except Exception as e:
        results.append(repr(e))
json.dump(results, open(sys.argv[2], "w"))
"""


def expected(values, k):
    return [sum(values[i:i + k]) for i in range(len(values) - k + 1)]


def main() -> int:
    rng = random.Random(7)
    cases = [[[1, 2, 3, 4], 2], [[5], 1], [[], 1], [[1, 2], 3], [[4, -1, 2], 3]]
    for _ in range(60):
        values = [rng.randint(-50, 50) for _ in range(rng.randint(0, 12))]
        cases.append([values, rng.randint(1, len(values) + 2)])
    with tempfile.TemporaryDirectory() as tmp:
        cases_path, out_path = f"{tmp}/cases.json", f"{tmp}/out.json"
        json.dump(cases, open(cases_path, "w"))
        try:
            subprocess.run([sys.executable, "-c", RUNNER, cases_path, out_path], timeout=30, check=True)
            results = json.load(open(out_path))
        except Exception as e:
            print(f"could not run window_sums: {type(e).__name__}")
            return 1
    failures = [(c, r) for c, r in zip(cases, results) if r != expected(*c)]
    for (values, k), got in failures[:5]:
        print(f"window_sums({values}, {k}): expected {expected(values, k)}, got {got}")
    print(f"{len(cases) - len(failures)}/{len(cases)} cases passed")
    return 1 if failures or len(results) != len(cases) else 0


if __name__ == "__main__":
    sys.exit(main())
