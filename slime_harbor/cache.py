"""slime-harbor's cache on this machine, outside any checkout: $SLIME_HARBOR_CACHE, else
~/.cache/slime-harbor. What lives there, each under its own folder and keyed by what made it:

    tiny-model-seed<N>-<recipe>/     the offline tiny model (policy/tiny_model.py)
    engines/                         the real SGLang and vLLM venvs (scripts/setup-*.sh, policy/engine_launcher.py)
    agent-installs/                  installed agents' host-side installs (agents/installed/installs.py)
    datasets/, harbor-tasks/         Harbor datasets by name (tasks/datasets.py)
    rootfs-*.tar, build-*.log        Docker base images built without a pull (scripts/setup-docker.sh)
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """The cache's root ($SLIME_HARBOR_CACHE, else ~/.cache/slime-harbor)."""
    return Path(os.environ.get("SLIME_HARBOR_CACHE", Path.home() / ".cache" / "slime-harbor"))
