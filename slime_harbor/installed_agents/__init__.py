"""Harbor's installed agents (they run inside the sandbox) with installs that need only the
package registries (PyPI, Debian, npm).

    recipes.py    one AgentRecipe per agent (Harbor's class, package, dialect, limits, exits)
                  and the class each recipe runs as
    installs.py   NpmInstall, PypiInstall: a package and its runtime under /opt/slime-harbor/<name>

Why the sandbox installs them, not the agent's ``setup()``: Harbor sets an agent up after its
environment started, and a no-network task's sandbox cannot reach a registry then. So the
environment installs the agent before the trial starts, once per base image (Docker) or once per
host (bubblewrap), and every trial reuses it:

- ``DockerEnvironment`` builds a derived image ``FROM`` the task's image (one ``RUN`` of
  :meth:`SandboxInstall.docker_script`, with the host network, at image build time), tagged by the
  base image's id and the script, and starts the trial's container from it.
- ``BubblewrapEnvironment`` builds :meth:`SandboxInstall.host_dir` on the host once (cached under
  ``slime_harbor.policy.tiny_model.cache_dir()``) and binds it read-only at ``sandbox_dir``.

The coupling is one environment kwarg, ``agent_installs`` (``--ek agent_installs=mini-swe-agent``;
a recipe's name (recipes.py) or ``module:attr`` of a :class:`SandboxInstall`), which :func:`environment_kwargs`
derives from an agent config. The agent checks in ``setup()`` that its install is there and says
how to get it when it is not.
"""

from __future__ import annotations

import asyncio
import importlib
import sys
import time
from abc import ABC, abstractmethod
from pathlib import Path

ENVIRONMENT_KWARG = "agent_installs"

DEFAULT_SETUP_TIMEOUT_SEC = 360.0
"""An environment's install budget when no trial set one (Harbor's BaseAgent default)."""
PROGRESS_EVERY_SEC = 30.0
"""How often a running install says how long it has been going."""


class AgentInstallError(RuntimeError):
    """An agent's install could not be built (a registry that did not answer, a failed pip or npm):
    an infrastructure failure, retried like an environment that did not start."""


class AgentInstallTimeoutError(AgentInstallError):
    """An agent's install ran past its budget, the agent's setup timeout (Harbor's
    ``agent_setup_timeout_sec``: its per-agent default, ``override_setup_timeout_sec`` and the
    multipliers), never the task's ``build_timeout_sec``."""


async def within_install_budget(install, *, name: str, where: str, budget_sec: float):
    """Await ``install`` (an awaitable building agent ``name``'s install ``where``: a Docker layer,
    a host venv) for at most ``budget_sec``; past it, :class:`AgentInstallTimeoutError` in one line
    that names the agent, the budget and how to raise it. The build itself is shielded, not
    cancelled: it is shared, and the retry or the next trial joins it. An install that takes more
    than a moment prints its progress on stderr (which agent, elapsed) every PROGRESS_EVERY_SEC."""
    build = asyncio.ensure_future(install)
    build.add_done_callback(lambda f: f.cancelled() or f.exception())  # a waiter that left never reads it
    started = time.monotonic()
    announced = False
    while True:
        elapsed = time.monotonic() - started
        left = budget_sec - elapsed
        if left <= 0:
            raise AgentInstallTimeoutError(
                f"installing agent {name} ({where}) did not finish within its {budget_sec:.0f} s budget, the "
                "agent's setup timeout (Harbor's default for the agent x the timeout multiplier); raise it "
                "with --agent-setup-timeout SEC or --timeout-multiplier"
            )
        wait = min(left, 2.0 if not announced else PROGRESS_EVERY_SEC)
        done, _ = await asyncio.wait({build}, timeout=wait)
        if done:
            result = build.result()
            if announced:
                print(f"[install] {name} ({where}) ready after {time.monotonic() - started:.0f} s", file=sys.stderr)
            return result
        announced = True
        print(f"[install] {name} ({where}): {time.monotonic() - started:.0f} s of its {budget_sec:.0f} s budget",
              file=sys.stderr)


class SandboxInstall(ABC):
    """Something an agent needs inside the sandbox, installed from the registries only and kept
    in ``sandbox_dir`` (away from the task's own Python and packages)."""

    name: str
    """Short name, used in image tags and cache dir names."""
    sandbox_dir: str
    """Where it lives inside the sandbox."""

    @abstractmethod
    def docker_script(self) -> str:
        """POSIX shell run as root in a ``RUN`` step ``FROM`` the task's image, with the host's
        network: installs into ``sandbox_dir``."""

    @abstractmethod
    def host_dir(self) -> Path:
        """A host directory bound read-only at ``sandbox_dir`` in a bubblewrap sandbox (which shares
        the host's /usr): built on first use, reused after. Blocking; safe across processes."""

    def check_host(self) -> None:
        """Raise RuntimeError (one line) when this host cannot build :meth:`host_dir`, so a run
        says so before its first trial."""


async def check_installed(environment, name: str, launcher: str, environments: str) -> None:
    """An agent's ``install()``: raise RuntimeError (one line) unless its launcher is in the
    sandbox, i.e. the environment was started with the agent's install (`environments`: slime-harbor's
    environments that provide it)."""
    done = await environment.exec(f"test -x {launcher}", user="root")
    if done.return_code != 0:
        raise RuntimeError(
            f"{name} is not installed in this sandbox ({launcher} is missing): start the environment with "
            f"agent_installs={name} (--ek agent_installs={name}; slime-harbor's rollout passes it), on "
            f"slime-harbor's {environments} environment"
        )


def resolve_installs(spec: str | list[str] | tuple[str, ...] | None) -> list[SandboxInstall]:
    """The installs an ``agent_installs`` kwarg names: a name, ``module:attr``, a comma-separated
    string of those, or a list. Raises ValueError with one line for an unknown one."""
    if not spec:
        return []
    names = [n.strip() for n in spec.split(",")] if isinstance(spec, str) else list(spec)
    from slime_harbor.installed_agents.recipes import RECIPES

    installs = []
    for name in filter(None, names):
        if name in RECIPES:
            installs.append(RECIPES[name].install)
            continue
        path = name
        if ":" not in path:
            raise ValueError(f"unknown agent install {name!r}: use one of {sorted(RECIPES)} or module:attr")
        module, _, attr = path.partition(":")
        try:
            install = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"agent install {name!r} cannot be imported: {exc}") from None
        if not isinstance(install, SandboxInstall):
            raise ValueError(f"agent install {name!r} is not a SandboxInstall")
        installs.append(install)
    return installs


def environment_kwargs(agent_config) -> dict[str, list[str]]:
    """The environment kwargs a trial of this agent needs (``{}`` for agents without installs): a
    Harbor ``AgentConfig`` whose class has a ``SANDBOX_INSTALLS`` attribute (a list of names)."""
    from harbor.agents.factory import AgentFactory

    try:
        agent_class = AgentFactory.get_agent_class_from_config(agent_config)
    except Exception:  # unknown agents are reported by the agent check, not here
        return {}
    installs = list(getattr(agent_class, "SANDBOX_INSTALLS", ()))
    return {ENVIRONMENT_KWARG: installs} if installs else {}
