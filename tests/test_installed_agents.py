"""Harbor's installed agents from their recipes (slime_harbor.agents.installed.catalog), each
installed from its registry alone in a Docker layer FROM the task's image and running a real trial
through the recording gateway on a bundled no-network task.

The installs are real (a pinned Node from npm and the agent's npm package, or a venv with its PyPI
package, over the host network at build time only): the first run builds each layer (about a
minute), later runs reuse it. The Docker tests skip, with the reason, without a daemon,
with SLIME_HARBOR_NO_DOCKER set, or when the layer cannot be built (no registry reachable).

The tiny model answers both harnesses' long first prompts (their system prompts and tool lists are
over 20k tokens) with text and no tool call, so each episode is one model call that ends the turn:
the agent exits, the verifier scores it, and the sample trains (its rollout_log_probs equal a
recomputation by the model)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from harbor.models.agent.context import AgentContext

from slime_harbor.agents.installed.installs import environment_kwargs

from slime_harbor.agents.installed.catalog import resolve_installs
from slime_harbor.agents.installed.catalog import RECIPES, ClaudeCode, Codex, OpenCode
from slime_harbor.agents.placement import agent_config, gateway_step_limit, ModelEndpoint
from slime_harbor.run_config import RolloutConfig
from slime_harbor.samples import SampleStatus
from helpers.docker import needs_docker

TASK = "count-errors"
ENDPOINT = ModelEndpoint(host_url="http://127.0.0.1:4321/s/t1/v1", sandbox_url="http://127.0.0.1:4321/s/t1/v1",
                         api_key="sk-t1-key")


# ---- the classes on their own ---------------------------------------------------------------------


def test_rollout_hands_claude_code_its_turn_limit_and_codex_the_gateways():
    claude = agent_config(RolloutConfig(agent="claude-code", step_limit=4), ENDPOINT)
    assert claude.import_path == "slime_harbor.agents.installed.catalog:ClaudeCode"
    assert claude.model_name == "anthropic/policy" and claude.kwargs["step_limit"] == 4
    assert environment_kwargs(claude) == {"agent_installs": ["claude-code"]}
    assert gateway_step_limit(claude, 4) is None  # Claude Code stops itself at --max-turns

    codex = agent_config(RolloutConfig(agent="codex", step_limit=4), ENDPOINT)
    assert codex.import_path == "slime_harbor.agents.installed.catalog:Codex" and codex.model_name == "openai/policy"
    assert environment_kwargs(codex) == {"agent_installs": ["codex"]}
    assert gateway_step_limit(codex, 4) == 4  # Codex has no turn limit: the gateway's session enforces it
    assert resolve_installs(["claude-code", "codex"]) == [RECIPES["claude-code"].install, RECIPES["codex"].install]


def test_step_limit_is_claude_codes_max_turns_and_versions_are_pinned(tmp_path):
    agent = ClaudeCode(logs_dir=tmp_path, model_name="anthropic/policy", step_limit=5)
    assert agent._resolved_flags["max_turns"] == 5
    assert "--max-turns 5" in agent.build_cli_flags()
    for cls in (ClaudeCode, Codex):
        for bad in (0, -2, "3", True):
            with pytest.raises(ValueError, match="step_limit"):
                cls(logs_dir=tmp_path, model_name="x/policy", step_limit=bad)
        with pytest.raises(ValueError, match="pinned"):
            cls(logs_dir=tmp_path, model_name="x/policy", version="0.0.1")


def test_the_bubblewrap_sandbox_refuses_them_in_one_line():
    with pytest.raises(RuntimeError, match="has no bubblewrap install: run it with --env docker"):
        RECIPES["codex"].install.check_host()


def test_an_agent_that_cannot_train_here_is_refused_in_one_line_before_any_trial(tmp_path, monkeypatch):
    from harbor.models.agent.name import AgentName

    from slime_harbor.agents.installed.catalog import UNAVAILABLE
    from slime_harbor.exits import ConfigError
    from slime_harbor.run_config import check_config
    from slime_harbor.run_config import DEFAULT_TASKS

    assert set(UNAVAILABLE) <= AgentName.values() and not set(UNAVAILABLE) & set(RECIPES)
    assert all(why and "\n" not in why for why in UNAVAILABLE.values())

    def refusal(agent: str) -> str:
        cfg = RolloutConfig(agent=agent, env="docker", tasks_dir=DEFAULT_TASKS, task_names=[TASK],
                            policy_url="http://127.0.0.1:9", model_dir=str(tmp_path))  # fmt: skip
        with pytest.raises(ConfigError) as refused:
            check_config(cfg)
        assert "\n" not in str(refused.value)
        return str(refused.value)

    for name, why in UNAVAILABLE.items():
        assert refusal(name) == f"agent {name!r} cannot train here: {why}"
    assert "GitHub release" in refusal("goose")
    # a Harbor name placed nowhere (as a new one after a Harbor upgrade) is refused too, not run
    monkeypatch.delitem(UNAVAILABLE, "goose")
    assert refusal("goose").startswith("agent 'goose' is Harbor's but has no place in slime-harbor")


def test_every_harbor_agent_name_is_a_recipe_ours_or_refused_with_a_reason():
    """Every name in Harbor's AgentName has exactly one place, so none reaches Harbor's own install
    (apt, curl, uv inside the sandbox, which fails offline). A Harbor upgrade that names a new agent
    fails here until it gets a recipe or a reason in UNAVAILABLE."""
    import importlib

    from harbor.agents.factory import AgentFactory
    from harbor.agents.installed.base import BaseInstalledAgent
    from harbor.models.agent.name import AgentName

    from slime_harbor.agents.installed.catalog import UNAVAILABLE
    from slime_harbor.agents.host import HOST_GATEWAY_AGENTS
    from slime_harbor.agents.placement import harbor_agent_place, NO_MODEL_AGENTS

    assert {name: harbor_agent_place(name) for name in AgentName.values() if harbor_agent_place(name) is None} == {}
    for name in AgentName.values():
        places = (name in RECIPES, name in NO_MODEL_AGENTS or name in HOST_GATEWAY_AGENTS, name in UNAVAILABLE)
        assert places.count(True) == 1, (name, places)
    assert harbor_agent_place("not-an-agent") is None
    # a recipe runs the class Harbor maps its name to (the recipe's name is Harbor's, not a near miss)
    for name, recipe in RECIPES.items():
        module, _, cls = recipe.harbor_class.partition(":")
        assert getattr(importlib.import_module(module), cls) is AgentFactory.get_agent_class(AgentName(name)), name
    for name in HOST_GATEWAY_AGENTS:  # they run in the trial's process: nothing to install in the sandbox
        assert not issubclass(AgentFactory.get_agent_class(AgentName(name)), BaseInstalledAgent), name


def _write_events(path: Path, events: list) -> None:
    path.write_text("".join((e if isinstance(e, str) else json.dumps(e)) + "\n" for e in events))


@pytest.mark.parametrize("events, expected", [
    ([{"type": "system", "subtype": "init"}, {"type": "result", "subtype": "success", "is_error": False}], "submitted"),
    ([{"type": "result", "subtype": "error_max_turns", "is_error": True, "num_turns": 3}], "step_limit"),
    ([{"type": "result", "subtype": "error_during_execution", "is_error": True}], None),
    (["[claude-code:unrecognized_model] not json", {"type": "assistant"}], None),
])  # fmt: skip
def test_claude_codes_exit_status_comes_from_its_last_result_event(tmp_path, events, expected):
    agent = ClaudeCode(logs_dir=tmp_path, model_name="anthropic/policy", step_limit=3)
    _write_events(tmp_path / "claude-code.txt", events)
    assert (agent.exit_metadata() or {}).get("exit_status") == expected


@pytest.mark.parametrize("events, expected", [
    ([{"type": "thread.started"}, {"type": "turn.started"}, {"type": "turn.completed", "usage": {}}], "submitted"),
    ([{"type": "turn.started"}, {"type": "error", "message": "unexpected status 400: {\"error\": {\"code\": "
                                                              "\"step_limit_reached\"}}"},
      {"type": "turn.failed", "error": {"message": "step_limit_reached"}}], "step_limit"),
    ([{"type": "turn.started"}, {"type": "turn.failed", "error": {"message": "unexpected status 503"}}], None),
    # the model's own text naming the code is inside an item event, not an error: no step limit
    ([{"type": "item.completed", "item": {"type": "agent_message", "text": "step_limit_reached"}},
      {"type": "turn.completed"}], "submitted"),
])  # fmt: skip
def test_codexs_exit_status_comes_from_its_turn_events(tmp_path, events, expected):
    agent = Codex(logs_dir=tmp_path, model_name="openai/policy", step_limit=3)
    _write_events(tmp_path / "codex.txt", events)
    assert (agent.exit_metadata() or {}).get("exit_status") == expected
    context = AgentContext()
    agent.populate_context_post_run(context)
    assert (context.metadata or {}).get("exit_status") == expected


# What opencode 1.18.33 writes when the gateway refuses at the step limit (it then exits 1).
OPENCODE_STEP_LIMIT_ERROR = {"type": "error", "sessionID": "ses_1", "error": {"name": "APIError", "data": {
    "message": "the episode's step limit (3 model calls) is reached", "statusCode": 400, "isRetryable": False,
    "responseBody": json.dumps({"error": {"message": "the episode's step limit (3 model calls) is reached",
                                          "type": "invalid_request_error", "param": None, "code": "step_limit_reached"}}),
    "metadata": {"url": "http://127.0.0.1:4321/s/t1/v1/responses"}}}}  # fmt: skip
OPENCODE_STEP = [{"type": "step_start", "sessionID": "ses_1", "part": {"type": "step-start"}},
                 {"type": "text", "sessionID": "ses_1", "part": {"type": "text", "text": "done"}},
                 {"type": "step_finish", "sessionID": "ses_1", "part": {"type": "step-finish", "reason": "stop"}}]


@pytest.mark.parametrize("events, expected", [
    (OPENCODE_STEP, "submitted"),
    (OPENCODE_STEP + [{"type": "step_start", "sessionID": "ses_1", "part": {}}, OPENCODE_STEP_LIMIT_ERROR], "step_limit"),
    ([{"type": "error", "error": {"name": "APIError", "data": {"message": "Service Unavailable", "statusCode": 503}}}],
     None),
    # the model's own text naming the code is inside a text event, not an error: no step limit
    ([*OPENCODE_STEP[:1], {"type": "text", "part": {"type": "text", "text": "step_limit_reached"}}, OPENCODE_STEP[2]],
     "submitted"),
])  # fmt: skip
def test_opencodes_exit_status_comes_from_its_error_events(tmp_path, events, expected):
    agent = OpenCode(logs_dir=tmp_path, model_name="openai/policy", step_limit=3)
    _write_events(tmp_path / "opencode.txt", events)
    assert (agent.exit_metadata() or {}).get("exit_status") == expected
    context = AgentContext()
    agent.populate_context_post_run(context)
    assert (context.metadata or {}).get("exit_status") == expected


def test_opencode_and_qwen_code_get_the_gateways_step_limit_and_their_endpoint_env():
    for name, cls, env in (("opencode", "OpenCode", "OPENCODE_DISABLE_MODELS_FETCH"),
                           ("qwen-coder", "QwenCode", "QWEN_CODE_SIMPLE")):  # fmt: skip
        config = agent_config(RolloutConfig(agent=name, step_limit=4), ENDPOINT)
        assert config.import_path == f"slime_harbor.agents.installed.catalog:{cls}"
        assert config.model_name == "openai/policy" and config.env["OPENAI_BASE_URL"] == ENDPOINT.sandbox_url
        assert config.env[env] and environment_kwargs(config) == {"agent_installs": [name]}
        # neither has a turn limit Harbor passes: the gateway's session enforces it
        assert RECIPES[name].gateway_step_limit and config.kwargs["step_limit"] == 4


def test_hermes_gets_its_host_key_check_passed_and_its_managed_config_before_it_runs(tmp_path, monkeypatch):
    """Hermes' run() wants OPENAI_API_KEY in this process (host_env) and a context window of 64K
    (files: a managed config); the agent's own key and URL come from the trial's env."""
    from types import SimpleNamespace

    from slime_harbor.agents.installed.recipe import write_files_command
    from slime_harbor.agents.installed.catalog import Hermes

    monkeypatch.setenv("OPENAI_API_KEY", "")  # restored after the test, whether it was set or not
    monkeypatch.delenv("OPENAI_API_KEY")
    commands = []

    class Sandbox:
        async def exec(self, command, user=None, env=None, cwd=None, timeout_sec=None):
            commands.append(command)
            return SimpleNamespace(return_code=0, stdout="", stderr="")

    config = agent_config(RolloutConfig(agent="hermes", step_limit=4), ENDPOINT)
    assert config.model_name == "openai/policy" and config.env["HERMES_MANAGED_DIR"] == "/tmp/hermes-managed"
    agent = Hermes(logs_dir=tmp_path, model_name=config.model_name, **config.kwargs)
    assert agent.options.max_turns == 4 and not RECIPES["hermes"].gateway_step_limit
    asyncio.run(agent.run("count the errors", Sandbox(), AgentContext()))
    assert commands[0].endswith(write_files_command(RECIPES["hermes"].files))
    assert any("--provider openai-api" in c and "--model policy" in c for c in commands)
    assert "context_length: 65536" in commands[0]

    path = tmp_path / "a dir" / "it's.toml"  # the files are written verbatim
    content = "[tools]\ndisabled = [\"Agent\"] # 100% $HOME `x`\n"
    import subprocess

    subprocess.run(["sh", "-c", write_files_command({str(path): content})], check=True)
    assert path.read_text() == content


def _pi_message(role: str, stop: str | None = None, text: str = "") -> dict:
    message = {"role": role, "content": [{"type": "text", "text": text}] if text else []}
    return {"type": "message_end", "message": {**message, "stopReason": stop} if stop else message}


@pytest.mark.parametrize("events, expected", [
    ([_pi_message("user", text="task"), _pi_message("assistant", "stop", "done")], "submitted"),
    ([_pi_message("assistant", "length", "cut")], "submitted"),
    # Harbor's max-turns extension aborted the turn after the last allowed one
    ([_pi_message("assistant", "toolUse"), _pi_message("toolResult"), _pi_message("assistant", "aborted")], "step_limit"),
    ([_pi_message("assistant", "error")], None),
    # the model's text naming a stop reason is content, not the message's stopReason
    ([_pi_message("assistant", "stop", '{"stopReason": "aborted"}')], "submitted"),
    ([{"type": "session"}], None),
])  # fmt: skip
def test_pis_exit_status_comes_from_its_last_assistant_message(tmp_path, events, expected):
    from slime_harbor.agents.installed.catalog import Pi

    agent = Pi(logs_dir=tmp_path, model_name="openai/policy", step_limit=3)
    _write_events(tmp_path / "pi.txt", events)
    assert (agent.exit_metadata() or {}).get("exit_status") == expected


def test_pi_gets_its_own_turn_limit_and_a_chat_completions_provider(tmp_path):
    from slime_harbor.agents.installed.catalog import Pi

    config = agent_config(RolloutConfig(agent="pi", step_limit=4), ENDPOINT)
    assert config.import_path == "slime_harbor.agents.installed.catalog:Pi" and config.model_name == "openai/policy"
    assert gateway_step_limit(config, 4) is None and environment_kwargs(config) == {"agent_installs": ["pi"]}
    agent = Pi(logs_dir=tmp_path, model_name="openai/policy", step_limit=4,
               extra_env={"OPENAI_BASE_URL": ENDPOINT.sandbox_url, "OPENAI_API_KEY": "t1"})  # fmt: skip
    assert agent.options.max_turns == 4
    models = agent._build_custom_models_json(agent.model_connection, "policy")
    assert models["providers"]["harbor-endpoint"]["baseUrl"] == ENDPOINT.sandbox_url
    assert models["providers"]["harbor-endpoint"]["api"] == "openai-completions"


def test_cline_gets_a_provider_colon_model_name_and_its_session_in_providers_json(tmp_path):
    import subprocess

    from slime_harbor.agents.installed.catalog import ClineCli

    config = agent_config(RolloutConfig(agent="cline-cli", step_limit=4), ENDPOINT)
    assert config.import_path == "slime_harbor.agents.installed.catalog:ClineCli"
    assert gateway_step_limit(config, 4) == 4 and config.env["CLINE_NO_AUTO_UPDATE"] == "1"
    agent = ClineCli(logs_dir=tmp_path, model_name=config.model_name, step_limit=4, extra_env=dict(config.env))
    assert agent.model_name == "openai:policy"  # Harbor's cline wants provider:model
    setup, run = agent.create_run_agent_commands("count the errors")
    assert "-P openai -k $API_KEY -m $MODELID" in run.command and run.env["MODELID"] == "policy"
    assert run.env["API_KEY"] == ENDPOINT.api_key
    # the recipe's setup names the session's URL in the settings Cline's run keeps its baseUrl from
    subprocess.run(["sh", "-c", RECIPES["cline-cli"].setup], check=True,
                   env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "OPENAI_BASE_URL": ENDPOINT.sandbox_url})
    settings = json.loads((tmp_path / ".cline/data/settings/providers.json").read_text())
    assert settings["providers"]["openai-compatible"]["settings"] == {"provider": "openai-compatible",
                                                                      "baseUrl": ENDPOINT.sandbox_url}  # fmt: skip


def test_a_pypi_install_newer_than_debians_python_brings_its_own_and_uv_installs_when_asked(tmp_path):
    """docker_script's choice: a recipe within what a Debian image's python3 gives (bookworm: 3.11)
    falls back to the distribution's python3 and installs with pip (its layer script, and so its
    hash, as before); above it, to Debian trixie's Python in <prefix>/python (debian_python.sh,
    in a subshell), with uv from PyPI when the recipe asks."""
    import subprocess

    from slime_harbor.agents.installed.installs import DEBIAN_PYTHON_SCRIPT, DISTRO_PYTHON, PypiInstall

    runtime = DEBIAN_PYTHON_SCRIPT.read_text()
    old = PypiInstall("old", "pkg", "1.0", "pkg", min_python=DISTRO_PYTHON).docker_script()
    assert "apt-get install -y -qq --no-install-recommends python3 python3-venv" in old
    assert runtime not in old and "/python/bin/python3" not in old and " uv" not in old
    new = PypiInstall("new", "pkg", "1.0", "pkg", min_python=(3, 12), installer="uv").docker_script()
    assert "python3 python3-venv" not in new  # bookworm's python3 could not do
    assert f"(\nPREFIX=/opt/slime-harbor/new/python\n{runtime}  )\n  py=/opt/slime-harbor/new/python/bin/python3\n" in new
    assert new.index("usable \"$candidate\"") < new.index("PREFIX=")  # the image's own Python first
    assert "-m pip install --no-cache-dir --disable-pip-version-check --no-input -q uv==" in new
    assert "venv/bin/python -m uv pip install --no-cache --native-tls -q pkg==1.0\n" in new
    assert new.index("-m uv pip install") < new.index("-m pip uninstall --disable-pip-version-check -y -q uv")
    for script in (old, new):
        (tmp_path / "layer.sh").write_text(script)
        assert subprocess.run(["sh", "-n", str(tmp_path / "layer.sh")]).returncode == 0
    assert "mini-swe-agent" in RECIPES and RECIPES["mini-swe-agent"].install.installer == "pip"
    assert not RECIPES["mini-swe-agent"].install.own_python
    for name in ("openhands-sdk", "kimi-cli", "vibe"):
        assert RECIPES[name].install.own_python and RECIPES[name].install.installer == "uv"


def test_an_install_with_links_outside_its_prefix_has_no_bubblewrap_install():
    with pytest.raises(RuntimeError, match="/opt/openhands-sdk-venv.* run it with --env docker"):
        RECIPES["openhands-sdk"].install.check_host()
    script = RECIPES["openhands-sdk"].install.docker_script()
    assert "ln -sfn /opt/slime-harbor/openhands-sdk/venv /opt/openhands-sdk-venv\n" in script
    assert "ln -sfn /opt/slime-harbor/openhands-sdk/venv/bin/run_agent.py /installed-agent/run_agent.py\n" in script


def test_kimi_cli_and_openhands_sdk_get_the_sessions_endpoint():
    kimi = agent_config(RolloutConfig(agent="kimi-cli", step_limit=4), ENDPOINT)
    config = json.loads(kimi.env["HARBOR_KIMI_CONFIG_JSON"])
    assert config["providers"]["harbor"] == {"type": "openai_legacy", "base_url": ENDPOINT.sandbox_url, "api_key": ""}
    assert config["models"]["model"]["model"] == "policy" and kimi.env["HARBOR_KIMI_API_KEY"] == ENDPOINT.api_key
    openhands = agent_config(RolloutConfig(agent="openhands-sdk", step_limit=4), ENDPOINT)
    assert openhands.env["LLM_BASE_URL"] == ENDPOINT.sandbox_url and openhands.env["LLM_API_KEY"] == ENDPOINT.api_key
    assert openhands.model_name == "openai/policy"


def test_openclaw_runs_harbors_nvm_commands_on_its_own_node(tmp_path):
    """Harbor's OpenClaw run() starts each command with `. ~/.nvm/nvm.sh && nvm use 22 && `: the
    recipe's setup gives a home without nvm a stand-in that does nothing, and leaves a real one."""
    import subprocess

    from slime_harbor.agents.installed.catalog import OpenClaw

    config = agent_config(RolloutConfig(agent="openclaw", step_limit=4), ENDPOINT)
    assert config.import_path == "slime_harbor.agents.installed.catalog:OpenClaw" and config.model_name == "openai/policy"
    assert gateway_step_limit(config, 4) == 4 and environment_kwargs(config) == {"agent_installs": ["openclaw"]}
    agent = OpenClaw(logs_dir=tmp_path, model_name=config.model_name, step_limit=4, extra_env=dict(config.env))
    provider = agent._build_full_openclaw_config()["models"]["providers"]["openai"]
    assert provider["baseUrl"] == ENDPOINT.sandbox_url  # Harbor's openclaw.json names the session
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    run = "sh -c '. ~/.nvm/nvm.sh && nvm use 22 && echo ran'"
    assert subprocess.run(["sh", "-c", run], env=env, capture_output=True).returncode != 0  # no nvm: Harbor's fails
    for _ in range(2):  # a second setup (a retried trial) keeps the stand-in
        subprocess.run(["sh", "-c", RECIPES["openclaw"].setup], env=env, check=True)
    assert subprocess.run(["sh", "-c", run], env=env, capture_output=True, text=True).stdout == "ran\n"
    (tmp_path / ".nvm" / "nvm.sh").write_text("nvm() { echo real nvm; }\n")  # an image's own nvm stays
    subprocess.run(["sh", "-c", RECIPES["openclaw"].setup], env=env, check=True)
    assert (tmp_path / ".nvm" / "nvm.sh").read_text() == "nvm() { echo real nvm; }\n"


def test_openhands_gets_the_sessions_endpoint_its_own_iteration_limit_and_tmux(tmp_path):
    from slime_harbor.agents.installed.catalog import OpenHands

    config = agent_config(RolloutConfig(agent="openhands", step_limit=4), ENDPOINT)
    assert config.import_path == "slime_harbor.agents.installed.catalog:OpenHands" and config.model_name == "openai/policy"
    assert config.env["LLM_BASE_URL"] == ENDPOINT.sandbox_url and config.env["LLM_API_KEY"] == ENDPOINT.api_key
    assert gateway_step_limit(config, 4) is None  # OpenHands stops itself at MAX_ITERATIONS
    agent = OpenHands(logs_dir=tmp_path, model_name=config.model_name, extra_env=dict(config.env), **config.kwargs)
    assert agent._resolved_env_vars["MAX_ITERATIONS"] == "4"
    assert agent.model_connection.env["LLM_BASE_URL"] == ENDPOINT.sandbox_url
    install = RECIPES["openhands"].install
    script = install.docker_script()
    assert "apt-get install -y -qq --no-install-recommends tmux" in script
    assert script.index("tmux") < script.index("-m venv")  # before the agent's own install and its smoke test
    assert "ln -sfn /opt/slime-harbor/openhands/venv /opt/openhands-venv\n" in script
    with pytest.raises(RuntimeError, match="/opt/openhands-venv.* run it with --env docker"):
        install.check_host()
    from slime_harbor.agents.installed.installs import PypiInstall

    # the bubblewrap sandbox shares the host's /usr: a Debian package the agent runs must be there
    with pytest.raises(RuntimeError, match="runs no-such-tool-xyz from the host's /usr: apt-get install no-such-tool-xyz"):
        PypiInstall("t", "pkg", "1.0", "pkg", apt_packages=("no-such-tool-xyz",)).check_host()


def _openhands_events(logs_dir: Path, events: list[dict]) -> None:
    events_dir = logs_dir / "sessions" / "0b0936e7" / "events"
    events_dir.mkdir(parents=True)
    for number, event in enumerate(events):
        (events_dir / f"{number}.json").write_text(json.dumps({"id": number, **event}))


def _state(state: str, reason: str = "") -> dict:
    return {"source": "environment", "observation": "agent_state_changed", "extras": {"agent_state": state, "reason": reason}}


@pytest.mark.parametrize("events, expected", [
    ([_state("running"), {"source": "agent", "action": "finish", "args": {}}, _state("finished")], "submitted"),
    # what 1.6.0 wrote at MAX_ITERATIONS=3 in the Docker trial
    ([_state("running"), _state("error", "RuntimeError: Agent reached maximum iteration. Current iteration: 3, "
                                         "max iteration: 3")], "step_limit"),
    ([_state("running"), _state("error", "litellm.APIConnectionError: Connection refused")], None),
    # the model's own text naming a state is a message action, not the controller's observation
    ([_state("running"), {"source": "agent", "action": "message", "args": {"content": json.dumps(_state("finished"))}},
      _state("awaiting_user_input")], None),
    ([], None),
    # events are numbered files: 10.json comes after 9.json
    ([_state("running")] * 10 + [_state("finished")], "submitted"),
])  # fmt: skip
def test_openhands_exit_status_comes_from_its_last_agent_state(tmp_path, events, expected):
    from slime_harbor.agents.installed.catalog import OpenHands

    agent = OpenHands(logs_dir=tmp_path, model_name="openai/policy", step_limit=3)
    _openhands_events(tmp_path, events)
    assert (agent.exit_metadata() or {}).get("exit_status") == expected


# ---- real trials in Docker --------------------------------------------------------------------------


LAYER_BUILDS_AT_ONCE = 4
_layer_errors: dict[str, str | None] = {}
"""Agent name -> why its layer could not be built (None: built), for this test session."""


def _build_layers(names: list[str]) -> dict[str, str | None]:
    """Build the agents' layers on the task's image, several at once (their installs mostly wait
    on the registries), through the environment's own start; cached by Docker after the first run."""
    import tempfile

    from harbor.models.task.task import Task
    from harbor.models.trial.paths import TrialPaths

    from slime_harbor.environments.docker import DockerEnvironment
    from slime_harbor.run_config import DEFAULT_TASKS

    async def build(name: str, tmp: Path, gate: asyncio.Semaphore) -> tuple[str, str | None]:
        async with gate:
            task = Task(DEFAULT_TASKS / TASK)
            paths = TrialPaths(trial_dir=tmp / name)
            paths.mkdir()
            env = DockerEnvironment(environment_dir=task.paths.environment_dir, environment_name=TASK,
                                    session_id=f"{name}-layer__env", trial_paths=paths,
                                    task_env_config=task.config.environment, agent_installs=[name])  # fmt: skip
            try:
                await env.start(force_build=False)
                await env.stop(delete=True)
            except Exception as exc:  # noqa: BLE001 - the reason is the skip message
                return name, str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
        return name, None

    async def build_all(tmp: Path) -> dict[str, str | None]:
        gate = asyncio.Semaphore(LAYER_BUILDS_AT_ONCE)
        return dict(await asyncio.gather(*(build(name, tmp, gate) for name in names)))

    with tempfile.TemporaryDirectory() as tmp:
        return asyncio.run(build_all(Path(tmp)))


def _layer_or_skip(name: str) -> None:
    """The agent's layer is built (on first use, every verified agent's at once); skip with the
    reason when it cannot be built here (e.g. no registry reachable)."""
    if name not in _layer_errors:
        pending = [n for n in DOCKER_VERIFIED if n not in _layer_errors] if name in DOCKER_VERIFIED else [name]
        _layer_errors.update(_build_layers(pending))
    if _layer_errors[name]:
        pytest.skip(f"the {name} layer cannot be built here: {_layer_errors[name]}")


DOCKER_VERIFIED = sorted(name for name, recipe in RECIPES.items() if recipe.verified_by == "tests/test_installed_agents.py")


@needs_docker
@pytest.mark.slow
@pytest.mark.parametrize("agent", DOCKER_VERIFIED)
def test_installed_agent_trains_through_the_gateway_in_docker(agent, tmp_path, policy_server, tiny_model_dir, model):
    """Plain `--agent NAME --env docker` on a bundled no-network task: the harness reaches the
    gateway (and nothing else), its calls are recorded, and its samples train token-exact. The
    gateway takes only the trial's own key (gateway_keys on): each harness sends the key it is
    handed, in its client's own header (pi 0.73.1 sends none it can: run with keys off)."""
    from helpers.samples import check_trains
    from helpers.rollout import config, leftovers

    from slime_harbor.rollout import run_rollouts
    from slime_harbor.samples import read_jsonl

    recipe = RECIPES[agent]
    _layer_or_skip(agent)
    cfg = config(tmp_path, policy_server, tiny_model_dir, agent=agent, env="docker", task_names=[TASK],
                 n_samples=1, step_limit=3, max_new_tokens=32,
                 gateway_keys="on" if recipe.sends_key else "off")  # fmt: skip
    summary = asyncio.run(run_rollouts(cfg))
    samples = read_jsonl(cfg.out_dir / "samples.jsonl")
    assert summary["status_counts"]["aborted"] == 0 and summary["status_counts"]["failed"] == 0, summary["errors"]
    # trained tokens = sampled, logprobs = a recomputation; one sample per gateway branch (an agent
    # that re-sends its history differently, as cline-cli after a cut reply, starts a branch)
    trained_samples = check_trains(samples, model)
    sample = trained_samples[0]
    assert len(trained_samples) == sample.metadata["n_branches"] and len({s.rollout_id for s in samples}) == 1
    assert summary["split_episodes"] == int(len(trained_samples) > 1)  # branches count, not only token drift
    assert sample.status in (SampleStatus.COMPLETED, SampleStatus.TRUNCATED) and sample.reward == 0.0
    trial_dir = Path(sample.metadata["trial_dir"])
    stats = sample.metadata["gateway"]
    assert stats["trained"] >= 1 and stats["errors"] == 0, stats
    records = list(map(json.loads, (trial_dir / "agent/gateway/calls.jsonl").open()))
    # a call line is written when the call ends; a side_call / superseded event at or after it untrains it
    untrained = {r["call"] for r in records if r.get("event") in ("side_call", "superseded")}
    calls = [r for r in records if "event" not in r]
    trained = [r for r in calls if r["trained"] and r["call"] not in untrained]
    assert len(trained) == stats["trained"], stats
    assert sum(sum(s.loss_mask) for s in trained_samples) == sum(r["usage"]["completion_tokens"] for r in trained)
    if recipe.gateway_step_limit:  # the gateway allowed step_limit calls, the agent had no other way
        assert stats["delivered"] <= cfg.step_limit, stats
    if recipe.exit_status is not None:  # the agent's own record says how it ended
        assert sample.metadata.get("exit_status") in ("submitted", "step_limit", "context_exceeded"), sample.metadata
        if sample.metadata["exit_status"] == "context_exceeded":  # vibe: its last reply was cut at max_new_tokens
            assert trained[-1]["finish_reason"] == "length", trained[-1]
    assert leftovers(cfg.out_dir) == ([], [])
