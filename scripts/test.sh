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
# The real inference engines (tests/test_real_engines.py): SGLang and vLLM in venvs of their own in
# the cache, installed from the registries once per machine (minutes and about 17 GB the first
# time, seconds after). An engine that cannot be installed is skipped by its tests, with the reason.
for engine in sglang vllm; do
    if line=$(bash scripts/setup-$engine.sh); then
        echo "[test] $engine: $line" >&2
    else
        echo "[test] $engine tests will skip: $line" >&2
    fi
done
# The viewer test drives a real headless Chromium (Debian's package); without it that test skips.
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[test] installing chromium for the viewer test" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1 \
        || echo "[test] chromium could not be installed: the viewer test will skip" >&2
fi
.venv/bin/python -m pytest "$@"
rc=$?
# pytest exits 5 when it collected no test: that is a broken suite, not a pass.
if [ $rc -eq 5 ]; then echo "ERROR: pytest collected no tests" >&2; exit 1; fi
exit $rc
