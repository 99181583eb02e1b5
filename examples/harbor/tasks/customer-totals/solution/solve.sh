#!/bin/bash
set -e
python3 - <<'PY'
import json
from collections import defaultdict

totals = defaultdict(lambda: [0, 0])
with open("/app/orders.jsonl") as f:
    for line in f:
        if not line.strip():
            continue
        order = json.loads(line)
        if order["status"] == "paid":
            totals[order["customer"]][0] += order["amount_cents"]
            totals[order["customer"]][1] += 1
with open("/app/totals.csv", "w") as f:
    f.write("customer,total_cents,orders\n")
    for customer in sorted(totals):
        f.write(f"{customer},{totals[customer][0]},{totals[customer][1]}\n")
PY
