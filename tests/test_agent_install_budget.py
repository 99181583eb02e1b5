"""An agent's install has its own budget, the agent's setup timeout, never the task's build timeout.

An install slower than the task's ``build_timeout_sec`` (aider's Docker layer built fresh on a busy
machine, mini-swe-agent's venv on an empty cache) used to fail every first trial: Harbor bounds the
environment's start by the build timeout, and the install ran inside the start. Here the install is
a real one (a Docker layer built with the host's network, a host directory bound into bubblewrap)
that takes longer than the task's build timeout on purpose: the trial trains. One that takes
longer than its own budget ends the trial as an infrastructure failure in one line, and the retry
joins the build that went on instead of starting it again.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path

import pytest
from harbor.agents.base import BaseAgent
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext
from helpers.docker import docker_skip_reason

from slime_harbor.agents.installed.installs import SandboxInstall
from slime_harbor.rollout import run_episode
from slime_harbor.samples import SampleStatus
from slime_harbor.run_config import RolloutConfig

AGENT = "test_agent_install_budget:SlowInstallAgent"
LAUNCHER = "/opt/slime-harbor/slow-install/bin/slow-install"


class SlowInstall(SandboxInstall):
    """An install that takes ``seconds`` to build: a launcher printing "installed"."""

    name = "slow-install"
    sandbox_dir = "/opt/slime-harbor/slow-install"

    def __init__(self):
        self.seconds = 0.0
        self.host_root: Path | None = None
        self.nonce = uuid.uuid4().hex  # a fresh Docker layer for each test session
        self.builds = 0

    def docker_script(self) -> str:
        return (f"set -eu\n# {self.nonce}\nsleep {self.seconds}\nmkdir -p {self.sandbox_dir}/bin\n"
                f"printf '#!/bin/sh\\necho installed\\n' > {LAUNCHER}\nchmod 755 {LAUNCHER}\n")

    def host_dir(self) -> Path:
        launcher = self.host_root / "bin" / "slow-install"
        if not launcher.exists():  # built once; a second caller while it builds waits on the file
            if self.builds == 0:
                self.builds += 1
                time.sleep(self.seconds)
                launcher.parent.mkdir(parents=True, exist_ok=True)
                launcher.write_text("#!/bin/sh\necho installed\n")
                launcher.chmod(0o755)
            while not launcher.exists():
                time.sleep(0.1)
        return self.host_root


SLOW_INSTALL = SlowInstall()


class SlowInstallAgent(BaseAgent):
    """Runs the install's launcher into /app/out.txt (a gateway agent: it is handed a session it never calls)."""

    SANDBOX_INSTALLS = ["test_agent_install_budget:SLOW_INSTALL"]

    def __init__(self, logs_dir, model_name: str | None = None, api_base: str | None = None, **kwargs):
        super().__init__(logs_dir, model_name=model_name, **kwargs)

    @staticmethod
    def name() -> str:
        return "slow-install-test-agent"

    def version(self) -> str | None:
        return "0"

    async def setup(self, environment: BaseEnvironment) -> None:
        pass

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        await environment.exec(f"{LAUNCHER} > /app/out.txt")


def write_task(root: Path, build_timeout_sec: float) -> Path:
    task = root / "slow-install-task"
    (task / "environment").mkdir(parents=True)
    (task / "environment" / "Dockerfile").write_text("FROM python:3.11-slim\nWORKDIR /app\n")
    (task / "instruction.md").write_text("Run the installed tool.\n")
    (task / "task.toml").write_text(f"""schema_version = "1.4"
[verifier]
timeout_sec = 60.0
[agent]
timeout_sec = 60.0
[environment]
workdir = "/app"
build_timeout_sec = {build_timeout_sec}
network_mode = "no-network"
""")
    (task / "tests").mkdir()
    (task / "tests" / "test.sh").write_text(
        "#!/bin/sh\nmkdir -p /logs/verifier\n"
        "if [ \"$(cat /app/out.txt 2>/dev/null)\" = installed ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n")
    (task / "tests" / "test.sh").chmod(0o755)
    return task


def run_one(tmp_path: Path, env: str, build_timeout_sec: float, policy_server, tiny_model_dir, **overrides):
    task = write_task(tmp_path / "tasks", build_timeout_sec)
    cfg = RolloutConfig(tasks_dir=task.parent, agent=AGENT, env=env, policy_url=policy_server,
                        model_dir=tiny_model_dir, out_dir=tmp_path / "out", progress=False, **overrides)
    return asyncio.run(run_episode(task, cfg, group_index=0, index=0, trials_dir=tmp_path / "trials"))


@pytest.fixture
def slow_install(tmp_path, monkeypatch):
    monkeypatch.setattr(SLOW_INSTALL, "host_root", tmp_path / "host-install")
    monkeypatch.setattr(SLOW_INSTALL, "builds", 0)
    return SLOW_INSTALL


def test_a_bubblewrap_install_slower_than_the_build_timeout_trains(tmp_path, slow_install, policy_server, tiny_model_dir):
    slow_install.seconds = 8
    episode = run_one(tmp_path, "local", 3, policy_server, tiny_model_dir)
    assert episode.status == SampleStatus.COMPLETED, episode.error
    assert episode.reward == 1.0
    assert episode.samples[0].metadata["env_start_attempts"] == 1


def test_an_install_past_its_own_budget_is_one_line_and_the_retry_joins_the_build(
        tmp_path, slow_install, policy_server, tiny_model_dir, capfd):
    slow_install.seconds = 9
    # No retry: the trial ends as an infrastructure failure (never trained) that names the agent and its budget.
    episode = run_one(tmp_path / "a", "local", 60, policy_server, tiny_model_dir, agent_setup_timeout_sec=3,
                      env_start_retries=0)
    assert episode.status == SampleStatus.ABORTED
    assert "installing agent slow-install" in episode.error and "3 s budget" in episode.error
    assert "--agent-setup-timeout" in episode.error and "\n" not in episode.error
    assert episode.samples[0].remove_sample
    assert "[install] slow-install (a venv on this host)" in capfd.readouterr().err  # progress, while it ran
    # The build went on: a retry waits for it instead of building again, and trains.
    episode = run_one(tmp_path / "b", "local", 60, policy_server, tiny_model_dir, agent_setup_timeout_sec=3,
                      env_start_retries=3, env_start_backoff_sec=0.5)
    assert episode.status == SampleStatus.COMPLETED, episode.error
    assert episode.reward == 1.0 and slow_install.builds == 1


def test_the_timeout_multiplier_scales_the_install_budget(tmp_path, slow_install, policy_server, tiny_model_dir):
    slow_install.seconds = 5
    episode = run_one(tmp_path, "local", 60, policy_server, tiny_model_dir, agent_setup_timeout_sec=2,
                      timeout_multiplier=4.0, env_start_retries=0)
    assert episode.status == SampleStatus.COMPLETED, episode.error
    config = json.loads(next((tmp_path / "trials").glob("*/config.json")).read_text())
    assert config["agent"]["override_setup_timeout_sec"] == 2


@pytest.mark.slow
def test_a_docker_layer_slower_than_the_build_timeout_trains(tmp_path, slow_install, policy_server, tiny_model_dir):
    if why := docker_skip_reason():
        pytest.skip(why)
    from slime_harbor.environments.docker_images import IMAGE_REPOSITORY, TOOLS_REPOSITORY, docker_client

    def layers(repositories=(f"{TOOLS_REPOSITORY}/{SLOW_INSTALL.name}",)) -> set[str]:
        images = [i for r in repositories for i in docker_client().api.images(name=r)]
        return {tag for image in images for tag in image.get("RepoTags") or []}

    slow_install.seconds = 25
    before = layers()
    try:
        episode = run_one(tmp_path, "docker", 20, policy_server, tiny_model_dir)
        assert episode.status == SampleStatus.COMPLETED, episode.error
        assert episode.reward == 1.0
        assert len(layers() - before) == 1  # built fresh, now
    finally:  # the task's image on the layer, then the layer
        for tag in layers((f"{IMAGE_REPOSITORY}/slow-install-task-tools",)) | (layers() - before):
            docker_client().api.remove_image(tag, force=True)
