"""Compares /app/totals.csv with totals computed from a pristine copy of orders.jsonl.

The copy lives in tests/, so editing /app/orders.jsonl does not change the answer.
"""

import json
import sys
from pathlib import Path


def expected_lines() -> list[str]:
    totals: dict[str, list[int]] = {}
    for line in (Path(__file__).parent / "orders.jsonl").read_text().splitlines():
        order = json.loads(line)
        if order["status"] == "paid":
            total = totals.setdefault(order["customer"], [0, 0])
            total[0] += order["amount_cents"]
            total[1] += 1
    rows = [f"{customer},{cents},{count}" for customer, (cents, count) in sorted(totals.items())]
    return ["customer,total_cents,orders", *rows]


def main() -> int:
    try:
        got = [line.strip() for line in Path("/app/totals.csv").read_text().splitlines() if line.strip()]
    except Exception as e:
        print(f"cannot read /app/totals.csv: {e!r}")
        return 1
    want = expected_lines()
    if got != want:
        print("expected:", *want, "got:", *got, sep="\n")
        return 1
    print(f"all {len(want) - 1} customers match")
    return 0


if __name__ == "__main__":
    sys.exit(main())
