"""The host side of the grading watch: the channel the hook reports on, and what its records say.

`WatchChannel.open` puts the hook (runtime/sitecustomize.py) and its config in a directory
the sandbox mounts read-only, binds the unix datagram socket the hook reports to, and collects
records on a daemon thread; `env()` gives the verifier's command the two variables that load the
hook; `close()` drains the socket and returns a `WatchReport`.

A run is watched only when every Python process that reported also said goodbye: a process with a
`start` and no `end` was cut off (os._exit, a kill, a lost send) and may have done anything after
its last record. Forked children need no `end` (multiprocessing's leave through os._exit). A record
the hook could not have written is proof someone else writes to the socket: a `forged_report` flag,
and the run is unwatched.
"""

from __future__ import annotations

import functools
import json
import os
import select
import shutil
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

RUNTIME_DIR = Path(__file__).resolve().parent / "runtime"
HOOK_FILE = "sitecustomize.py"
WATCH_ENV = "SLIME_HARBOR_WATCH"
CONFIG_FILE = "config"
RECORD_KINDS = ("start", "event", "spawned", "capped", "fork", "end")
MAX_DATAGRAM = 65536


@dataclass
class WatchEvent:
    """One flagged operation of agent code, as the hook saw it."""

    category: str
    """Row of the hook's table: grader_files, frames, heap, tracer, hook, disguise, spawn, forged_report."""
    event: str
    """The audit event (open, sys._getframe, ...)."""
    api: str | None
    """The public API the agent's code called (builtins.open, inspect.stack, ...)."""
    reached: str
    """What it reached: a path, a frame's owner, the heap."""
    where: str
    """file:line of the agent's frame."""
    function: str
    """The agent's function at `where`."""
    pid: int | None = None

    def line(self) -> str:
        return f"{self.where} in {self.function}: {self.event} {self.reached} ({self.api})"


@dataclass
class WatchReport:
    """What the hook reported for one verifier run."""

    watched: bool
    why: str | None
    """Why the run counts as unwatched (None when watched)."""
    events: list[WatchEvent] = field(default_factory=list)
    spawned: list[str] = field(default_factory=list)
    """Processes agent code started that were not flagged (argv, short)."""
    processes: int = 0
    """Python processes that reported a start (forked children included)."""

    def flag_details(self, limit: int = 5) -> list[str]:
        lines = [event.line() for event in self.events[:limit]]
        if len(self.events) > limit:
            lines.append(f"(+{len(self.events) - limit} more)")
        return lines


def summarize(datagrams: list[bytes]) -> WatchReport:
    """The report that a run's datagrams, in arrival order, add up to."""
    starts: dict[str, dict] = {}
    ended: set[str] = set()
    events: list[WatchEvent] = []
    spawned: list[str] = []
    forged: list[str] = []
    for data in datagrams:
        record = _parse(data)
        if record is None:
            forged.append(data[:80].decode("utf-8", "replace"))
            continue
        kind, proc = record["kind"], record["proc"]
        if kind in ("start", "fork"):
            starts[proc] = record
        elif kind == "end":
            ended.add(proc)
        elif kind == "event":
            events.append(WatchEvent(record.get("category", "?"), record.get("event", "?"), record.get("api"),
                                     str(record.get("reached", "")), str(record.get("where", "?")),
                                     str(record.get("function", "?")), record.get("pid")))
        elif kind == "spawned":
            spawned.append(str(record.get("argv", "")))
    for sample in forged:
        events.append(WatchEvent("forged_report", "datagram", None, repr(sample), "report.sock", "?"))
    why = _why_unwatched(starts, ended, forged)
    return WatchReport(watched=why is None, why=why, events=events, spawned=spawned, processes=len(starts))


def _parse(data: bytes) -> dict | None:
    """The record, or None when the hook cannot have written it."""
    try:
        record = json.loads(data)
    except ValueError:
        return None
    if not isinstance(record, dict) or record.get("kind") not in RECORD_KINDS:
        return None
    if not isinstance(record.get("proc"), str) or not isinstance(record.get("pid"), int):
        return None
    return record


def _why_unwatched(starts: dict[str, dict], ended: set[str], forged: list[str]) -> str | None:
    if forged:
        return f"a record that is not the hook's: {forged[0]!r}"
    for record in starts.values():
        if record.get("no_audit"):
            return f"python {'.'.join(str(record.get('python', '?')).split('.')[:2])} has no audit hooks"
    for proc, record in starts.items():
        if record["kind"] == "start" and proc not in ended:
            argv = " ".join(str(a) for a in record.get("argv", []))[:120]
            return f"pid {record['pid']} ({argv}) ended without its report's end"
    if not starts:
        return "no Python process reported"
    return None


HOST_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")
"""Interpreters besides our own that compiled_hooks compiles the hook for, where this machine has
them (bubblewrap runs the host's; a Docker image of the same version uses the same bytecode)."""


@functools.cache
def compiled_hooks() -> tuple[Path, ...]:
    """The hook compiled by each Python of this machine (HOST_PYTHONS and our own), once per process:
    unchecked hash-based .pyc files (valid whatever the copied source's mtime), which a Python of
    another version ignores, compiling the source instead. A Python that fails to compile it is
    skipped."""
    import subprocess
    import tempfile

    cache = Path(tempfile.mkdtemp(prefix="slime-harbor-hook-pyc-"))
    source = RUNTIME_DIR / HOOK_FILE
    found = []
    for python in dict.fromkeys([sys.executable, *(p for p in HOST_PYTHONS if os.path.exists(p))]):
        script = ("import importlib.util, py_compile, sys; "
                  "print(py_compile.compile(sys.argv[1], cfile=sys.argv[2] + '/' + importlib.util.cache_from_source("
                  "sys.argv[1]).rsplit('/', 1)[1], doraise=True, "
                  "invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH))")
        try:
            done = subprocess.run([python, "-I", "-c", script, str(source), str(cache)], capture_output=True,
                                  text=True, timeout=60)
        except (OSError, subprocess.SubprocessError):
            continue  # that Python compiles the source itself, a few ms per process
        if done.returncode == 0 and done.stdout.strip():
            found.append(Path(done.stdout.strip()))
    import atexit
    atexit.register(shutil.rmtree, cache, True)
    return tuple(found)


class WatchChannel:
    """The hook's directory and report socket for one verifier run (a context manager)."""

    def __init__(self, host_dir: Path, inside_dir: str, sock: socket.socket):
        self.host_dir = host_dir
        self.inside_dir = inside_dir.rstrip("/") or "/"
        self._sock = sock
        self._datagrams: list[bytes] = []
        self._stop = threading.Event()
        self._wake_read, self._wake_write = os.pipe()
        self._receiver = threading.Thread(target=self._receive, name="grader-watch", daemon=True)
        self._receiver.start()
        self.report: WatchReport | None = None

    @classmethod
    def open(cls, host_dir: Path, *, agent_files, grader_paths, frames: bool = True, inside_dir: str,
             agent_dirs=()) -> WatchChannel:
        """Empties `host_dir`, copies the hook into it, writes its config (paths as the sandbox sees
        them, under `inside_dir`; `agent_dirs`: dirs whose every file counts as the agent's, for
        calibrate's probe) and binds host_dir/report.sock."""
        host_dir = Path(host_dir)
        host_dir.mkdir(parents=True, exist_ok=True)
        host_dir.chmod(0o755)
        # Only what is written here is on the tests' PYTHONPATH (an agent that remounted the dir
        # writable in its phase could have left a module of a stdlib name there).
        for entry in host_dir.iterdir():
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
        hook = host_dir / HOOK_FILE
        shutil.copyfile(RUNTIME_DIR / HOOK_FILE, hook)
        hook.chmod(0o644)
        compiled = compiled_hooks()
        if compiled:  # the dir is read-only inside: without these every Python compiles the hook anew
            (host_dir / "__pycache__").mkdir(mode=0o755)
            for pyc in compiled:
                shutil.copyfile(pyc, host_dir / "__pycache__" / pyc.name)
                (host_dir / "__pycache__" / pyc.name).chmod(0o644)
        inside = inside_dir.rstrip("/") or "/"
        # One `key value` a line (the hook reads it without json: runtime/sitecustomize.read_config).
        lines = [f"report {inside}/report.sock", f"frames {int(bool(frames))}", f"started {time.time()!r}",
                 *(f"agent_file {p}" for p in sorted(map(str, agent_files))),
                 *(f"grader_path {p}" for p in sorted(map(str, grader_paths))),
                 *(f"agent_dir {p}" for p in sorted(map(str, agent_dirs)))]
        (host_dir / CONFIG_FILE).write_text("\n".join(line for line in lines if "\n" not in line) + "\n")
        (host_dir / CONFIG_FILE).chmod(0o644)
        sock_path = host_dir / "report.sock"
        sock_path.unlink(missing_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(str(sock_path))
        sock_path.chmod(0o777)  # the SWE grader runs the tests as `nobody`
        return cls(host_dir, inside, sock)

    def env(self, existing_pythonpath: str | None = None) -> dict[str, str]:
        """The variables that load the hook into the verifier's Pythons."""
        pythonpath = self.inside_dir + (f":{existing_pythonpath}" if existing_pythonpath else "")
        return {"PYTHONPATH": pythonpath, WATCH_ENV: f"{self.inside_dir}/{CONFIG_FILE}"}

    def _receive(self) -> None:
        # Woken by a datagram or by close() (its pipe): a verifier's end never waits on a poll interval.
        self._sock.setblocking(False)
        while not self._stop.is_set():
            ready, _, _ = select.select([self._sock, self._wake_read], [], [])
            if self._sock in ready:
                try:
                    self._datagrams.append(self._sock.recv(MAX_DATAGRAM))
                except BlockingIOError:
                    continue
                except OSError:
                    return

    def close(self) -> WatchReport:
        """Stops the receiver after draining what is queued, removes the socket, and reports."""
        if self.report is not None:
            return self.report
        self._stop.set()
        os.write(self._wake_write, b"x")
        self._receiver.join()
        os.close(self._wake_read)
        os.close(self._wake_write)
        self._sock.setblocking(False)
        while True:
            try:
                self._datagrams.append(self._sock.recv(MAX_DATAGRAM))
            except (BlockingIOError, OSError):
                break
        self._sock.close()
        sock_path = self.host_dir / "report.sock"
        try:
            if sock_path.is_socket():
                os.unlink(sock_path)
        except OSError:
            pass
        self.report = summarize(self._datagrams)
        return self.report

    def __enter__(self) -> WatchChannel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
