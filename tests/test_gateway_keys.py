"""The gateway usable only by its trials: with keys on (`gateway_keys`, on by default beyond
loopback) a call on a session without that session's own key is refused 401 and one with another
trial's key 403, in every dialect's own error shape; each agent kind is handed its key where its
client sends it, so real trials of a host-side agent (terminus-2) and a `module:Class` agent run
through a keyed gateway; and the key is in no file of the trial dir, no sample and no summary."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
from helpers.rollout import config, leftovers
from helpers.samples import check_trains
from helpers.tool_gateway import run_with_gateway

from slime_harbor.gateway.server import Gateway
from slime_harbor.http_api import is_loopback
from slime_harbor.policy.sampling import SamplingParams
from slime_harbor.rollout import run_rollouts
from slime_harbor.samples import read_jsonl

CHAT_TOOLS_AGENT = "chat_tools_agent:ChatToolsAgent"  # tests/chat_tools_agent.py: takes api_key


def dialect_calls(gateway, session) -> dict[str, tuple[str, dict, str]]:
    """Per dialect: its URL on `session`, a minimal body, and the header its clients send a key in."""
    root = session.openai_base_url().removesuffix("/v1")
    user = [{"role": "user", "content": "hi"}]
    return {
        "chat": (root + "/v1/chat/completions", {"messages": user, "max_tokens": 2}, "authorization"),
        "responses": (root + "/v1/responses", {"input": "hi", "max_output_tokens": 2}, "authorization"),
        "anthropic": (root + "/v1/messages", {"model": "policy", "max_tokens": 2, "messages": user}, "x-api-key"),
        "gemini": (root + "/v1beta/models/policy:generateContent",
                   {"contents": [{"role": "user", "parts": [{"text": "hi"}]}],
                    "generationConfig": {"maxOutputTokens": 2}}, "x-goog-api-key"),
    }


def key_header(name: str, key: str) -> dict[str, str]:
    return {name: f"Bearer {key}" if name == "authorization" else key}


def test_a_call_without_its_sessions_key_is_refused_in_every_dialect(base_server, tiny_model_dir, tmp_path):
    async def scenario(gateway):
        mine = gateway.open_session("mine", tmp_path / "mine", SamplingParams(max_new_tokens=2))
        other = gateway.open_session("other", tmp_path / "other", SamplingParams(max_new_tokens=2))
        answers = {}
        async with httpx.AsyncClient(timeout=60) as http:
            for dialect, (url, body, header) in dialect_calls(gateway, mine).items():
                answers[dialect, "none"] = await http.post(url, json=body)
                answers[dialect, "other's"] = await http.post(url, json=body, headers=key_header(header, other.api_key))
                answers[dialect, "own"] = await http.post(url, json=body, headers=key_header(header, mine.api_key))
            # No session in the path: a call with no key is refused too (not a 404 naming none).
            answers["chat", "none, no path"] = await http.post(gateway.base_url + "/v1/chat/completions",
                                                                json={"messages": [{"role": "user", "content": "x"}]})
        return mine, other, answers

    (mine, other, answers), _ = run_with_gateway(base_server, tiny_model_dir, scenario, require_keys=True)
    for (dialect, key), response in answers.items():
        expected = {"none": 401, "other's": 403, "own": 200, "none, no path": 401}[key]
        assert response.status_code == expected, (dialect, key, response.text)
        assert mine.api_key not in response.text and other.api_key not in response.text
        if expected != 200:
            error = response.json()["error"]
            kind = error.get("type") or error.get("status")  # OpenAI / Anthropic type, Gemini status
            assert kind in {401: ("authentication_error", "UNAUTHENTICATED"),
                            403: ("permission_error", "PERMISSION_DENIED")}[expected], (dialect, error)
    assert mine.stats["calls"] == 4 and other.stats["calls"] == 0  # only the keyed calls reached a session


def test_keys_are_on_by_default_beyond_loopback(tiny_model_dir):
    assert [is_loopback(h) for h in ("127.0.0.1", "127.0.0.2", "::1", "localhost")] == [True] * 4
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "10.1.2.3", "gateway.internal"))
    assert Gateway("http://127.0.0.1:9", tiny_model_dir).require_keys is False
    assert Gateway("http://127.0.0.1:9", tiny_model_dir, host="0.0.0.0").require_keys is True
    assert Gateway("http://127.0.0.1:9", tiny_model_dir, host="0.0.0.0", require_keys=False).require_keys is False


def test_a_bad_gateway_keys_setting_is_one_line(tmp_path, capsys):
    from slime_harbor.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["rollout", "--gateway-keys", "sometimes", "--out", str(tmp_path / "o")])
    assert exit_.value.code == 2 and "invalid choice: 'sometimes'" in capsys.readouterr().err


def files_holding(root: Path, secrets: list[str]) -> list[str]:
    """Every file under `root` whose bytes hold one of `secrets`."""
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            found += [f"{path}: {s[:8]}..." for s in secrets if s.encode() in data]
    return found


@pytest.mark.parametrize("agent", ["terminus-2", CHAT_TOOLS_AGENT])
def test_real_trials_run_through_a_keyed_gateway_and_the_key_is_recorded_nowhere(
        agent, tmp_path, responsive_server, responsive_model_dir, hf_model, monkeypatch, capsys):
    """terminus-2 (its key in LiteLLM's kwargs) and our module:Class agent (the `api_key` keyword
    beside api_base) on a gateway that refuses any call without its trial's key. Before terminus-2 was
    handed its key, LiteLLM sent a placeholder of its own: every call was refused 403 and both trials
    failed."""
    keys = []
    open_session = Gateway.open_session

    def keep_key(self, *args, **kwargs):
        session = open_session(self, *args, **kwargs)
        keys.append(session.api_key)
        return session

    monkeypatch.setattr(Gateway, "open_session", keep_key)
    cfg = config(tmp_path, responsive_server, responsive_model_dir, agent=agent, n_samples=2, step_limit=2,
                 max_new_tokens=96, gateway_keys="on",
                 agent_kwargs={"max_turns": 2} if agent == CHAT_TOOLS_AGENT else {})
    summary = asyncio.run(run_rollouts(cfg))
    assert "every call needs its trial's own key" in capsys.readouterr().err
    assert summary["status_counts"]["aborted"] == 0 and summary["status_counts"]["failed"] == 0, summary["errors"]
    samples = read_jsonl(cfg.out_dir / "samples.jsonl")
    assert len(check_trains(samples, hf_model)) == 2
    assert len(keys) == 2 and len(set(keys)) == 2
    calls = [json.loads(line) for p in (cfg.out_dir / "trials").rglob("calls.jsonl") for line in p.read_text().splitlines()]
    assert calls and all(c.get("status", 200) == 200 for c in calls), [c.get("status") for c in calls]
    # Nowhere on disk: the trial dirs (Harbor's config.json, the agent's logs, the gateway's
    # records), samples.jsonl, summary.json.
    assert files_holding(cfg.out_dir, keys) == []
    assert leftovers(cfg.out_dir) == ([], [])


def test_an_agent_that_sends_no_usable_key_is_refused_in_one_line_where_keys_are_on(tmp_path, capsys):
    """pi 0.73.1 sends its models.json apiKey literally ('$OPENAI_API_KEY'): on a keyed gateway every
    call of it would be refused, so the run stops before any trial; on loopback it runs (keys auto)."""
    from slime_harbor.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["rollout", "--agent", "pi", "--env", "docker", "--gateway-keys", "on", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1
    assert "agent 'pi' sends no usable key" in err
