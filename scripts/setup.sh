#!/usr/bin/env bash
# Set up slime-harbor on a fresh machine: find Python >= 3.12, create .venv/ in the repo root,
# install the package and its test tools, and make sure the sandbox's system tools exist.
# Idempotent: a second run only checks. Usage: bash scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv

say() { echo "[setup] $*" >&2; }

python_ok() { "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' >/dev/null 2>&1; }

find_python() {
    local c
    for c in "${SLIME_HARBOR_PYTHON:-}" python3.13 python3.12 python3; do
        [ -n "$c" ] || continue
        command -v "$c" >/dev/null 2>&1 && python_ok "$c" && { command -v "$c"; return 0; }
    done
    # pyenv keeps versions that are installed but not selected; use the newest >= 3.12.
    for c in $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.1[2-9]*/bin/python3 2>/dev/null | sort -rV); do
        python_ok "$c" && { echo "$c"; return 0; }
    done
    return 1
}

if [ ! -x "$VENV/bin/python" ] || ! python_ok "$VENV/bin/python"; then
    PY=$(find_python) || {
        say "ERROR: slime-harbor needs Python >= 3.12 (Harbor requires it) and none was found."
        say "       Looked at \$SLIME_HARBOR_PYTHON, python3.13, python3.12, python3 and pyenv versions."
        say "       Install one (e.g. 'pyenv install 3.12') or point SLIME_HARBOR_PYTHON at it."
        exit 1
    }
    say "creating $VENV with $PY ($("$PY" --version 2>&1))"
    rm -rf "$VENV"
    "$PY" -m venv "$VENV"
fi

stamp="$VENV/.installed-$(cat pyproject.toml requirements.txt | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
    say "installing slime-harbor and its requirements into $VENV (torch is large; first run takes minutes)"
    "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
    "$VENV/bin/python" -m pip install -q -r requirements.txt
    "$VENV/bin/python" -m pip install -q --no-deps -e .
    rm -f "$VENV"/.installed-* && touch "$stamp"
fi

# System tools the local sandbox needs: bubblewrap (the sandbox itself), nsenter from util-linux
# (each command joins the sandbox's namespaces) and tmux (terminus-2 drives a tmux session inside).
missing=()
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
command -v nsenter >/dev/null 2>&1 || missing+=(util-linux)
command -v tmux >/dev/null 2>&1 || missing+=(tmux)
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        say "installing system packages: ${missing[*]}"
        apt-get update -qq >/dev/null 2>&1 || true
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null \
            || { say "ERROR: apt-get could not install ${missing[*]}"; exit 1; }
    else
        say "ERROR: missing system packages: ${missing[*]}. Install them (e.g. 'sudo apt-get install ${missing[*]}')."
        exit 1
    fi
fi
say "ready: $VENV ($("$VENV/bin/python" --version 2>&1))"
