"""What the bubblewrap sandbox (environments/bubblewrap.py) does on the host, outside the sandbox:
its per-trial directories (made, removed, swept when the process that owned them died), the root
skeleton and the readable copy of /etc it starts from, and finding and signalling the processes
that carry its marker.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import re
import shutil
import signal
import stat
import tempfile
import threading
import uuid
from pathlib import Path

from slime_harbor.environments.common import owner_stamp


SANDBOX_TYPE = "bubblewrap"


# Host directories shared read-only; symlinks among them (merged /usr) are recreated instead.
HOST_TOOL_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")


# The writable system dirs are overlays (mount point -> lower dir); bubblewrap.py mounts them.
ETC_TEMPLATE_MOUNT = "/run/host-etc"
OVERLAY_MOUNT = "/.slime-harbor-overlay"
OVERLAYS = {"/usr": "/usr", "/etc": ETC_TEMPLATE_MOUNT}


# Directories every sandbox root has, with their modes (as in a Debian image).
_ROOT_SKELETON = {
    "root": 0o700, "tmp": 0o1777, "var/tmp": 0o1777, "var/log": 0o755, "home": 0o755,
    "opt": 0o755, "srv": 0o755, "mnt": 0o755, "run": 0o755, "logs": 0o755, "etc": 0o755,
}  # fmt: skip


def default_sandbox_root() -> Path:
    """Where per-trial sandbox directories go unless ``base_dir`` says otherwise."""
    return Path(tempfile.gettempdir()) / "slime-harbor-sandboxes"


@functools.cache
def host_tool(name: str) -> str:
    """The path of a host program the sandbox needs (bwrap, nsenter); a clear error if missing."""
    path = shutil.which(name)
    if path is None:
        raise FileNotFoundError(
            f"{name} is not installed; the {SANDBOX_TYPE} environment needs bubblewrap and "
            "util-linux (e.g. 'apt-get install bubblewrap util-linux')"
        )
    return path


def sigkill(kill, target: int) -> None:
    """SIGKILL a process (``kill=os.kill``) or process group (``os.killpg``); one already gone,
    or no longer ours, is not an error."""
    try:
        kill(target, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def new_owned_dir(base_dir: Path, label: str) -> Path:
    """A fresh directory under ``base_dir`` that records this process as its owner."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", label)[:80]
    path = base_dir / f"{name}-{uuid.uuid4().hex[:12]}"
    path.mkdir(mode=0o700)
    # Who owns it, so a later sweep can tell a live sandbox from one whose process died.
    (path / "owner").write_text(owner_stamp(os.getpid()) or "")
    return path


def sweep_stale_sandboxes(base_dir: Path) -> None:
    """Remove sandbox directories whose owning process has died."""
    our_namespace = os.readlink("/proc/self/ns/pid")
    for path in base_dir.iterdir():
        try:
            stamp = (path / "owner").read_text()
            namespace, pid, _ = stamp.split()
        except (OSError, ValueError):
            continue
        # An owner in another pid namespace (another container sharing /tmp) cannot be checked.
        if namespace == our_namespace and owner_stamp(int(pid)) != stamp:
            with contextlib.suppress(FileNotFoundError):  # another sweeper got there first
                remove_tree(path)


MARKER_VAR = "SLIME_HARBOR_SANDBOX"


def pids_with_marker(marker: str) -> list[int]:
    """Host pids whose environment holds SLIME_HARBOR_SANDBOX=<marker>."""
    needle = f"{MARKER_VAR}={marker}".encode()
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    pids.append(int(name))
        except OSError:  # gone, or not ours to read
            continue
    return pids


def pids_in_namespace(namespace_inode: int, exclude: int) -> list[int]:
    """Host pids of the live (not zombie) processes in the pid namespace with that inode."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == exclude:
            continue
        try:
            if os.stat(f"/proc/{name}/ns/pid").st_ino != namespace_inode:
                continue
            with open(f"/proc/{name}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]  # after the command name, which may hold spaces
        except (OSError, IndexError):
            continue
        if state != "Z":
            pids.append(int(name))
    return pids


def remove_tree(path: Path) -> None:
    """Remove a sandbox directory, whatever modes the sandbox left on it."""

    def make_writable_and_retry(function, failed_path, _exc):
        # The sandbox may have left read-only directories (chmod 500 ...).
        os.chmod(os.path.dirname(failed_path), 0o700)
        if os.path.isdir(failed_path) and not os.path.islink(failed_path):
            os.chmod(failed_path, 0o700)
        function(failed_path)

    shutil.rmtree(path, onexc=make_writable_and_retry)


def populate_root(rootfs: Path) -> None:
    """Lay out the sandbox's writable ``/``: skeleton directories and links to host tools, and
    beside it the upper and work dirs of its overlays (``overlay/usr``, ``overlay/etc``)."""
    for point in OVERLAYS:
        for part in ("upper", "work"):
            (rootfs.parent / "overlay" / point.strip("/") / part).mkdir(parents=True, mode=0o755)
    rootfs.mkdir(mode=0o755)
    for relative, mode in _ROOT_SKELETON.items():
        path = rootfs / relative
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(mode)
    for name in HOST_TOOL_DIRS:
        host = Path("/") / name
        if host.is_symlink():
            os.symlink(os.readlink(host), rootfs / name)


_etc_templates: dict[Path, Path] = {}


_etc_template_lock = threading.Lock()


def etc_template(base_dir: Path) -> Path:
    """This process's copy of what any host user may read of /etc (so no /etc/shadow, no
    private keys), made once under ``base_dir`` and swept like a sandbox when the process dies."""
    with _etc_template_lock:
        template = _etc_templates.get(base_dir)
        if template is None:
            template = new_owned_dir(base_dir, "etc-template") / "etc"
            _copy_readable_etc(template)
            _etc_templates[base_dir] = template
        return template


# Removed at interpreter exit (after the sandboxes: bubblewrap.py registers its own handler later,
# and atexit runs the last registered first).
@atexit.register
def _remove_etc_templates() -> None:
    for template in _etc_templates.values():
        shutil.rmtree(template.parent, ignore_errors=True)


def _copy_readable_etc(target: Path) -> None:
    def unreadable(directory: str, names: list[str]) -> list[str]:
        skipped = []
        for name in names:
            try:
                st = os.lstat(os.path.join(directory, name))
            except OSError:
                skipped.append(name)
                continue
            if stat.S_ISLNK(st.st_mode):
                continue
            readable = st.st_mode & stat.S_IROTH and (
                stat.S_ISREG(st.st_mode) or (stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_IXOTH)
            )
            if not readable:
                skipped.append(name)
        return skipped

    shutil.copytree("/etc", target, symlinks=True, ignore=unreadable)
    resolv = target / "resolv.conf"
    if resolv.is_symlink():  # often points into /run, which the sandbox does not share
        resolv.unlink()
        try:
            shutil.copyfile("/etc/resolv.conf", resolv)
        except OSError:
            pass
