"""Calls rank from /app/leaderboard.py, in a separate process, on hidden leaderboards."""

import json
import random
import subprocess
import sys
import tempfile

RUNNER = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("leaderboard", "/app/leaderboard.py")
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
results = []
for players in json.load(open(sys.argv[1])):
    try:
        results.append([list(p) for p in module.rank([tuple(p) for p in players])])
    except Exception as e:
        results.append(repr(e))
json.dump(results, open(sys.argv[2], "w"))
"""

NAMES = ["ada", "bob", "cy", "dee", "eve", "fay", "gus", "hal", "ivy", "jo", "kim", "lu"]


def expected(players):
    return [list(p) for p in sorted(players, key=lambda p: (-p[1], p[0]))]


def main() -> int:
    rng = random.Random(11)
    cases = [[], [["zed", 5], ["amy", 5], ["max", 9]]]
    for _ in range(40):
        names = rng.sample(NAMES, rng.randint(1, len(NAMES)))
        cases.append([[name, rng.randint(0, 4) * 10] for name in names])  # few scores: many ties
    with tempfile.TemporaryDirectory() as tmp:
        cases_path, out_path = f"{tmp}/cases.json", f"{tmp}/out.json"
        json.dump(cases, open(cases_path, "w"))
        try:
            subprocess.run([sys.executable, "-c", RUNNER, cases_path, out_path], timeout=30, check=True)
            results = json.load(open(out_path))
        except Exception as e:
            print(f"could not run rank: {type(e).__name__}")
            return 1
    failures = [(c, r) for c, r in zip(cases, results) if r != expected(c)]
    for players, got in failures[:3]:
        print(f"rank({players}):\n  expected {expected(players)}\n  got      {got}")
    print(f"{len(cases) - len(failures)}/{len(cases)} cases passed")
    return 1 if failures or len(results) != len(cases) else 0


if __name__ == "__main__":
    sys.exit(main())
