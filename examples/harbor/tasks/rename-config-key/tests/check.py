"""Compares /app/config with the expected rename of a pristine copy kept in tests/."""

import re
import sys
from pathlib import Path

ORIGINAL = Path(__file__).parent / "original_config"
CONFIG = Path("/app/config")
ASSIGNMENT = re.compile(r"^db_host(\s*=)", re.MULTILINE)


def expected_text(path: Path) -> str:
    text = path.read_text()
    return ASSIGNMENT.sub(r"database_host\1", text) if path.suffix == ".ini" else text


def main() -> int:
    originals = sorted(p.relative_to(ORIGINAL) for p in ORIGINAL.rglob("*") if p.is_file())
    failures = 0
    for relative in originals:
        path = CONFIG / relative
        try:
            got = path.read_text()
        except Exception as e:
            print(f"{relative}: cannot read: {e!r}")
            failures += 1
            continue
        want = expected_text(ORIGINAL / relative)
        if got != want:
            failures += 1
            print(f"{relative}: expected\n{want}\ngot\n{got}")
    print(f"{len(originals) - failures}/{len(originals)} files as expected")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
