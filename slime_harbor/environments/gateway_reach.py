"""How a sandbox without a network reaches the model gateway, and nothing else, on the host.

Both sandboxes (bubblewrap ``--unshare-net``, Docker ``network_mode=none``) have a loopback of
their own. For an environment given ``gateway_port``, :class:`GatewayForward` puts a listening
socket on ``127.0.0.1:<gateway_port>`` INSIDE the sandbox's network namespace and serves it from
the host process: every connection accepted there is piped, on the caller's event loop, to the
gateway at ``gateway_host:gateway_port`` on the host. So an agent's ``http://127.0.0.1:<port>/...``
works the same in a no-network sandbox as in one that shares the host's network, and only that
one port leads out: the namespace still has no route anywhere else.

Why this shape: nothing runs inside the sandbox (task images may lack python, socat or even
bash), nothing is written into it, and there is no process to leave behind. The socket is made
by a short-lived helper (this Python, ``-I -S``) that joins the namespace and hands the socket
back over ``SCM_RIGHTS``: joining a user namespace (bubblewrap's network namespace belongs to
the sandbox's user namespace) needs a single-threaded process, which ours is not. The helper
runs the host's interpreter from the host's filesystem; it enters no mount namespace.

The environments' side: both take the kwargs ``gateway_port`` (``None``: no forward) and
``gateway_host`` (the host address the gateway listens on, default 127.0.0.1), open the forward
right after the sandbox's namespaces exist and close it first thing in ``stop()``. A sandbox that
shares the host's network needs none: the same URL reaches the gateway directly. How each finds its
network namespace stays in the environment, as it differs: bubblewrap holds handles on its own
namespaces (and passes its user namespace, which owns the network one); Docker opens the
container's pid's, after checking that the pid is the container's on this machine.

Teardown is closing the socket and the piped connections (``close()``): after that we hold
nothing of the sandbox's namespace, and a sandbox killed first only leaves a socket to close.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys

_LOOPBACK = "127.0.0.1"
_BACKLOG = 1024
_CHUNK = 1 << 16
_HELPER_TIMEOUT_SEC = 30
# Runs in the helper: join the user namespace (if given), then the network namespace, bind
# 127.0.0.1:PORT there and send the listening socket back. One line of text on failure.
_HELPER = """
import os, socket, sys
channel = socket.socket(fileno=int(sys.argv[1]))
user_ns, net_ns, port = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
try:
    if user_ns >= 0:
        os.setns(user_ns, os.CLONE_NEWUSER)
    os.setns(net_ns, os.CLONE_NEWNET)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(int(sys.argv[5]))
    socket.send_fds(channel, [b"ok"], [listener.fileno()])
except OSError as exc:
    channel.sendall(f"{type(exc).__name__}: {exc}".encode())
"""


class GatewayReachError(RuntimeError):
    """The forward into the sandbox could not be set up (one line, says why)."""


def gateway_target_host(gateway_host: str) -> str:
    """Where to connect on the host for a gateway listening on ``gateway_host`` (a wildcard
    address is reached through loopback)."""
    return {"": _LOOPBACK, "0.0.0.0": _LOOPBACK, "::": "::1"}.get(gateway_host, gateway_host)


def listen_in_namespace(net_ns_fd: int, port: int, user_ns_fd: int | None = None) -> socket.socket:
    """A socket listening on 127.0.0.1:``port`` inside the network namespace ``net_ns_fd`` (an
    open ``/proc/PID/ns/net``), joined through ``user_ns_fd`` first when given. Blocking."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        fds = (theirs.fileno(), net_ns_fd) + ((user_ns_fd,) if user_ns_fd is not None else ())
        argv = [sys.executable, "-I", "-S", "-c", _HELPER, str(theirs.fileno()),
                str(-1 if user_ns_fd is None else user_ns_fd), str(net_ns_fd), str(port), str(_BACKLOG)]  # fmt: skip
        try:
            done = subprocess.run(argv, pass_fds=fds, stdin=subprocess.DEVNULL, capture_output=True,
                                  timeout=_HELPER_TIMEOUT_SEC)  # fmt: skip
        except subprocess.TimeoutExpired:
            raise GatewayReachError("the helper that opens the gateway's port in the sandbox hung") from None
        theirs.close()
        ours.settimeout(_HELPER_TIMEOUT_SEC)
        message, fds_back, _, _ = socket.recv_fds(ours, 4096, 1)
    finally:
        ours.close()
        theirs.close()
    if message != b"ok" or len(fds_back) != 1:
        for fd in fds_back:
            os.close(fd)
        reason = message.decode(errors="replace") or done.stderr.decode(errors="replace").strip()
        raise GatewayReachError(f"cannot open 127.0.0.1:{port} inside the sandbox for the gateway: {reason}")
    return socket.socket(fileno=fds_back[0])


class GatewayForward:
    """127.0.0.1:<port> inside a sandbox, piped to the gateway on the host (module docstring).

    Use: ``forward = await GatewayForward.open(net_ns_fd, port, gateway_host)`` once the sandbox's
    namespace exists; ``forward.close()`` when the sandbox stops (idempotent, any thread)."""

    def __init__(self, listener: socket.socket, target: tuple[str, int]):
        self.port = listener.getsockname()[1]
        self.target = target
        self._listener = listener
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task] = set()
        self._closed = False

    @classmethod
    async def open(cls, net_ns_fd: int, port: int, gateway_host: str = _LOOPBACK, *,
                   user_ns_fd: int | None = None) -> GatewayForward:  # fmt: skip
        listener = await asyncio.to_thread(listen_in_namespace, net_ns_fd, port, user_ns_fd)
        forward = cls(listener, (gateway_target_host(gateway_host), port))
        try:
            forward._server = await asyncio.start_server(forward._serve, sock=listener, limit=_CHUNK)
        except BaseException:  # no server: the listener in the namespace is closed (re-raised)
            forward.close()
            raise
        return forward

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._connections.add(task)
        upstream_writer = None
        try:
            try:
                upstream_reader, upstream_writer = await asyncio.open_connection(*self.target, limit=_CHUNK)
            except OSError:  # the gateway is not (or no longer) listening: the agent sees a reset
                return
            # Each direction ends on its own end of file (a half-close); a reset on either side
            # ends both.
            pipes = [asyncio.ensure_future(_pipe(client_reader, upstream_writer)),
                     asyncio.ensure_future(_pipe(upstream_reader, client_writer))]  # fmt: skip
            try:
                await asyncio.wait(pipes, return_when=asyncio.FIRST_EXCEPTION)
            finally:
                for pipe in pipes:
                    pipe.cancel()
                    pipe.add_done_callback(_retrieve)
        except asyncio.CancelledError:
            pass  # close(): both ends are aborted below
        finally:
            self._connections.discard(task)
            for writer in (client_writer, upstream_writer):
                if writer is not None:
                    writer.transport.abort() if self._closed else writer.close()

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    def close(self) -> None:
        """Stop accepting, drop the piped connections and close the socket in the sandbox."""
        if self._closed:
            return
        self._closed = True
        if self._server is not None:
            with contextlib.suppress(RuntimeError):  # its loop is closed already (interpreter exit)
                self._server.close()
                for task in list(self._connections):
                    task.cancel()
        self._listener.close()


def _retrieve(task: asyncio.Task) -> None:
    """A reset ends a pipe with OSError: expected, not worth asyncio's 'never retrieved' log."""
    if not task.cancelled():
        task.exception()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until end of file, then half-close the other side (HTTP clients may do that)."""
    while data := await reader.read(_CHUNK):
        writer.write(data)
        await writer.drain()
    if writer.can_write_eof():
        with contextlib.suppress(OSError):
            writer.write_eof()


def gateway_port_kwarg(value: int | str | None) -> int | None:
    """The ``gateway_port`` environment kwarg as a port number (``--ek`` passes text); a
    ValueError with one line for anything else."""
    if value is None or value == "":
        return None
    try:
        port = int(value)
    except (TypeError, ValueError):
        port = 0
    if not 0 < port < 65536:
        raise ValueError(f"gateway_port must be a TCP port number (1-65535), got {value!r}")
    return port
