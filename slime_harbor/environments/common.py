"""What the bubblewrap and Docker sandboxes share: a command's result and timeout, who counts as
root, owner stamps, archives, network rule, flag kwargs."""

from __future__ import annotations

import fnmatch
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from harbor.models.task.config import EnvironmentConfig, NetworkMode, NetworkPolicy


ROOT_USERS = (None, "root", 0, "0")
"""Who is root: a command's user as Harbor passes it (None: the default, which is root in both
sandboxes; a name; a uid, int or text), and the USER / --chown words of a Dockerfile."""


@dataclass
class CompletedCommand:
    """A command run in a sandbox: its exit code and output, as bytes."""

    return_code: int
    stdout: bytes
    stderr: bytes
    timed_out: bool = False
    """Killed at its timeout. The Docker exec server collects a killed command's reply and says so
    here; bubblewrap raises ExecTimeoutError instead."""

    def output(self) -> str:
        """stdout then stderr as text, for an error message."""
        return (self.stdout + self.stderr).decode(errors="replace").strip()


class SandboxError(RuntimeError):
    """The sandbox failed (would not start, stopped under us, a command of ours in it failed)."""


class SandboxFileNotFoundError(FileNotFoundError):
    """A path asked of the sandbox is not there."""


class ExecTimeoutError(RuntimeError):
    """An exec ran past its timeout; its process group was killed.

    A RuntimeError with Docker environment's message, so callers written for it behave the same.
    """


def tail(text: str, limit: int = 4000) -> str:
    """The last `limit` characters of a log, marked as cut when it was."""
    return text if len(text) <= limit else "...\n" + text[-limit:]


def flag_kwarg(value: bool | str) -> bool:
    """An on/off environment kwarg (``--ek`` passes text: true/1/yes)."""
    return str(value).strip().lower() in ("1", "true", "yes")


def owner_stamp(pid: int) -> str | None:
    """Identifies a live process across pid reuse: its pid namespace, pid and start time."""
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    start_time = stat_line.rsplit(")", 1)[1].split()[19]  # field 22, after the command name
    return f"{os.readlink('/proc/self/ns/pid')} {pid} {start_time}"


def shares_host_network(policy: NetworkPolicy, task_env: EnvironmentConfig, default_mode: NetworkMode) -> bool:
    """Whether a sandbox gets the host's network: only when the task asks for "public" network in
    its task.toml, or leaves it unset and the environment's default_network_mode is "public"."""
    if policy.network_mode != NetworkMode.PUBLIC:
        return False
    explicit = "network_mode" in task_env.model_fields_set
    return explicit or default_mode == NetworkMode.PUBLIC


def root_owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def write_dir_archive(archive: IO[bytes], source_dir: Path) -> None:
    """A tar stream of source_dir's contents (not the dir itself), owned by root."""
    with tarfile.open(fileobj=archive, mode="w") as tar:
        for path in sorted(source_dir.rglob("*")):
            tar.add(path, arcname=path.relative_to(source_dir).as_posix(), recursive=False,
                    filter=root_owned)  # fmt: skip


def tar_excludes(path: str, patterns: tuple[str, ...]) -> bool:
    """Whether tar --exclude=PATTERN would leave `path` (relative, "/"-separated) out."""
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    return any(fnmatch.fnmatchcase(x, p) for p in patterns for x in (*parts, *prefixes))
