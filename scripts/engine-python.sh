#!/usr/bin/env bash
# Prints a Python for an inference engine's venv (SGLang, vLLM): 3.12, else 3.11 or 3.10, with
# venv. Their wheels (and torch's) cover these; the project's own .venv may be newer.
# $SLIME_HARBOR_ENGINE_PYTHON overrides. Exit 1 when none is found.
set -euo pipefail
# Prints the interpreter's real path (not a pyenv shim, whose answer depends on the directory).
real() { "$1" -c 'import sys, venv, ensurepip; assert (3, 10) <= sys.version_info[:2] <= (3, 12); print(sys.executable)' 2>/dev/null; }
for c in "${SLIME_HARBOR_ENGINE_PYTHON:-}" python3.12 $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3 2>/dev/null | sort -rV) \
         python3.11 $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.1[01]*/bin/python3 2>/dev/null | sort -rV) python3.10 python3; do
    [ -n "$c" ] && command -v "$c" >/dev/null 2>&1 && real "$c" && exit 0
done
exit 1
