"""How a trial is set up around its agent: the sandbox it runs in (environment_config: ours, told
where the gateway listens and what the agent needs, or Harbor's), whether that sandbox can keep
the agent's state for a second verifier, the agent's installs before the sandbox starts, and the
trial's hard timeout. The run's settings are run_config.py's; the agent's config is
agents/placement.py's.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from slime_harbor.agents.host import HOST_GATEWAY_AGENTS
from slime_harbor.agents.placement import connect_host
from slime_harbor.exits import ConfigError, one_line

LOCAL_SANDBOX = "slime_harbor.environments.bubblewrap:BubblewrapEnvironment"
DOCKER_SANDBOX = "slime_harbor.environments.docker:DockerEnvironment"
# Slack on top of the task's own agent + verifier + build timeouts before we cancel a trial that
# Harbor's own timeouts failed to end (a hung container teardown, a stuck verifier upload).
HARD_TIMEOUT_SLACK_SEC = 120.0



def environment_config(env: str, gateway=None, agent=None):
    """The trial's EnvironmentConfig. With a gateway, our sandboxes (local, docker) are told where
    it listens: a no-network sandbox then reaches it, and nothing else, at 127.0.0.1:<its port>.
    Given the trial's AgentConfig, they provide what the agent needs without opening the task's
    network: tmux for terminus-2, and what the agent installs from the registries before the trial
    starts (`agent_installs`, e.g. mini-swe-agent's venv; slime_harbor.agents.installed)."""
    from harbor.models.trial.config import EnvironmentConfig

    from slime_harbor.agents.installed.installs import environment_kwargs

    ours = {"gateway_port": gateway.port, "gateway_host": connect_host(gateway)} if gateway is not None else {}
    if agent is not None and (host_agent := HOST_GATEWAY_AGENTS.get(agent.name)):
        ours.update(host_agent.ENVIRONMENT_KWARGS)
    ours.update(environment_kwargs(agent) if agent is not None else {})
    if env == "local":
        return EnvironmentConfig(import_path=LOCAL_SANDBOX, delete=True, kwargs=ours)
    if env == "docker":
        return EnvironmentConfig(import_path=DOCKER_SANDBOX, delete=True, kwargs=ours)
    if env == "harbor-docker":  # Harbor's own, one `docker compose` process per call
        return EnvironmentConfig(type="docker", delete=True)
    if ":" in env:
        return EnvironmentConfig(import_path=env, delete=True)
    return EnvironmentConfig(type=env, delete=True)


def environment_keeps_state(env: str) -> bool:
    """Whether the run's environment can keep the agent's state for a second verifier: its class
    declares abilities.KeepsState (our docker and local sandboxes)."""
    config = environment_config(env)
    if not config.import_path:
        return False
    from harbor.utils.import_path import import_class

    from slime_harbor.environments.abilities import KeepsState

    try:
        return issubclass(import_class(config.import_path, label="environment"), KeepsState)
    except Exception:  # an environment that does not import: check_config says so; it keeps nothing
        return False


def preflight_environment(env: str) -> None:
    """One clear error before any trial starts when the environment cannot run here."""
    if env == "docker":
        from slime_harbor.environments.docker_images import check_docker

        check_docker()  # DockerUnavailableError: no daemon answers


def check_environment_runs(env: str) -> None:
    """preflight_environment as a ConfigError, which the command line prints as one line."""
    try:
        preflight_environment(env)
    except RuntimeError as exc:  # DockerUnavailableError: no daemon answers
        raise ConfigError(f"env {env!r} cannot run here: {one_line(exc)}") from None


def hard_timeout_sec(task_path: Path, multiplier: float, verifier_timeout_sec: float | None = None,
                     agent_setup_sec: float = 0.0) -> float:
    """Upper bound on one trial's wall time, from the task's own timeouts (Harbor's defaults if unset)
    and the agent's setup budget (`agent_setup_sec`, Harbor's resolved one: it bounds the agent's
    install before the environment starts and Harbor's agent setup after)."""
    config = tomllib.loads((Path(task_path) / "task.toml").read_text())
    agent = config.get("agent", {}).get("timeout_sec", 600.0)
    verifier = verifier_timeout_sec or config.get("verifier", {}).get("timeout_sec", 600.0)
    build = config.get("environment", {}).get("build_timeout_sec", 600.0)
    verifier_config = config.get("verifier", {})
    if verifier_config.get("environment_mode") == "separate" or (
        "environment" in verifier_config and verifier_config.get("environment_mode") != "shared"
    ):  # a separate verifier starts an environment of its own, under the same build timeout
        build *= 2
    return multiplier * (agent + verifier + build) + 2 * agent_setup_sec + HARD_TIMEOUT_SLACK_SEC


def install_agents_first(trial) -> None:
    """Install the trial's agent (the tool layers or host venvs our sandboxes build from the
    registries) before Harbor starts its environment, within the agent's setup budget: Harbor's
    ``trial.agent_setup_timeout_sec`` (the agent class's default, ``override_setup_timeout_sec``
    and the multipliers), not the task's build timeout, which Harbor puts around the start. A hook
    on the trial's ENVIRONMENT_START event, which Harbor awaits before that bound; an install that
    fails or runs out of budget ends the trial with AgentInstallError (an infrastructure failure,
    retried like an environment that did not start). Environments that do not declare
    abilities.InstallsAgents: nothing."""
    from harbor.trial.hooks import TrialEvent

    from slime_harbor.environments.abilities import InstallsAgents

    environment = trial.agent_environment
    if not isinstance(environment, InstallsAgents):
        return
    environment.agent_setup_timeout_sec = trial.agent_setup_timeout_sec

    async def install(event) -> None:
        await environment.install_agents(trial.config.environment.force_build)

    trial.add_hook(TrialEvent.ENVIRONMENT_START, install)
