"""Where the grading watch's files live on the host: one short dir per sandbox, bound read-only at
WATCH_DIR inside it (and inside a separate verifier's), empty until a verifier runs.

Short because the report is a unix socket in it, and a socket's path must fit in 108 bytes: the
dirs sit under the temp dir's ``slime-harbor-watch/``, named ``<pid>-<random>`` after the process
that owns them, so a process killed with SIGKILL leaves dirs the next one sweeps.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

WATCH_DIR = "/logs/grader-watch"
"""Where a sandbox sees the watch's dir (beside Harbor's /logs/agent, /logs/verifier)."""


def watch_root() -> Path:
    return Path(tempfile.gettempdir()) / "slime-harbor-watch"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale_watch_dirs() -> None:
    """Remove the dirs of processes that are gone."""
    try:
        entries = list(watch_root().iterdir())
    except OSError:
        return
    for entry in entries:
        owner = entry.name.split("-", 1)[0]
        if owner.isdigit() and int(owner) != os.getpid() and not _alive(int(owner)):
            shutil.rmtree(entry, ignore_errors=True)


_swept = False


def reserve_watch_dir() -> Path:
    """A fresh dir's path, not made yet (make_watch_dir makes it when its sandbox starts: Harbor
    builds sandboxes it never starts, as a regrade's agent environment, and those must leave none)."""
    import uuid

    return watch_root() / f"{os.getpid()}-{uuid.uuid4().hex[:8]}"


def make_watch_dir(path: Path) -> None:
    """Make the reserved dir, empty (mode 0755: the SWE grader's tests run as nobody and must reach
    the socket); the first of a process also sweeps the dirs of processes that are gone."""
    global _swept
    root = watch_root()
    root.mkdir(mode=0o755, exist_ok=True)
    if not _swept:
        _swept = True
        sweep_stale_watch_dirs()
    path.mkdir(mode=0o755)
    path.chmod(0o755)  # past the umask


def remove_watch_dir(path: Path | None) -> None:
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)
