#!/bin/bash
set -e
cat > /app/confparse.py <<'PY'
def parse(text):
    """Parse `key = value` lines with optional [section] headers into a flat dict."""
    result = {}
    section = ""
    for raw_line in text.splitlines():
        line = raw_line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, _, value = line.partition("=")
        key = key.strip()
        result[f"{section}.{key}" if section else key] = value.strip()
    return result
PY
