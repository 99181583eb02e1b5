"""Files into and out of a bubblewrap sandbox: the Dockerfile's build steps replayed (RUN, COPY,
WORKDIR's mkdir) and Harbor's file API (upload/download of files and directories).

Transfers run ``tar``/``cat`` inside the sandbox rather than copying on the host, so a symlink the
agent planted (``/app/x -> /home/you/.bashrc``) resolves inside the sandbox and never reaches a
host file. BubblewrapEnvironment (environments/bubblewrap.py) takes these methods from
SandboxFiles; they run commands through its ``_run`` / ``_check``.
"""

from __future__ import annotations

import asyncio
import os
import posixpath
import tarfile
import tempfile
import uuid
from pathlib import Path
from typing import IO

from harbor.environments.base import transfer_tar_filter

from slime_harbor.environments.common import root_owned, tail, write_dir_archive
from slime_harbor.environments.dockerfile import CopyEntry, CopyFiles, MakeDir, RunCommand


class SandboxFiles:
    """The file side of BubblewrapEnvironment (a mixin: it needs the sandbox's _run, _check,
    _base_env and _default_cwd)."""

    async def _apply(self, step: MakeDir | CopyFiles | RunCommand) -> None:
        try:
            if isinstance(step, MakeDir):
                await self._check(["mkdir", "-p", "--", step.path], "mkdir")
            elif isinstance(step, CopyFiles):
                for entry in step.entries:
                    await self._copy_entry(entry)
            else:
                env = {**self._base_env, **step.env}
                done = await self._run(list(step.argv), cwd=step.workdir, env=env)
                if done.return_code != 0:
                    raise step.instruction.error(
                        f"exited with code {done.return_code}:\n{tail(done.output())}"
                    )
        except RuntimeError as e:
            raise step.instruction.error(str(e)) from e

    async def _copy_entry(self, entry: CopyEntry) -> None:
        dest = entry.dest
        if entry.source.is_dir() or entry.extract:
            target_dir, name = dest, None
        else:
            into_dir = entry.into_dir
            if into_dir is None:
                into_dir = (await self._run(["test", "-d", dest])).return_code == 0
            target_dir, name = (dest, entry.source.name) if into_dir else posixpath.split(dest)
        with tempfile.TemporaryFile() as archive:
            await asyncio.to_thread(_write_copy_archive, archive, entry, name)
            await self._extract(archive, target_dir)

    # --- file transfer ------------------------------------------------------------------------

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        # Like `docker cp`: into the directory if the target is one, else as that file.
        script = (
            't=$1; if [ -d "$t" ]; then t="${t%/}/$2"; else mkdir -p -- "$(dirname -- "$t")"; '
            'fi; cat > "$t" && chmod "$3" "$t"'
        )
        source = Path(source_path)
        mode = format(source.stat().st_mode & 0o7777, "o")
        with open(source, "rb") as data:
            await self._check(
                ["/bin/sh", "-c", script, "upload", target_path, source.name, mode],
                f"upload_file {source} -> {target_path}",
                stdin=data,
                cwd=self._default_cwd,
            )

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        # Like `docker cp source/. target`: the directory's contents land in target_dir.
        with tempfile.TemporaryFile() as archive:
            await asyncio.to_thread(write_dir_archive, archive, Path(source_dir))
            await self._extract(archive, target_dir)

    async def _extract(self, archive: IO[bytes], target_dir: str) -> None:
        archive.seek(0)
        await self._check(
            ["/bin/sh", "-c", 'mkdir -p -- "$1" && tar -x -f - -C "$1"', "extract", target_dir],
            f"copy into {target_dir}",
            stdin=archive,
            cwd=self._default_cwd,
        )

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        target = Path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.partial")
        try:
            with open(partial, "wb") as out:
                await self._check(
                    ["cat", "--", source_path],
                    f"download_file {source_path}",
                    stdout=out,
                    cwd=self._default_cwd,
                )
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        target = Path(target_dir)
        target.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile() as archive:
            await self._check(
                ["tar", "-c", "-f", "-", "-C", source_dir, "."],
                f"download_dir {source_dir}",
                stdout=archive,
                cwd=self._default_cwd,
            )
            archive.seek(0)
            await asyncio.to_thread(_extract_archive, archive, target)


def _write_copy_archive(archive: IO[bytes], entry: CopyEntry, file_name: str | None) -> None:
    """The tar stream a COPY/ADD entry extracts into its target directory."""

    def with_mode(info: tarfile.TarInfo) -> tarfile.TarInfo:
        if entry.mode is not None and not info.issym():
            info.mode = entry.mode
        return root_owned(info)

    with tarfile.open(fileobj=archive, mode="w") as tar:
        if entry.extract:
            with tarfile.open(entry.source, mode="r:*") as packed:
                for member in packed:
                    data = packed.extractfile(member) if member.isfile() else None
                    tar.addfile(with_mode(member), data)
        elif entry.source.is_dir():
            for path in sorted(entry.source.rglob("*")):
                tar.add(path, arcname=path.relative_to(entry.source).as_posix(),
                        recursive=False, filter=with_mode)  # fmt: skip
        else:
            # A source given by name is followed if it is a symlink, as Docker does.
            info = tar.gettarinfo(entry.source.resolve(), arcname=file_name)
            with open(entry.source, "rb") as data:
                tar.addfile(with_mode(info), data)


def _extract_archive(archive: IO[bytes], target: Path) -> None:
    with tarfile.open(fileobj=archive, mode="r:") as tar:
        tar.extractall(path=target, filter=transfer_tar_filter)
