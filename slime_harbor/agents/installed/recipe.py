"""How a recipe becomes an agent: :class:`AgentRecipe`, the data one agent is declared as, and
:class:`RecipeAgent`, what every recipe's class adds to Harbor's.

Harbor's own ``install()`` of these agents fetches from outside the registries (a vendor's
bootstrap script, nvm's Node, uv's Python builds) inside the sandbox, which fails on a
no-network task. Here the sandbox installs the recipe's package before the trial starts
(:mod:`slime_harbor.agents.installed.installs`) and the agent runs as Harbor's class with three
changes (:class:`RecipeAgent`): ``install()`` only checks the launcher is there, the agent's
commands find the launcher first on PATH, and ``step_limit`` becomes the agent's own limit
(``step_limit_kwarg``) or, for an agent without one, the gateway's (the call after ``step_limit``
model calls is refused with a 400 whose code is ``step_limit_reached``; the episode is verified
and scored, truncated). The recipes themselves, one per agent, are in catalog.py.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import os
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harbor.agents.installed.base import NonZeroAgentExitCodeError
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext

from slime_harbor.episode import TRUNCATING_EXITS
from slime_harbor.agents.installed.installs import PypiInstall, SandboxInstall, check_installed

CATALOG_MODULE = "slime_harbor.agents.installed.catalog"
"""Where the recipes are, and their classes (``CATALOG_MODULE:<Harbor's class name>``, built on first import)."""
DIALECTS = ("chat", "anthropic", "responses", "gemini")
"""The gateway's wire formats: OpenAI chat completions, Anthropic Messages, OpenAI Responses,
Gemini generateContent."""


@dataclasses.dataclass(frozen=True)
class AgentRecipe:
    """How one of Harbor's installed agents trains here."""

    name: str
    """Harbor's agent name (``--agent NAME``)."""
    harbor_class: str
    """``module:Class`` of the Harbor class that runs it."""
    install: SandboxInstall
    """What the sandbox installs before the trial (installs.py)."""
    dialect: str
    """The wire format it speaks to the gateway (one of DIALECTS)."""
    provider: str | None = None
    """The provider prefix of its model name (``openai`` -> ``openai/<served name>``); None: LiteLLM's
    ``hosted_vllm/<served name>``."""
    model_name: str | None = None
    """Harbor's model_name where its class wants another form than ``<provider>/<served name>``,
    with ``{model}`` (the served name) filled in (cline-cli: ``openai:{model}``)."""
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    """Variables added to the endpoint's (agents/placement.installed_agent_env), with ``{url}`` (the
    session's OpenAI base URL, ending in /v1), ``{root}`` (without /v1), ``{key}`` and ``{model}``
    (the served name) filled in."""
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Fixed kwargs of Harbor's class (a user's --agent-kwarg wins)."""
    host_env: dict[str, str] = dataclasses.field(default_factory=dict)
    """Variables Harbor's class requires in this (the rollout) process's environment rather than in
    the agent's, set here to these placeholders where absent. The agent still gets the trial's own
    values: the AgentConfig env (the endpoint's and ``env``) wins over what run() passes."""
    files: dict[str, str] = dataclasses.field(default_factory=dict)
    """Files written in the sandbox, as the agent's user, before Harbor's run() starts the agent:
    sandbox path -> content (the agent's own config where Harbor's class writes none)."""
    setup: str = ""
    """A shell command run in the sandbox as the agent's user, after ``files`` and before Harbor's
    run() starts the agent, with the agent's environment (the endpoint's variables): for a config
    that must name the trial's own session, which only the environment knows."""
    step_limit_kwarg: str | None = None
    """The Harbor kwarg that takes ``step_limit`` (the agent's own turn limit; with set_step_limit,
    where that puts it); None: the gateway enforces it."""
    set_step_limit: Callable[[dict[str, Any], int], dict[str, Any]] | None = None
    """For a limit that is not one kwarg: (kwargs, step_limit) -> kwargs."""
    exit_status: Callable[[Path], dict[str, Any] | None] | None = None
    """Reads the agent's logs dir after the run: metadata with ``exit_status`` in the converter's
    words (``submitted``, ``step_limit``, ``context_exceeded``, ``aborted``), or None. Where it is None
    the gateway's record says how the episode ended."""
    side_calls: str = "none seen"
    """Which of its calls are side calls (titles, checks, token counts) and how they are told apart."""
    notes: str = ""
    """What the gateway had to learn for it, what its trials show."""
    verified_by: str = ""
    """The test that runs a real trial of it through the gateway (empty: not verified)."""
    sends_key: bool = True
    """Whether it sends the key it is handed (False: it cannot run where the gateway takes only its
    trial's key, run_config.gateway_keys_on; notes say why)."""

    @property
    def class_name(self) -> str:
        return self.harbor_class.rpartition(":")[2]

    @property
    def import_path(self) -> str:
        return f"{CATALOG_MODULE}:{self.class_name}"

    @property
    def gateway_step_limit(self) -> bool:
        return self.step_limit_kwarg is None


class RecipeAgent:
    """What every recipe's class adds to Harbor's (it comes first in the MRO)."""

    RECIPE: AgentRecipe

    def __init__(self, *args: Any, step_limit: int | None = None, version: str | None = None, **kwargs: Any):
        recipe = self.RECIPE
        if version not in (None, recipe.install.version):
            raise ValueError(f"this {recipe.name} install is pinned to {recipe.install.version}, got version={version!r}")
        kwargs = {**recipe.kwargs, **kwargs}
        if recipe.model_name and kwargs.get("model_name"):
            kwargs["model_name"] = recipe.model_name.format(model=kwargs["model_name"].partition("/")[2])
        if step_limit is not None:
            if isinstance(step_limit, bool) or not isinstance(step_limit, int) or step_limit < 1:
                raise ValueError(f"Invalid value for 'step_limit': expected an int >= 1, got {step_limit!r}")
            if recipe.set_step_limit:
                kwargs = recipe.set_step_limit(kwargs, step_limit)
            elif recipe.step_limit_kwarg:
                kwargs[recipe.step_limit_kwarg] = step_limit
        self.step_limit = step_limit  # the gateway's, where the recipe maps it to no kwarg (rollout reads it)
        super().__init__(*args, version=recipe.install.version, **kwargs)

    def get_version_command(self) -> str | None:
        return None  # pinned by the recipe

    async def install(self, environment: BaseEnvironment) -> None:
        await check_installed(environment, self.RECIPE.name, self.RECIPE.install.launcher, _environments(self.RECIPE))

    async def exec_as_agent(self, environment: BaseEnvironment, command: str, env: dict[str, str] | None = None,
                            cwd: str | None = None, timeout_sec: int | None = None) -> Any:  # fmt: skip
        # Harbor's run() calls the agent by name: only the launcher's dir goes first on PATH, so the
        # agent's own commands still find the task's python and node.
        command = f'export PATH={self.RECIPE.install.sandbox_dir}/bin:"$PATH"; {command}'
        return await super().exec_as_agent(environment, command, env=env, cwd=cwd, timeout_sec=timeout_sec)

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        for name, placeholder in self.RECIPE.host_env.items():
            os.environ.setdefault(name, placeholder)
        if self.RECIPE.files:
            await self.exec_as_agent(environment, write_files_command(self.RECIPE.files), timeout_sec=30)
        if self.RECIPE.setup:
            await self.exec_as_agent(environment, self.RECIPE.setup, timeout_sec=30)
        try:
            await super().run(instruction, environment, context)
        except NonZeroAgentExitCodeError:
            # An agent that exits non-zero at its own limit (mini-swe-agent re-raises a context
            # error, Claude Code at --max-turns): the episode is verified and scored, not failed.
            if (self.exit_metadata() or {}).get("exit_status") not in TRUNCATING_EXITS:
                raise
            self.logger.info(f"{self.RECIPE.name} stopped at a limit: {self.exit_metadata()}")

    def populate_context_post_run(self, context: AgentContext) -> None:
        super().populate_context_post_run(context)
        metadata = self.exit_metadata()
        if metadata:
            context.metadata = {**(context.metadata or {}), **metadata}

    def exit_metadata(self) -> dict[str, Any] | None:
        return self.RECIPE.exit_status(self.logs_dir) if self.RECIPE.exit_status else None


def write_files_command(files: dict[str, str]) -> str:
    """A shell command that writes each file (its directory made first)."""
    return " && ".join(f"mkdir -p {shlex.quote(str(Path(path).parent))} && printf %s {shlex.quote(content)} > "
                       f"{shlex.quote(path)}" for path, content in files.items())


def _environments(recipe: AgentRecipe) -> str:
    return "docker or local" if isinstance(recipe.install, PypiInstall) else "docker"


def recipe_class(recipe: AgentRecipe) -> type:
    """The agent class of a recipe: Harbor's class with :class:`RecipeAgent` first."""
    module, _, name = recipe.harbor_class.partition(":")
    harbor_class = getattr(importlib.import_module(module), name)
    return type(recipe.class_name, (RecipeAgent, harbor_class), {
        "RECIPE": recipe,
        "SANDBOX_INSTALLS": (recipe.install.name,),
        "GATEWAY_STEP_LIMIT": recipe.gateway_step_limit,
        "__module__": CATALOG_MODULE,
        "__qualname__": recipe.class_name,
        "__doc__": f"Harbor's {recipe.name}, installed by the sandbox from {recipe.install.name!r}'s registry "
                   f"({recipe.install.package} {recipe.install.version}); see slime_harbor.agents.installed.catalog.",
    })


# ---- reading an agent's logs (each recipe's exit reader uses it) ---------------------------------------------------------------------------------


def json_events(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines log (other lines skipped); [] when it is missing."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    events = []
    for line in lines:
        if line.startswith("{"):
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                events.append(event)
    return events
