"""What the agent changed in a sandbox relative to its image, and what that image's runtime is, read
from the host: nothing here runs a program inside the sandbox after the agent had it (the agent
may have replaced any of them). :mod:`slime_harbor.verifier_runtime` judges the result.

- Docker: the daemon's diff of the container against its image (``GET /containers/ID/changes``),
  and the image's runtime index, listed once per image id by a throwaway container of the pristine
  image (no network), cached for the process.
- bubblewrap: its writable system dirs are overlays (``/usr`` over the host's, ``/etc`` over a copy
  of the host's) whose upper directories live on the host, and its ``/`` is a host directory. A
  snapshot of those trees (lstat only, never following a link) is taken when the sandbox has been
  built and again before the verifier; the difference is what the agent changed. An overlay
  whiteout is a deletion, an opaque directory deletes what was under it. The runtime index is the
  host's (dpkg's lists, the Python distributions under /usr) plus what the task's build installed.
  Where those trees lie is the sandbox's to say (its HostLayout); nothing here imports a sandbox.

These are the sandboxes' side of abilities.ReportsAgentChanges.
"""

from __future__ import annotations

import base64
import glob
import json
import os
import stat
import asyncio
import tarfile
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from slime_harbor.environments.common import SandboxError
from slime_harbor.verifier_runtime import (
    ADDED, DELETED, LISTING_SCRIPT, MODIFIED, MOUNTED, Change, RuntimeIndex, parse_listing,
)

# --- Docker -----------------------------------------------------------------------------------

_DOCKER_KINDS = {0: MODIFIED, 1: ADDED, 2: DELETED}
_index_cache: dict[str, RuntimeIndex] = {}
_index_lock = threading.Lock()


def docker_agent_changes(api, container_id: str, mount_targets: list[str]) -> list[Change]:
    """The container's changes against its image, as the daemon reports them. The daemon lists the
    mount points it made as changes; each is reported instead when it is no longer a directory
    (stat'ed through the archive API, which also answers for a container that no longer starts)."""
    changes = [Change(c["Path"], _DOCKER_KINDS[c["Kind"]]) for c in api.diff(container_id) or []
               if c["Path"] not in mount_targets]
    for target in mount_targets:
        # HEAD /containers/ID/archive: the path's stat in a header, without its contents
        reply = api.head(api._url("/containers/{0}/archive", container_id), params={"path": target})
        header = reply.headers.get("x-docker-container-path-stat") if reply.ok else None
        is_dir = bool(header) and bool(json.loads(base64.b64decode(header)).get("mode", 0) & (1 << 31))  # os.ModeDir
        if not is_dir:
            changes.append(Change(target, MODIFIED, False))
    return changes


def docker_runtime_index(api, image: str) -> RuntimeIndex:
    """The runtime index of `image` (its id is the cache key), listed by a pristine container of it."""
    image_id = api.inspect_image(image)["Id"]
    with _index_lock:
        if image_id in _index_cache:
            return _index_cache[image_id]
        container = api.create_container(image_id, command=["/bin/sh", "-c", LISTING_SCRIPT], entrypoint=[],
                                         user="0", network_disabled=True,
                                         host_config=api.create_host_config(network_mode="none"))
        try:
            api.start(container)
            status = api.wait(container, timeout=300).get("StatusCode")
            text = api.logs(container, stdout=True, stderr=False).decode(errors="replace")
        finally:
            api.remove_container(container, force=True)
        if "@end" not in text:
            raise SandboxError(f"listing the runtime of image {image} failed (exit {status})")
        _index_cache[image_id] = parse_listing(text)
        return _index_cache[image_id]


def docker_file_text(api, container_id: str, path: str, limit: int = 1 << 20) -> str | None:
    """A regular file's text, through the archive API (a link is not followed: None)."""
    import docker

    try:
        stream, _ = api.get_archive(container_id, path)
    except docker.errors.NotFound:
        return None
    with tempfile.TemporaryFile() as archive:
        for chunk in stream:
            archive.write(chunk)
        archive.seek(0)
        with tarfile.open(fileobj=archive) as tar:
            member = tar.next()
            if member is None or not member.isreg() or member.size > limit:
                return None
            return tar.extractfile(member).read().decode(errors="replace")


def read_host_file(host: Path, limit: int = 1 << 20) -> str | None:
    """A regular file's text on the host, never through a link."""
    try:
        fd = os.open(host, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None
        data = f.read(limit + 1)
    return None if len(data) > limit else data.decode(errors="replace")


class ContainerChanges:
    """The Docker environment's side of this (a mixin of DockerEnvironment: it needs its _client,
    container_id, _mounts, run_image and image)."""

    async def agent_changes(self) -> list[Change]:  # from the daemon, never the container
        targets = [m["target"] for m in self._mounts if m.get("type") == "bind"]
        return await asyncio.to_thread(docker_agent_changes, self._client.api, self.container_id, targets)

    async def runtime_index(self) -> RuntimeIndex:  # the image's, listed by a pristine container of it
        return await asyncio.to_thread(docker_runtime_index, self._client.api, self.run_image or self.image)

    async def changed_file_text(self, path: str) -> str | None:  # through the archive API, as the diff
        return await asyncio.to_thread(docker_file_text, self._client.api, self.container_id, path)


# --- bubblewrap -------------------------------------------------------------------------------

OPAQUE_XATTRS = ("trusted.overlay.opaque", "user.overlay.opaque")


@dataclass(frozen=True)
class Entry:
    """What a path was: enough to tell any change (ctime moves on every write, chmod and rename)."""

    mode: int
    size: int
    mtime_ns: int
    ctime_ns: int
    ino: int
    rdev: int
    opaque: bool

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)

    @property
    def whiteout(self) -> bool:
        return stat.S_ISCHR(self.mode) and self.rdev == 0


def snapshot(host_dir: Path, sandbox_path: str, skip: frozenset[str] = frozenset()) -> dict[str, Entry]:
    """sandbox path -> Entry for everything under `host_dir` (shown at `sandbox_path` in the
    sandbox); `skip`: sandbox paths not descended into (mount points: what lies under one on the
    host is hidden in the sandbox, so the entry changes only if the agent unmounted it)."""
    out: dict[str, Entry] = {}
    base = str(host_dir)
    stack = [(base, sandbox_path.rstrip("/") or "/")]
    while stack:
        host, inside = stack.pop()
        try:
            names = os.listdir(host)
        except OSError:
            continue
        for name in names:
            h = os.path.join(host, name)
            p = (inside.rstrip("/") + "/" + name)
            try:
                st = os.lstat(h)
            except OSError:
                continue
            opaque = False
            if stat.S_ISDIR(st.st_mode):
                opaque = any(_xattr(h, a) == b"y" for a in OPAQUE_XATTRS)
                if p not in skip:
                    stack.append((h, p))
            out[p] = Entry(st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_rdev, opaque)
    return out


def _xattr(path: str, name: str) -> bytes | None:
    try:
        return os.getxattr(path, name, follow_symlinks=False)
    except OSError:
        return None


def changes_between(before: dict[str, Entry], after: dict[str, Entry]) -> list[Change]:
    """What happened between two snapshots of the same trees."""
    changes = []
    for path, entry in after.items():
        old = before.get(path)
        if entry.whiteout:
            if old is None or not old.whiteout:
                changes.append(Change(path, DELETED))
        elif old is None or old.whiteout:
            changes.append(Change(path, DELETED if entry.opaque else ADDED, entry.is_dir))
            if entry.opaque:  # rm -rf then mkdir: the old contents are gone, the dir is new
                changes.append(Change(path, ADDED, True))
        elif entry.opaque and not old.opaque:
            changes.append(Change(path, DELETED, True))
        elif entry != old:
            changes.append(Change(path, MODIFIED, entry.is_dir))
    changes += [Change(path, DELETED, old.is_dir) for path, old in before.items()
                if path not in after and not old.whiteout]
    return changes


def _host_listing(host_links: tuple[str, ...]) -> str:
    """The host's tools as a listing (LISTING_SCRIPT's format): what the sandbox's lower /usr ships;
    `host_links`: the top-level dirs whose host links the sandbox's root recreates (merged /usr)."""
    lines = [f"@link /{d} {os.readlink('/' + d)}" for d in host_links if os.path.islink("/" + d)]
    lines.append("@dpkg")
    for listed in glob.glob("/var/lib/dpkg/info/*.list"):
        try:
            lines += [p for p in Path(listed).read_text(errors="replace").splitlines() if p and not os.path.isdir(p)]
        except OSError:
            continue
    for pattern in ("/usr/lib/python3*/*-packages/*.dist-info/RECORD",
                    "/usr/local/lib/python3*/*-packages/*.dist-info/RECORD"):
        for record in glob.glob(pattern):
            lines.append(f"@record {record}")
            try:
                lines += Path(record).read_text(errors="replace").splitlines()
            except OSError:
                continue
    lines.append("@end")
    return "\n".join(lines)


_host_index: RuntimeIndex | None = None


def bubblewrap_runtime_index(built: dict[str, Entry], upper_files, host_links: tuple[str, ...]) -> RuntimeIndex:
    """The host's runtime (parsed once per process, and shared), plus the distributions the task's
    build installed (RECORDs in the sandbox's upper dirs when it was built); `upper_files(sandbox
    path) -> Path` finds them on the host; `host_links`: see _host_listing."""
    global _host_index
    with _index_lock:
        if _host_index is None:
            _host_index = parse_listing(_host_listing(host_links))
    records = ["@dpkg"]
    for path, entry in built.items():
        if path.endswith(".dist-info/RECORD") and stat.S_ISREG(entry.mode):
            text = read_host_file(upper_files(path), limit=64 << 20)
            if text is not None:
                records += [f"@record {path}", *text.splitlines()]
    if len(records) == 1:
        return _host_index
    task = parse_listing("\n".join([*(f"@link {k} {v}" for k, v in _host_index.merged_usr.items()), *records, "@end"]))
    return RuntimeIndex(owned=_host_index.owned | task.owned, merged_usr=_host_index.merged_usr)


@dataclass(frozen=True)
class HostLayout:
    """Where a sandbox that keeps its files on the host lays them out, as the sandbox declares it
    (BubblewrapEnvironment.HOST_LAYOUT): what SandboxChanges reads to tell what its agent changed."""

    overlays: tuple[str, ...]
    """The sandbox dirs that are overlays (/usr, /etc): the agent's writes there are in their upper dirs."""
    plumbing: tuple[str, ...]
    """Mount points of the sandbox's own plumbing (/proc, /dev, the overlays' host dirs), never read."""
    host_links: tuple[str, ...]
    """The top-level dirs whose host links (merged /usr) the sandbox's root recreates."""


class SandboxChanges:
    """The bubblewrap sandbox's side of this (a mixin of BubblewrapEnvironment: it needs its
    HOST_LAYOUT, sandbox_dir, _rootfs, _overlay_dir(point) and _overlay_lower(point), _mounts,
    _init_pid, and _built / _built_mounts, which start() fills once the sandbox is built)."""

    def _snapshot(self) -> dict:
        layout = self.HOST_LAYOUT
        skip = frozenset({*layout.overlays, *layout.plumbing, *(m["target"] for m in self._mounts)})
        trees = snapshot(self._rootfs, "/", skip)
        for point in layout.overlays:
            trees.update(snapshot(self._overlay_dir(point) / "upper", point))
        return trees

    def _host_file(self, path: str) -> Path:
        """Where a file the sandbox shows at `path` lies on the host, if the sandbox wrote it."""
        for point in self.HOST_LAYOUT.overlays:
            if path.startswith(point + "/"):
                return self._overlay_dir(point) / "upper" / path[len(point) + 1:]
        return self._rootfs / path.lstrip("/")

    def _mount_points(self) -> set[tuple[str, str]]:
        """(mount id, mount point) of every mount in the sandbox: an unmount and remount at the
        same point (the /usr overlay taken away) changes the id."""
        with open(f"/proc/{self._init_pid}/mountinfo") as f:
            return {(fields[0], fields[4]) for fields in map(str.split, f)}

    async def agent_changes(self) -> list[Change]:
        """What changed in the sandbox since it was built (files, and mounts the agent made)."""
        if self._built is None:
            raise SandboxError("the sandbox was not built")
        now = await asyncio.to_thread(self._snapshot)
        mounts = self._mount_points()
        changes = [Change(c.path, MODIFIED, c.is_dir) if c.kind == ADDED and self._in_lower(c.path) else c
                   for c in changes_between(self._built, now)]  # a copy-up changes the host's file
        return [*changes, *(Change(p, MOUNTED) for p in sorted({p for _, p in mounts ^ self._built_mounts}))]

    def _in_lower(self, path: str) -> bool:
        """Whether an overlay's lower layer (the host's /usr, the /etc copy) has `path`."""
        for point in self.HOST_LAYOUT.overlays:
            if path.startswith(point + "/"):
                return os.path.lexists(self._overlay_lower(point) / path[len(point) + 1:])
        return False

    async def runtime_index(self) -> RuntimeIndex:
        return await asyncio.to_thread(bubblewrap_runtime_index, self._built, self._host_file, self.HOST_LAYOUT.host_links)

    async def changed_file_text(self, path: str) -> str | None:
        return await asyncio.to_thread(read_host_file, self._host_file(path))

