"""A no-network sandbox reaches the model gateway's port on the host, and nothing else
(slime_harbor.environments.gateway_reach), in the bubblewrap sandbox and in a Docker container
with network ``none``: real sandboxes, a real HTTP server on the host's loopback, requests made
from inside with bash's /dev/tcp (what every task image here has). The Docker cases skip when no
Docker daemon answers or SLIME_HARBOR_NO_DOCKER is set."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import os
import shutil
import socket
import threading
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from slime_harbor.agents.placement import agent_config
from slime_harbor.run_config import DEFAULT_TASKS
from slime_harbor.trial_setup import DOCKER_SANDBOX
from helpers.docker import containers_labelled, needs_docker
from helpers.rollout import config
from helpers.samples import check_sample_against_model

TASK = DEFAULT_TASKS / "dedupe-lines"  # network_mode = "no-network", python:3.11-slim
SANDBOXES = ["bubblewrap", pytest.param("docker", marks=needs_docker)]

# One HTTP/1.0 GET from inside the sandbox, printing the status line and body (bash only).
HTTP_GET = (
    "exec 3<>/dev/tcp/127.0.0.1/{port} && printf 'GET {path} HTTP/1.0\\r\\nHost: x\\r\\n\\r\\n' >&3 && "
    "tr -d '\\r' <&3 | sed -n '1p;$p'"
)


class _Reply(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        body = f"gateway saw {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def gateway_stand_in():
    """An HTTP server on the host's 127.0.0.1 standing in for the gateway; yields its port."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Reply)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def other_host_port():
    """Another port listening on the host's 127.0.0.1: the sandbox must not reach it."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


def make_sandbox(kind: str, task_dir: Path, tmp_path: Path, **kwargs):
    from harbor.models.task.task import Task
    from harbor.models.trial.paths import TrialPaths

    task = Task(task_dir)
    paths = TrialPaths(tmp_path / f"trial-{uuid.uuid4().hex[:6]}")
    paths.mkdir()
    common = dict(environment_dir=task.paths.environment_dir, environment_name=task_dir.name,
                  session_id=f"reach-{uuid.uuid4().hex[:6]}__env", trial_paths=paths,
                  task_env_config=task.config.environment, **kwargs)  # fmt: skip
    if kind == "docker":
        from slime_harbor.environments.docker import DockerEnvironment

        return DockerEnvironment(**common)
    from slime_harbor.environments.bubblewrap import BubblewrapEnvironment

    return BubblewrapEnvironment(base_dir=tmp_path / "sandboxes", **common)


@contextlib.asynccontextmanager
async def started(kind: str, tmp_path: Path, task_dir: Path = TASK, **kwargs):
    sandbox = make_sandbox(kind, task_dir, tmp_path, **kwargs)
    try:
        await sandbox.start(force_build=False)
        yield sandbox
    finally:
        await sandbox.stop(delete=True)


async def http_get(sandbox, port: int, path: str = "/probe") -> tuple[str, str]:
    """(status line, body) of a GET from inside the sandbox, or ("", stderr) when it fails."""
    result = await sandbox.exec(HTTP_GET.format(port=port, path=path), timeout_sec=30)
    lines = result.stdout.splitlines()
    if result.return_code != 0 or len(lines) != 2:
        return "", result.stderr.strip()
    return lines[0], lines[1]


def public_copy(tmp_path: Path) -> Path:
    task = tmp_path / "public" / TASK.name
    shutil.copytree(TASK, task)
    toml = task / "task.toml"
    toml.write_text(toml.read_text().replace('network_mode = "no-network"', 'network_mode = "public"'))
    return task


def open_fds() -> set[str]:
    """What this process's file descriptors point at (a socket as socket:[inode]), but for unix
    sockets (the Docker client's pool to the daemon grows with concurrent API calls)."""
    unix = {f"socket:[{line.split()[6]}]" for line in Path("/proc/self/net/unix").read_text().splitlines()[1:]}
    targets = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own fd, gone by now
            targets.add(os.readlink(f"/proc/self/fd/{fd}"))
    return targets - unix


def child_pids() -> set[int]:
    """Live (non-zombie) processes whose parent is this process."""
    children = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == os.getpid() and fields[0] != "Z":
                    children.add(int(entry))
    return children


@pytest.mark.parametrize("kind", SANDBOXES)
def test_no_network_sandbox_reaches_the_gateway_port_and_nothing_else(kind, tmp_path, gateway_stand_in,
                                                                        other_host_port):  # fmt: skip
    async def scenario():
        async with started(kind, tmp_path, gateway_port=gateway_stand_in) as sandbox:
            assert not sandbox.shares_host_network
            reply = await http_get(sandbox, gateway_stand_in, "/v1/models")
            assert reply == ("HTTP/1.0 200 OK", "gateway saw /v1/models")
            status, error = await http_get(sandbox, other_host_port)
            assert status == "" and "Connection refused" in error
            links = (await sandbox.exec("tail -n +3 /proc/net/dev | cut -d: -f1")).stdout.split()
            assert links == ["lo"]  # still no network: one port forwarded into its own loopback
        # Without gateway_port the same sandbox reaches nothing (the check above can fail).
        async with started(kind, tmp_path) as sandbox:
            status, error = await http_get(sandbox, gateway_stand_in)
            assert status == "" and "Connection refused" in error

    asyncio.run(scenario())


@pytest.mark.parametrize("kind", SANDBOXES)
def test_public_sandbox_reaches_the_gateway_directly(kind, tmp_path, gateway_stand_in):
    async def scenario():
        async with started(kind, tmp_path, public_copy(tmp_path), gateway_port=gateway_stand_in) as sandbox:
            assert sandbox.shares_host_network and sandbox._gateway_forward is None
            assert (await http_get(sandbox, gateway_stand_in))[0] == "HTTP/1.0 200 OK"

    asyncio.run(scenario())


@pytest.mark.parametrize("kind", SANDBOXES)
def test_many_concurrent_connections_and_nothing_left_after_stop(kind, tmp_path, gateway_stand_in):
    connections = 64
    parallel_gets = (
        f"for i in $(seq {connections}); do ( {HTTP_GET.format(port=gateway_stand_in, path='/c$i')} ) > /tmp/r$i & done; "
        "wait; cat /tmp/r* | grep -c 'gateway saw /c'"
    )

    async def scenario():
        fds_before, children_before = open_fds(), child_pids()
        async with started(kind, tmp_path, gateway_port=gateway_stand_in) as sandbox:
            forward = sandbox._gateway_forward
            result = await sandbox.exec(parallel_gets, timeout_sec=120)
            assert result.stdout.strip() == str(connections), result.stderr
            # A connection still open when the sandbox stops: its host side is closed too.
            await sandbox.exec(f"exec 3<>/dev/tcp/127.0.0.1/{gateway_stand_in}; sleep 1000 <&3 >&3 &")
            for _ in range(100):
                if forward.open_connections:
                    break
                await asyncio.sleep(0.05)
            assert forward.open_connections == 1
            listener = forward._listener
        await asyncio.sleep(0.1)  # the cancelled connection's task finishes
        assert forward.open_connections == 0 and listener.fileno() == -1
        assert open_fds() - fds_before == set()
        assert child_pids() <= children_before  # the helper that opened the socket exited

    asyncio.run(scenario())


@pytest.mark.parametrize("kind", SANDBOXES)
def test_concurrent_sandboxes_each_reach_the_gateway(kind, tmp_path, gateway_stand_in):
    async def one(k: int):
        async with started(kind, tmp_path / str(k), gateway_port=gateway_stand_in) as sandbox:
            return await http_get(sandbox, gateway_stand_in, f"/s/{k}")

    async def scenario():
        return await asyncio.gather(*(one(k) for k in range(6)))

    assert asyncio.run(scenario()) == [("HTTP/1.0 200 OK", f"gateway saw /s/{k}") for k in range(6)]


def test_gateway_on_a_wildcard_address_is_reached_through_loopback(tmp_path, gateway_stand_in):
    async def scenario():
        kwargs = {"gateway_port": str(gateway_stand_in), "gateway_host": "0.0.0.0"}  # as --ek passes them
        async with started("bubblewrap", tmp_path, **kwargs) as sandbox:
            assert sandbox._gateway_forward.target == ("127.0.0.1", gateway_stand_in)
            assert (await http_get(sandbox, gateway_stand_in))[0] == "HTTP/1.0 200 OK"

    asyncio.run(scenario())


@pytest.mark.parametrize("bad", ["http", "0", "70000"])
def test_a_bad_gateway_port_is_one_line(tmp_path, bad):
    with pytest.raises(ValueError, match=r"^gateway_port must be a TCP port number \(1-65535\), got"):
        make_sandbox("bubblewrap", TASK, tmp_path, gateway_port=bad)


@pytest.mark.parametrize("kind", SANDBOXES)
def test_provide_tmux_gives_a_working_tmux(kind, tmp_path):
    """Docker: a layer on the task's image (the bundled image has none); bubblewrap: the host's."""
    script = "tmux new-session -d -s probe 'sleep 60' && tmux has-session -t probe && tmux -V"

    async def scenario():
        async with started(kind, tmp_path, provide_tmux="true") as sandbox:
            return await sandbox.exec(script)

    result = asyncio.run(scenario())
    assert result.return_code == 0 and result.stdout.startswith("tmux "), result.stderr


def terminus2_trial(tmp_path: Path, cfg, environment_kwargs: dict):
    """One terminus-2 trial in our Docker sandbox, sampling through a recording gateway in front of
    cfg.policy_url, as rollout runs it. Returns (TrialResult, the trial's closed gateway session)."""
    import uuid

    from harbor.models.trial.config import EnvironmentConfig, TaskConfig, TrialConfig
    from harbor.trial.trial import Trial

    from slime_harbor.rollout import serving_gateway
    from slime_harbor.agents.placement import ModelEndpoint

    async def run():
        async with serving_gateway(cfg) as gateway:
            name = f"t2-{uuid.uuid4().hex[:8]}"
            session = gateway.open_session(name, record_dir=tmp_path / "trials" / name / "agent" / "gateway",
                                           sampling=cfg.sampling)  # fmt: skip
            environment = EnvironmentConfig(import_path=DOCKER_SANDBOX, delete=True, kwargs=environment_kwargs)
            trial = await Trial.create(TrialConfig(task=TaskConfig(path=TASK), trial_name=name,
                                                   trials_dir=tmp_path / "trials",
                                                   agent=agent_config(cfg, ModelEndpoint.of(gateway, session)),
                                                   environment=environment))  # fmt: skip
            try:
                return await trial.run(), gateway.sessions[name]
            finally:
                await gateway.close_session(name)

    return asyncio.run(run())


@needs_docker
def test_terminus2_trial_runs_in_a_no_network_container_with_tmux_provided(tmp_path, responsive_server,
                                                                          responsive_model_dir, hf_model, tokenizer):  # fmt: skip
    """Harbor's terminus-2 installs tmux at setup, which a no-network container cannot: with
    provide_tmux its session starts, the policy answers, the verifier scores, tokens come back.
    terminus-2 itself runs on the host (its api_base is its gateway session); what runs inside the
    container reaches the policy only through the forwarded port."""
    from slime_harbor.converter import trial_to_episode

    port = urlsplit(responsive_server).port
    cfg = config(tmp_path, responsive_server, responsive_model_dir, agent="terminus-2", step_limit=2, max_new_tokens=96)

    async def container_reaches_the_policy():
        async with started("docker", tmp_path, gateway_port=port, provide_tmux=True) as sandbox:
            status, body = await http_get(sandbox, port, "/v1/models")
            assert status.endswith(" 200 OK") and '"object"' in body, body
            tmux = await sandbox.exec("tmux -V")
            assert tmux.return_code == 0 and tmux.stdout.startswith("tmux ")

    asyncio.run(container_reaches_the_policy())
    # Without it, terminus-2 cannot start its session (the check below can fail).
    result, _ = terminus2_trial(tmp_path, cfg, {"gateway_port": port})
    assert result.exception_info is not None and "tmux" in result.exception_info.exception_message

    result, session = terminus2_trial(tmp_path, cfg, {"gateway_port": port, "provide_tmux": True})
    assert result.exception_info is None, result.exception_info
    assert result.verifier_result is not None and result.verifier_result.rewards is not None
    samples = trial_to_episode(result, group_index=0, index=0, tokenizer=tokenizer, recorded=session).samples
    trained = [s for s in samples if not s.remove_sample]
    assert trained, "terminus-2 produced no trainable sample"
    for sample in trained:
        assert check_sample_against_model(sample, hf_model, cfg.sampling.temperature) < 1e-4
    assert containers_labelled(f"slime-harbor.trial={result.trial_name}") == []
