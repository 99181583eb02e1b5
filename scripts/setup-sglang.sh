#!/usr/bin/env bash
# The real SGLang (and its router) in a venv of its own, from the package registries alone, kept in
# the cache outside the checkout ($SLIME_HARBOR_CACHE, else ~/.cache/slime-harbor) and keyed by
# SGLang's version, so every clone of the project (CI's included) reuses one install.
#
# Usage: bash scripts/setup-sglang.sh        Idempotent: seconds when the venv is there.
# Progress goes to stderr; stdout gets one line: the venv's path (exit 0) or why it failed (exit 1).
#
# On a machine with an NVIDIA GPU this installs SGLang as SGLang documents it (the PyPI package and
# its CUDA kernels). On a CPU the same packages are installed: SGLang's CUDA build of torch runs on a
# CPU, and `slime-harbor serve --engine sglang` puts a stand-in for the kernel package in front of
# the real one (slime_harbor/policy/cpu_shims/sgl_kernel: the real one ships CUDA binaries
# only, and a CPU serving this model calls none of its functions; see that module).
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${SLIME_HARBOR_SGLANG_VERSION:-0.5.23}
ROUTER_VERSION=${SLIME_HARBOR_SGLANG_ROUTER_VERSION:-0.3.2}
CACHE=${SLIME_HARBOR_CACHE:-$HOME/.cache/slime-harbor}
VENV=$CACHE/engines/sglang-$VERSION

exec 3>&1 1>&2  # everything but the last line goes to stderr
say() { echo "[setup-sglang] $*" >&2; }
fail() { say "ERROR: $*"; echo "SGLang unavailable: $*" >&3; exit 1; }

ready() { [ -f "$VENV/.installed" ] && "$VENV/bin/python" -c 'import sglang, sglang_router' 2>/dev/null; }
if ready; then echo "$VENV" >&3; exit 0; fi

PY=$(bash scripts/engine-python.sh) || fail "no Python 3.10-3.12 with venv found for SGLang's venv (set SLIME_HARBOR_ENGINE_PYTHON)"
say "installing SGLang $VERSION and sglang-router $ROUTER_VERSION into $VENV with $PY (about 11 GB and several minutes)"
mkdir -p "$CACHE/engines"
staging="$VENV.partial"
rm -rf "$staging"
"$PY" -m venv "$staging"
pip() { "$staging/bin/python" -m pip --no-cache-dir --disable-pip-version-check --no-input -q "$@"; }
pip install --upgrade pip >/dev/null
started=$SECONDS
pip install "sglang==$VERSION" "sglang-router==$ROUTER_VERSION" || fail "pip could not install sglang==$VERSION"
"$staging/bin/python" -c 'import sglang, sglang_router' || fail "SGLang $VERSION installed but does not import"
# A venv is not relocatable: its scripts name the directory it was made in. Fix the shebangs and
# pyvenv.cfg after the rename (the install itself ran in the staging dir so that an interrupted one
# never looks ready).
rm -rf "$VENV"
mv "$staging" "$VENV"
grep -rlI --exclude-dir=site-packages -- "$staging" "$VENV/bin" "$VENV/pyvenv.cfg" 2>/dev/null \
    | xargs -r sed -i "s#$staging#$VENV#g"
echo "sglang==$VERSION sglang-router==$ROUTER_VERSION python=$PY seconds=$((SECONDS - started))" > "$VENV/.installed"
say "ready: $VENV ($(du -sh "$VENV" | cut -f1), $((SECONDS - started)) s)"
echo "$VENV" >&3
