"""Harbor's mini-swe-agent (its recipe in slime_harbor.agents.installed.catalog) installed from the
registries only, in our bubblewrap and Docker sandboxes, through real Harbor trials against a real
model endpoint (the recording gateway in front of the embedded policy server on the tiny model).

The trials that are handed a model URL themselves (no rollout wiring) run on a public-network
copy of a bundled task, so the sandbox shares the host's loopback where the endpoint listens: a
gateway session's chat completions (the tiny model calls no tool, so every reply is a format
error and the episode ends at mini-swe-agent's own step or format-error limit, verified and
scored truncated), or a stub that records mini-swe-agent's requests. The last test is the production path: plain
`--agent mini-swe-agent --env docker` on the bundled no-network task, through the recording
gateway and the sandbox's forward to it, and the samples train.

The installs are real (PyPI over the host network): the first run of this module builds them
(about a minute each), later runs reuse them. Docker tests skip without a daemon or with
SLIME_HARBOR_NO_DOCKER set."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import re
import shutil
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig
from harbor.trial.trial import Trial

from slime_harbor.converter import trial_to_episode
from slime_harbor.agents.installed.installs import environment_kwargs
from slime_harbor.agents.installed.catalog import resolve_installs
from slime_harbor.agents.installed.catalog import RECIPES, MiniSweAgent, Codex
from slime_harbor.run_config import DEFAULT_TASKS
from slime_harbor.trial_setup import DOCKER_SANDBOX, LOCAL_SANDBOX
from slime_harbor.samples import SampleStatus
from helpers.docker import needs_docker

AGENT_IMPORT_PATH = "slime_harbor.agents.installed.catalog:MiniSweAgent"
INSTALL = RECIPES["mini-swe-agent"].install
TASK = "count-errors"


class RecordingProxy:
    """An HTTP proxy on loopback that answers 502 to everything and records what was asked: set as
    HTTP(S)_PROXY in the agent's environment, it catches any traffic not meant for the model."""

    def __init__(self):
        self.requests: list[str] = []
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _refuse(self):
                proxy.requests.append(f"{self.command} {self.path}")
                self.send_error(502)

            do_GET = do_POST = do_HEAD = do_CONNECT = do_PUT = _refuse

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def proxy():
    recorder = RecordingProxy()
    try:
        yield recorder
    finally:
        recorder.close()


def public_task_copy(dest_root: Path) -> Path:
    """A copy of a bundled task whose sandbox shares the host's network (the model endpoint is on
    the host's loopback until the sandbox forwarding exists)."""
    dest = dest_root / TASK
    shutil.copytree(DEFAULT_TASKS / TASK, dest)
    toml = dest / "task.toml"
    toml.write_text(re.sub(r'network_mode = "no-network"', 'network_mode = "public"', toml.read_text()))
    return dest


@contextlib.asynccontextmanager
async def gateway_sessions(policy_url: str, model_dir: str, record_dir: Path):
    """The recording gateway in front of the policy, in this test's event loop; yields a function
    that opens a session and returns its root URL (agent_config appends /v1)."""
    from slime_harbor.gateway.server import Gateway

    gateway = Gateway(policy_url, model_dir)
    await gateway.start()
    try:
        yield lambda name: gateway.open_session(name, record_dir / name).openai_base_url().removesuffix("/v1")
    finally:
        await gateway.aclose()


def agent_config(policy_url: str, served_name: str, proxy_url: str, step_limit: int) -> AgentConfig:
    """What the gateway wiring gives an installed agent: the OpenAI base URL under every name
    Harbor's class and LiteLLM read, a key, LiteLLM's local cost map, hosted_vllm/<name>."""
    base = f"{policy_url}/v1"
    return AgentConfig(
        import_path=AGENT_IMPORT_PATH,
        model_name=f"hosted_vllm/{served_name}",
        kwargs={"step_limit": step_limit, "max_tokens": 16},
        env={
            "OPENAI_BASE_URL": base, "OPENAI_API_BASE": base, "HOSTED_VLLM_API_BASE": base,
            "MSWEA_API_KEY": "none", "OPENAI_API_KEY": "none", "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            # Anything not sent to the model goes to the recording proxy (and fails there).
            "HTTP_PROXY": proxy_url, "HTTPS_PROXY": proxy_url, "ALL_PROXY": proxy_url,
            "http_proxy": proxy_url, "https_proxy": proxy_url, "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
        },  # fmt: skip
    )


async def run_trial(task: Path, tmp_path: Path, agent: AgentConfig, env_import_path: str, env_kwargs: dict):
    config = TrialConfig(
        task=TaskConfig(path=task),
        trials_dir=tmp_path / "trials",
        agent=agent,
        environment=EnvironmentConfig(import_path=env_import_path, delete=True,
                                      kwargs={**environment_kwargs(agent), **env_kwargs}),  # fmt: skip
    )
    trial = await Trial.create(config)
    result = await trial.run()
    return trial, result


def check_scored_truncated(result, expected_agent_exit: str, step_limit: int) -> dict:
    """The episode ended at mini-swe-agent's own limit, was verified, and is scored truncated."""
    assert result.exception_info is None, result.exception_info
    assert result.verifier_result is not None and result.verifier_result.rewards == {"reward": 0.0}
    meta = result.agent_result.metadata
    assert meta["agent_exit_status"] == expected_agent_exit and meta["exit_status"] == "step_limit", meta
    assert 1 <= meta["turns"] <= step_limit
    (sample,) = trial_to_episode(result).samples
    assert sample.status == SampleStatus.TRUNCATED and sample.reward == 0.0
    return meta


def check_requests_to_model(trial_dir: Path, step_limit: int) -> list[dict]:
    """mini-swe-agent's trajectory: what it sent (tools, parameters) and what came back."""
    trajectory = json.loads((trial_dir / "agent" / "mini-swe-agent.trajectory.json").read_text())
    assert trajectory["info"]["config"]["agent"]["step_limit"] == step_limit
    assert trajectory["info"]["mini_version"] == INSTALL.version
    replies = [m for m in trajectory["messages"] if (m.get("extra") or {}).get("response")]
    assert replies, trajectory["messages"][-1]
    assert (trial_dir / "agent" / "trajectory.json").is_file()  # Harbor's ATIF conversion
    return replies


# --- the agent class on its own -----------------------------------------------------------------


def test_step_limit_maps_onto_mini_swe_agents_step_limit(tmp_path):
    agent = MiniSweAgent(logs_dir=tmp_path, model_name="hosted_vllm/policy", step_limit=7,
                               config={"agent": {"cost_limit": 0}, "model": {"model_kwargs": {"temperature": 1.0}}})  # fmt: skip
    assert "step_limit: 7" in agent._config_yaml and "cost_limit: 0" in agent._config_yaml
    assert "temperature: 1.0" in agent._config_yaml
    assert agent.version() == INSTALL.version
    for bad in (0, -1, "3", True):
        with pytest.raises(ValueError, match="step_limit"):
            MiniSweAgent(logs_dir=tmp_path, model_name="hosted_vllm/policy", step_limit=bad)
    with pytest.raises(ValueError, match="pinned"):
        MiniSweAgent(logs_dir=tmp_path, model_name="hosted_vllm/policy", version="2.0.0")


def test_environment_kwargs_name_the_install_and_resolve():
    config = AgentConfig(import_path=AGENT_IMPORT_PATH, model_name="hosted_vllm/policy")
    kwargs = environment_kwargs(config)
    assert kwargs == {"agent_installs": ["mini-swe-agent"]}
    assert resolve_installs(kwargs["agent_installs"]) == [INSTALL]
    assert resolve_installs("test_mini_swe_agent:INSTALL") == [INSTALL]
    assert environment_kwargs(AgentConfig(name="oracle")) == {}
    with pytest.raises(ValueError, match="unknown agent install 'nope'"):
        resolve_installs("nope")


@pytest.mark.parametrize(
    "exit_status, expected",
    [("Submitted", "submitted"), ("LimitsExceeded", "step_limit"), ("RepeatedFormatError", "step_limit"),
     ("ContextWindowExceededError", "context_exceeded"), ("APIConnectionError", "aborted")],
)  # fmt: skip
def test_exit_status_is_reported_in_the_converters_words(tmp_path, exit_status, expected):
    from harbor.models.agent.context import AgentContext

    agent = MiniSweAgent(logs_dir=tmp_path, model_name="hosted_vllm/policy")
    (tmp_path / "mini-swe-agent.trajectory.json").write_text(json.dumps(
        {"info": {"exit_status": exit_status, "model_stats": {"api_calls": 3}}, "messages": []}
    ))  # fmt: skip
    context = AgentContext()
    agent.populate_context_post_run(context)
    assert context.metadata == {"exit_status": expected, "agent_exit_status": exit_status, "turns": 3}


# --- bubblewrap -----------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.asyncio
async def test_bubblewrap_trial_runs_mini_swe_agent_to_the_verifier(tmp_path, policy_server, tiny_model_dir, proxy):
    task = public_task_copy(tmp_path / "tasks")
    step_limit = 5  # above the format-error limit (3): the episode ends at RepeatedFormatError
    env_kwargs = {"base_dir": str(tmp_path / "sandboxes")}
    host_dir = await asyncio.to_thread(INSTALL.host_dir)  # built here at most once
    builds = INSTALL.builds
    stamp = (host_dir / "build.json").stat().st_mtime_ns

    async with gateway_sessions(policy_server, tiny_model_dir, tmp_path / "gateway") as session_root:
        agent = agent_config(session_root("one"), Path(tiny_model_dir).name, proxy.url, step_limit)
        trial, result = await run_trial(task, tmp_path / "one", agent, LOCAL_SANDBOX, env_kwargs)
        check_scored_truncated(result, "RepeatedFormatError", step_limit)
        replies = check_requests_to_model(trial.paths.trial_dir, step_limit)
        assert len(replies) == 3  # mini-swe-agent's max_consecutive_format_errors
        assert not proxy.requests, proxy.requests  # no cost map, update check or telemetry
        assert not trial.agent_environment.sandbox_dir.exists()

        # A second trial reuses the host install: no build, the same directory.
        agent = agent_config(session_root("two"), Path(tiny_model_dir).name, proxy.url, step_limit)
        trial, result = await run_trial(task, tmp_path / "two", agent, LOCAL_SANDBOX, env_kwargs)
        check_scored_truncated(result, "RepeatedFormatError", step_limit)
        assert INSTALL.builds == builds and (host_dir / "build.json").stat().st_mtime_ns == stamp


class ToolCallingStub:
    """An OpenAI chat-completions endpoint on loopback that records every request and answers with
    a bash tool call: `commands` in order, then mini-swe-agent's submit command."""

    def __init__(self, commands: list[str], context_limit_after: int | None = None):
        self.requests: list[dict] = []
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                n = len(stub.requests)
                if context_limit_after is not None and n > context_limit_after:
                    # vLLM's (and the gateway's) wording, which LiteLLM maps to ContextWindowExceededError
                    error = {"error": {"message": "This model's maximum context length is 64 tokens. However, your "
                                                  "request has 99 input tokens.", "type": "BadRequestError", "code": 400}}
                    data = json.dumps(error).encode()
                    self.send_response(400)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                command = commands[n - 1] if n <= len(commands) else "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
                reply = {
                    "id": f"chatcmpl-{n}", "object": "chat.completion", "created": 0, "model": body.get("model"),
                    "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                        "role": "assistant", "content": f"step {n}",
                        "tool_calls": [{"id": f"call_{n}", "type": "function", "function": {
                            "name": "bash", "arguments": json.dumps({"command": command})}}]}}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
                }  # fmt: skip
                data = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.slow
@pytest.mark.asyncio
async def test_what_mini_swe_agent_sends_the_model_and_a_submitted_episode(tmp_path, proxy):
    """The wire format the gateway must handle, and the other way an episode ends: the agent runs a
    command, submits, and the verifier scores it (completed, not truncated)."""
    task = public_task_copy(tmp_path / "tasks")
    command = "python3 -c 'import sys; print(sys.prefix)'"
    stub = ToolCallingStub([command])
    try:
        agent = agent_config(stub.url, "policy", proxy.url, step_limit=5)
        trial, result = await run_trial(task, tmp_path, agent, LOCAL_SANDBOX, {"base_dir": str(tmp_path / "sb")})
    finally:
        stub.close()
    assert result.exception_info is None, result.exception_info
    assert result.agent_result.metadata["exit_status"] == "submitted"
    assert result.verifier_result.rewards == {"reward": 0.0}
    (sample,) = trial_to_episode(result).samples
    assert sample.status == SampleStatus.COMPLETED
    assert not proxy.requests, proxy.requests

    first, second = [r["body"] for r in stub.requests]
    for request in stub.requests:
        assert request["path"] == "/v1/chat/completions"
        assert request["headers"]["X-Session-ID"] == f"{trial.config.trial_name}__agent"
        # hosted_vllm/<name> reaches the server as <name>; no stream, no tool_choice, no sampling
        # parameters: only the run's max_tokens.
        assert set(request["body"]) == {"model", "messages", "max_tokens", "tools"}, request["body"]
        assert request["body"]["model"] == "policy" and request["body"]["max_tokens"] == 16
        assert [t["function"]["name"] for t in request["body"]["tools"]] == ["bash"]
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    # Append-only: the second request is the first's messages, the reply as sent, the tool result.
    assert second["messages"][:2] == first["messages"]
    reply, observation = second["messages"][2:]
    assert reply["role"] == "assistant" and reply["content"] == "step 1"
    assert reply["tool_calls"][0]["function"]["arguments"] == json.dumps({"command": command})
    assert observation["role"] == "tool" and observation["tool_call_id"] == "call_1"
    output = json.loads(observation["content"])
    assert output["returncode"] == 0 and "/opt/slime-harbor" not in output["output"]  # the task's python


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_prompt_over_the_context_limit_ends_the_episode_truncated_and_verified(tmp_path, proxy):
    """mini-swe-agent exits non-zero on a context-window error (after saving its trajectory): the
    episode is still verified and scored, truncated at context_exceeded, not an agent failure."""
    task = public_task_copy(tmp_path / "tasks")
    stub = ToolCallingStub(["true"], context_limit_after=1)
    try:
        agent = agent_config(stub.url, "policy", proxy.url, step_limit=5)
        _, result = await run_trial(task, tmp_path, agent, LOCAL_SANDBOX, {"base_dir": str(tmp_path / "sb")})
    finally:
        stub.close()
    assert len(stub.requests) == 2  # not retried
    assert result.exception_info is None, result.exception_info
    meta = result.agent_result.metadata
    assert meta["exit_status"] == "context_exceeded" and meta["agent_exit_status"] == "ContextWindowExceededError"
    assert result.verifier_result.rewards == {"reward": 0.0}
    (sample,) = trial_to_episode(result).samples
    assert sample.status == SampleStatus.TRUNCATED


@pytest.mark.slow
@pytest.mark.asyncio
async def test_bubblewrap_install_is_read_only_and_leaves_the_task_python_alone(tmp_path):
    from slime_harbor.environments.bubblewrap import BubblewrapEnvironment
    from harbor.models.trial.paths import TrialPaths
    from harbor.models.task.task import Task

    task = Task(DEFAULT_TASKS / TASK)
    paths = TrialPaths(trial_dir=tmp_path / "trial")
    paths.mkdir()
    env = BubblewrapEnvironment(
        environment_dir=task.paths.environment_dir, environment_name=TASK, session_id="mswea-ro",
        trial_paths=paths, task_env_config=task.config.environment, base_dir=str(tmp_path / "sandboxes"),
        agent_installs="mini-swe-agent",
    )  # fmt: skip
    await env.start(force_build=False)
    try:
        done = await env.exec(f"{INSTALL.launcher} --help && touch {INSTALL.sandbox_dir}/x")
        assert "Run mini-SWE-agent" in done.stdout and done.return_code != 0
        assert "Read-only file system" in done.stderr
        # The task's python is the host's, without the agent's packages.
        done = await env.exec("command -v python3; python3 -c 'import minisweagent'")
        assert done.stdout.strip() in ("/usr/bin/python3", "/usr/local/bin/python3") and done.return_code != 0
    finally:
        await env.stop(delete=True)


# --- Docker -------------------------------------------------------------------------------------


def _image(tag: str) -> dict:
    from slime_harbor.environments.docker_images import docker_client

    return docker_client().api.inspect_image(tag)


@needs_docker
@pytest.mark.slow
@pytest.mark.asyncio
async def test_docker_trial_runs_mini_swe_agent_on_a_layer_built_once(tmp_path, policy_server, tiny_model_dir, proxy):
    task = public_task_copy(tmp_path / "tasks")
    step_limit = 2  # below the format-error limit: the episode ends at LimitsExceeded
    # The install is a layer on the image the task's Dockerfile starts FROM, under its own instructions.
    from slime_harbor.environments.dockerfile import single_base_image

    async with gateway_sessions(policy_server, tiny_model_dir, tmp_path / "gateway") as session_root:
        agent = agent_config(session_root("one"), Path(tiny_model_dir).name, proxy.url, step_limit)
        trial, result = await run_trial(task, tmp_path / "one", agent, DOCKER_SANDBOX, {})
        check_scored_truncated(result, "LimitsExceeded", step_limit)
        replies = check_requests_to_model(trial.paths.trial_dir, step_limit)
        assert len(replies) == step_limit
        assert not proxy.requests, proxy.requests
        environment = trial.agent_environment
        layer = _image(environment.run_image)
        base = _image(single_base_image((task / "environment" / "Dockerfile").read_text()))
        assert environment.run_image != environment.image and layer["Id"] != base["Id"]
        assert layer["RootFS"]["Layers"][: len(base["RootFS"]["Layers"])] == base["RootFS"]["Layers"]
        assert layer["Config"]["User"] == base["Config"]["User"] and layer["Config"]["WorkingDir"] == "/app"

        # A second trial starts from the same layer image: not rebuilt.
        agent = agent_config(session_root("two"), Path(tiny_model_dir).name, proxy.url, step_limit)
        trial, result = await run_trial(task, tmp_path / "two", agent, DOCKER_SANDBOX, {})
        check_scored_truncated(result, "LimitsExceeded", step_limit)
        assert trial.agent_environment.run_image == environment.run_image
        again = _image(environment.run_image)
        assert again["Id"] == layer["Id"] and again["Created"] == layer["Created"]


@needs_docker
@pytest.mark.slow
@pytest.mark.asyncio
async def test_docker_layer_leaves_the_task_python_untouched(tmp_path):
    """The layer adds /opt/slime-harbor only: the image's python3 and its site-packages are the
    base image's, byte for byte (what SWE-bench's /testbed env relies on)."""
    from harbor.models.task.task import Task
    from harbor.models.trial.paths import TrialPaths

    from slime_harbor.environments.docker import DockerEnvironment

    task = Task(DEFAULT_TASKS / TASK)
    paths = TrialPaths(trial_dir=tmp_path / "trial")
    paths.mkdir()
    env = DockerEnvironment(
        environment_dir=task.paths.environment_dir, environment_name=TASK, session_id="mswea-py__env",
        trial_paths=paths, task_env_config=task.config.environment, agent_installs=["mini-swe-agent"],
    )  # fmt: skip
    await env.start(force_build=False)
    try:
        probe = ("command -v python3; python3 -c 'import sys, site; print(sys.prefix); print(site.getsitepackages())'; "
                 "python3 -m pip freeze --all 2>/dev/null | sort | md5sum; python3 -c 'import minisweagent' 2>&1 | tail -1")  # fmt: skip
        inside = await env.exec(probe)
        done = await env.exec(f"{INSTALL.launcher} --help")
        assert done.return_code == 0 and "Run mini-SWE-agent" in done.stdout
    finally:
        await env.stop(delete=True)
    # The same probe in a container of the task's own image.
    from slime_harbor.environments.docker_images import docker_client, ensure_image

    await ensure_image(env.environment_dir, env.image, TASK, 600)

    api = docker_client().api
    container = api.create_container(env.image, ["sh", "-c", probe], network_disabled=True,
                                     host_config=api.create_host_config(network_mode="none"))  # fmt: skip
    try:
        api.start(container)
        api.wait(container, timeout=120)
        base_output = api.logs(container, stdout=True, stderr=True).decode()
    finally:
        api.remove_container(container, force=True)
    assert inside.stdout.strip() == base_output.strip()
    assert "No module named 'minisweagent'" in base_output


@pytest.mark.parametrize("dockerfile, base, rebased", [
    ("FROM python:3.11-slim\nWORKDIR /app\n", "python:3.11-slim", "FROM tools/x:1\nWORKDIR /app\n"),
    ("# a comment\nfrom debian:12 as build\nRUN true\n", "debian:12", "# a comment\nFROM tools/x:1 as build\nRUN true\n"),
    ("FROM a AS first\nRUN true\nFROM b\nCOPY --from=first /x /x\n", None, None),  # multi-stage
    ("FROM --platform=linux/amd64 python:3.11-slim\n", None, None),  # flags
    ("ARG BASE=python:3.11-slim\nFROM $BASE\n", None, None),  # a variable
    ("FROM ${BASE}\n", None, None),
    ("LABEL x=y \\\nFROM python:3.11-slim\n", None, None),  # continued from the line before: not an instruction
    ("FROM \\\n  python:3.11-slim AS b\nRUN true\n", "python:3.11-slim", "FROM tools/x:1 AS b\nRUN true\n"),  # continued
    ("FROM debian:12\nRUN <<EOF\nFROM x\nEOF\n", "debian:12", "FROM tools/x:1\nRUN <<EOF\nFROM x\nEOF\n"),  # a heredoc's line
    ("FROM debian:12\nFROBNICATE\n", None, None),  # BuildKit cannot parse it: the task's own build says why
])
def test_only_a_plain_single_stage_dockerfile_is_rebased_under_the_tools(dockerfile, base, rebased):
    from slime_harbor.environments.dockerfile import rebased_dockerfile, single_base_image

    assert single_base_image(dockerfile) == base
    if base:
        assert rebased_dockerfile(dockerfile, "tools/x:1") == rebased


@needs_docker
@pytest.mark.slow
@pytest.mark.asyncio
async def test_docker_install_is_built_once_for_tasks_that_share_a_base_image(tmp_path):
    """Procedural tasks differ only in the files their Dockerfiles copy: the install is one layer on
    their common base, under each task's own instructions, not a venv built again per task (which
    took longer than the demo's 60 s build timeout, for every task). A multi-stage Dockerfile keeps
    the layer on top of its own image."""
    from harbor.models.task.task import Task
    from harbor.models.trial.paths import TrialPaths

    from slime_harbor.environments.docker import DockerEnvironment
    from slime_harbor.environments.docker_images import TOOLS_REPOSITORY, docker_client
    from slime_harbor.tasks import families as task_families

    def tools_images() -> set[str]:
        return {tag for image in docker_client().api.images() for tag in image.get("RepoTags") or []
                if tag.startswith(f"{TOOLS_REPOSITORY}/mini-swe-agent:")}

    instances = task_families.instances("rename-file", 2, 11, "train")
    dirs = [task_families.write_task(inst, tmp_path / "tasks") for inst in instances]
    multi = tmp_path / "tasks" / "multi-stage"
    shutil.copytree(dirs[0], multi)
    dockerfile = multi / "environment" / "Dockerfile"
    dockerfile.write_text("FROM python:3.11-slim AS first\nRUN echo built > /built\n" + dockerfile.read_text()
                          + "COPY --from=first /built /built\n")

    async def start(task_dir: Path, name: str):
        task = Task(task_dir)
        paths = TrialPaths(trial_dir=tmp_path / name)
        paths.mkdir()
        env = DockerEnvironment(
            environment_dir=task.paths.environment_dir, environment_name=task_dir.name, session_id=f"{name}__env",
            trial_paths=paths, task_env_config=task.config.environment.model_copy(update={"build_timeout_sec": 600}),
            agent_installs=["mini-swe-agent"],
        )  # fmt: skip
        await env.start(force_build=False)
        return env

    first = await start(dirs[0], "first")
    before = tools_images()
    try:
        second = await start(dirs[1], "second")
        try:
            assert tools_images() == before  # the second task built no install of its own
            # Both run images are the base, the install (its COPY and RUN), then each task's own files.
            base = _image("python:3.11-slim")["RootFS"]["Layers"]
            a, b = (_image(env.run_image)["RootFS"]["Layers"] for env in (first, second))
            common = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            assert a[: len(base)] == base and common >= len(base) + 2 and a != b
            for env, inst in ((first, instances[0]), (second, instances[1])):
                done = await env.exec(f"ls /app && {INSTALL.launcher} --help >/dev/null && echo launcher ok")
                assert done.return_code == 0, done.stderr
                assert all(name in done.stdout for name in inst.files) and "launcher ok" in done.stdout
        finally:
            await second.stop(delete=True)
        staged = await start(multi, "multi")
        try:
            done = await staged.exec(f"cat /built && {INSTALL.launcher} --help >/dev/null && echo launcher ok")
            assert done.stdout.split() == ["built", "launcher", "ok"], done.stderr
            own = _image(staged.image)["RootFS"]["Layers"]  # on top of the multi-stage task's own image
            assert _image(staged.run_image)["RootFS"]["Layers"][: len(own)] == own
        finally:
            await staged.stop(delete=True)
    finally:
        await first.stop(delete=True)


# --- through rollout: `--agent mini-swe-agent` ----------------------------------------------------


def test_rollout_has_our_sandboxes_install_mini_swe_agent():
    from slime_harbor.agents.placement import agent_config
    from slime_harbor.run_config import RolloutConfig
    from slime_harbor.trial_setup import environment_config

    gateway = SimpleNamespace(host="127.0.0.1", port=4321)  # where a started Gateway listens
    forward = {"gateway_port": 4321, "gateway_host": "127.0.0.1"}
    agent = agent_config(RolloutConfig(agent="mini-swe-agent", step_limit=4))
    assert agent.import_path == AGENT_IMPORT_PATH and agent.kwargs["step_limit"] == 4
    for env in ("docker", "local"):
        assert environment_config(env, gateway, agent).kwargs == {**forward, "agent_installs": ["mini-swe-agent"]}
    assert environment_config("harbor-docker", gateway, agent).kwargs == {}
    assert environment_config("docker", gateway, agent_config(RolloutConfig(agent="oracle"))).kwargs == forward


@pytest.mark.slow
@pytest.mark.parametrize("env", [pytest.param("docker", marks=needs_docker), "local"])
def test_mini_swe_agent_trains_on_a_no_network_task(env, tmp_path, policy_server, tiny_model_dir, model):
    """Plain `--agent mini-swe-agent --env docker|local` on a bundled no-network task: through the
    gateway, every reply delivered is trained once, in samples whose rollout_log_probs match a
    recomputation by the model. The tiny model's replies carry no tool call, and mini-swe-agent
    drops such a reply from its history (it appends only its format-error message), so each call
    starts a new branch of the episode: one sample per call, all with the episode's rollout_id."""
    from helpers.samples import check_trains
    from helpers.rollout import config, leftovers

    from slime_harbor.rollout import run_rollouts
    from slime_harbor.samples import read_jsonl

    step_limit = 3
    cfg = config(tmp_path, policy_server, tiny_model_dir, agent="mini-swe-agent", env=env, task_names=[TASK],
                 n_samples=2, step_limit=step_limit, max_new_tokens=32)  # fmt: skip
    summary = asyncio.run(run_rollouts(cfg))
    samples = read_jsonl(cfg.out_dir / "samples.jsonl")
    assert summary["status_counts"]["aborted"] == 0 and summary["status_counts"]["failed"] == 0, summary["errors"]
    trained = check_trains(samples, model)
    assert len(trained) == len(samples) == 2 * step_limit and len({s.rollout_id for s in samples}) == 2
    for s in trained:
        assert s.status == SampleStatus.TRUNCATED and s.reward is not None  # mini-swe-agent's own limits
        assert s.metadata["exit_status"] == "step_limit"
        stats = s.metadata["gateway"]
        assert stats["calls"] == stats["delivered"] == stats["trained"] == step_limit
        assert (Path(s.metadata["trial_dir"]) / "agent" / "gateway" / "calls.jsonl").is_file()
    assert leftovers(cfg.out_dir) == ([], [])


def test_no_usable_host_python_is_one_config_error_before_any_trial(monkeypatch, tmp_path):
    from slime_harbor.exits import ConfigError
    from slime_harbor.run_config import check_config, RolloutConfig

    from slime_harbor.agents.installed import installs

    monkeypatch.setattr(installs, "_HOST_PYTHONS", (str(tmp_path / "no-python3"),))
    cfg = RolloutConfig(agent="mini-swe-agent", env="local", tasks_dir=DEFAULT_TASKS, task_names=[TASK],
                        policy_url="http://127.0.0.1:9", model_dir=str(tmp_path))  # fmt: skip
    with pytest.raises(ConfigError, match=r"agent 'mini-swe-agent' cannot run with env 'local': .*Python >= 3.10"):
        check_config(cfg)
    monkeypatch.undo()
    check_config(cfg)  # this host has one


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_sandbox_started_without_the_install_is_one_clear_error(tmp_path):
    """install() finds no launcher (the environment was started without agent_installs): one line
    saying how to start it, for mini-swe-agent and the npm agents alike."""
    from harbor.models.task.task import Task
    from harbor.models.trial.paths import TrialPaths

    from slime_harbor.environments.bubblewrap import BubblewrapEnvironment

    task = Task(DEFAULT_TASKS / TASK)
    paths = TrialPaths(trial_dir=tmp_path / "trial")
    paths.mkdir()
    env = BubblewrapEnvironment(
        environment_dir=task.paths.environment_dir, environment_name=TASK, session_id="no-install",
        trial_paths=paths, task_env_config=task.config.environment, base_dir=str(tmp_path / "sandboxes"),
    )  # fmt: skip
    await env.start(force_build=False)
    try:
        with pytest.raises(RuntimeError, match=r"^mini-swe-agent is not installed in this sandbox .*"
                                                r"agent_installs=mini-swe-agent .* docker or local environment$"):
            await MiniSweAgent(logs_dir=tmp_path, model_name="hosted_vllm/policy").install(env)
        with pytest.raises(RuntimeError, match=r"^codex is not installed in this sandbox \(/opt/slime-harbor/codex/"
                                                r"bin/codex is missing\).* on slime-harbor's docker environment$"):
            await Codex(logs_dir=tmp_path, model_name="openai/policy").install(env)
    finally:
        await env.stop(delete=True)
