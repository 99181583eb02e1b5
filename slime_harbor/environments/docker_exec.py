"""Commands in a running container without a process (or an Engine API call) per command.

A ``docker exec`` costs a CLI process, two or three Engine API calls and a runc start; Harbor's
own docker environment pays that, plus a ``docker compose`` process, on every command. Here each
container gets one small shell loop (a "worker") started once through one attached Engine API
exec; a command is one line written to its stdin, its result one framed reply on its stdout.

The worker is POSIX shell plus ``wc``/``head`` (any image with /bin/sh and coreutils or busybox):
bash when the image has it (``set -m`` then puts every command in a process group of its own,
and the job runs in a forked subshell: one exec per command), else /bin/sh with ``setsid``.
Each command's JOBFILE runs in its own process group,
stdin from /dev/null, stdout and stderr to files (so a background job that inherits them never
keeps the reply waiting), and the JOBFILE (written by the host, see
:mod:`slime_harbor.environments.docker`) does the ``cd``, the env and the user switch and then
``exec``s ``bash -c COMMAND`` as ``docker exec`` would. Protocol, one command at a time per worker:

    host -> worker   go\\n                         once, before the worker writes anything
    worker -> host   H <has bash> <has setpriv>\\n  (N\\n: neither bash nor setsid: unusable)
    host -> worker   <id> <job file, %b-escaped>\\n  one line: backslash and newline escaped
    worker -> host   P <id> <pgid>\\n               the job started (its process group)
    worker -> host   R <id> <rc> <n out> <n err>\\n<stdout bytes><stderr bytes>E <id>\\n

Output is binary-safe and framed by byte counts, so missing trailing newlines, NULs and large
outputs pass unchanged. Concurrent commands use more workers (spawned on demand, kept for
reuse). A timeout kills the command's whole process group through another worker; a worker that
dies or breaks the protocol raises :class:`ExecServerError` and is discarded.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import socket
from collections import deque

from slime_harbor.environments.common import CompletedCommand

WORKER_DIR = "/run/slime-harbor-exec"
"""Where workers keep their job files and outputs inside the container (mode 1777)."""
_HELLO_TIMEOUT_SEC = 60.0
_STARTED_TIMEOUT_SEC = 120.0

_LOOP = r"""
w=$1; d=$2
if [ -n "$BASH_VERSION" ]; then set -m; b=1; SHLVL=0; else b=0; fi
if command -v setpriv >/dev/null 2>&1; then p=1; else p=0; fi
IFS= read -r _ || exit 0
printf 'H %s %s\n' "$b" "$p"
while IFS= read -r line; do
  id=${line%% *}; enc=${line#* }; f=$d/$w
  [ -d "$d" ] || mkdir -p -m 1777 "$d"
  printf '%b' "$enc" > "$f.sh"
  if [ "$b" = 1 ]; then (. "$f.sh") </dev/null >"$f.out" 2>"$f.err" &
  else setsid /bin/sh "$f.sh" </dev/null >"$f.out" 2>"$f.err" &
  fi
  pid=$!
  printf 'P %s %s\n' "$id" "$pid"
  wait "$pid"; rc=$?
  set -- $(wc -c "$f.out" "$f.err"); o=$1; e=$3
  printf 'R %s %s %s %s\n' "$id" "$rc" "$o" "$e"
  if [ "$o" -gt 0 ]; then head -c "$o" "$f.out"; fi
  if [ "$e" -gt 0 ]; then head -c "$e" "$f.err"; fi
  printf 'E %s\n' "$id"
done
"""
# Started as `/bin/sh -c BOOT sh NAME DIR`: bash if present, else sh + setsid, else say N.
_BOOT = (
    f"L={shlex.quote(_LOOP)}; "
    'if command -v bash >/dev/null 2>&1; then exec bash -c "$L" bash "$@"; fi; '
    'if command -v setsid >/dev/null 2>&1; then exec /bin/sh -c "$L" sh "$@"; fi; '
    "IFS= read -r _; echo N"
)


class ExecServerError(RuntimeError):
    """The in-container exec server died or broke its protocol."""


class ExecServerUnavailable(ExecServerError):
    """The image has neither bash nor setsid: commands must go through Engine API execs."""


def encode_job(script: str) -> bytes:
    """One protocol line: the worker turns it back into the script with ``printf %b``."""
    return script.replace("\0", "").replace("\\", "\\\\").replace("\n", "\\n").encode()


class _Worker:
    """One shell loop in the container, attached through one Engine API exec."""

    def __init__(self, name: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.name = name
        self._reader = reader
        self._writer = writer
        self._out = asyncio.StreamReader(limit=2**24)
        self._stderr: deque[bytes] = deque(maxlen=20)
        self._pump = asyncio.ensure_future(self._demultiplex())
        self._seq = 0
        self.broken = False

    async def _demultiplex(self) -> None:
        """Split Docker's stdout/stderr frames (8-byte header: stream, 0, 0, 0, size)."""
        try:
            while True:
                header = await self._reader.readexactly(8)
                payload = await self._reader.readexactly(int.from_bytes(header[4:], "big"))
                if header[0] == 2:
                    self._stderr.append(payload)
                else:
                    self._out.feed_data(payload)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            self._out.feed_eof()

    @property
    def alive(self) -> bool:
        return not self.broken and not self._pump.done()

    def diagnostics(self) -> str:
        """What the worker wrote on stderr, less bash's job notices ("[1]+ Done ...")."""
        text = b"".join(self._stderr).decode(errors="replace")
        return "\n".join(line for line in text.splitlines() if not line.startswith("[")).strip()[-2000:]

    async def _line(self, timeout: float | None = None, *, job_timeout: bool = False) -> list[str]:
        """The next protocol line. A timeout raises TimeoutError when it is the job's own timeout
        (``job_timeout``: the worker is fine, the job is late), else ExecServerError."""
        try:
            line = await asyncio.wait_for(self._out.readline(), timeout)
        except TimeoutError:
            if job_timeout:
                raise
            self.broken = True
            raise ExecServerError(f"exec server {self.name} did not answer in {timeout:.0f}s") from None
        if not line.endswith(b"\n"):
            self.broken = True
            raise ExecServerError(
                f"exec server {self.name} in the container ended"
                + (f": {self.diagnostics()}" if self.diagnostics() else "")
            )
        return line.decode(errors="replace").split()

    async def hello(self) -> tuple[bool, bool]:
        self._writer.write(b"go\n")
        await self._writer.drain()
        reply = await self._line(_HELLO_TIMEOUT_SEC)
        if reply == ["N"]:
            raise ExecServerUnavailable("the image has neither bash nor setsid")
        if len(reply) != 3 or reply[0] != "H":
            self.broken = True
            raise ExecServerError(f"exec server {self.name}: unexpected greeting {reply!r}")
        return reply[1] == "1", reply[2] == "1"

    async def start_job(self, script: str) -> tuple[str, int]:
        self._seq += 1
        job = str(self._seq)
        self._writer.write(job.encode() + b" " + encode_job(script) + b"\n")
        await self._writer.drain()
        started = await self._line(_STARTED_TIMEOUT_SEC)
        if started[:2] != ["P", job] or len(started) != 3:
            self.broken = True
            raise ExecServerError(f"exec server {self.name}: expected P {job}, got {started!r}")
        return job, int(started[2])

    async def result(self, job: str, timeout: float | None = None) -> CompletedCommand:
        """The job's reply; TimeoutError if it has not ended within ``timeout``."""
        head = await self._line(timeout, job_timeout=True)
        if head[:2] != ["R", job] or len(head) != 5:
            self.broken = True
            raise ExecServerError(f"exec server {self.name}: expected R {job}, got {head!r}")
        rc, n_out, n_err = (int(x) for x in head[2:])
        try:
            body = await self._out.readexactly(n_out + n_err)
        except asyncio.IncompleteReadError:
            self.broken = True
            raise ExecServerError(f"exec server {self.name} ended mid-reply") from None
        if await self._line(_STARTED_TIMEOUT_SEC) != ["E", job]:
            self.broken = True
            raise ExecServerError(f"exec server {self.name}: reply of job {job} is out of frame")
        return CompletedCommand(rc, body[:n_out], body[n_out:])

    def close(self) -> None:
        self.broken = True
        self._pump.cancel()
        with contextlib.suppress(Exception):
            self._writer.close()


class ExecServer:
    """A pool of workers in one container; ``run`` is safe to call concurrently.

    ``client`` is a ``docker.APIClient``; its blocking calls run in threads.
    """

    def __init__(self, client, container_id: str):
        self._client = client
        self._container_id = container_id
        self._idle: list[_Worker] = []
        self._all: set[_Worker] = set()
        self._background: set[asyncio.Task] = set()
        self._count = 0
        self.has_bash = False
        self.has_setpriv = False
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> None:
        """Start the first worker and learn what the image has (raises ExecServerUnavailable)."""
        self._loop = asyncio.get_running_loop()
        worker = await self._spawn()
        self._idle.append(worker)

    async def _spawn(self) -> _Worker:
        if self._closed:
            raise ExecServerError("the exec server was closed (environment stopped)")
        self._count += 1
        name = f"w{self._count}"
        try:
            raw = await asyncio.to_thread(self._attach, name)
        except Exception as exc:  # the Engine refused (container not running, daemon gone)
            explanation = getattr(exc, "explanation", None) or str(exc)
            raise ExecServerError(f"cannot start an exec server: {explanation}") from None
        reader, writer = await asyncio.open_connection(sock=raw, limit=2**24)
        worker = _Worker(name, reader, writer)
        self._all.add(worker)
        try:
            self.has_bash, self.has_setpriv = await worker.hello()
        except BaseException:  # a worker that never said hello is not reusable (re-raised)
            self._discard(worker)
            raise
        return worker

    def _attach(self, name: str) -> socket.socket:
        """One Engine API exec of the worker loop with stdin attached; a plain socket for asyncio."""
        exec_id = self._client.exec_create(
            self._container_id, ["/bin/sh", "-c", _BOOT, "sh", name, WORKER_DIR],
            stdin=True, stdout=True, stderr=True, user="root",
        )["Id"]  # fmt: skip
        hijacked = self._client.exec_start(exec_id, socket=True)
        # docker-py hands back the HTTP response's socket wrapper; asyncio gets a socket of its
        # own (a dup of the same connection), and the wrapper is left to the garbage collector
        # (closing it by hand upsets the HTTP response that still refers to it). Nothing was read
        # past the HTTP headers: the worker writes nothing before the host's first line.
        inner = getattr(hijacked, "_sock", hijacked)
        raw = socket.socket(fileno=os.dup(inner.fileno()))
        raw.setblocking(False)
        return raw

    def _discard(self, worker: _Worker) -> None:
        worker.close()
        self._all.discard(worker)
        with contextlib.suppress(ValueError):
            self._idle.remove(worker)

    async def run(self, script: str, timeout_sec: float | None = None) -> CompletedCommand:
        """Run one job file; on timeout its process group is killed and ``timed_out`` is set."""
        if self._loop is not asyncio.get_running_loop():
            # Workers' streams belong to the event loop that made them: start afresh in this one.
            for worker in list(self._all):
                self._discard(worker)
            self._loop = asyncio.get_running_loop()
        worker = None
        while self._idle and worker is None:
            worker = self._idle.pop()
            if not worker.alive:  # killed while idle (say, by a command that killed every shell)
                self._discard(worker)
                worker = None
        worker = worker or await self._spawn()
        try:
            job, pgid = await worker.start_job(script)
        except ExecServerError:
            # An idle worker killed a moment ago (its end not seen yet) started nothing: retry
            # once on a fresh one.
            self._discard(worker)
            worker = await self._spawn()
            try:
                job, pgid = await worker.start_job(script)
            except BaseException:  # the retry failed too: its worker goes (re-raised)
                self._discard(worker)
                raise
        except BaseException:  # a job half-started leaves the worker unusable (re-raised)
            self._discard(worker)
            raise
        try:
            try:
                done = await worker.result(job, timeout_sec or None)
            except TimeoutError:
                # Kill the job's process group, then collect the killed job's reply, so the
                # worker is reusable and nothing of the job outlives its timeout.
                await self.kill_group(pgid)
                done = await worker.result(job, _STARTED_TIMEOUT_SEC)
                done.timed_out = True
        except ExecServerError:
            self._discard(worker)
            raise
        except BaseException:  # cancelled: kill the job; the worker is not reusable mid-reply
            self._discard(worker)
            if not self._closed:
                task = asyncio.ensure_future(self.kill_group(pgid))
                self._background.add(task)
                task.add_done_callback(self._background.discard)
            raise
        if worker.broken:
            self._discard(worker)
        else:
            self._idle.append(worker)
        return done

    async def kill_group(self, pgid: int) -> None:
        """SIGKILL a job's whole process group (run through another worker, as root)."""
        with contextlib.suppress(ExecServerError, OSError):
            # `-s KILL --` is the spelling dash, bash and busybox all take for a negative pid.
            await self.run(f"kill -s KILL -- -{pgid} 2>/dev/null || kill -9 -{pgid} 2>/dev/null; "
                           f"kill -9 {pgid} 2>/dev/null; exit 0", 30)  # fmt: skip

    def close(self) -> None:
        self._closed = True
        for worker in list(self._all):
            self._discard(worker)
        for task in list(self._background):
            task.cancel()
