"""Compares /app/people.json with the conversion of a pristine copy of people.csv.

The copy lives in tests/, so editing /app/people.csv does not change the answer.
"""

import csv
import json
import sys
from pathlib import Path


def main() -> int:
    with open(Path(__file__).parent / "people.csv", newline="") as f:
        expected = [{**row, "age": int(row["age"])} for row in csv.DictReader(f)]
    try:
        got = json.loads(Path("/app/people.json").read_text())
    except Exception as e:
        print(f"cannot read /app/people.json as JSON: {e!r}")
        return 1
    if got != expected:
        print(f"expected:\n{json.dumps(expected, indent=1)}\ngot:\n{json.dumps(got, indent=1)}")
        return 1
    # == treats 36 and 36.0 (and True and 1) alike; the task asks for integers.
    if not all(type(row["age"]) is int for row in got):
        print("every age must be a JSON integer")
        return 1
    print(f"all {len(expected)} rows match")
    return 0


if __name__ == "__main__":
    sys.exit(main())
