"""Harbor's ``claude-code`` and ``codex`` agents with installs that need only Debian and npm.

Harbor's own installs fetch from elsewhere: Claude Code's from its vendor's bootstrap script,
Codex's Node from nvm. Both CLIs are on npm with their native binaries as optional dependencies
(``@anthropic-ai/claude-code-linux-x64``, ``@openai/codex-linux-x64``), so the sandbox installs
them before the trial starts (see :mod:`slime_harbor.installed_agents`): in a Docker image layer
``FROM`` the task's image, Debian's ``nodejs`` and ``npm`` when the image has no npm, then ``npm
install -g --prefix /opt/slime-harbor/<name> <package>@<pinned version>``. The agents' commands
add only ``/opt/slime-harbor/<name>/bin`` to PATH. Claude Code's ``claude`` is the native binary
(Node is needed only to install it; its ``engines`` asks for Node 22, Debian bookworm's 18 installs
it); Codex's ``codex`` is a Node launcher of its native binary.

The bubblewrap sandbox has no install for them (it shares the host's /usr, and a host without
npm cannot build one): ``--env docker``.

Use them like Harbor's classes, plus ``step_limit``::

    AgentConfig(import_path="slime_harbor.installed_agents.npm_agents:ClaudeCode", kwargs={"step_limit": 8},
                env={"ANTHROPIC_BASE_URL": <session root>, "ANTHROPIC_API_KEY": <session>})
    AgentConfig(import_path="slime_harbor.installed_agents.npm_agents:Codex", kwargs={"step_limit": 8},
                env={"OPENAI_BASE_URL": <session>/v1, "OPENAI_API_KEY": <session>})

Step limits: Claude Code's is its own ``--max-turns``; an episode that ends there (its result
event ``error_max_turns``) is verified and scored, truncated. Codex has no turn limit, so the
recording gateway enforces ours (``GATEWAY_STEP_LIMIT``): the call after ``step_limit`` model
calls is refused with a 400 whose code is ``step_limit_reached``, Codex ends its turn with that
error, and the episode is verified and scored, truncated. ``agent_result.metadata["exit_status"]``
says ``step_limit`` in both cases.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from harbor.agents.installed.base import NonZeroAgentExitCodeError
from harbor.agents.installed.claude_code import ClaudeCode as HarborClaudeCode
from harbor.agents.installed.codex import Codex as HarborCodex
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext

from slime_harbor.gateway.session import STEP_LIMIT_CODE
from slime_harbor.installed_agents import SandboxInstall, check_installed

CLAUDE_CODE_VERSION = "2.1.330"
CODEX_VERSION = "0.169.0"


class NpmInstall(SandboxInstall):
    """An npm package installed with its own prefix under /opt/slime-harbor/<name>, with Debian's
    nodejs and npm in the image when it has no npm."""

    def __init__(self, name: str, package: str, version: str, binary: str):
        self.name, self.package, self.version, self.binary = name, package, version, binary
        self.sandbox_dir = f"/opt/slime-harbor/{name}"

    @property
    def launcher(self) -> str:
        return f"{self.sandbox_dir}/bin/{self.binary}"

    def docker_script(self) -> str:
        spec = shlex.quote(f"{self.package}@{self.version}")
        return f"""set -eu
if ! command -v npm >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq --no-install-recommends nodejs npm ca-certificates >/dev/null
    rm -rf /var/lib/apt/lists/*
  elif command -v apk >/dev/null 2>&1; then
    apk add --no-cache -q nodejs npm
  else
    echo "{self.name} needs nodejs and npm: the image has neither apt-get nor apk" >&2
    exit 1
  fi
fi
echo "{self.name}: npm $(npm --version), node $(node --version)"
# npm trusts its own CA list; the image's trust store (with a cluster's TLS proxy CA) is the one.
if [ -s /etc/ssl/certs/ca-certificates.crt ]; then export npm_config_cafile=/etc/ssl/certs/ca-certificates.crt; fi
npm install -g --prefix {self.sandbox_dir} --no-fund --no-audit --no-update-notifier --loglevel=error {spec}
rm -rf /root/.npm
{self.launcher} --version
"""

    def host_dir(self) -> Path:
        raise RuntimeError(f"{self.name} has no bubblewrap install: run it with --env docker")

    def check_host(self) -> None:
        self.host_dir()


CLAUDE_CODE_INSTALL = NpmInstall("claude-code", "@anthropic-ai/claude-code", CLAUDE_CODE_VERSION, "claude")
CODEX_INSTALL = NpmInstall("codex", "@openai/codex", CODEX_VERSION, "codex")


def _check_step_limit(step_limit: Any) -> None:
    if isinstance(step_limit, bool) or not isinstance(step_limit, int) or step_limit < 1:
        raise ValueError(f"Invalid value for 'step_limit': expected an int >= 1, got {step_limit!r}")


def _json_events(path: Path) -> list[dict[str, Any]]:
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


class _SandboxInstalled:
    """What both agents share: the install is the sandbox's, the launcher dir goes first on PATH,
    and an episode ended at its step limit is scored, not failed."""

    INSTALL: NpmInstall

    def get_version_command(self) -> str | None:
        return None  # pinned

    async def install(self, environment: BaseEnvironment) -> None:
        await check_installed(environment, self.INSTALL.name, self.INSTALL.launcher, "docker")

    async def exec_as_agent(self, environment: BaseEnvironment, command: str, env: dict[str, str] | None = None,
                            cwd: str | None = None, timeout_sec: int | None = None) -> Any:  # fmt: skip
        command = f'export PATH={self.INSTALL.sandbox_dir}/bin:"$PATH"; {command}'
        return await super().exec_as_agent(environment, command, env=env, cwd=cwd, timeout_sec=timeout_sec)

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        try:
            await super().run(instruction, environment, context)
        except NonZeroAgentExitCodeError:
            if self.exit_status() != "step_limit":
                raise
            self.logger.info(f"{self.INSTALL.name} stopped at its step limit")

    def populate_context_post_run(self, context: AgentContext) -> None:
        super().populate_context_post_run(context)
        status = self.exit_status()
        if status is not None:
            context.metadata = {**(context.metadata or {}), "exit_status": status}

    def exit_status(self) -> str | None:
        raise NotImplementedError


class ClaudeCode(_SandboxInstalled, HarborClaudeCode):
    """Harbor's claude-code, installed by the sandbox from npm, ``step_limit`` as ``--max-turns``."""

    INSTALL = CLAUDE_CODE_INSTALL
    SANDBOX_INSTALLS = (CLAUDE_CODE_INSTALL.name,)
    GATEWAY_PROVIDER = "anthropic"

    def __init__(self, *args: Any, step_limit: int | None = None, version: str | None = None, **kwargs: Any):
        if version not in (None, CLAUDE_CODE_VERSION):
            raise ValueError(f"this claude-code install is pinned to {CLAUDE_CODE_VERSION}, got version={version!r}")
        if step_limit is not None:
            _check_step_limit(step_limit)
            kwargs["max_turns"] = step_limit
        super().__init__(*args, version=CLAUDE_CODE_VERSION, **kwargs)

    def exit_status(self) -> str | None:
        """From the last ``result`` event of Claude Code's stream-json output."""
        results = [e for e in _json_events(self.logs_dir / "claude-code.txt") if e.get("type") == "result"]
        if not results:
            return None
        subtype = str(results[-1].get("subtype") or "")
        if subtype == "error_max_turns":
            return "step_limit"
        return "submitted" if subtype == "success" and not results[-1].get("is_error") else None


class Codex(_SandboxInstalled, HarborCodex):
    """Harbor's codex, installed by the sandbox from npm; its step limit is the gateway's."""

    INSTALL = CODEX_INSTALL
    SANDBOX_INSTALLS = (CODEX_INSTALL.name,)
    GATEWAY_PROVIDER = "openai"
    GATEWAY_STEP_LIMIT = True
    """Codex has no turn limit of its own: the gateway refuses the call after step_limit."""

    def __init__(self, *args: Any, step_limit: int | None = None, version: str | None = None, **kwargs: Any):
        if version not in (None, CODEX_VERSION):
            raise ValueError(f"this codex install is pinned to {CODEX_VERSION}, got version={version!r}")
        if step_limit is not None:
            _check_step_limit(step_limit)
        self.step_limit = step_limit  # enforced by the gateway session (rollout reads GATEWAY_STEP_LIMIT)
        super().__init__(*args, version=CODEX_VERSION, **kwargs)

    def exit_status(self) -> str | None:
        """From Codex's --json events: the gateway's step-limit refusal in a turn.failed / error
        event (Codex writes those itself from the HTTP error; the model's text and command output
        are inside item events, so a policy cannot forge one), else how the turn ended."""
        events = _json_events(self.logs_dir / self._OUTPUT_FILENAME)
        for event in events:
            if event.get("type") in ("turn.failed", "error") and STEP_LIMIT_CODE in json.dumps(event):
                return "step_limit"
        if any(e.get("type") == "turn.completed" for e in events):
            return "submitted"
        return None
