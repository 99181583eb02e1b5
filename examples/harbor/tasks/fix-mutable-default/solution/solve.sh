#!/bin/bash
set -e
# A default list is created once and shared by every call; build a new one each time.
cat > /app/tags.py <<'PY'
def add_tag(tag, tags=None):
    """Return tags followed by tag, as a new list; tags defaults to no tags."""
    return [*(tags or []), tag]
PY
