"""How a command ends: one-line errors for bad input, orderly shutdown on SIGINT and SIGTERM.

Bad input (a flag value, a tasks dir, a task.toml, an agent or environment that does not
resolve) raises `ConfigError`, or is refused by a `OneLineArgumentParser`; the command prints it
as `slime-harbor: error: ...`, one line, and exits with EXIT_USAGE.

`timeout`, job schedulers and container runtimes stop a job with SIGTERM, and Python's default for
it is to die on the spot: no summary.json, sandboxes left for the next run to sweep. Inside a
`SignalGuard` both signals take the path Ctrl-C takes:

  * while a coroutine runs under `guard.run(...)`, the signal cancels it, so its own cleanup runs
    (run_rollouts tears every sandbox down and writes summary.json), then `Interrupted` is raised;
  * in plain code the signal raises `Interrupted` where the program is (finally blocks run);
  * inside `with guard.deferred():` it is only noted, and raised when the block ends, so a step
    that must not be cut in half (an optimizer update, a checkpoint being written) finishes first.

The process should then exit with `Interrupted.exit_code` (128 + signal: 130 for SIGINT, 143 for
SIGTERM), as a shell reports a process killed by that signal.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

SIGNALS = (signal.SIGINT, signal.SIGTERM)
EXIT_USAGE = 2  # argparse's own code for bad flags
T = TypeVar("T")


class ConfigError(ValueError):
    """A setting, flag or task that cannot work; commands print it as one line, no traceback."""


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (pydantic and Harbor messages span several)."""
    return " ".join(str(exc).split()) or type(exc).__name__


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line (`prog: error: ... (see --help)`), not usage + error."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class Interrupted(Exception):
    """The run was stopped by a signal, after its cleanup ran."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class SignalGuard:
    """Installs the handlers on enter and restores the previous ones on exit (main thread only).
    A guard never entered, or entered in another thread, changes nothing: `run` is runner.run and
    `deferred` an empty block, so library callers (tests, benches) keep their own signal handling."""

    def __init__(self) -> None:
        self.signum: int | None = None  # the first signal received
        self._deferring = 0
        self._previous: dict[int, Any] = {}
        self._active = False  # handlers installed: only inside `with`, and only in the main thread

    def __enter__(self) -> SignalGuard:
        self._active = threading.current_thread() is threading.main_thread()
        if self._active:
            for s in SIGNALS:
                self._previous[s] = signal.getsignal(s)
                signal.signal(s, self._on_signal)
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous.clear()
        self._active = False

    def _note(self, signum: int) -> bool:
        """Record the signal; False when one was already received (we are already stopping)."""
        if self.signum is not None:
            print(f"{signal.Signals(signum).name} again: already stopping, waiting for sandboxes to be "
                  f"torn down", file=sys.stderr)
            return False
        self.signum = signum
        print(f"{signal.Signals(signum).name}: stopping (finished work is kept)", file=sys.stderr)
        return True

    def _on_signal(self, signum: int, frame) -> None:
        if self._note(signum) and not self._deferring:
            raise Interrupted(signum)

    def check(self) -> None:
        """Raise Interrupted if a signal was received."""
        if self.signum is not None:
            raise Interrupted(self.signum)

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """Run the block to its end even if a signal arrives; raise Interrupted after it."""
        self._deferring += 1
        try:
            yield
        finally:
            self._deferring -= 1
        if not self._deferring:
            self.check()

    def run(self, coro: Coroutine[Any, Any, T], runner: asyncio.Runner | None = None) -> T:
        """asyncio.run (or runner.run) where a signal cancels `coro` and then raises Interrupted."""
        self.check()
        try:
            if runner is None:
                with asyncio.Runner() as fresh:
                    return fresh.run(self._cancel_on_signal(coro))
            return runner.run(self._cancel_on_signal(coro))
        except asyncio.CancelledError:
            # A signal in the instant between the coroutine's end and its task's: still ours.
            if self.signum is None:
                raise
            raise Interrupted(self.signum) from None

    async def _cancel_on_signal(self, coro: Coroutine[Any, Any, T]) -> T:
        if not self._active:
            return await coro
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()

        def on_signal(signum: int) -> None:
            if self._note(signum):
                task.cancel()

        for s in SIGNALS:
            loop.add_signal_handler(s, on_signal, s)
        try:
            return await coro
        except asyncio.CancelledError:
            if self.signum is None:
                raise
            task.uncancel()
            raise Interrupted(self.signum) from None
        finally:
            for s in SIGNALS:  # back to ours (remove_signal_handler would reset them to the defaults)
                loop.remove_signal_handler(s)
                signal.signal(s, self._on_signal)
