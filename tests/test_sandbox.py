"""The bubblewrap sandbox: real bwrap, real Harbor Trials (oracle, nop, a hanging agent), a tiny
inline task whose Dockerfile uses ARG/ENV/WORKDIR/COPY/ADD/RUN, and checks that nothing it
started (processes, directories) outlives it."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest
from harbor.agents.base import BaseAgent
from harbor.models.task.task import Task
from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig
from harbor.models.trial.paths import TrialPaths
from harbor.trial.trial import Trial

from slime_harbor.environments.dockerfile import DockerfileError, parse_dockerfile
from slime_harbor.environments.bubblewrap import BubblewrapEnvironment
from slime_harbor.environments.common import ExecTimeoutError

SANDBOX_IMPORT_PATH = "slime_harbor.environments.bubblewrap:BubblewrapEnvironment"

DOCKERFILE = """\
# syntax=docker/dockerfile:1
ARG BASE=ubuntu:24.04
FROM ${BASE} AS build
ARG GREETING=hello
ENV GREETING="${GREETING} world" \\
    DATA_DIR=/app/data
WORKDIR /app
COPY data/ ${DATA_DIR}/
COPY --chmod=755 tool.sh /opt/tools/
ADD bundle.tar.gz /opt/bundle/
SHELL ["/bin/bash", "-c"]
RUN echo "$GREETING from $(pwd)" > built.txt && \\
    # comments inside a continued RUN are dropped
    [[ -n "$BASH_VERSION" ]] && chmod 600 built.txt
VOLUME /var/cache/app
EXPOSE 8080
CMD ["bash"]
"""

TASK_TOML = """\
[agent]
timeout_sec = {agent_timeout}
[verifier]
timeout_sec = 30
[environment]
build_timeout_sec = 60
{environment_extra}
"""

SOLVE_SH = """\
#!/bin/bash
read a b < /app/data/input.txt
echo $((a + b)) > /app/answer.txt
"""

TEST_SH = """\
#!/bin/bash
if [ "$(cat /app/answer.txt 2>/dev/null)" = "7" ]; then reward=1; else reward=0; fi
echo "$reward" > /logs/verifier/reward.txt
"""


def write_task(
    root: Path,
    *,
    dockerfile: str = DOCKERFILE,
    agent_timeout: float = 30,
    environment_extra: str = "",
    solve: str = SOLVE_SH,
) -> Path:
    """A complete Harbor task directory: sum two numbers from /app/data/input.txt."""
    task = root / "task"
    for part in ("environment/data", "solution", "tests"):
        (task / part).mkdir(parents=True, exist_ok=True)
    (task / "instruction.md").write_text("Write the sum of the numbers in /app/data/input.txt to /app/answer.txt.\n")
    (task / "task.toml").write_text(
        TASK_TOML.format(agent_timeout=agent_timeout, environment_extra=environment_extra)
    )
    (task / "environment" / "Dockerfile").write_text(dockerfile)
    (task / "environment" / "data" / "input.txt").write_text("3 4\n")
    (task / "environment" / "tool.sh").write_text("#!/bin/sh\necho tool\n")
    with tarfile.open(task / "environment" / "bundle.tar.gz", "w:gz") as bundle:
        payload = b"from the archive\n"
        info = tarfile.TarInfo("inner/readme.txt")
        info.size = len(payload)
        bundle.addfile(info, io.BytesIO(payload))
    (task / "solution" / "solve.sh").write_text(solve)
    (task / "tests" / "test.sh").write_text(TEST_SH)
    return task


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory) -> Path:
    """One sandbox base dir for the module (the /etc template is built once per base dir)."""
    return tmp_path_factory.mktemp("sandboxes")


@contextlib.asynccontextmanager
async def started_sandbox(task_dir: Path, base_dir: Path, tmp_path: Path, **kwargs):
    task = Task(task_dir)
    trial_paths = TrialPaths(tmp_path / "trial")
    trial_paths.mkdir()
    environment = BubblewrapEnvironment(
        environment_dir=task.paths.environment_dir,
        environment_name=task.name,
        session_id="test__env",
        trial_paths=trial_paths,
        task_env_config=task.config.environment,
        base_dir=base_dir,
        **kwargs,
    )
    try:
        await environment.start(force_build=False)
        yield environment
    finally:
        await environment.stop(delete=True)


def processes_running(marker: str) -> list[int]:
    """Host pids whose command line is exactly ``marker`` (zombies have none, so never match)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if cmdline.replace(b"\0", b" ").strip() == marker.encode():
            pids.append(int(entry))
    return pids


async def wait_until(condition, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        await asyncio.sleep(0.05)
    return condition()


def trial_config(task_dir: Path, tmp_path: Path, base_dir: Path, agent: AgentConfig) -> TrialConfig:
    return TrialConfig(
        task=TaskConfig(path=task_dir),
        trials_dir=tmp_path / "trials",
        agent=agent,
        environment=EnvironmentConfig(
            import_path=SANDBOX_IMPORT_PATH, kwargs={"base_dir": str(base_dir)}
        ),
    )


class HangingAgent(BaseAgent):
    """Runs one command that never finishes."""

    COMMAND = "sleep 1005"

    @staticmethod
    def name() -> str:
        return "hanging"

    def version(self) -> str:
        return "1.0"

    async def setup(self, environment) -> None:
        pass

    async def run(self, instruction, environment, context) -> None:
        await environment.exec(self.COMMAND)


# --- real Harbor trials ---------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("agent, reward", [("oracle", 1.0), ("nop", 0.0)])
async def test_trial_reward_comes_from_the_verifier(agent, reward, tmp_path, base_dir):
    task_dir = write_task(tmp_path)
    trial = await Trial.create(trial_config(task_dir, tmp_path, base_dir, AgentConfig(name=agent)))
    result = await trial.run()

    assert result.exception_info is None, result.exception_info
    assert result.verifier_result.rewards == {"reward": reward}
    assert not trial.agent_environment.sandbox_dir.exists()


@pytest.mark.asyncio
async def test_hanging_agent_times_out_and_leaves_nothing(tmp_path, base_dir):
    task_dir = write_task(tmp_path, agent_timeout=2)
    agent = AgentConfig(import_path=f"{__name__}:HangingAgent")
    trial = await Trial.create(trial_config(task_dir, tmp_path, base_dir, agent))
    started = time.monotonic()
    result = await trial.run()

    assert time.monotonic() - started < 30
    assert result.exception_info.exception_type == "AgentTimeoutError"
    assert result.verifier_result.rewards == {"reward": 0.0}  # the verifier still ran
    assert processes_running(HangingAgent.COMMAND) == []
    assert not trial.agent_environment.sandbox_dir.exists()


@pytest.mark.asyncio
async def test_cancelled_trial_leaves_nothing(tmp_path, base_dir):
    task_dir = write_task(tmp_path, solve="#!/bin/bash\nsleep 1006\n")
    trial = await Trial.create(trial_config(task_dir, tmp_path, base_dir, AgentConfig(name="oracle")))
    running = asyncio.create_task(trial.run())
    assert await wait_until(lambda: processes_running("sleep 1006"), timeout=30)

    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running

    assert processes_running("sleep 1006") == []
    assert not trial.agent_environment.sandbox_dir.exists()


@pytest.mark.asyncio
async def test_start_cancelled_at_any_point_leaves_nothing(tmp_path, base_dir):
    """Ctrl-C lands anywhere in start(): before bwrap runs, while it sets up, mid Dockerfile RUN.
    Whatever the moment, stop() must kill every process of the sandbox and remove its dir."""
    import random

    from slime_harbor.environments.bubblewrap_host import pids_with_marker

    task_dir = write_task(tmp_path)
    task = Task(task_dir)
    rng = random.Random(0)
    for i in range(25):
        trial_paths = TrialPaths(tmp_path / f"trial{i}")
        trial_paths.mkdir()
        environment = BubblewrapEnvironment(
            environment_dir=task.paths.environment_dir, environment_name=task.name, session_id=f"cancel{i}__env",
            trial_paths=trial_paths, task_env_config=task.config.environment, base_dir=base_dir,
        )
        starting = asyncio.create_task(environment.start(force_build=False))
        await asyncio.sleep(rng.uniform(0, 0.15))
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await starting
        await asyncio.wait_for(environment.stop(delete=True), 30)
        if environment.sandbox_dir is not None:
            assert pids_with_marker(environment.sandbox_dir.name) == []
            assert not environment.sandbox_dir.exists()


# --- the Dockerfile -------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_dockerfile_instructions_are_honoured(tmp_path, base_dir):
    task_dir = write_task(tmp_path, environment_extra='env = { TASK_VAR = "from-task-toml" }')
    async with started_sandbox(task_dir, base_dir, tmp_path) as sandbox:
        result = await sandbox.exec(
            "pwd; echo $GREETING; echo $TASK_VAR; cat built.txt; stat -c %a built.txt;"
            " cat /app/data/input.txt; /opt/tools/tool.sh;"
            " stat -c %a /opt/tools/tool.sh; cat /opt/bundle/inner/readme.txt;"
            " test -d /var/cache/app && echo volume"
        )
        assert result.return_code == 0, result.stderr
        assert result.stdout.splitlines() == [
            "/app",
            "hello world",
            "from-task-toml",
            "hello world from /app",
            "600",
            "3 4",
            "tool",
            "755",
            "from the archive",
            "volume",
        ]
        # Per-exec env and cwd override the defaults.
        result = await sandbox.exec("pwd; echo $GREETING", cwd="/tmp", env={"GREETING": "hi"})
        assert result.stdout.splitlines() == ["/tmp", "hi"]


@pytest.mark.parametrize(
    "instruction, reason",
    [
        ("USER agent", "USER other than root"),
        ("COPY --from=builder /out /app", "COPY --from"),
        ("ADD https://example.com/x.tar.gz /opt/", "URL"),
        ("FROM debian:12", "multi-stage"),
        ("RUN --mount=type=cache,target=/root/.cache pip install x", "RUN flags"),
        ("RUN <<EOF\necho hi\nEOF", "heredocs"),
        ("COPY missing.txt /app/", "not found in the build context"),
        ("COPY ../outside /app/", "outside the build context"),
        ("FROBNICATE now", "unknown"),
    ],
)
def test_unsupported_instruction_fails_naming_line_and_instruction(tmp_path, instruction, reason):
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(f"FROM ubuntu:24.04\nWORKDIR /app\n{instruction}\n")
    with pytest.raises(DockerfileError) as error:
        parse_dockerfile(dockerfile)
    message = str(error.value)
    assert f"{dockerfile}:3: {instruction.split()[0]}" in message
    assert reason in message


def test_recipe_follows_docker_variable_and_path_rules(tmp_path):
    (tmp_path / "a.txt").write_text("a")
    (tmp_path / ".hidden").write_text("h")
    (tmp_path / "Dockerfile").write_text(
        "ARG TAG=24.04\n"
        "FROM ubuntu:$TAG\n"
        "ARG TAG\n"
        "ARG UNSET\n"
        "ENV A=1\n"
        "ENV B=\"two words\" C='$A' D=${A}x E=${UNSET:-fallback} F=${A:+set} G=\\$A A=2 H=$A\n"
        "ENV LEGACY value with  spaces\n"
        "ENV PATH=/opt/bin:$PATH T=$TAG\n"
        "WORKDIR app\n"
        "WORKDIR sub\n"
        "COPY * ./\n"
        "COPY a.txt /etc/a.conf\n"
        "RUN [\"python3\", \"-c\", \"print(1)\"]\n"
        "RUN\techo $A\n"
    )
    recipe = parse_dockerfile(tmp_path / "Dockerfile")

    assert recipe.base_image == "ubuntu:24.04"
    env = recipe.env
    assert (env["B"], env["C"], env["D"], env["E"], env["F"], env["G"]) == (
        "two words", "$A", "1x", "fallback", "set", "$A",
    )
    # Within one ENV, values refer to what was set before it (Docker's rule).
    assert (env["A"], env["H"]) == ("2", "1")
    assert env["LEGACY"] == "value with  spaces"
    assert env["PATH"].startswith("/opt/bin:/usr/local/sbin:") and env["T"] == "24.04"
    assert recipe.workdir == "/app/sub"
    copy_glob, copy_file = recipe.steps[2], recipe.steps[3]
    # `*` matches dotfiles (Docker globbing, unlike the shell's); several sources go into a dir.
    assert {e.source.name for e in copy_glob.entries} == {"a.txt", ".hidden", "Dockerfile"}
    assert {(e.dest, e.into_dir) for e in copy_glob.entries} == {("/app/sub", True)}
    assert (copy_file.entries[0].dest, copy_file.entries[0].into_dir) == ("/etc/a.conf", None)
    exec_form, shell_form = recipe.steps[4], recipe.steps[5]
    assert exec_form.argv == ("python3", "-c", "print(1)")
    assert shell_form.argv == ("/bin/sh", "-c", "echo $A") and shell_form.env["TAG"] == "24.04"
    assert "UNSET" not in shell_form.env


def test_recipe_reads_the_dockerfile_as_buildkit_does(tmp_path):
    """What the hand-written reader got wrong: a global ARG built from an earlier one, BuildKit's
    other ${} modifiers and nested defaults, an escaped backslash at the end of a line (no
    continuation), the escape directive, and a syntax error named by its line."""
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(
        "ARG REG=docker.io\n"
        "ARG IMAGE=$REG/library/ubuntu\n"
        "FROM ${IMAGE}:24.04\n"
        "ENV ARCHIVE=tool.tar.gz\n"
        "ENV NAME=${ARCHIVE%.tar.gz} \\\n"
        "\n"
        "    # a comment inside the continuation\n"
        "    ALT=${MISSING:-${ARCHIVE}} SWAPPED=${ARCHIVE/tool/lib}\n"
        "RUN echo done \\\\\n"
        "WORKDIR /x\n"
    )
    recipe = parse_dockerfile(dockerfile)
    assert recipe.base_image == "docker.io/library/ubuntu:24.04"
    assert (recipe.env["NAME"], recipe.env["ALT"], recipe.env["SWAPPED"]) == ("tool", "tool.tar.gz", "lib.tar.gz")
    run, workdir = recipe.steps
    assert run.argv == ("/bin/sh", "-c", "echo done \\\\") and run.instruction.line == 9
    assert workdir.path == "/x"

    dockerfile.write_text("# escape=`\nFROM ubuntu:24.04\nENV DIR=C:\\tools\nRUN echo one && `\n    echo two\n")
    recipe = parse_dockerfile(dockerfile)
    assert recipe.env["DIR"] == "C:\\tools"
    assert recipe.steps[0].argv == ("/bin/sh", "-c", "echo one &&     echo two")

    dockerfile.write_text("FROM ubuntu:24.04\nRUN <<EOF\necho\n")
    with pytest.raises(DockerfileError) as error:
        parse_dockerfile(dockerfile)
    assert str(error.value) == f"{dockerfile}:2: RUN <<EOF\n  unterminated heredoc"


@pytest.mark.asyncio
async def test_failing_run_fails_start_with_its_output(tmp_path, base_dir):
    dockerfile = "FROM ubuntu:24.04\nRUN echo installing && apt-get install -y cowsay\n"
    task_dir = write_task(tmp_path, dockerfile=dockerfile)
    with pytest.raises(DockerfileError) as error:
        async with started_sandbox(task_dir, base_dir, tmp_path):
            pass
    message = str(error.value)
    assert ":2: RUN echo installing" in message
    assert "exited with code" in message and "installing" in message


# --- isolation ------------------------------------------------------------------------------


@pytest.fixture
def host_loopback_server():
    """A TCP server on the host's 127.0.0.1; yields its port."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def accept_loop():
        server.settimeout(0.1)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                connection, _ = server.accept()
                connection.sendall(b"hello from the host\n")
                connection.close()

    thread = threading.Thread(target=accept_loop, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        server.close()


CONNECT = (
    "python3 -c \"import socket; s = socket.create_connection(('127.0.0.1', {port}), timeout=3);"
    " print(s.recv(100).decode().strip())\""
)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "environment_extra, reachable",
    [("", False), ('network_mode = "no-network"', False), ('network_mode = "public"', True)],
)
async def test_network_only_when_the_task_asks_for_it(
    tmp_path, base_dir, host_loopback_server, environment_extra, reachable
):
    task_dir = write_task(tmp_path, environment_extra=environment_extra)
    async with started_sandbox(task_dir, base_dir, tmp_path) as sandbox:
        assert sandbox.shares_host_network is reachable
        result = await sandbox.exec(CONNECT.format(port=host_loopback_server), timeout_sec=20)
        if reachable:
            assert result.return_code == 0 and result.stdout.strip() == "hello from the host"
        else:
            assert result.return_code != 0 and "ConnectionRefusedError" in result.stderr


@pytest.mark.asyncio
async def test_host_is_untouched_and_private_files_stay_out(tmp_path, base_dir):
    (tmp_path / "victim.txt").write_text("host data\n")
    task_dir = write_task(tmp_path)
    async with started_sandbox(task_dir, base_dir, tmp_path) as sandbox:
        # /usr is the sandbox's own overlay: writable inside, the host's never changes, and a
        # second sandbox does not see the first one's files
        assert (await sandbox.exec("touch /usr/bin/planted && echo x >> /usr/bin/env")).return_code == 0
        assert not Path("/usr/bin/planted").exists() and not Path("/usr/bin/env").read_bytes().endswith(b"x\n")
        async with started_sandbox(task_dir, base_dir, tmp_path / "second") as other:
            assert (await other.exec("test -e /usr/bin/planted")).return_code != 0
        assert (await sandbox.exec(f"test -e {tmp_path}/victim.txt")).return_code != 0
        assert (await sandbox.exec("test -e /etc/passwd && ! test -e /etc/shadow")).return_code == 0
        # /etc is the sandbox's own: writable, and the host's is untouched.
        assert (await sandbox.exec("echo 10.0.0.1 planted >> /etc/hosts")).return_code == 0
        assert "planted" not in Path("/etc/hosts").read_text()
        # A symlink the sandbox plants resolves inside the sandbox, never to a host file.
        await sandbox.exec(f"mkdir -p {tmp_path} && ln -s {tmp_path}/victim.txt /app/link")
        await sandbox.upload_file(tmp_path / "task" / "instruction.md", "/app/link")
        assert (tmp_path / "victim.txt").read_text() == "host data\n"
        landed = await sandbox.exec(f"cat {tmp_path}/victim.txt")
        assert landed.stdout == (tmp_path / "task" / "instruction.md").read_text()


@pytest.mark.asyncio
async def test_gpu_and_other_users_are_rejected(tmp_path, base_dir):
    task_dir = write_task(tmp_path, environment_extra="gpus = 1")
    with pytest.raises(RuntimeError, match="GPU"):
        async with started_sandbox(task_dir, base_dir, tmp_path):
            pass
    async with started_sandbox(write_task(tmp_path / "b"), base_dir, tmp_path / "b") as sandbox:
        with pytest.raises(RuntimeError, match="runs every command as root"):
            await sandbox.exec("true", user="agent")


# --- processes ------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_exec_timeout_kills_its_process_group(tmp_path, base_dir):
    task_dir = write_task(tmp_path)
    async with started_sandbox(task_dir, base_dir, tmp_path) as sandbox:
        started = time.monotonic()
        with pytest.raises(ExecTimeoutError, match="timed out after 1 seconds"):
            await sandbox.exec("sleep 1001 & sleep 1002", timeout_sec=1)
        assert time.monotonic() - started < 5
        # SIGKILL is sent to the whole group at once; give the kernel a moment to finish them.
        gone = lambda: not processes_running("sleep 1001") and not processes_running("sleep 1002")  # noqa: E731
        assert await wait_until(gone, timeout=3)
        # The sandbox itself is unharmed.
        assert (await sandbox.exec("echo still here")).stdout == "still here\n"


@pytest.mark.asyncio
async def test_execs_share_processes_and_stop_kills_them_all(tmp_path, base_dir):
    task_dir = write_task(tmp_path)
    async with started_sandbox(task_dir, base_dir, tmp_path) as sandbox:
        # Detached jobs: the exec returns although they hold no terminal and outlive it.
        started = time.monotonic()
        await sandbox.exec("nohup sleep 1003 > /dev/null 2>&1 &")
        await sandbox.exec("setsid sleep 1004 &")  # still holds the exec's stdout
        await sandbox.exec("tmux new-session -d -s main -x 80 -y 24")
        assert time.monotonic() - started < 5

        # A later exec drives the tmux server the first one started.
        await sandbox.exec("tmux send-keys -t main 'echo typed-into-tmux > /tmp/typed' Enter")
        typed = await sandbox.exec("for i in $(seq 50); do [ -s /tmp/typed ] && break; sleep 0.1; done; cat /tmp/typed")
        assert typed.stdout == "typed-into-tmux\n"
        assert await wait_until(lambda: processes_running("sleep 1003") and processes_running("sleep 1004"))
        listing = await sandbox.exec("ps -eo args")
        assert "sleep 1003" in listing.stdout and "sleep 1004" in listing.stdout
        assert "tmux new-session" in listing.stdout

        # Many execs at once.
        started = time.monotonic()
        results = await asyncio.gather(*[sandbox.exec(f"sleep 1; echo {i}") for i in range(8)])
        assert [r.stdout for r in results] == [f"{i}\n" for i in range(8)]
        assert time.monotonic() - started < 4

        sandbox_dir = sandbox.sandbox_dir
        await sandbox.stop(delete=True)
        await sandbox.stop(delete=True)  # idempotent

    assert processes_running("sleep 1003") == processes_running("sleep 1004") == []
    assert not any("tmux new-session -d -s main" in cmd for cmd in host_commands())
    assert not sandbox_dir.exists()
    with pytest.raises(RuntimeError, match="not running"):
        await sandbox.exec("true")


@pytest.mark.asyncio
async def test_exec_in_a_dead_sandbox_fails_instead_of_running_elsewhere(tmp_path, base_dir):
    task_dir = write_task(tmp_path)
    async with started_sandbox(task_dir, base_dir, tmp_path) as sandbox:
        # Nothing inside can kill pid 1 ...
        assert (await sandbox.exec("kill -9 1; kill -9 -1; true")).return_code == 0
        assert (await sandbox.exec("echo alive")).stdout == "alive\n"
        # ... but the host (or the OOM killer) can.
        os.kill(sandbox._init_pid, signal.SIGKILL)
        assert await wait_until(lambda: not Path(f"/proc/{sandbox._init_pid}/ns").exists())
        with pytest.raises(RuntimeError, match="exited unexpectedly"):
            await sandbox.exec("touch /tmp/ran-somewhere")


def host_commands() -> list[str]:
    commands = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                commands.append(Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode())
    return commands


# --- file transfer --------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_upload_and_download_like_docker_cp(tmp_path, base_dir):
    source = tmp_path / "source"
    (source / "sub").mkdir(parents=True)
    (source / "top.txt").write_text("top\n")
    (source / "sub" / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (source / "sub" / "run.sh").chmod(0o755)
    task_dir = write_task(tmp_path)
    async with started_sandbox(task_dir, base_dir, tmp_path) as sandbox:
        await sandbox.upload_dir(source, "/tests")  # contents, like `docker cp source/. /tests`
        assert (await sandbox.exec("cat /tests/top.txt; /tests/sub/run.sh")).stdout == "top\nran\n"
        await sandbox.upload_file(source / "top.txt", "/app/data")  # an existing dir: inside it
        await sandbox.upload_file(source / "top.txt", "/srv/new/renamed.txt")  # else: that file
        listing = await sandbox.exec("cat /app/data/top.txt /srv/new/renamed.txt")
        assert listing.stdout == "top\ntop\n"

        await sandbox.download_file("/app/built.txt", tmp_path / "out" / "built.txt")
        assert (tmp_path / "out" / "built.txt").read_text() == "hello world from /app\n"
        await sandbox.download_dir("/tests", tmp_path / "out" / "tests")
        assert (tmp_path / "out" / "tests" / "sub" / "run.sh").read_text() == "#!/bin/sh\necho ran\n"
        assert os.access(tmp_path / "out" / "tests" / "sub" / "run.sh", os.X_OK)
        with pytest.raises(RuntimeError, match="No such file"):
            await sandbox.download_file("/nope.txt", tmp_path / "out" / "nope.txt")
        assert not (tmp_path / "out" / "nope.txt").exists()


KILLED_OWNER_SCRIPT = """
import asyncio, sys
from pathlib import Path
from harbor.models.task.task import Task
from harbor.models.trial.paths import TrialPaths
from slime_harbor.environments.bubblewrap import BubblewrapEnvironment

async def main(task_dir, base_dir, trial_dir):
    task = Task(Path(task_dir))
    paths = TrialPaths(Path(trial_dir))
    paths.mkdir()
    sandbox = BubblewrapEnvironment(
        environment_dir=task.paths.environment_dir, environment_name="t", session_id="t__env",
        trial_paths=paths, task_env_config=task.config.environment, base_dir=base_dir)
    await sandbox.start(force_build=False)
    await sandbox.exec("nohup sleep 1008 > /dev/null 2>&1 &")
    print(sandbox.sandbox_dir, flush=True)
    await asyncio.sleep(1000)

asyncio.run(main(*sys.argv[1:]))
"""


@pytest.mark.asyncio
async def test_sandbox_of_a_killed_process_dies_with_it_and_is_swept(tmp_path, base_dir):
    task_dir = write_task(tmp_path)
    owner = subprocess.Popen(
        [sys.executable, "-c", KILLED_OWNER_SCRIPT, str(task_dir), str(base_dir), str(tmp_path / "t")],
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[1],
        text=True,
    )
    try:
        sandbox_dir = Path(owner.stdout.readline().strip())
        assert sandbox_dir.is_dir()
        assert await wait_until(lambda: processes_running("sleep 1008"))  # nohup execs it soon
    finally:
        owner.kill()  # SIGKILL: no stop(), no atexit
        owner.wait()

    assert await wait_until(lambda: not processes_running("sleep 1008"), timeout=5)
    assert sandbox_dir.is_dir()  # left behind by the killed process ...
    async with started_sandbox(task_dir, base_dir, tmp_path):
        assert not sandbox_dir.exists()  # ... and swept by the next sandbox under the same base_dir
