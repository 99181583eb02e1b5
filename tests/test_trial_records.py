"""Records keep their names: a trial dir names its trial in every file, for every kind of agent and
sandbox.

At the end of every trial Harbor replaces the value of each agent variable it deems sensitive
(harbor.utils.env.is_sensitive_env_key: OPENAI_API_KEY, MSWEA_API_KEY, ...) with `[REDACTED]` in
every file of the trial dir. The key a gateway agent gets is its session's own secret
(GatewaySession.api_key), so that scrub takes out the secret alone: were the key the session's
name (the trial's), result.json and config.json would say `"trial_name": "[REDACTED]"` and the
gateway's records and the ATIF trajectory would lose every mention of the trial.

Real trials (run_rollouts on a bundled task, the embedded policy server on the tiny model) for the
native agent, host-side gateway agents (a user's module:Class, terminus-2) and an installed one
(mini-swe-agent, inside the sandbox), in bubblewrap and, where a daemon answers, Docker."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
from harbor.utils.env import is_sensitive_env_key

from slime_harbor.gateway.server import Gateway
from slime_harbor.agents.host import HOST_GATEWAY_AGENTS
from slime_harbor.agents.installed.catalog import RECIPES
from slime_harbor.rollout import run_rollouts
from slime_harbor.agents.placement import agent_config, ModelEndpoint
from slime_harbor.run_config import RolloutConfig
from helpers.docker import needs_docker
from helpers.rollout import config, trial_names

CHAT_TOOLS_AGENT = "chat_tools_agent:ChatToolsAgent"  # tests/chat_tools_agent.py: a user's host-side agent
ENVS = ["local", pytest.param("docker", marks=needs_docker)]
REDACTED = "[REDACTED]"
# An assignment of a value that was scrubbed: `"NAME": "[REDACTED]"` (JSON), `NAME=[REDACTED]` (a
# shell or .env line), `NAME: [REDACTED]` (YAML).
SCRUBBED_ASSIGNMENT = re.compile(r"""["']?([A-Za-z_][A-Za-z0-9_]*)["']?\s*(?:=|:)\s*["']?\[REDACTED\]""")


# ---- what an agent is handed ------------------------------------------------------------------

class _Gateway:
    host, port = "127.0.0.1", 4321


class _Session:
    session_id = "count-errors__g0_1__abc123"
    api_key = "sk-0123456789abcdef"


@pytest.mark.parametrize("agent", [*HOST_GATEWAY_AGENTS, CHAT_TOOLS_AGENT, *sorted(RECIPES)])
def test_no_variable_harbor_scrubs_holds_the_trials_name(agent):
    """Every variable of a gateway agent whose value Harbor scrubs from the records holds the
    session's secret (or a fixed value), never the session's name; the URLs, which name the
    session, are all under variables Harbor leaves alone."""
    endpoint = ModelEndpoint.of(_Gateway(), _Session())
    config = agent_config(RolloutConfig(agent=agent), endpoint)
    sensitive = {name: value for name, value in config.env.items() if is_sensitive_env_key(name)}
    assert any(value == _Session.api_key for value in sensitive.values()), sensitive
    assert not [name for name, value in sensitive.items() if _Session.session_id in value], sensitive
    assert any(_Session.session_id in value for value in config.env.values()) or "api_base" in config.kwargs


# ---- real trials ------------------------------------------------------------------------------

@pytest.fixture
def sessions(monkeypatch) -> dict:
    """Every gateway session the run opens, by its id (the trial's name), as the gateway made it:
    the check needs each one's API key, which no record holds."""
    opened: dict = {}
    open_session = Gateway.open_session

    def recording(self, session_id, *args, **kwargs):
        opened[session_id] = open_session(self, session_id, *args, **kwargs)
        return opened[session_id]

    monkeypatch.setattr(Gateway, "open_session", recording)
    return opened


def check_records_keep_their_names(out: Path, sessions: dict, gateway: bool) -> None:
    """Every trial dir names its trial where Harbor and the gateway record it; `[REDACTED]` stands
    only where a sensitive variable's value (the session's secret) stood; the secret is nowhere."""
    names = trial_names(out)
    assert names
    for name in names:
        trial_dir = out / "trials" / name
        assert json.loads((trial_dir / "result.json").read_text())["trial_name"] == name
        assert json.loads((trial_dir / "config.json").read_text())["trial_name"] == name
        if gateway:
            assert name in (trial_dir / "lock.json").read_text()  # the agent's endpoint, its session's URL
            record = trial_dir / "agent" / "gateway"
            assert json.loads((record / "session.json").read_text())["session"] == name
            calls = [json.loads(line) for line in (record / "calls.jsonl").read_text().splitlines()]
            assert calls and all(call["session"] == name for call in calls if "session" in call)
            assert name in (trial_dir / "agent" / "trajectory.json").read_text()
        key = sessions[name].api_key if gateway else None
        for path in sorted(p for p in trial_dir.rglob("*") if p.is_file() and not p.is_symlink()):
            text = path.read_bytes().decode("utf-8", errors="replace")
            assert key is None or key not in text, f"{path} holds the session's key"
            scrubbed = [m.group(1) for m in SCRUBBED_ASSIGNMENT.finditer(text)]
            assert text.count(REDACTED) == len(scrubbed), f"{path}: {REDACTED} where no secret stood"
            assert all(is_sensitive_env_key(variable) for variable in scrubbed), (path, scrubbed)


def run_and_check(cfg: RolloutConfig, sessions: dict, gateway: bool) -> None:
    summary = asyncio.run(run_rollouts(cfg))
    assert summary["status_counts"]["aborted"] == 0 and summary["status_counts"]["failed"] == 0, summary["errors"]
    check_records_keep_their_names(cfg.out_dir, sessions, gateway)


@pytest.mark.parametrize("agent, gateway", [("native", False), (CHAT_TOOLS_AGENT, True)])
def test_bubblewrap_trials_keep_their_names(agent, gateway, tmp_path, policy_server, tiny_model_dir, sessions):
    cfg = config(tmp_path, policy_server, tiny_model_dir, agent=agent, n_samples=1, step_limit=2, max_new_tokens=16,
                 agent_kwargs={"max_turns": 2} if gateway else {})
    run_and_check(cfg, sessions, gateway)


@pytest.mark.slow
@pytest.mark.parametrize("env", ENVS)
def test_terminus2_trials_keep_their_names(env, tmp_path, responsive_server, responsive_model_dir, sessions):
    """terminus-2 runs in this process and gets its session's key in its environment (the model
    taught its format, so its replies parse and it ends at its turn limit)."""
    cfg = config(tmp_path, responsive_server, responsive_model_dir, agent="terminus-2", env=env, n_samples=1,
                 step_limit=2, max_new_tokens=96)
    run_and_check(cfg, sessions, gateway=True)


@pytest.mark.slow
@pytest.mark.parametrize("env", ENVS)
def test_installed_agent_trials_keep_their_names(env, tmp_path, policy_server, tiny_model_dir, sessions):
    """mini-swe-agent runs inside the sandbox, its key in the variables Harbor passes it there."""
    cfg = config(tmp_path, policy_server, tiny_model_dir, agent="mini-swe-agent", env=env,
                 task_names=["count-errors"], n_samples=1, step_limit=2, max_new_tokens=16)
    run_and_check(cfg, sessions, gateway=True)
