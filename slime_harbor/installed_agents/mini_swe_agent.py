"""Harbor's mini-swe-agent with an install that needs only PyPI (and Debian, for an image whose
Python is older than 3.10).

Harbor's own install (``harbor.agents.installed.mini_swe_agent``) runs ``curl astral.sh | sh`` for
uv and ``uv python install 3.12`` (a Python build from GitHub) inside the sandbox, which fails on a
no-network task, here, and on many clusters. This one is installed by the sandbox before the trial
starts (see :mod:`slime_harbor.installed_agents`), into ``/opt/slime-harbor/mini-swe-agent``:

- ``venv/``: a venv of the image's Python >= 3.10 (Debian's ``python3`` from apt when it has none;
  the host's /usr/bin/python3 in the bubblewrap sandbox) with ``mini-swe-agent==2.4.6`` from PyPI.
- ``bin/mini-swe-agent``: the only thing the agent's commands add to PATH. It starts that venv's
  Python with ``-I``, so the task's PYTHONPATH / PYTHONHOME / working directory cannot reach the
  agent's imports; the agent's bash commands run with the task's own environment and Python
  (SWE-bench's /testbed env is never touched).

Use it like Harbor's class (same kwargs, plus ``step_limit``)::

    AgentConfig(import_path="slime_harbor.installed_agents.mini_swe_agent:MiniSweAgent",
                model_name="hosted_vllm/policy", kwargs={"step_limit": 30},
                env={"OPENAI_API_BASE": ..., "HOSTED_VLLM_API_BASE": ..., "MSWEA_API_KEY": ...})
    EnvironmentConfig(import_path=..., kwargs={"agent_installs": ["mini-swe-agent"]})

How an episode ends is reported in ``agent_result.metadata["exit_status"]`` in the converter's
words: ``submitted``; ``step_limit`` when mini-swe-agent stopped at its own step limit
(``LimitsExceeded``), its format-error limit (``RepeatedFormatError``) or its time limit;
``context_limit`` when the prompt outgrew the model's context; ``aborted`` when the model
endpoint could not be reached. mini-swe-agent's own status stays in ``agent_exit_status``.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import yaml
from harbor.agents.installed.base import NonZeroAgentExitCodeError
from harbor.agents.installed.mini_swe_agent import MiniSweAgent as HarborMiniSweAgent
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext

from slime_harbor.installed_agents import SandboxInstall, check_installed

MINI_SWE_AGENT_VERSION = "2.4.6"
SANDBOX_DIR = "/opt/slime-harbor/mini-swe-agent"
LAUNCHER = f"{SANDBOX_DIR}/bin/mini-swe-agent"

# mini-swe-agent 2.4.6's dependencies minus `datasets`, which only its SWE-bench batch runners
# import (it brings pyarrow, pandas and numpy: half of a 700 MB venv), plus what LiteLLM imports
# on its tool-calling path without declaring it: orjson and fastapi (Harbor adds them too) and mcp
# (LiteLLM 1.106 imports its MCP handler for any request with tools). LiteLLM is pinned to the
# version this was tested with.
REQUIREMENTS = (
    "pyyaml", "requests", "jinja2", "pydantic>=2.0", "litellm==1.106.2", "tenacity",
    "rich", "python-dotenv", "typer", "platformdirs", "textual", "prompt_toolkit",
    "openai!=1.100.0,!=1.100.1", "orjson", "fastapi", "mcp",
)  # fmt: skip

# The launcher: the venv's Python, isolated (-I: no PYTHON* variables, no user site, no cwd on
# sys.path; the filter covers Pythons before 3.11, where -I still put '' there for -c).
LAUNCHER_SCRIPT = f"""#!/bin/sh
exec {SANDBOX_DIR}/venv/bin/python -I -c 'import sys
sys.path[:] = [p for p in sys.path if p]
sys.argv[0] = "mini-swe-agent"
from minisweagent.run.mini import app
app()' "$@"
"""

_PIP_INSTALL = (
    "-m pip install --no-cache-dir --disable-pip-version-check --no-input -q "
    f"--no-deps mini-swe-agent=={MINI_SWE_AGENT_VERSION}"
)
_PIP_INSTALL_REQUIREMENTS = "-m pip install --no-cache-dir --disable-pip-version-check --no-input -q " + " ".join(
    shlex.quote(r) for r in REQUIREMENTS
)

# Image build: pick the image's Python (>= 3.10, with venv and ensurepip), else install the
# distribution's; then the venv, the packages, the launcher, and a smoke run of the launcher.
DOCKER_SCRIPT = f"""set -eu
usable() {{ "$1" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; }}
py=
for candidate in /usr/bin/python3 /usr/local/bin/python3 "$(command -v python3 || true)"; do
  if [ -n "$candidate" ] && [ -x "$candidate" ] && usable "$candidate"; then py=$candidate; break; fi
done
if [ -z "$py" ]; then
  if command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq --no-install-recommends python3 python3-venv ca-certificates >/dev/null
    rm -rf /var/lib/apt/lists/*
  elif command -v apk >/dev/null 2>&1; then
    apk add --no-cache -q python3
  fi
  if usable /usr/bin/python3; then py=/usr/bin/python3; else
    echo "mini-swe-agent needs Python >= 3.10 with venv: the image has none and its distribution's python3 is older or missing" >&2
    exit 1
  fi
fi
echo "mini-swe-agent venv on $py ($("$py" --version 2>&1))"
# pip trusts its own CA bundle; the image's trust store (with a cluster's TLS proxy CA) is the one.
if [ -z "${{PIP_CERT:-}}${{REQUESTS_CA_BUNDLE:-}}" ] && [ -s /etc/ssl/certs/ca-certificates.crt ]; then
  export PIP_CERT=/etc/ssl/certs/ca-certificates.crt
fi
"$py" -m venv {SANDBOX_DIR}/venv
{SANDBOX_DIR}/venv/bin/python {_PIP_INSTALL}
{SANDBOX_DIR}/venv/bin/python {_PIP_INSTALL_REQUIREMENTS}
mkdir -p {SANDBOX_DIR}/bin
cat > {LAUNCHER} <<'LAUNCHER_EOF'
{LAUNCHER_SCRIPT}LAUNCHER_EOF
chmod 755 {LAUNCHER}
MSWEA_CONFIGURED=true LITELLM_LOCAL_MODEL_COST_MAP=True {LAUNCHER} --help >/dev/null
"""

# mini-swe-agent's exit status -> the converter's (TRUNCATING_EXITS, "aborted" = transient).
_EXIT_STATUS = {
    "Submitted": "submitted",
    "LimitsExceeded": "step_limit",
    "RepeatedFormatError": "step_limit",
    "TimeExceeded": "step_limit",
    "ContextWindowExceededError": "context_limit",
    # LiteLLM's names for an endpoint it could not reach after mini-swe-agent's retries.
    "APIConnectionError": "aborted",
    "ServiceUnavailableError": "aborted",
    "InternalServerError": "aborted",
    "Timeout": "aborted",
}
_SCORED_EXITS = ("step_limit", "context_limit")


class MiniSweAgentInstall(SandboxInstall):
    name = "mini-swe-agent"
    sandbox_dir = SANDBOX_DIR

    def docker_script(self) -> str:
        return DOCKER_SCRIPT

    def host_dir(self) -> Path:
        return ensure_host_install(*_host_install_key())

    def check_host(self) -> None:
        host_python()


SANDBOX_INSTALL = MiniSweAgentInstall()

_HOST_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")
host_builds = 0
"""Host venvs this process built (tests check that a second trial builds none)."""


@functools.cache
def _host_install_key() -> tuple[str, str]:
    """(host Python, key of the install built with it): the Python's version and the recipe."""
    python = host_python()
    version = subprocess.run([python, "-c", "import sys; print(sys.version)"], capture_output=True, text=True,
                             check=True).stdout.strip()  # fmt: skip
    recipe = "\n".join((python, version, _PIP_INSTALL, _PIP_INSTALL_REQUIREMENTS, LAUNCHER_SCRIPT))
    return python, hashlib.sha256(recipe.encode()).hexdigest()[:16]


def host_python() -> str:
    """A host Python >= 3.10 with venv whose files a bubblewrap sandbox sees (it binds the host's
    /usr, /bin and /lib*, not /root or /opt): /usr/bin/python3, else /usr/local/bin/python3."""
    check = "import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 10))"
    for candidate in _HOST_PYTHONS:
        if os.access(candidate, os.X_OK) and subprocess.run([candidate, "-c", check],
                                                            capture_output=True).returncode == 0:  # fmt: skip
            return candidate
    raise RuntimeError(
        f"mini-swe-agent in the bubblewrap sandbox needs a Python >= 3.10 with venv at one of {_HOST_PYTHONS} "
        "(e.g. apt-get install python3 python3-venv)"
    )


def ensure_host_install(python: str, key: str) -> Path:
    """The host directory holding the venv and launcher, built once per key (across processes:
    a lock file, a build into a temporary dir renamed into place)."""
    global host_builds
    from slime_harbor.policy.tiny_model import cache_dir

    root = cache_dir() / "agent-installs" / f"mini-swe-agent-{MINI_SWE_AGENT_VERSION}-{key}"
    if (root / "bin" / "mini-swe-agent").exists():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f"{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (root / "bin" / "mini-swe-agent").exists():  # built by another process while we waited
            return root
        staging = root.parent / f".{root.name}.{uuid.uuid4().hex[:8]}"
        started = time.monotonic()
        try:
            _run_build([python, "-m", "venv", str(staging / "venv")])
            venv_python = str(staging / "venv" / "bin" / "python")
            _run_build([venv_python, *shlex.split(_PIP_INSTALL)])
            _run_build([venv_python, *shlex.split(_PIP_INSTALL_REQUIREMENTS)])
            launcher = staging / "bin" / "mini-swe-agent"
            launcher.parent.mkdir()
            launcher.write_text(LAUNCHER_SCRIPT)
            launcher.chmod(0o755)
            (staging / "build.json").write_text(json.dumps(
                {"python": python, "seconds": round(time.monotonic() - started, 1), "version": MINI_SWE_AGENT_VERSION}
            ))  # fmt: skip
            shutil.rmtree(root, ignore_errors=True)  # a half-built dir from a killed build
            staging.rename(root)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        host_builds += 1
    return root


def _run_build(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        output = (done.stdout + done.stderr).strip()
        raise RuntimeError(f"installing mini-swe-agent failed ({' '.join(argv[:4])} ...): {output[-2000:]}")


class MiniSweAgent(HarborMiniSweAgent):
    """Harbor's mini-swe-agent, installed by the sandbox from the registries (see the module
    docstring), with ``step_limit`` mapped onto mini-swe-agent's ``agent.step_limit`` (model calls,
    format errors included) and exits reported in the converter's words."""

    SANDBOX_INSTALLS = (SANDBOX_INSTALL.name,)
    """What the environment must install (``slime_harbor.installed_agents.environment_kwargs``)."""

    def __init__(
        self,
        *args: Any,
        step_limit: int | None = None,
        config: dict[str, Any] | None = None,
        config_file: str | None = None,
        version: str | None = None,
        **kwargs: Any,
    ) -> None:
        if version not in (None, MINI_SWE_AGENT_VERSION):
            raise ValueError(
                f"this mini-swe-agent install is pinned to {MINI_SWE_AGENT_VERSION}, got version={version!r}"
            )
        if step_limit is not None:
            if isinstance(step_limit, bool) or not isinstance(step_limit, int) or step_limit < 1:
                raise ValueError(f"Invalid value for 'step_limit': expected an int >= 1, got {step_limit!r}")
            if config is not None and config_file is not None:
                raise ValueError("'config' and 'config_file' are mutually exclusive")
            # Harbor writes `config` to a YAML file passed after `-c mini`; mini-swe-agent merges it.
            if config is not None:
                base = dict(config)
            else:
                base = yaml.safe_load(Path(config_file).read_text()) if config_file else {}
            if not isinstance(base, dict):
                raise ValueError(f"Invalid value for 'config_file': {config_file} is not a YAML mapping")
            config = {**base, "agent": {**(base.get("agent") or {}), "step_limit": step_limit}}
            config_file = None
        super().__init__(*args, config=config, config_file=config_file, version=MINI_SWE_AGENT_VERSION, **kwargs)

    def get_version_command(self) -> str | None:
        return None  # pinned: Harbor's command asks uv

    async def install(self, environment: BaseEnvironment) -> None:
        await check_installed(environment, "mini-swe-agent", LAUNCHER, "docker or local")

    async def exec_as_agent(self, environment: BaseEnvironment, command: str, env: dict[str, str] | None = None,
                            cwd: str | None = None, timeout_sec: int | None = None) -> Any:  # fmt: skip
        # Harbor's run() calls `mini-swe-agent` from PATH. Only the launcher's dir is added, so the
        # agent's commands still find the task's python first. LiteLLM fetches its cost map from
        # the internet at import unless told to use its bundled copy.
        env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", **(env or {})}
        command = f'export PATH={SANDBOX_DIR}/bin:"$PATH"; {command}'
        return await super().exec_as_agent(environment, command, env=env, cwd=cwd, timeout_sec=timeout_sec)

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        try:
            await super().run(instruction, environment, context)
        except NonZeroAgentExitCodeError:
            # mini-swe-agent re-raises a context-window error after saving its trajectory: the
            # episode ended at a limit and is verified and scored (truncated), not failed.
            if self._exit_status()[0] not in _SCORED_EXITS:
                raise
            self.logger.info(f"mini-swe-agent stopped at a limit: {self._exit_status()[1]}")

    def populate_context_post_run(self, context: AgentContext) -> None:
        super().populate_context_post_run(context)
        exit_status, agent_exit_status, api_calls = self._exit_status()
        if agent_exit_status is None:
            return
        context.metadata = {
            **(context.metadata or {}),
            "exit_status": exit_status,
            "agent_exit_status": agent_exit_status,
            "turns": api_calls,
        }

    def _exit_status(self) -> tuple[str | None, str | None, int | None]:
        """(converter exit status, mini-swe-agent's exit status, model calls) from the trajectory
        mini-swe-agent saved in the agent logs dir; Nones when it saved none."""
        try:
            info = json.loads((self.logs_dir / "mini-swe-agent.trajectory.json").read_text()).get("info") or {}
        except (OSError, ValueError):
            return None, None, None
        raw = str(info.get("exit_status") or "")
        calls = (info.get("model_stats") or {}).get("api_calls")
        return _EXIT_STATUS.get(raw, raw or None), raw or None, calls
