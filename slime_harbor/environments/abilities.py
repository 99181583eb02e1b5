"""What our sandboxes can do beyond Harbor's ``BaseEnvironment``, declared in one place, and the
keyword arguments they share.

An ability is a class a sandbox inherits; its methods are abstract, so a sandbox that declares one
has it. Whoever needs one asks ``isinstance(environment, Ability)`` (``issubclass`` of a class
named by import path), never by looking for a method: Harbor's own and the cloud environments
declare none and simply lack them. A user's ``module:Class`` environment may declare any of them.

    InstallsAgents       builds the trial's agent installs (tool layers, host venvs) before Harbor
                         starts it, within the agent's setup budget (trial_setup.install_agents_first)
    EndsAgentProcesses   kills every process the agent left, its files kept (isolation.py, before a
                         verifier in the same sandbox)
    ReportsAgentChanges  says, from the host, what the agent changed against the image, what that
                         image's runtime is, and a changed file's text (isolation.py's checks, the
                         hack monitor)
    KeepsState           keeps the agent's final state for a second verifier (twin_grading.py; a run
                         can check a task's impossible twin only where its environment keeps state)
    WatchesGrading       binds a host dir of ours read-only at grader_watch.WATCH_DIR from the start,
                         which the host fills right before a verifier runs: the grading watch's
                         audit hook and its report socket (grader_watch/verifier.py)

`Sandbox` is what the bubblewrap and Docker sandboxes share: every ability above, and the keyword
arguments of ours they take (`SandboxOptions`: the network of a task that sets none, the model
gateway they forward to, tmux, agent installs, a kept state to start from), parsed once.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

from harbor.environments.base import BaseEnvironment
from harbor.environments.capabilities import EnvironmentCapabilities
from harbor.models.task.config import EnvironmentConfig, NetworkMode, NetworkPolicy
from harbor.models.trial.paths import TrialPaths

from slime_harbor.agents.installed.catalog import resolve_installs
from slime_harbor.agents.installed.installs import DEFAULT_SETUP_TIMEOUT_SEC, SandboxInstall
from slime_harbor.environments.common import flag_kwarg, shares_host_network
from slime_harbor.environments.gateway_reach import gateway_port_kwarg
from slime_harbor.environments.watch_dir import make_watch_dir, remove_watch_dir, reserve_watch_dir, WATCH_DIR

if TYPE_CHECKING:
    from slime_harbor.verifier_runtime import Change, RuntimeIndex


# --- the abilities -------------------------------------------------------------------------------


class InstallsAgents(ABC):
    """Builds the trial's agent installs before Harbor starts the environment (start() builds them
    too, a no-op once done)."""

    agent_setup_timeout_sec: float
    """The budget of each install: the agent's setup budget, which the trial runner sets from Harbor's."""

    @abstractmethod
    async def install_agents(self, force_build: bool = False) -> None:
        """Build (or find) the installs; AgentInstallError when one fails or runs out of budget."""


class EndsAgentProcesses(ABC):
    """Kills every process in the sandbox (detached daemons, a tmux server), keeping its files."""

    @abstractmethod
    async def end_agent_processes(self) -> None:
        """Done from the host, with nothing of the sandbox's (whose tools the agent may have replaced)."""


class ReportsAgentChanges(ABC):
    """Says from the host, without running anything inside, what the agent changed."""

    @abstractmethod
    async def agent_changes(self) -> list[Change]:
        """What changed in the sandbox against its image (files, and mounts the agent made)."""

    @abstractmethod
    async def runtime_index(self) -> RuntimeIndex:
        """What the image's runtime is: which files its packages ship (verifier_runtime judges against it)."""

    @abstractmethod
    async def changed_file_text(self, path: str) -> str | None:
        """A changed regular file's text (None: gone, not a regular file, a link, too large)."""


class KeepsState(ABC):
    """Keeps the agent's final state, for a second verifier that starts a copy of it later."""

    @abstractmethod
    async def keep_state(self) -> KeptState:
        """The state as it is now, untouched by what runs in this sandbox afterwards."""


class WatchesGrading(ABC):
    """A host dir of ours is bound read-only at grader_watch.WATCH_DIR in the sandbox (and in a
    separate verifier's), empty until the host fills it for a verifier; the image's own environment
    variables are known, so the watch's PYTHONPATH keeps the image's."""

    watch_host_dir: Path
    """The host side of watch_dir.WATCH_DIR (short: a unix socket's path must fit in 108 bytes)."""

    @abstractmethod
    def image_env(self) -> dict[str, str]:
        """The image's ENV as a command sees it before Harbor's env (PYTHONPATH among them)."""


class KeptState(ABC):
    """What `KeepsState.keep_state` kept (a copied dir, a committed image): a copy of it starts
    later, with other mounts; `discard()` drops it."""

    def __init__(self, source: Sandbox, kept: str | Path):
        self.source, self.kept = source, kept

    async def start(self, trial_paths: TrialPaths, mounts: list[dict], session_id: str) -> Sandbox:
        """A started sandbox of the kept state, with `mounts` (Harbor's log dirs) instead of the
        source's, and no gateway; stop(delete=True) removes it."""
        source = self.source
        copy = type(source)(
            environment_dir=source.environment_dir, environment_name=source.environment_name, session_id=session_id,
            trial_paths=trial_paths, task_env_config=source.task_env_config, logger=source.logger, mounts=mounts,
            network_policy=source.network_policy, default_network_mode=source.options.default_network_mode,
            kept_state=str(self.kept), **source.copy_kwargs())  # fmt: skip
        try:
            await copy.start(force_build=False)
        except BaseException:  # a copy that did not start is removed (re-raised)
            await copy.stop(delete=True)
            raise
        return copy

    @abstractmethod
    async def discard(self) -> None:
        """Drop the kept state, unless a started copy took it over."""


# --- what our sandboxes share --------------------------------------------------------------------


@dataclass(frozen=True)
class SandboxOptions:
    """Our sandboxes' own keyword arguments, declared once: `Sandbox` takes each field by its name
    from the environment's kwargs (Harbor passes ``EnvironmentConfig.kwargs`` / ``--ek``, as text
    from the command line), and this turns text into the field's type; a ValueError with one line
    for a bad one."""

    default_network_mode: NetworkMode = NetworkMode.NO_NETWORK
    """The network of a task whose task.toml does not set ``[environment] network_mode``
    (``"public"`` follows Harbor, which treats an unset mode as public)."""
    gateway_port: int | None = None
    """The model gateway's port on the host: a sandbox without the host's network reaches it, and
    only it, at 127.0.0.1:<gateway_port> (gateway_reach.py)."""
    gateway_host: str = "127.0.0.1"
    """The host address the gateway listens on."""
    provide_tmux: bool = False
    """The trial needs tmux (terminus-2): Docker builds a layer with the distribution's, bubblewrap
    checks that the host has one (it uses the host's)."""
    agent_installs: tuple[SandboxInstall, ...] = ()
    """The agents installed from the registries for this trial (names or ``module:attr``, see
    slime_harbor.agents.installed): an image layer in Docker, a host venv bound read-only in bubblewrap."""
    kept_state: str | None = None
    """Start from what `KeepsState.keep_state` kept (bubblewrap: the kept dir, taken over and removed
    with the sandbox; Docker: the committed image): nothing is built or installed."""

    def __post_init__(self):
        installs = self.agent_installs
        if not all(isinstance(i, SandboxInstall) for i in installs or ()):  # names, as the kwargs give them
            installs = resolve_installs(installs)
        parsed = {"default_network_mode": NetworkMode(self.default_network_mode),
                  "gateway_port": gateway_port_kwarg(self.gateway_port), "provide_tmux": flag_kwarg(self.provide_tmux),
                  "agent_installs": tuple(installs), "kept_state": str(self.kept_state) if self.kept_state else None}  # fmt: skip
        for name, value in parsed.items():
            object.__setattr__(self, name, value)  # frozen: set once, here


OPTION_NAMES = frozenset(f.name for f in fields(SandboxOptions))


class Sandbox(InstallsAgents, EndsAgentProcesses, ReportsAgentChanges, KeepsState, WatchesGrading, BaseEnvironment):
    """What the bubblewrap and Docker sandboxes share: every ability, the keyword arguments of
    `SandboxOptions` (``self.options``), the network rule, and Harbor's log dirs bound in (mounted),
    with the grading watch's dir beside them."""

    def __init__(
        self,
        environment_dir: Path,
        environment_name: str,
        session_id: str,
        trial_paths: TrialPaths,
        task_env_config: EnvironmentConfig,
        *,
        network_policy: NetworkPolicy | None = None,
        **kwargs,
    ):
        # Set before BaseEnvironment.__init__, which validates the network policy (shares_host_network).
        self.options = SandboxOptions(**{name: kwargs.pop(name) for name in OPTION_NAMES & kwargs.keys()})
        self.agent_setup_timeout_sec = DEFAULT_SETUP_TIMEOUT_SEC
        super().__init__(
            environment_dir=environment_dir,
            environment_name=environment_name,
            session_id=session_id,
            trial_paths=trial_paths,
            task_env_config=task_env_config,
            # A Trial passes the task's resolved policy; used on its own, take the task's.
            network_policy=network_policy or task_env_config.resolve_baseline(),
            **kwargs,
        )
        # Bound from the start (a container's binds are fixed at creation) and empty until a
        # verifier: the host fills it then (grader_watch/verifier.py), read-only inside. Made by
        # start() (make_watch_dir), so a sandbox never started leaves no dir behind.
        self.watch_host_dir = reserve_watch_dir()
        self._mounts.append({"type": "bind", "source": str(self.watch_host_dir), "target": WATCH_DIR,
                             "read_only": True})

    def make_watch_dir(self) -> None:
        """Make the grading watch's host dir: the first thing start() does."""
        make_watch_dir(self.watch_host_dir)

    def remove_watch_dir(self) -> None:
        """Remove the grading watch's host dir (at stop; a killed process's are swept later)."""
        remove_watch_dir(self.watch_host_dir)

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        # mounted: Harbor's log directories are bound in, so Harbor reads them on the host.
        return EnvironmentCapabilities(disable_internet=True, mounted=True)

    @property
    def shares_host_network(self) -> bool:
        """Whether commands see the host's network (else: a loopback of the sandbox's own)."""
        return shares_host_network(self.network_policy, self.task_env_config, self.options.default_network_mode)

    def copy_kwargs(self) -> dict:
        """The keyword arguments of this sandbox's own (beyond `SandboxOptions`) that a copy of its
        kept state is started with (KeptState.start)."""
        return {}
