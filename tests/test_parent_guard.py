"""The parent guard (policy/parent_guard.py): an engine started by a process that is then killed
with SIGKILL (no teardown, no atexit) leaves no process and frees its port within 20 s.

Here against a stand-in engine, a real Python process that serves a port, starts a child of its
own (the real engines run several processes) and ignores SIGTERM (the worst an engine can do);
tests/test_real_engines.py does the same with the real SGLang and vLLM."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from helpers.cli import first_line_then_sigkill
from helpers.servers import free_port, port_is_free

from slime_harbor.policy.engine_launcher import process_group_alive, start_guarded

FREED_WITHIN_SEC = 20.0

STAND_IN_ENGINE = r"""
import os, signal, socket, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
server = socket.socket()
server.bind(("127.0.0.1", int(sys.argv[1])))
server.listen()
if os.fork() == 0:  # a worker of its own, holding the port too, as the engines' schedulers do
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
while True:
    time.sleep(1)
"""

STARTER = r"""
import json, sys, time
from slime_harbor.policy.engine_launcher import start_guarded
process, _ = start_guarded([sys.executable, "-c", {engine!r}, "{port}"], dict(__import__("os").environ))
time.sleep(1.0)  # the stand-in binds its port
print(json.dumps({{"group": process.pid}}), flush=True)
time.sleep(600)
"""


def wait_gone(group: int, port: int, within_sec: float) -> float:
    """Seconds until the group has no process and the port binds again; AssertionError past ``within_sec``."""
    started = time.monotonic()
    while process_group_alive(group) or not port_is_free(port):
        assert time.monotonic() - started < within_sec, f"group {group} or port {port} still there after {within_sec} s"
        time.sleep(0.2)
    return time.monotonic() - started


def test_a_starter_killed_by_sigkill_leaves_no_engine_process_and_a_free_port():
    port = free_port()
    line = first_line_then_sigkill(STARTER.format(engine=STAND_IN_ENGINE, port=port))
    group = json.loads(line)["group"]
    took = wait_gone(group, port, FREED_WITHIN_SEC)
    print(f"\nstand-in engine gone {took:.1f} s after its starter's SIGKILL")


def test_the_guard_passes_the_engine_exit_code_and_keeps_running_while_its_starter_lives(tmp_path):
    process, starter_end = start_guarded([sys.executable, "-c", "import sys, time; time.sleep(1.5); sys.exit(7)"],
                                         {}, tmp_path / "log")
    try:
        assert process.wait(timeout=30) == 7
    finally:
        os.close(starter_end)


def test_an_engine_killed_by_a_signal_exits_the_guard_with_128_plus_it():
    process, starter_end = start_guarded([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"], {})
    try:
        assert process.wait(timeout=30) == 128 + signal.SIGKILL
    finally:
        os.close(starter_end)
