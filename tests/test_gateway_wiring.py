"""Every agent but native / oracle / nop samples through the recording gateway: what each kind of
agent is handed (rollout.agent_config), and real rollouts through it: terminus-2 behind the real
sglang-router, a `module:Class` agent of our own that speaks chat completions with tools through the
openai SDK, and the gateway closed with its port free after the run (also after a cancellation).
"Trains" is checked as the issue states it: samples kept, and their rollout_log_probs equal to a
recomputation by the model on the sample's own tokens (fp32 mean abs diff < 1e-4)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlparse

import pytest
from helpers.servers import port_is_free

from slime_harbor.policy.sampling import SamplingParams
from slime_harbor.rollout import run_rollouts
from slime_harbor.agents.placement import (
    agent_config,
    is_installed_agent,
    ModelEndpoint,
    samples_policy,
    uses_gateway,
)
from slime_harbor.run_config import RolloutConfig
from slime_harbor.trial_setup import environment_config
from slime_harbor.samples import SampleStatus, read_jsonl
from helpers.rollout import config, leftovers
from helpers.samples import check_trains

CHAT_TOOLS_AGENT = "chat_tools_agent:ChatToolsAgent"  # tests/chat_tools_agent.py, importable from tests/
ENDPOINT = ModelEndpoint(host_url="http://127.0.0.1:4321/s/trial-1/v1",
                         sandbox_url="http://127.0.0.1:4321/s/trial-1/v1", api_key="sk-trial-1-key")


# ---- what each agent is handed ------------------------------------------------------------------

def test_which_agents_go_through_the_gateway():
    assert [uses_gateway(a) for a in ("native", "slime_harbor.agents.native:NativeAgent", "oracle", "nop")] == [False] * 4
    assert all(uses_gateway(a) for a in ("terminus-2", "mini-swe-agent", "claude-code", CHAT_TOOLS_AGENT))
    assert not samples_policy("oracle") and samples_policy("native") and samples_policy(CHAT_TOOLS_AGENT)


def test_host_side_agents_get_api_base_and_a_hosted_vllm_model_name():
    cfg = RolloutConfig(agent="terminus-2", model_name="policy", step_limit=7, sampling=SamplingParams(max_new_tokens=33),
                        max_context_len=900,
                        agent_kwargs={"model_info": {"max_output_tokens": 40}})
    term = agent_config(cfg, ENDPOINT)
    assert not is_installed_agent(term)
    assert term.name == "terminus-2" and term.model_name == "hosted_vllm/policy"
    kwargs = term.kwargs
    assert kwargs["api_base"] == ENDPOINT.host_url and kwargs["api_base"].endswith("/v1")
    assert kwargs["max_turns"] == 7 and kwargs["enable_summarize"] is False and kwargs["llm_call_kwargs"] == {"max_tokens": 33}
    # agent_kwargs merge key by key into the dict-valued defaults
    assert kwargs["model_info"]["max_input_tokens"] == 900 and kwargs["model_info"]["max_output_tokens"] == 40
    assert term.env["HOSTED_VLLM_API_KEY"] == ENDPOINT.api_key == kwargs["llm_kwargs"]["api_key"]  # LiteLLM sends it

    own = agent_config(RolloutConfig(agent=CHAT_TOOLS_AGENT, agent_kwargs={"max_turns": 2}), ENDPOINT)
    assert not is_installed_agent(own) and own.import_path == CHAT_TOOLS_AGENT
    # its constructor names api_key: the key beside api_base
    assert own.kwargs == {"api_base": ENDPOINT.host_url, "api_key": ENDPOINT.api_key, "max_turns": 2}
    assert own.model_name == "hosted_vllm/policy"


@pytest.mark.parametrize("served", ["/root/.cache/slime-harbor/tiny-model-glm-4.5-seed0-8350dec6ed18b837",
                                    "Qwen/Qwen3.6-35B-A3B", "policy"])
def test_terminus2_takes_the_name_of_a_policy_served_under_its_path(served):
    """vLLM serves a checkpoint under its path, and run_config.with_engine takes that name: terminus-2
    got `hosted_vllm/<path>`, which Harbor's own check refuses, so every terminus-2 trial on vLLM
    failed. The name agents use is one Harbor takes (the gateway answers to any)."""
    from harbor.llms.utils import validate_hosted_vllm_model_config

    term = agent_config(RolloutConfig(agent="terminus-2", model_name=served), ENDPOINT)
    name, _ = validate_hosted_vllm_model_config(term.model_name, term.kwargs["model_info"])
    assert name == (served if served == "policy" else served.rsplit("/", 1)[-1])


@pytest.mark.parametrize("agent, model_name", [("claude-code", "anthropic/policy"), ("codex", "openai/policy"),
                                               ("aider", "openai/policy")])
def test_installed_agents_get_the_endpoint_variables_of_their_session(agent, model_name):
    installed = agent_config(RolloutConfig(agent=agent, model_name="policy"), ENDPOINT)
    assert is_installed_agent(installed) and installed.model_name == model_name
    env = installed.env
    for key in ("OPENAI_BASE_URL", "OPENAI_API_BASE", "HOSTED_VLLM_API_BASE"):
        assert env[key] == ENDPOINT.sandbox_url
    for key in ("OPENAI_API_KEY", "MSWEA_API_KEY", "HOSTED_VLLM_API_KEY"):
        assert env[key] == ENDPOINT.api_key
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:4321/s/trial-1" and env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
    assert env["ANTHROPIC_API_KEY"] == ENDPOINT.api_key
    assert "api_base" not in installed.kwargs


def test_endpoint_of_a_gateway_bound_to_every_address_is_reached_on_loopback():
    class Bound:
        host, port = "0.0.0.0", 5555

    session = SimpleNamespace(session_id="t__g0_1__abc", api_key="sk-secret")
    endpoint = ModelEndpoint.of(Bound(), session)
    assert endpoint.host_url == endpoint.sandbox_url == "http://127.0.0.1:5555/s/t__g0_1__abc/v1"
    assert endpoint.api_key == "sk-secret"


def test_our_sandboxes_are_told_where_the_gateway_listens():
    class Bound:
        host, port = "0.0.0.0", 4321

    reach = {"gateway_port": 4321, "gateway_host": "127.0.0.1"}
    assert environment_config("local", Bound()).kwargs == reach
    terminus = agent_config(RolloutConfig(agent="terminus-2"), ENDPOINT)
    assert environment_config("docker", Bound(), terminus).kwargs == {**reach, "provide_tmux": True}
    assert environment_config("docker").kwargs == {} and environment_config("harbor-docker", Bound()).kwargs == {}


def test_a_gateway_that_cannot_start_is_one_config_error(tiny_model_dir):
    """An address not on this host (--gateway-host): one ConfigError line, which the CLI prints."""
    from slime_harbor.exits import ConfigError
    from slime_harbor.rollout import start_gateway

    cfg = RolloutConfig(agent="terminus-2", policy_url="http://127.0.0.1:9", model_dir=str(tiny_model_dir),
                        gateway_host="192.0.2.1")
    with pytest.raises(ConfigError, match="model gateway for agent 'terminus-2' cannot start: .*") as error:
        asyncio.run(start_gateway(cfg))
    assert "\n" not in str(error.value)


# ---- real rollouts through the gateway ------------------------------------------------------------

def session_ports(out: Path) -> set[int]:
    """The gateway ports the run's trials were handed (their Harbor config.json: api_base / env)."""
    ports = set()
    for trial in (out / "trials").iterdir():
        if not (trial / "config.json").is_file():
            continue
        agent = json.loads((trial / "config.json").read_text())["agent"]
        url = (agent.get("kwargs") or {}).get("api_base") or (agent.get("env") or {}).get("OPENAI_BASE_URL")
        ports.add(urlparse(url).port)
    return ports


def sampled_turns(sample) -> int:
    """How many sampled stretches (runs of loss mask 1) the sample holds: one per model call."""
    return sum(1 for i, m in enumerate(sample.loss_mask) if m == 1 and (i == 0 or sample.loss_mask[i - 1] == 0))


@pytest.mark.slow
def test_terminus2_trains_through_the_gateway_behind_the_real_sglang_router(tmp_path, responsive_model_dir, hf_model):
    """sglang-router strips chat replies' token-id fields; the gateway calls /generate through it itself."""
    from helpers.servers import sglang_router

    from slime_harbor.policy.server import EmbeddedPolicyServer

    with EmbeddedPolicyServer(responsive_model_dir) as server, sglang_router([server.url]) as router:
        cfg = config(tmp_path, router, responsive_model_dir, agent="terminus-2", n_samples=2, step_limit=2,
                     max_new_tokens=96)
        summary = asyncio.run(run_rollouts(cfg))
    samples = read_jsonl(cfg.out_dir / "samples.jsonl")
    assert summary["status_counts"]["aborted"] == 0 and summary["status_counts"]["failed"] == 0, summary["errors"]
    trained = check_trains(samples, hf_model)
    for s in trained:
        assert s.status in (SampleStatus.COMPLETED, SampleStatus.TRUNCATED) and s.reward is not None
        assert (Path(s.metadata["trial_dir"]) / "agent" / "gateway" / "calls.jsonl").is_file()
    # terminus-2 only appends to its history: each episode is one token-exact sample
    assert len(trained) == len({s.rollout_id for s in trained}) == 2
    (port,) = session_ports(cfg.out_dir)
    assert port_is_free(port)
    assert leftovers(cfg.out_dir) == ([], [])


def test_a_module_class_agent_with_tools_trains_through_the_gateway(tmp_path, policy_server, tiny_model_dir, model):
    """Our own host-side agent (openai SDK, chat completions with a bash tool): three calls over an
    append-only history, so one sample per episode holding all three sampled replies."""
    cfg = config(tmp_path, policy_server, tiny_model_dir, agent=CHAT_TOOLS_AGENT, n_samples=2,
                 agent_kwargs={"max_turns": 3}, max_new_tokens=48)
    summary = asyncio.run(run_rollouts(cfg))
    samples = read_jsonl(cfg.out_dir / "samples.jsonl")
    assert summary["status_counts"]["aborted"] == 0 and summary["status_counts"]["failed"] == 0, summary["errors"]
    trained = check_trains(samples, model)
    assert len(trained) == 2 and all(sampled_turns(s) == 3 for s in trained)
    assert all(s.status == SampleStatus.TRUNCATED for s in trained)  # the agent's own turn limit: scored
    (port,) = session_ports(cfg.out_dir)
    assert port_is_free(port) and leftovers(cfg.out_dir) == ([], [])


def test_a_cancelled_rollout_closes_the_gateway_and_frees_its_port(tmp_path, policy_server, tiny_model_dir):
    cfg = config(tmp_path, policy_server, tiny_model_dir, agent=CHAT_TOOLS_AGENT, n_samples=2,
                 agent_kwargs={"max_turns": 200}, max_new_tokens=48)

    async def cancel_after(seconds: float) -> None:
        run = asyncio.ensure_future(run_rollouts(cfg))
        await asyncio.sleep(seconds)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run

    asyncio.run(cancel_after(10.0))
    summary = json.loads((cfg.out_dir / "summary.json").read_text())
    assert summary["interrupted"] is True
    (port,) = session_ports(cfg.out_dir)
    assert port_is_free(port)
    assert leftovers(cfg.out_dir) == ([], [])
    # every session was closed and flushed: each started trial has its call record
    calls = list((cfg.out_dir / "trials").glob("*/agent/gateway/calls.jsonl"))
    assert calls and all(path.read_text().strip() for path in calls)


def test_an_agent_that_raises_at_a_gateway_limit_is_ended_there_and_any_other_raise_propagates():
    """end_run_at_gateway_limits: Harbor skips the verifier after an agent's exception, so an
    exception raised once the session ended at a limit ends the run (kept as agent_error); one
    raised while the session is at no limit is the trial's, as before."""
    from types import SimpleNamespace

    from harbor.models.agent.context import AgentContext

    from slime_harbor.episode import CONTEXT_EXCEEDED, STEP_LIMIT
    from slime_harbor.rollout import end_run_at_gateway_limits

    class Refused(Exception):
        pass

    async def run(instruction, environment, context):
        context.metadata = {"turns": 0}
        raise Refused("Error code: 400 - maximum context length")

    for exit_reason in (CONTEXT_EXCEEDED, STEP_LIMIT, None, "policy_unavailable"):
        trial, session = SimpleNamespace(agent=SimpleNamespace(run=run)), SimpleNamespace(exit_reason=exit_reason)
        end_run_at_gateway_limits(trial, session)
        context = AgentContext()
        if exit_reason is None or exit_reason == "policy_unavailable":
            with pytest.raises(Refused):
                asyncio.run(trial.agent.run(instruction="x", environment=None, context=context))
            continue
        asyncio.run(trial.agent.run(instruction="x", environment=None, context=context))
        assert context.metadata == {"turns": 0, "agent_error": "Refused: Error code: 400 - maximum context length"}
