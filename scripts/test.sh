#!/usr/bin/env bash
# Run the test suite (sets the machine up first, so it works on a fresh clone).
# Usage: bash scripts/test.sh [pytest args]
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
.venv/bin/python -m pytest "$@"
rc=$?
# pytest exits 5 when it collected no test: that is a broken suite, not a pass.
if [ $rc -eq 5 ]; then echo "ERROR: pytest collected no tests" >&2; exit 1; fi
exit $rc
