"""Runs /app/organize.sh on hidden directories and checks the resulting tree."""

import random
import subprocess
import sys
import tempfile
from pathlib import Path

NAMES = ["report.PDF", "data.csv", "archive.tar.gz", "notes", ".bashrc", "Photo 1.JPG", "photo2.jpg",
         "my notes.txt", "README", ".env.local", "draft.v2.Txt", "run.sh", "x.CSV"]


def expected_location(name: str) -> str:
    stem = name[1:] if name.startswith(".") else name
    return f"{stem.rsplit('.', 1)[1].lower() if '.' in stem else 'other'}/{name}"


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in root.rglob("*") if p.is_file()}


def main() -> int:
    rng = random.Random(21)
    failures = 0
    cases = [NAMES] + [rng.sample(NAMES, rng.randint(1, len(NAMES))) for _ in range(4)] + [[]]
    for i, names in enumerate(cases):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp) / f"inbox {i}"
            root.mkdir()
            (root / "keep").mkdir()  # an existing subdirectory stays untouched
            (root / "keep" / "old.txt").write_text("keep me\n")
            want = {"keep/old.txt": "keep me\n"}
            for name in names:
                content = f"content of {name} {rng.random()}\n"
                (root / name).write_text(content)
                want[expected_location(name)] = content
            try:
                subprocess.run(["/app/organize.sh", str(root)], capture_output=True, timeout=20)
                got = snapshot(root)
            except Exception as e:
                got = {"<error>": repr(e)}
            if got != want:
                failures += 1
                print(f"case {i}:\n  expected {sorted(want)}\n  got      {sorted(got)}")
    print(f"{len(cases) - failures}/{len(cases)} cases passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
