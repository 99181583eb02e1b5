"""Harbor's installed agents, declared as data: one :class:`AgentRecipe` per agent says which
Harbor class runs it, what the sandbox installs from which registry, the wire format it speaks to
the gateway, how its endpoint and step limit reach it and how its exits show (the mechanism is
recipe.py). Each agent's section holds all of it: its exit reader and config snippets, then its
recipe.

The class of a recipe is ``slime_harbor.agents.installed.catalog:<Harbor's class name>``, built on
first import. Adding an agent is adding a section; for example, Harbor's ``opencode``::

    OPENCODE = AgentRecipe(
        name="opencode",                                   # Harbor's agent name: --agent opencode
        harbor_class="harbor.agents.installed.opencode:OpenCode",
        install=NpmInstall("opencode", "opencode-ai", "1.18.33", "opencode"),
        dialect="responses",                               # chat | anthropic | responses | gemini
        provider="openai",                                 # model_name is openai/<served name>
    )

and naming it in RECIPES. ``docs/gateway.md``'s agent table is generated from these recipes
(``python scripts/agent_table.py``; a test checks it is current).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import shlex
from pathlib import Path
from typing import Any

from slime_harbor.episode import CONTEXT_EXCEEDED
from slime_harbor.gateway.session import STEP_LIMIT_CODE
from slime_harbor.agents.installed.installs import SANDBOX_ROOT, NpmInstall, PypiInstall, SandboxInstall
from slime_harbor.agents.installed.recipe import AgentRecipe, json_events, recipe_class


# ---- mini-swe-agent ---------------------------------------------------------------------------

# mini-swe-agent's exit status -> the converter's (TRUNCATING_EXITS, "aborted" = transient).
MINI_SWE_AGENT_EXITS = {
    "Submitted": "submitted",
    "LimitsExceeded": "step_limit",
    "RepeatedFormatError": "step_limit",
    "TimeExceeded": "step_limit",
    "ContextWindowExceededError": CONTEXT_EXCEEDED,
    # LiteLLM's names for an endpoint it could not reach after mini-swe-agent's retries.
    "APIConnectionError": "aborted",
    "ServiceUnavailableError": "aborted",
    "InternalServerError": "aborted",
    "Timeout": "aborted",
}


def mini_swe_agent_exit(logs_dir: Path) -> dict[str, Any] | None:
    """From the trajectory mini-swe-agent saved: its own status kept as ``agent_exit_status``, its
    model calls as ``turns``."""
    try:
        info = json.loads((logs_dir / "mini-swe-agent.trajectory.json").read_text()).get("info") or {}
    except (OSError, ValueError):
        return None
    raw = str(info.get("exit_status") or "")
    if not raw:
        return None
    return {"exit_status": MINI_SWE_AGENT_EXITS.get(raw, raw), "agent_exit_status": raw,
            "turns": (info.get("model_stats") or {}).get("api_calls")}


def mini_swe_agent_step_limit(kwargs: dict[str, Any], step_limit: int) -> dict[str, Any]:
    """mini-swe-agent's ``agent.step_limit`` (model calls, format errors included), merged into the
    config Harbor writes to a YAML file passed after ``-c mini``."""
    import yaml

    config, config_file = kwargs.get("config"), kwargs.get("config_file")
    if config is not None and config_file is not None:
        raise ValueError("'config' and 'config_file' are mutually exclusive")
    base = dict(config) if config is not None else (yaml.safe_load(Path(config_file).read_text()) if config_file else {})
    if not isinstance(base, dict):
        raise ValueError(f"Invalid value for 'config_file': {config_file} is not a YAML mapping")
    config = {**base, "agent": {**(base.get("agent") or {}), "step_limit": step_limit}}
    return {**kwargs, "config": config, "config_file": None}


# ---- the recipes ------------------------------------------------------------------------------------

# mini-swe-agent 2.4.6's dependencies minus `datasets`, which only its SWE-bench batch runners
# import (it brings pyarrow, pandas and numpy: half of a 700 MB venv), plus what LiteLLM imports
# on its tool-calling path without declaring it: orjson and fastapi (Harbor adds them too) and mcp
# (LiteLLM 1.106 imports its MCP handler for any request with tools). LiteLLM is pinned to the
# version this was tested with.
MINI_SWE_AGENT_REQUIREMENTS = (
    "pyyaml", "requests", "jinja2", "pydantic>=2.0", "litellm==1.106.2", "tenacity",
    "rich", "python-dotenv", "typer", "platformdirs", "textual", "prompt_toolkit",
    "openai!=1.100.0,!=1.100.1", "orjson", "fastapi", "mcp",
)  # fmt: skip


MINI_SWE_AGENT = AgentRecipe(
    name="mini-swe-agent", harbor_class="harbor.agents.installed.mini_swe_agent:MiniSweAgent",
    install=PypiInstall("mini-swe-agent", "mini-swe-agent", "2.4.6", "mini-swe-agent",
                        entry="minisweagent.run.mini:app", requirements=MINI_SWE_AGENT_REQUIREMENTS, no_deps=True),
    dialect="chat", env={"LITELLM_LOCAL_MODEL_COST_MAP": "True"},
    step_limit_kwarg="config: agent.step_limit", set_step_limit=mini_swe_agent_step_limit,
    exit_status=mini_swe_agent_exit,
    notes="tool calls through LiteLLM; retries a failed call up to 10 times",
    verified_by="tests/test_mini_swe_agent.py",
)


# ---- claude-code ------------------------------------------------------------------------------

def claude_code_exit(logs_dir: Path) -> dict[str, Any] | None:
    """From the last ``result`` event of Claude Code's stream-json output."""
    results = [e for e in json_events(logs_dir / "claude-code.txt") if e.get("type") == "result"]
    if not results:
        return None
    subtype = str(results[-1].get("subtype") or "")
    if subtype == "error_max_turns":
        return {"exit_status": "step_limit"}
    if subtype == "success" and not results[-1].get("is_error"):
        return {"exit_status": "submitted"}
    return None


CLAUDE_CODE = AgentRecipe(
    name="claude-code", harbor_class="harbor.agents.installed.claude_code:ClaudeCode",
    install=NpmInstall("claude-code", "@anthropic-ai/claude-code", "2.1.330", "claude"),
    dialect="anthropic", provider="anthropic", step_limit_kwarg="max_turns", exit_status=claude_code_exit,
    side_calls="titles and command checks go to /v1/messages without the agent's tools; "
               "/v1/messages/count_tokens is counted, not sampled",
    notes="system as cached text blocks; HEAD / and GET /v1/models probes",
    verified_by="tests/test_installed_agents.py",
)


# ---- codex ------------------------------------------------------------------------------------

def codex_exit(logs_dir: Path) -> dict[str, Any] | None:
    """From Codex's --json events: the gateway's step-limit refusal in a turn.failed / error event
    (Codex writes those itself from the HTTP error; the model's text and command output are inside
    item events, so a policy cannot forge one), else how the turn ended."""
    events = json_events(logs_dir / "codex.txt")
    for event in events:
        if event.get("type") in ("turn.failed", "error") and STEP_LIMIT_CODE in json.dumps(event):
            return {"exit_status": "step_limit"}
    if any(e.get("type") == "turn.completed" for e in events):
        return {"exit_status": "submitted"}
    return None


CODEX = AgentRecipe(
    name="codex", harbor_class="harbor.agents.installed.codex:Codex",
    install=NpmInstall("codex", "@openai/codex", "0.169.0", "codex"),
    dialect="responses", provider="openai", exit_status=codex_exit,
    notes="GET /models at start; Responses input with function_call, function_call_output and reasoning items",
    verified_by="tests/test_installed_agents.py",
)


# ---- opencode ---------------------------------------------------------------------------------

def opencode_exit(logs_dir: Path) -> dict[str, Any] | None:
    """From ``opencode run --format=json`` events: the gateway's step-limit refusal in an ``error``
    event (OpenCode writes those itself from the HTTP error, with the response body; the model's
    text is inside ``text`` / ``tool_use`` events, so a policy cannot forge one), else a run whose
    steps finished without an error."""
    events = json_events(logs_dir / "opencode.txt")
    errors = [e for e in events if e.get("type") == "error"]
    if any(STEP_LIMIT_CODE in json.dumps(e.get("error")) for e in errors):
        return {"exit_status": "step_limit"}
    if not errors and any(e.get("type") == "step_finish" for e in events):
        return {"exit_status": "submitted"}
    return None


OPENCODE = AgentRecipe(
    name="opencode", harbor_class="harbor.agents.installed.opencode:OpenCode",
    install=NpmInstall("opencode", "opencode-ai", "1.18.33", "opencode"),
    # its openai provider (@ai-sdk/openai) calls /v1/responses; the base URL is Harbor's
    # provider.openai.options.baseURL in ~/.config/opencode/opencode.json, from OPENAI_BASE_URL
    dialect="responses", provider="openai",
    # no network at run time: its bundled models.dev snapshot, no update check, LSP download or share
    env={"OPENCODE_DISABLE_MODELS_FETCH": "true", "OPENCODE_DISABLE_AUTOUPDATE": "true",
         "OPENCODE_DISABLE_LSP_DOWNLOAD": "true", "OPENCODE_DISABLE_SHARE": "true"},
    exit_status=opencode_exit,
    side_calls="the session title (agent `title`, its small model gpt-5.4-nano, no tools) before the first turn",
    notes="a 400 is not retried: an error event with the response body, exit 1",
    verified_by="tests/test_installed_agents.py",
)


# ---- qwen-coder -------------------------------------------------------------------------------

QWEN_CODER = AgentRecipe(
    name="qwen-coder", harbor_class="harbor.agents.installed.qwen_code:QwenCode",
    install=NpmInstall("qwen-coder", "@qwen-code/qwen-code", "0.24.4", "qwen"),
    # --openai-base-url "$OPENAI_BASE_URL", --openai-api-key, OPENAI_MODEL = the served name (Harbor's run())
    dialect="chat", provider="openai",
    # QWEN_CODE_SIMPLE: its bare mode (the core tools, no skills list, subagents or memory): the
    # default first prompt is 33,111 tokens of the tiny model's 32,768. No usage statistics sent.
    env={"QWEN_CODE_SIMPLE": "1", "QWEN_USAGE_STATISTICS_ENABLED": "false"},
    side_calls="none seen",
    notes="a reply cut at max_tokens is asked again (same prompt: superseded), then continued with an "
          "'Output token limit hit. Resume directly' user turn; a 400 is not retried",
    verified_by="tests/test_installed_agents.py",
)


# ---- aider ------------------------------------------------------------------------------------

AIDER = AgentRecipe(
    name="aider", harbor_class="harbor.agents.installed.aider:Aider",
    # aider-chat pins every dependency itself (litellm 1.81.10, numpy, scipy, tree-sitter); Python < 3.13
    install=PypiInstall("aider", "aider-chat", "0.86.2", "aider", smoke="--version"),
    dialect="chat", provider="openai",
    # Harbor passes --model=<served name> and AIDER_API_KEY=openai=<key>; the alias makes it LiteLLM's
    # openai/<served name>, which calls OPENAI_API_BASE (the session). No update check, analytics,
    # release notes or model-warning prompts. No call outside the conversation: no commit messages
    # (auto/dirty commits off) and no chat-history summaries (its one --message run never needs one;
    # the summary would be lost at exit or replace the history of a lint reflection).
    env={"AIDER_ALIAS": "{model}:openai/{model}", "AIDER_CHECK_UPDATE": "false", "AIDER_ANALYTICS": "false",
         "AIDER_SHOW_RELEASE_NOTES": "false", "AIDER_SHOW_MODEL_WARNINGS": "false",
         "AIDER_AUTO_COMMITS": "false", "AIDER_DIRTY_COMMITS": "false",
         "AIDER_MAX_CHAT_HISTORY_TOKENS": "1000000000"},
    side_calls="none with this env: its commit messages and chat-history summaries (no tools, like every "
               "aider call, so the gateway could not tell them apart) are turned off",
    notes="edits as text (whole/diff formats), streamed, no tools; one --message turn plus up to 3 "
          "reflections (lint errors, malformed edits); a 400 is not retried. Tries to fetch LiteLLM's model "
          "list from GitHub once at start (fails fast, no network)",
    verified_by="tests/test_installed_agents.py",
)


# ---- kimi-code --------------------------------------------------------------------------------

# Kimi Code's tools that need a user (questions, plan-mode approval), the network, a schedule or
# subagents: off, in its config.toml (KIMI_CODE_HOME is Harbor's), which takes its first prompt from
# about 39k tokens of the tiny model's to 26k.
KIMI_CODE_HOME = "/logs/agent/.kimi-code"


KIMI_CODE_DISABLED_TOOLS = ("AskUserQuestion", "EnterPlanMode", "ExitPlanMode", "FetchURL", "CronCreate", "CronList",
                            "CronDelete", "Agent", "AgentSwarm")


KIMI_CODE = AgentRecipe(
    name="kimi-code", harbor_class="harbor.agents.installed.kimi_code:KimiCode",
    install=NpmInstall("kimi-code", "@moonshot-ai/kimi-code", "2.1.0", "kimi", ignore_scripts=True),
    dialect="chat", provider="openai",
    env={"KIMI_MODEL_PROVIDER_TYPE": "openai", "KIMI_MODEL_BASE_URL": "{url}", "KIMI_MODEL_API_KEY": "{key}",
         "KIMI_MODEL_MAX_CONTEXT_SIZE": "32768", "KIMI_MODEL_CAPABILITIES": "tool_use"},
    files={f"{KIMI_CODE_HOME}/config.toml": "[tools]\ndisabled = [%s]\n" % ", ".join(
        f'"{tool}"' for tool in KIMI_CODE_DISABLED_TOOLS)},
    notes="streamed chat completions with tools (no thinking: KIMI_MODEL_CAPABILITIES); a 400 is not retried and "
          "exits 1",
    verified_by="tests/test_installed_agents.py",
)


# ---- hermes -----------------------------------------------------------------------------------

HERMES_MANAGED_DIR = "/tmp/hermes-managed"


HERMES = AgentRecipe(
    name="hermes", harbor_class="harbor.agents.installed.hermes:Hermes",
    install=PypiInstall("hermes", "hermes-agent", "0.19.0", "hermes", min_python=(3, 11)),
    # --provider openai-api on a base URL that is not api.openai.com: chat completions
    dialect="chat", provider="openai", step_limit_kwarg="max_turns",
    # run() takes the openai provider only with an OPENAI_API_KEY in this process's environment.
    # The value is only a placeholder: the agent gets its session's key from the AgentConfig env.
    host_env={"OPENAI_API_KEY": "slime-harbor-placeholder"},
    # Hermes refuses a model whose window is under 64K (the gateway reports the policy's, the tiny
    # model's is 32K): a managed config (it wins over Harbor's config.yaml) declares 64K. Past the
    # policy's real window the gateway ends the episode (context_exceeded).
    env={"HERMES_MANAGED_DIR": HERMES_MANAGED_DIR},
    files={f"{HERMES_MANAGED_DIR}/config.yaml": "model:\n  context_length: 65536\n"},
    side_calls="at max_turns one summary request without tools (the gateway's side call)",
    notes="streamed chat completions with tools; probes GET /api/v1/models, /api/tags, /v1/props, /props and "
          "/version at start (404s); a 400 is not retried and exits 1",
    verified_by="tests/test_installed_agents.py",
)


# ---- code-puppy -------------------------------------------------------------------------------

CODE_PUPPY = AgentRecipe(
    name="code-puppy", harbor_class="harbor.agents.installed.code_puppy:CodePuppy",
    # its plugins and OpenAI client pinned to what it was tested with (code-puppy asks only >=)
    install=PypiInstall("code-puppy", "code-puppy", "0.0.946", "code-puppy", min_python=(3, 11), smoke="--version",
                        requirements=("code-puppy-core-plugins==0.0.100", "openai==3.57.0")),
    # Harbor writes ~/.code_puppy/extra_models.json: OPENAI_BASE_URL makes the model a custom_openai
    # endpoint (chat completions, pydantic-ai's OpenAI client) keyed by CODE_PUPPY_API_KEY
    dialect="chat", provider="openai",
    env={"NO_VERSION_UPDATE": "1"},  # no PyPI version check at start
    side_calls="none seen; its compaction summary (at 85% of the 128k context it assumes, without the "
               "agent's tools) would be one",
    notes="tools in every call, streamed with stream_options; a 400 is not retried (429/5xx are, 5 times): it "
          "prints the error, exits 0 without its usage file and Harbor's guard exits 1",
    verified_by="tests/test_installed_agents.py",
)


# ---- pi ---------------------------------------------------------------------------------------

def pi_exit(logs_dir: Path) -> dict[str, Any] | None:
    """From ``pi --mode json`` events: the stop reason of its last assistant message. Harbor's
    max-turns extension aborts the turn after the last allowed one (``aborted``, before any request
    is sent); a reply without tool calls ends the run (``stop`` / ``length``). Pi sets stopReason
    itself; the model's text is inside ``content``, so a policy cannot forge one."""
    ends = [e.get("message") or {} for e in json_events(logs_dir / "pi.txt") if e.get("type") == "message_end"]
    replies = [m for m in ends if isinstance(m, dict) and m.get("role") == "assistant"]
    if not replies:
        return None
    reason = replies[-1].get("stopReason")
    if reason == "aborted":
        return {"exit_status": "step_limit"}
    if reason in ("stop", "length"):
        return {"exit_status": "submitted"}
    return None


PI = AgentRecipe(
    name="pi", harbor_class="harbor.agents.installed.pi:Pi",
    # the legacy package name (0.74 moved it to @earendil-works); Harbor installs it with --ignore-scripts
    install=NpmInstall("pi", "@mariozechner/pi-coding-agent", "0.73.1", "pi", ignore_scripts=True),
    # OPENAI_BASE_URL makes Harbor write a models.json provider (harbor-endpoint) with model_api's wire format
    dialect="chat", provider="openai", kwargs={"model_api": "openai-completions"},
    # Harbor's max-turns extension: aborts after step_limit turns (one model call each)
    step_limit_kwarg="max_turns", exit_status=pi_exit,
    side_calls="none seen",
    notes="streams with stream_options, store: false and max_completion_tokens 16384; sends models.json's apiKey "
          "'$OPENAI_API_KEY' literally (0.73.1 reads an env var name there, Harbor writes $NAME): the session's "
          "URL names it. A call that cannot connect is retried 3 times (auto_retry)",
    verified_by="tests/test_installed_agents.py",
    sends_key=False,  # the literal '$OPENAI_API_KEY' above: a keyed gateway refuses each of its calls 403
)


# ---- cline-cli --------------------------------------------------------------------------------

# Cline's provider settings naming the session's endpoint (what `cline auth -p openai -b URL` writes):
# its run keeps a stored baseUrl and adds the -k key and -m model to it.
CLINE_PROVIDERS = ('{"version": 1, "lastUsedProvider": "openai-compatible", "modes": {}, "providers": '
                   '{"openai-compatible": {"settings": {"provider": "openai-compatible", "baseUrl": "%s"}, '
                   '"updatedAt": "2026-01-01T00:00:00.000Z", "tokenSource": "manual"}}}\\n')


CLINE_PROVIDERS_SETUP = (f'mkdir -p ~/.cline/data/settings && printf {shlex.quote(CLINE_PROVIDERS)} "$OPENAI_BASE_URL" '
                         "> ~/.cline/data/settings/providers.json")


CLINE_CLI = AgentRecipe(
    name="cline-cli", harbor_class="harbor.agents.installed.cline.cline:ClineCli",
    # the npm package's platform binary (@cline/cli-linux-<arch>) embeds Bun: no Bun, no source build
    install=NpmInstall("cline-cli", "cline", "3.0.65", "cline"),
    # Harbor runs `cline -P openai -k $API_KEY -m <model>` from a provider:model name; its
    # openai-compatible provider (chat completions) reads the base URL only from providers.json
    dialect="chat", provider="openai", model_name="openai:{model}", setup=CLINE_PROVIDERS_SETUP,
    env={"CLINE_NO_AUTO_UPDATE": "1"},  # no npm update check at start
    side_calls="none seen",
    notes="headless it needs its submit_and_exit tool: a reply without it gets a [SYSTEM] reminder turn, so "
          "the episode runs to the gateway's step limit, whose 400 it does not retry (exit 1, truncated). "
          "After a reply cut at max_tokens it nudges, and from then on sends its first two user messages (the "
          "task, the reminder) as one message of two parts: a new gateway branch, so such an episode trains "
          "as two samples (the first call alone, then the rest; both token-exact)",
    verified_by="tests/test_installed_agents.py",
)


# ---- openhands-sdk ----------------------------------------------------------------------------

# openhands-sdk: Harbor's run() starts /opt/openhands-sdk-venv/bin/python /installed-agent/run_agent.py
# (its install() makes that venv with uv's Python builds and uploads its runner there). The layer
# puts Harbor's own runner in the venv's bin (the launcher, so the smoke test imports what it
# imports) and links both paths to the prefix.
OPENHANDS_SDK_RUNNER = Path(importlib.util.find_spec("harbor.agents.installed.openhands_sdk").origin).with_name(
    "openhands_sdk_runner.py").read_text()


OPENHANDS_SDK = AgentRecipe(
    name="openhands-sdk", harbor_class="harbor.agents.installed.openhands_sdk:OpenHandsSDK",
    # Python >= 3.12: Debian trixie's in the prefix on a bookworm image; uv resolves in seconds
    # what pip backtracks through for minutes (lmnr's opentelemetry / grpcio). Harbor's install
    # adds fastapi, which LiteLLM imports on its tool-calling path.
    install=PypiInstall("openhands-sdk", "openhands-sdk", "1.58.2", "run_agent.py", min_python=(3, 12),
                        installer="uv", requirements=("openhands-tools==1.58.2", "fastapi==0.165.0"),
                        files={"venv/bin/run_agent.py": OPENHANDS_SDK_RUNNER},
                        links={"/opt/openhands-sdk-venv": "venv", "/installed-agent/run_agent.py": "venv/bin/run_agent.py"}),
    # LiteLLM's openai/<served name> at LLM_BASE_URL (the session): chat completions
    dialect="chat", provider="openai",
    env={"LLM_BASE_URL": "{url}", "LLM_API_KEY": "{key}"},
    # its own max_iterations ends the run with exit 0 and only a log line: the gateway's limit,
    # whose 400 it does not retry (ConversationRunError: the runner exits 1, truncated)
    side_calls="none seen",
    notes="LiteLLM chat completions with its 5 tools (terminal, file_editor, task_tracker, finish, think); "
          "Harbor's runner script comes from Harbor's package, baked into the layer",
    verified_by="tests/test_installed_agents.py",
)


# ---- kimi-cli ---------------------------------------------------------------------------------

# kimi-cli: Harbor's run() writes its config (and after the run its session index) with
# `uv run --no-project python -c ...`, uv being what its install() fetched. The layer has no uv:
# this shim runs that one form on the agent's venv Python.
KIMI_CLI_UV_SHIM = f"""#!/bin/sh
# Harbor's kimi-cli run() calls `uv run --no-project python -c CODE`: run CODE on kimi-cli's Python.
if [ "$1" = run ] && [ "$2" = --no-project ] && [ "$3" = python ]; then
  shift 3
  exec {SANDBOX_ROOT}/kimi-cli/venv/bin/python -I "$@"
fi
echo "uv: this sandbox's uv runs only 'uv run --no-project python ...'" >&2
exit 2
"""


def kimi_cli_config_env() -> str:
    """The config Harbor's run() writes for kimi-cli (HARBOR_KIMI_CONFIG_JSON), naming the trial's
    session: Harbor's names only its provider's default base URL (its kwarg base_url is fixed per
    class, not per trial). An env template: JSON braces doubled, {url} and {model} filled in."""
    # reserved_context_size: kimi-cli compacts (a summary call that rewrites the history) once the
    # context plus this reserve reaches max_context_size; its default 50,000 is over the 32K
    # declared here, so it would compact before every step. With 4,096 its 85% trigger decides.
    config = {"default_model": "model", "default_yolo": True,
              "providers": {"harbor": {"type": "openai_legacy", "base_url": "@URL@", "api_key": ""}},
              "models": {"model": {"provider": "harbor", "model": "@MODEL@", "max_context_size": 32768}},
              "loop_control": {"reserved_context_size": 4096}}  # fmt: skip
    text = json.dumps(config).replace("{", "{{").replace("}", "}}")
    return text.replace("@URL@", "{url}").replace("@MODEL@", "{model}")


KIMI_CLI = AgentRecipe(
    name="kimi-cli", harbor_class="harbor.agents.installed.kimi_cli:KimiCli",
    # 1.51.0: 1.52.0, the last release, is a tombstone whose every entry point prints "no longer
    # maintained" (and with no arguments runs Kimi Code's install script from its CDN)
    install=PypiInstall("kimi-cli", "kimi-cli", "1.51.0", "kimi", min_python=(3, 12), installer="uv",
                        files={"bin/uv": KIMI_CLI_UV_SHIM}, smoke="--version"),
    # the openai provider is kimi-cli's openai_legacy type: chat completions at the config's base_url
    dialect="chat", provider="openai",
    env={"HARBOR_KIMI_CONFIG_JSON": kimi_cli_config_env(), "HARBOR_KIMI_API_KEY": "{key}"},
    # no turn limit Harbor passes (max_steps_per_turn is config only): the gateway's, whose 400 it
    # does not retry (429/5xx only); the wire prompt ends and Harbor's reader stops it
    side_calls="none seen; its compaction summary (at 85% of the 32K declared) would be one",
    notes="--wire mode; the uv shim (bin/uv) stands in for the `uv run --no-project python` Harbor's run() "
          "uses to write its config and session index",
    verified_by="tests/test_installed_agents.py",
)


# ---- vibe -------------------------------------------------------------------------------------

# How vibe's last turn stopped short (projection-state.json's latestTurn.stopReason) -> the converter's.
VIBE_STOPS = {"limit": "step_limit", "length": CONTEXT_EXCEEDED}


def vibe_exit(logs_dir: Path) -> dict[str, Any] | None:
    """From vibe's own session store (VIBE_HOME is under the logs dir): the latest session's
    current generation (CURRENT), its projection-state.json's last turn. ``--max-turns`` stops a
    turn with stopReason ``limit``; a reply cut at the output-token cap (VIBE_OUTPUT_LIMIT_RETRIES=0)
    with ``length`` (both exit 3); a finished turn has none (exit 0). Vibe writes these itself; the
    model's text is inside the turn's entries, so a policy cannot forge one."""
    stops = []
    for current in (logs_dir / "vibe-home" / "logs" / "session" / "unified").glob("*/CURRENT"):
        try:
            generation = json.loads(current.read_text())["generation"]
            state = json.loads((current.parent / "generations" / generation / "projection-state.json").read_text())
            turn = state["snapshot"]["latestTurn"] or {}
        except (OSError, ValueError, KeyError, TypeError):
            continue
        stops.append((current.stat().st_mtime, turn.get("status"), turn.get("stopReason")))
    if not stops:
        return None
    _, status, reason = max(stops)
    if status != "completed":
        return None
    if reason is None:
        return {"exit_status": "submitted"}
    return {"exit_status": VIBE_STOPS.get(reason, reason), "agent_exit_status": reason}


VIBE = AgentRecipe(
    name="vibe", harbor_class="harbor.agents.installed.vibe:Vibe",
    # vibe is a Rust TUI (vibe-rs, in the wheel) driving vibe-app-server, the Python harness
    # 3.0.2: 3.0.3 pins certifi==2026.10.19, which PyPI does not have
    install=PypiInstall("vibe", "mistral-vibe", "3.0.2", "vibe", min_python=(3, 12), installer="uv",
                        smoke="--version"),
    # the generic backend: api_style openai (chat completions) at OPENAI_BASE_URL, key OPENAI_API_KEY
    dialect="chat", provider="openai", kwargs={"backend": "generic"},
    # A reply cut at the output-token cap ends the turn (exit 3, outcome length) rather than being
    # discarded and asked again twice with a "shorter response" user turn (each a branch of its own)
    env={"VIBE_OUTPUT_LIMIT_RETRIES": "0"},
    # --max-turns: at the limit, or on a reply cut at the output-token cap, it exits 3 (vibe_exit)
    step_limit_kwarg="max_turns", exit_status=vibe_exit,
    side_calls="none seen",
    notes="vibe-rs (the Rust CLI in the wheel, on the image's glibc) drives vibe-app-server (the Python "
          "harness); telemetry and update checks off in Harbor's config.toml",
    verified_by="tests/test_installed_agents.py",
)


# ---- openhands --------------------------------------------------------------------------------

def openhands_exit(logs_dir: Path) -> dict[str, Any] | None:
    """From OpenHands' event store (FILE_STORE_PATH is the logs dir): the agent state of its last
    ``agent_state_changed`` observation. ``finished`` is its finish tool; ``error`` with "maximum
    iteration" is MAX_ITERATIONS (it exits 0 either way). OpenHands' controller writes these; the
    model's text is inside action events, so a policy cannot forge one."""
    states = []
    for path in logs_dir.glob("sessions/*/events/*.json"):
        try:
            event = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(event, dict) and event.get("observation") == "agent_state_changed" and path.stem.isdigit():
            states.append((int(path.stem), event.get("extras") or {}))
    if not states:
        return None
    _, last = max(states, key=lambda s: s[0])
    state, reason = last.get("agent_state"), str(last.get("reason") or "")
    if state == "finished":
        return {"exit_status": "submitted"}
    if state == "error" and "maximum iteration" in reason:
        return {"exit_status": "step_limit", "agent_exit_status": reason}
    return None


# openhands: Harbor's run() starts `/opt/openhands-venv/bin/python -m openhands.core.main` (its
# install() makes that venv with uv's Python builds). The layer links that path to the prefix's
# venv; the launcher runs the same module (its smoke test imports what the CLI imports).
OPENHANDS_MAIN = "import runpy\nrunpy.run_module('openhands.core.main', run_name='__main__')\n"


OPENHANDS = AgentRecipe(
    name="openhands", harbor_class="harbor.agents.installed.openhands:OpenHands",
    # 1.6.0: the last release with the V0 CLI (openhands.core.main) Harbor's class runs; 1.7 on
    # ship only the app server. Python >= 3.12: Debian trixie's on a bookworm image; uv resolves
    # its tree (litellm, google-cloud, playwright's client) in seconds. Its local runtime runs
    # the agent's shell in tmux, which Harbor's install() adds with apt too. LiteLLM pinned to
    # what it was tested with (openhands-ai asks only >=).
    install=PypiInstall("openhands", "openhands-ai", "1.6.0", "openhands", min_python=(3, 12), installer="uv",
                        requirements=("litellm==1.80.10",), files={"venv/bin/openhands": OPENHANDS_MAIN},
                        links={"/opt/openhands-venv": "venv"}, apt_packages=("tmux",)),
    # LiteLLM's openai/<served name> at LLM_BASE_URL (the session): chat completions
    dialect="chat", provider="openai",
    # SANDBOX_ENABLE_AUTO_LINT (Harbor's run() sets it true) is the one variable its local runtime
    # persists with `export` into the agent's ~/.bashrc: root's .bashrc changed is tampering to
    # the grading (environment_file), which would score every episode 0 unverified
    env={"LLM_BASE_URL": "{url}", "LLM_API_KEY": "{key}", "SANDBOX_ENABLE_AUTO_LINT": "false"},
    # MAX_ITERATIONS: one model call each; at the limit it ends in state error, exit 0 (openhands_exit)
    step_limit_kwarg="max_iterations", exit_status=openhands_exit,
    side_calls="none seen",
    notes="CodeActAgent, chat completions with 6 tools; a reply without a tool call gets its 'Please continue' "
          "user turn. Its local runtime starts an action-execution server and a Jupyter kernel gateway on the "
          "venv's Python inside the sandbox, with the venv's bin first on the PATH of its shell",
    verified_by="tests/test_installed_agents.py",
)


# ---- openclaw ---------------------------------------------------------------------------------

# openclaw: Harbor's run() starts every command with `. ~/.nvm/nvm.sh && nvm use 22 && ...`, nvm
# being what its install() fetched from GitHub. The layer has no nvm: where the agent's home has
# none, this stand-in makes both a no-op (openclaw runs on the Node of its own launcher).
OPENCLAW_NVM_SETUP = ("[ -s ~/.nvm/nvm.sh ] || { mkdir -p ~/.nvm && "
                      "printf '%s\\n' '# slime-harbor: openclaw runs on its own Node' 'nvm() { :; }' > ~/.nvm/nvm.sh; }")


OPENCLAW = AgentRecipe(
    name="openclaw", harbor_class="harbor.agents.installed.openclaw:OpenClaw",
    # 2026.9.x needs Node >= 24.16 (it refuses 22 at start)
    install=NpmInstall("openclaw", "openclaw", "2026.9.6", "openclaw", node="24.21.0"),
    # Harbor's openclaw.json: models.providers.openai.baseUrl from OPENAI_BASE_URL (the session);
    # there it uses its openai-completions transport (POST .../chat/completions, seen in its log)
    dialect="chat", provider="openai", setup=OPENCLAW_NVM_SETUP,
    # no turn limit Harbor passes: the gateway's, whose 400 it does not retry (it prints
    # {"ok": false, ...}; Harbor's run() pipes it through tee, so the run still exits 0)
    side_calls="none seen",
    notes="`openclaw agent --local --json` (embedded, no gateway daemon); streamed with stream_options and "
          "max_completion_tokens; its tool-search surface catalogs 55 tools behind a compact prompt",
    verified_by="tests/test_installed_agents.py",
)


# ---- gemini-cli -------------------------------------------------------------------------------

GEMINI_CLI = AgentRecipe(
    name="gemini-cli", harbor_class="harbor.agents.installed.gemini_cli:GeminiCli",
    install=NpmInstall("gemini-cli", "@google/gemini-cli", "0.61.0", "gemini"),
    # Gemini's generateContent, streamed (?alt=sse), at GOOGLE_GEMINI_BASE_URL (the session's root;
    # the SDK appends /v1beta/models/<model>:...); the key in x-goog-api-key. Harbor's settings.json
    # selects gemini-api-key auth (with only a base URL it picks one headless mode rejects).
    dialect="gemini", provider="google",
    env={"GOOGLE_GEMINI_BASE_URL": "{root}", "GEMINI_API_KEY": "{key}"},
    side_calls="none seen (it sent no countTokens; a next-speaker or loop check would go without tools)",
    notes="systemInstruction with role user, 16 functionDeclarations (parametersJsonSchema), its session "
          "context and the prompt as two text parts; echoes a placeholder thoughtSignature and our call ids; "
          "an empty reply is sent again (the gateway supersedes the first); a 400 ends the run (exit 1)",
    verified_by="tests/test_installed_agents.py",
)


# ---- the table -------------------------------------------------------------------------------------

RECIPES: dict[str, AgentRecipe] = {r.name: r for r in (
    MINI_SWE_AGENT,
    CLAUDE_CODE,
    CODEX,
    OPENCODE,
    QWEN_CODER,
    AIDER,
    KIMI_CODE,
    HERMES,
    CODE_PUPPY,
    PI,
    CLINE_CLI,
    OPENHANDS_SDK,
    KIMI_CLI,
    VIBE,
    OPENHANDS,
    OPENCLAW,
    GEMINI_CLI,
)}
"""Recipes by Harbor agent name."""


UNAVAILABLE: dict[str, str] = {
    "acp": "a launcher for agents in the ACP registry, which it looks up on GitHub and fetches at setup; train the "
           "agent by its own Harbor name instead",
    "antigravity-cli": "its agy binary is only distributed by Google's install script, not on PyPI or npm",
    "copilot-cli": "needs a GitHub Copilot subscription (a GitHub token) and talks only to GitHub's Copilot service; "
                   "Harbor gives it no base URL",
    "cortex-code": "its CLI is only distributed by Snowflake's install script and needs a Snowflake account connection",
    "cursor-cli": "its CLI is only distributed by Cursor's install script and needs a Cursor account (CURSOR_API_KEY) "
                  "for Cursor's own service",
    "deerflow": "installed from a git clone of DeerFlow with uv; its harness is not on PyPI",
    "devin": "its CLI is only distributed by Cognition's install script and needs a Devin account (DEVIN_API_KEY)",
    "eve": "an adapter for the user's own Eve app (path=...), whose dependencies it installs at trial time; there is no"
           " agent to install",
    "fx": "its CLI is only distributed by Vercel's install script (fx.sh) and talks to the Vercel AI Gateway "
          "(AI_GATEWAY_API_KEY)",
    "fx-dev": "fx's dev channel: its CLI is only distributed by Vercel's install script and upgrades itself over the "
              "network",
    "goose": "its CLI is only distributed as GitHub release binaries (download_cli.sh), not on PyPI or npm",
    "grok-build": "its grok CLI is only distributed by xAI's install script, not on PyPI or npm",
    "junie": "its CLI is only distributed by JetBrains' install script (the npm package downloads it from GitHub "
             "releases at install) and needs a Junie key or a vendor key",
    "langgraph": "an adapter for the user's own LangGraph project (project_path=...), whose dependencies it installs at"
                 " trial time; there is no agent to install",
    "mcode": "its package @minimax-ai/code is not on the npm registry",
    "mimo": "its CLI is only distributed by Xiaomi's install script, not on PyPI or npm",
    "muse-code": "its muse CLI is only distributed by Meta's install script, not on PyPI or npm",
    "rovodev-cli": "its acli comes from Atlassian's own apt repository, not Debian's, and needs an Atlassian account "
                   "login",
    "strands": "an adapter for the user's own Strands agent factory (factory_path=...); there is no agent to install",
    "swe-agent": "installed from a git clone of SWE-agent (its config and tools dirs); PyPI's sweagent 0.0.1 is a 2024 "
                 "pre-1.0 snapshot",
    "trae-agent": "installed from a git clone of trae-agent; it is not on PyPI",
    "terminus": "Harbor 0.24 names it but maps no class to it (its AgentFactory has terminus-2 only); use terminus-2",
    "terminus-1": "Harbor 0.24 names it but maps no class to it (its AgentFactory has terminus-2 only); use terminus-2",
    "computer-1": "a desktop computer-use agent: it drives Xvfb, XFCE and Chromium in the sandbox with xdotool and "
                  "screenshots, for a vision model; the terminal tasks here have no desktop",
    "dspy-rlm": "runs dspy.RLM in the trial's process with dspy.LM(model_name) and no base URL Harbor passes, so its "
                "calls cannot be sent to the trial's gateway session; it also needs dspy (harbor[dspy]), not installed",
    "nemo-agent": "NeMo Agent Toolkit workflows answer in text and do not act on the sandbox (Harbor's class supports "
                  "only text-output tasks, not ones that change files); no recipe for nvidia-nat has been written",
    "antigravity-sdk": "no recipe has been written and verified yet: Harbor's runner needs PyPI google-antigravity "
                       "(which bundles its own agent binary) and Gemini generateContent at GOOGLE_GEMINI_BASE_URL",
}
"""Harbor agents that cannot train here, with why (``--agent NAME`` says so before any trial)."""


def recipe_for_class(name: str) -> AgentRecipe | None:
    return next((r for r in RECIPES.values() if r.class_name == name), None)


def __getattr__(name: str) -> type:
    """The recipes' classes, built on first use (importing one imports only its Harbor module)."""
    recipe = recipe_for_class(name)
    if recipe is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    cls = recipe_class(recipe)
    globals()[name] = cls
    return cls


# ---- the agent table in docs/gateway.md -------------------------------------------------------------

def resolve_installs(spec: str | list[str] | tuple[str, ...] | None) -> list[SandboxInstall]:
    """The installs an ``agent_installs`` kwarg names: a name, ``module:attr``, a comma-separated
    string of those, or a list. Raises ValueError with one line for an unknown one."""
    if not spec:
        return []
    names = [n.strip() for n in spec.split(",")] if isinstance(spec, str) else list(spec)
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
