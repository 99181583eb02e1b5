"""Runs an engine so that it cannot outlive the process that started it, even one killed by SIGKILL
(the OOM killer, a cluster's preemption, `kill -9`), which runs no teardown of its own.

    python -I parent_guard.py FD -- ENGINE_ARGV...

The guard leads the engine's process group (its starter gives it a session of its own) and starts
the engine in it. FD is the read end of a pipe whose only write end the starter holds: when the
starter dies, for whatever reason, the kernel closes that end and the guard reads end-of-file. It
then sends SIGTERM to the group, gives the engine GRACE_SEC to exit, and SIGKILLs the group, itself
included, so that nothing is left and the port is free. When the engine exits first, the guard
exits with its code (128 + the signal when a signal ended it), as if it were the engine.

A SIGTERM or SIGINT sent to the group (the starter's own stop) reaches the engine directly; the
guard ignores them and waits for the engine, so its starter still reads the engine's exit code.

Why a guard process and not only a parent-death signal: PR_SET_PDEATHSIG reaches one process, when
the *thread* that started it ends, and the engines run several processes (SGLang four). The guard
also sets PR_SET_PDEATHSIG on the engine itself, so that a guard killed on its own takes the
engine's main process with it. Standard library only: it runs with -I, apart from any venv.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time

GRACE_SEC = 5.0
"""How long the engine may take to exit on SIGTERM once its starter is gone: well under the 20 s
in which its port must be free (SGLang's own shutdown takes 20-30 s, so it is usually SIGKILLed)."""
PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In the engine, before exec: SIGKILL it when the guard (its parent) dies."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the pipe still guards the group
        pass


def exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--" or not argv[0].isdigit():
        print("usage: parent_guard.py FD -- ENGINE_ARGV...", file=sys.stderr)
        return 2
    starter_pipe = int(argv[0])
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    # The engine must not inherit the ignored signals: it restores the defaults before exec.
    engine = subprocess.Popen(argv[2:], preexec_fn=lambda: (die_with_parent(), restore_signals()))
    ended = threading.Event()

    def watch_starter() -> None:
        while os.read(starter_pipe, 1024):  # the starter never writes: only end-of-file comes
            pass
        ended.set()

    threading.Thread(target=watch_starter, daemon=True).start()
    while not ended.wait(0.5):
        if engine.poll() is not None:
            return exit_code(engine.returncode)
    # The starter is gone: stop the whole group, as its own stop would have.
    group = os.getpgrp()
    os.killpg(group, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_SEC
    while time.monotonic() < deadline and engine.poll() is None:
        time.sleep(0.1)
    os.killpg(group, signal.SIGKILL)  # what the engine left, and the guard itself
    return 1


def restore_signals() -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
