"""Calls parse from /app/confparse.py, in a separate process, on hidden config texts."""

import json
import random
import subprocess
import sys
import tempfile

RUNNER = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("confparse", "/app/confparse.py")
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
results = []
for text in json.load(open(sys.argv[1])):
    try:
        results.append(module.parse(text))
    except Exception as e:
        results.append(repr(e))
json.dump(results, open(sys.argv[2], "w"))
"""

KEYS = ["host", "port", "user", "path", "mode", "level", "url"]
VALUES = ["10.0.0.1", "8080", "alice", "/var/lib/app", "a=b", "", "x = y = z", "on", "http://h/?q=1"]
SECTIONS = ["db", "cache", "log", "web"]


def make_config(rng: random.Random) -> tuple[str, dict[str, str]]:
    """A random config text and the dict the spec says it parses to."""
    lines, expected, section = [], {}, ""
    for _ in range(rng.randint(0, 25)):
        kind = rng.random()
        if kind < 0.15:
            lines.append(rng.choice(["", "   ", "# a comment", "  # indented = comment", "#[db]"]))
        elif kind < 0.3:
            section = rng.choice(SECTIONS)
            lines.append(f"[{section}]")
        else:
            key, value = rng.choice(KEYS), rng.choice(VALUES)
            pad = rng.choice(["", " ", "  ", "\t"])
            lines.append(f"{rng.choice(['', '  '])}{key}{pad}={pad}{value}{rng.choice(['', ' '])}")
            expected[f"{section}.{key}" if section else key] = value.strip()
    return "\n".join(lines) + rng.choice(["", "\n"]), expected


def main() -> int:
    rng = random.Random(42)
    cases = [("a=1\n[db]\nhost = x=y\n# note\n", {"a": "1", "db.host": "x=y"}), ("", {})]
    cases += [make_config(rng) for _ in range(60)]
    with tempfile.TemporaryDirectory() as tmp:
        cases_path, out_path = f"{tmp}/cases.json", f"{tmp}/out.json"
        json.dump([text for text, _ in cases], open(cases_path, "w"))
        try:
            subprocess.run([sys.executable, "-c", RUNNER, cases_path, out_path], timeout=30, check=True)
            results = json.load(open(out_path))
        except Exception as e:
            print(f"could not run parse: {type(e).__name__}")
            return 1
    failures = [(text, want, got) for (text, want), got in zip(cases, results) if got != want]
    for text, want, got in failures[:3]:
        print(f"parse({text!r}):\n  expected {want}\n  got      {got}")
    print(f"{len(cases) - len(failures)}/{len(cases)} cases passed")
    return 1 if failures or len(results) != len(cases) else 0


if __name__ == "__main__":
    sys.exit(main())
