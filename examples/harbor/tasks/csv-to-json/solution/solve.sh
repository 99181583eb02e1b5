#!/bin/bash
set -e
python3 - <<'PY'
import csv, json
with open("/app/people.csv", newline="") as f:
    rows = [{**row, "age": int(row["age"])} for row in csv.DictReader(f)]
with open("/app/people.json", "w") as f:
    json.dump(rows, f, indent=2)
PY
