"""Calls add_tag from /app/tags.py many times in one process, on hidden sequences.

Each call's result and the caller's list afterwards are both checked, so sharing
state between calls or mutating the argument shows up.
"""

import json
import random
import subprocess
import sys
import tempfile

RUNNER = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("tags", "/app/tags.py")
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
results = []
for tag, given in json.load(open(sys.argv[1])):
    try:
        if given is None:
            results.append([list(module.add_tag(tag)), None])  # a copy: later calls may change it
        else:
            argument = list(given)
            returned = module.add_tag(tag, argument)
            returned_is_argument = returned is argument
            results.append([list(returned), "same object" if returned_is_argument else argument])
    except Exception as e:
        results.append(repr(e))
json.dump(results, open(sys.argv[2], "w"))
"""


def main() -> int:
    rng = random.Random(4)
    calls = [["a", None], ["b", None], ["c", ["x"]], ["d", None]]
    for _ in range(40):
        given = None if rng.random() < 0.5 else rng.sample("pqrstuvw", rng.randint(0, 4))
        calls.append([rng.choice("abcdefg"), given])
    with tempfile.TemporaryDirectory() as tmp:
        calls_path, out_path = f"{tmp}/calls.json", f"{tmp}/out.json"
        json.dump(calls, open(calls_path, "w"))
        try:
            subprocess.run([sys.executable, "-c", RUNNER, calls_path, out_path], timeout=30, check=True)
            results = json.load(open(out_path))
        except Exception as e:
            print(f"could not run add_tag: {type(e).__name__}")
            return 1
    failures = 0
    for (tag, given), got in zip(calls, results):
        want = [[*(given or []), tag], given]  # a new list, and the argument left as it was
        if got != want:
            failures += 1
            if failures <= 5:
                print(f"add_tag({tag!r}, {given}): expected [result, argument after] = {want}, got {got}")
    print(f"{len(calls) - failures}/{len(calls)} calls as expected")
    return 1 if failures or len(results) != len(calls) else 0


if __name__ == "__main__":
    sys.exit(main())
