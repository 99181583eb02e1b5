"""Servers on loopback in tests: free ports, and the real sglang-router before some workers."""

import contextlib
import os

import pytest


def free_port() -> int:
    """A loopback port nothing listens on right now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_is_free(port: int) -> bool:
    """Nothing listens on the loopback port, and a new server can bind it (SO_REUSEADDR, as servers
    do: connections a server closed may linger in TIME_WAIT, which is not a leak)."""
    import socket

    with socket.socket() as probe:
        try:
            probe.connect(("127.0.0.1", port))
            return False
        except ConnectionRefusedError:
            pass
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            server.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


@contextlib.contextmanager
def sglang_router(worker_urls):
    """The real sglang-router (cache_aware, its default policy) on loopback before `worker_urls`;
    yields its URL. Its metrics listener gets its own loopback port (the default 0.0.0.0:29000
    collides with any other router); it is killed, with its process group, whatever happens."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    import httpx

    router_bin = Path(sys.executable).parent / "sglang-router"
    if not router_bin.exists():
        pytest.skip("sglang-router is not installed in .venv")
    port = free_port()
    router = subprocess.Popen(
        [str(router_bin), "launch", "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *worker_urls,
         "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()), "--log-level", "warn"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert router.poll() is None, "sglang-router exited while starting"
            try:  # healthy, and every worker registered (the router adds them a moment after it starts)
                if httpx.get(f"{url}/health", timeout=2).status_code == 200 and \
                        len(httpx.get(f"{url}/workers", timeout=2).json()["workers"]) == len(worker_urls):
                    break
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            assert time.monotonic() < deadline, "sglang-router did not become healthy with its workers in 60 s"
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(router.pid, signal.SIGKILL)
        router.wait(timeout=30)
