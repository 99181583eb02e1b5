"""Starts the real engines that SLiME, Prime-RL and the external-server trainer sample with,
SGLang and vLLM, each from its own venv (scripts/setup-sglang.sh, scripts/setup-vllm.sh) with the
flags the machine needs; what differs between them is each one's class (policy/engines/: the ones
that are StartsFromVenv). (Ours, the embedded engine, runs in-process: engines/embedded.py.) What a
running server is, whoever started it: policy/probe.py.

    ENGINES                    embedded | sglang | vllm (engine_type(name): the class of one we start)
    engine_python(engine)      the engine venv's Python, or EngineMissing naming its setup script
    engine_command(...)        argv + environment that start the engine on this machine (CPU or GPU)
    EngineProcess              a started engine: its URL, weight version "0", stop() that leaves no process
    start_guarded(argv, env)   a process group that ends when this process does, even by SIGKILL (parent_guard.py)
    serve_engine(...)          `slime-harbor serve --engine sglang|vllm`
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from slime_harbor.policy.engines import ENGINE_TYPES
from slime_harbor.policy.engines.abilities import StartsFromVenv
from slime_harbor.policy.engines.base import INITIAL_WEIGHT_VERSION, EngineMissing
from slime_harbor.policy.engines.embedded import Embedded
from slime_harbor.policy.probe import forget

ENGINES = (Embedded.name, *ENGINE_TYPES)
"""The `--engine` names: ours (in-process, policy/server.py) and the ones we start (policy/engines/)."""
PARENT_GUARD = Path(__file__).with_name("parent_guard.py")
"""Runs each engine we start: it stops the engine's process group when this process dies (its docstring)."""
START_TIMEOUT_SEC = 600.0
STOP_TIMEOUT_SEC = 60.0


def engine_type(engine: str) -> type[StartsFromVenv]:
    """The class of the engine named ``engine`` (ValueError naming the ones we start)."""
    if engine not in ENGINE_TYPES:
        raise ValueError(f"engine must be one of {', '.join(ENGINE_TYPES)} to start a real one, got {engine!r}")
    return ENGINE_TYPES[engine]


def has_gpu() -> bool:
    """Whether an NVIDIA GPU answers (the setup scripts ask the same)."""
    nvidia_smi = shutil.which("nvidia-smi")
    return bool(nvidia_smi) and subprocess.run([nvidia_smi, "-L"], capture_output=True).returncode == 0


def engine_venv(engine: str, gpu: bool | None = None) -> Path:
    """Where the setup script installs ``engine`` (the cache, keyed by the engine's version)."""
    from slime_harbor.cache import cache_dir

    gpu = has_gpu() if gpu is None else gpu
    name = engine_type(engine).venv_name(gpu)
    return cache_dir() / "engines" / name


def engine_python(engine: str, gpu: bool | None = None) -> Path:
    """The Python ``engine`` runs with (EngineMissing, naming its set-up script, when not installed)."""
    return engine_type(engine).python(has_gpu() if gpu is None else gpu)


def engine_command(engine: str, model: str | Path, host: str, port: int, *, gpu: bool | None = None,
                   extra_args: list[str] = ()) -> tuple[list[str], dict[str, str]]:
    """The argv and environment that serve ``model`` with ``engine`` on host:port, weight version "0".

    On a GPU: the engine's defaults. On a CPU (both engines run there, slowly, on a small model):
    float32 as the checkpoint is (else SGLang runs a float32 model in float16), torch's own
    attention and sampling, no CUDA graphs or overlap scheduler, a KV pool of 32768 tokens
    (SGLang) or 1 GiB (vLLM; the tiny model's context fits either), and SGLang's --sleep-on-idle
    (its idle scheduler otherwise keeps a core busy). --engine-args adds to or overrides them."""
    kind = engine_type(engine)
    gpu = has_gpu() if gpu is None else gpu
    env = dict(os.environ)
    argv = kind.command(kind.python(gpu), str(model), host, port, gpu, env)
    return argv + list(extra_args), env


class EngineProcess:
    """A real engine serving ``model`` on host:port, in a process group of its own, led by the
    parent guard (policy/parent_guard.py).

    ``start()`` returns once /health answers 200 and the weight version is "0"; ``stop()`` sends
    SIGTERM to the whole group (the engines run several processes), waits for it to go (they take
    20-30 s), then SIGKILLs what is left: no process of the engine outlives it. When this process
    dies without stopping it (SIGKILL, the OOM killer), the guard stops the group within seconds."""

    def __init__(self, engine: str, model: str | Path, host: str = "127.0.0.1", port: int = 30000, *,
                 extra_args: list[str] = (), log_path: str | Path | None = None, gpu: bool | None = None):
        self.engine, self.model, self.host, self.port = engine, str(model), host, port
        self.argv, self.env = engine_command(engine, model, host, port, gpu=gpu, extra_args=list(extra_args))
        self.log_path = Path(log_path) if log_path else None
        self.process: subprocess.Popen | None = None
        self._starter_end: int | None = None
        self.started_in_sec: float | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_sec: float = START_TIMEOUT_SEC) -> EngineProcess:
        started = time.monotonic()
        self.process, self._starter_end = start_guarded(self.argv, self.env, self.log_path)
        try:
            wait_healthy(self.url, started + timeout_sec - time.monotonic(), self.process, self.engine, self.log_path)
            engine_type(self.engine).after_start(self.url)
        except BaseException:  # a start that failed or was interrupted leaves no engine process: raised again
            self.stop()
            raise
        self.started_in_sec = time.monotonic() - started
        return self

    def stop(self, timeout_sec: float = STOP_TIMEOUT_SEC) -> None:
        process = self.process
        if process is None:
            self._close_starter_end()
            return
        for sig, wait in ((signal.SIGTERM, timeout_sec), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and process_group_alive(process.pid):
                process.poll()
                time.sleep(0.2)
            if not process_group_alive(process.pid):
                break
        process.poll()
        self.process = None
        forget(self.url)
        self._close_starter_end()

    def _close_starter_end(self) -> None:
        if self._starter_end is not None:
            os.close(self._starter_end)
            self._starter_end = None

    def __enter__(self) -> EngineProcess:
        return self.start() if self.process is None else self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_guarded(argv: list[str], env: dict[str, str], log_path: Path | None = None) -> tuple[subprocess.Popen, int]:
    """Start ``argv`` under the parent guard (policy/parent_guard.py), in a session of its own that
    the guard leads. Returns the guard's process and the write end of its pipe: keep that end open
    while the engine should run; it closes when this process ends, even by SIGKILL, and the guard
    then stops the whole group. The returned process's exit code is the engine's."""
    log = open(log_path, "ab") if log_path else None
    guard_end, starter_end = os.pipe()  # both not inheritable: no other child of ours holds the write end
    try:
        process = subprocess.Popen([sys.executable, "-I", str(PARENT_GUARD), str(guard_end), "--", *argv], env=env,
                                   stdout=log, stderr=subprocess.STDOUT if log else None, stdin=subprocess.DEVNULL,
                                   start_new_session=True, pass_fds=(guard_end,))
    except BaseException:
        os.close(starter_end)
        raise
    finally:
        os.close(guard_end)
        if log is not None:
            log.close()
    return process, starter_end


def wait_healthy(url: str, timeout_sec: float, process: subprocess.Popen | None = None, name: str = "the server",
                 log_path: Path | None = None) -> None:
    """Return once ``url``/health answers 200; RuntimeError (one line) when ``process`` exits first
    or ``timeout_sec`` runs out."""
    deadline = time.monotonic() + timeout_sec
    while True:
        if process is not None and process.poll() is not None:
            where = f" (its log: {log_path})" if log_path else ""
            raise RuntimeError(f"{name} exited with code {process.returncode} while starting{where}")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} did not answer {url}/health within {timeout_sec:.0f} s")
        time.sleep(0.2)


def process_group_alive(pgid: int) -> bool:
    """Whether any process of the group is still there (zombies of ours are reaped first)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # killpg(0) succeeds on zombies too: count the group's members that are not.
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def serve_engine(engine: str, model: str | Path, host: str, port: int, extra_args: list[str] = ()) -> int:
    """`slime-harbor serve --engine sglang|vllm`: start it, say where it serves, wait. However this
    ends (Ctrl-C or SIGTERM, which the command line turns into an exception; the engine exiting on
    its own), every process the engine started is stopped. Returns the exit code."""
    server = EngineProcess(engine, model, host, port, extra_args=extra_args)
    try:
        print(f"starting {engine} for {model} on {server.url} (a minute or so)", file=sys.stderr, flush=True)
        server.start()
        print(f"{engine} serves {model} at {server.url} (weight version {INITIAL_WEIGHT_VERSION}); "
              f"started in {server.started_in_sec:.0f} s", file=sys.stderr, flush=True)
        code = server.process.wait()
        print(f"{engine} exited with code {code}", file=sys.stderr)
        return code or 1
    finally:
        if server.process is not None and server.process.poll() is None:
            print(f"stopping {engine} (its processes take 20-30 s to exit)", file=sys.stderr, flush=True)
        server.stop()
