#!/usr/bin/env bash
# Run the test suite (sets the machine up first, so it works on a fresh clone).
# Usage: bash scripts/test.sh [pytest args]
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
# Docker is optional: when scripts/setup-docker.sh cannot provide it, its one stdout line says why
# and the Docker tests skip with that reason; everything else still runs.
if docker_line=$(bash scripts/setup-docker.sh); then
    echo "[test] $docker_line" >&2
else
    export SLIME_HARBOR_NO_DOCKER="${docker_line:-scripts/setup-docker.sh failed without a reason}"
    echo "[test] skipping Docker tests: $SLIME_HARBOR_NO_DOCKER" >&2
fi
.venv/bin/python -m pytest "$@"
rc=$?
# pytest exits 5 when it collected no test: that is a broken suite, not a pass.
if [ $rc -eq 5 ]; then echo "ERROR: pytest collected no tests" >&2; exit 1; fi
exit $rc
