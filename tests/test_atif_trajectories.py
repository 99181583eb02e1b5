"""Both trajectory.json writers, the native agent's and the gateway's, write what Harbor's own ATIF
model (harbor.models.trajectories.Trajectory) accepts, with our token data and extras kept."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
from harbor.models.agent.context import AgentContext
from harbor.models.trajectories import Trajectory

import slime_harbor.agents.native as agent_module
from slime_harbor.agents.native import NativeAgent
from slime_harbor.gateway.session import Call, GatewaySession
from slime_harbor.policy.sampling import Generation, SamplingParams


def load(path) -> Trajectory:
    return Trajectory.model_validate(json.loads(path.read_text()))


# ---- the native agent ------------------------------------------------------------------------
REPLIES = ["THOUGHT: look.\n```bash\nls\n```", "THOUGHT: no command here.", "THOUGHT: done.\n```bash\nsubmit\n```"]


class ScriptedPolicy:
    """Stands in for PolicyClient: each turn samples the next of REPLIES."""

    tokenizer = None

    def __init__(self, *args, **kwargs):
        self.turn = 0

    async def generate(self, ids, params, routing_key=None) -> Generation:
        tokens = self.tokenizer.encode(REPLIES[self.turn] + "<|im_end|>", add_special_tokens=False)
        self.turn += 1
        return Generation(token_ids=tokens, logprobs=[-0.5] * len(tokens), text="", finish_reason="stop",
                          rid=f"r{self.turn}", weight_version="3")

    async def aclose(self) -> None:
        pass


class FakeSandbox:
    async def exec(self, command, timeout_sec=None):
        return SimpleNamespace(stdout="a.txt\n", stderr="", return_code=0)


def test_the_native_agents_trajectory_is_harbors_atif(tmp_path, tiny_model_dir, monkeypatch):
    agent = NativeAgent(tmp_path / "agent", model_name="tiny", policy_url="http://127.0.0.1:9",
                        tokenizer_path=str(tiny_model_dir))
    agent.session_id = "trial__agent"
    ScriptedPolicy.tokenizer = agent.tokenizer
    monkeypatch.setattr(agent_module, "PolicyClient", ScriptedPolicy)
    context = AgentContext()
    asyncio.run(agent.run("List the files.", FakeSandbox(), context))

    trajectory = load(tmp_path / "agent" / "trajectory.json")
    assert trajectory.schema_version == "ATIF-v1.8" and trajectory.session_id == "trial__agent"
    assert (trajectory.agent.name, trajectory.agent.version, trajectory.agent.model_name) == (
        "slime-harbor-native", "0.1.0", "tiny")
    assert [s.source for s in trajectory.steps] == ["system", "user", "agent", "agent", "agent"]
    assert trajectory.extra == {"exit_status": "submitted"}
    detail = context.rollout_details[0]
    agent_steps = trajectory.steps[2:]
    # Each agent step carries the turn's exact tokens and logprobs, as the converter gets them.
    assert [s.metrics.completion_token_ids for s in agent_steps] == detail["completion_token_ids"]
    assert [s.metrics.logprobs for s in agent_steps] == detail["logprobs"]
    assert [s.metrics.prompt_tokens for s in agent_steps] == [len(p) for p in detail["prompt_token_ids"]]
    assert [s.metrics.completion_tokens for s in agent_steps] == [len(c) for c in detail["completion_token_ids"]]
    ls, no_command, submit = agent_steps
    assert [(c.function_name, c.arguments) for c in ls.tool_calls] == [("bash", {"command": "ls"})]
    assert ls.observation.results[0].content == "<returncode>0</returncode>\n<output>\na.txt\n</output>"
    assert no_command.tool_calls is None and "Format error" in no_command.observation.results[0].content
    assert submit.tool_calls[0].arguments == {"command": "submit"} and submit.observation is None
    final = trajectory.final_metrics
    assert (final.total_prompt_tokens, final.total_completion_tokens, final.total_steps) == (
        context.n_input_tokens, context.n_output_tokens, 5)


# ---- the gateway -----------------------------------------------------------------------------
def session(tmp_path, calls: list[Call]) -> GatewaySession:
    s = GatewaySession(SimpleNamespace(served_model_name="served"), "ep1", tmp_path / "agent" / "gateway",
                       SamplingParams(), None, None, 4096, api_key="unused")
    s.calls = calls
    s.exit_reason = "agent_done"
    return s


def call(index: int, new_messages: list[dict], reply: dict | None, delivered: bool = True) -> Call:
    return Call(index=index, branch=0, prompt_ids=list(range(10 + index)), request=(), rid=f"r{index}",
                completion_ids=[5, 6, 7], logprobs=[-0.1, -0.2, -0.3], weight_version="2", delivered=delivered,
                trained=delivered, message=reply, new_messages=new_messages)


def tool_call(call_id: str, command: str) -> dict:
    return {"id": call_id, "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"command": command})}}


def written(s: GatewaySession, tmp_path) -> Trajectory:
    asyncio.run(s.flush())
    return load(tmp_path / "agent" / "trajectory.json")


def test_the_gateways_trajectory_is_harbors_atif(tmp_path):
    s = session(tmp_path, [
        call(0, [{"role": "system", "content": "be brief"}, {"role": "user", "content": "list files"}],
             {"role": "assistant", "content": None, "reasoning_content": "hmm",
              "tool_calls": [tool_call("call_0_0", "ls")]}),
        call(1, [{"role": "tool", "tool_call_id": "call_0_0", "content": "a.txt"}],
             {"role": "assistant", "content": "done"}),
    ])
    trajectory = written(s, tmp_path)
    assert trajectory.session_id == "ep1" and trajectory.agent.name == "slime-harbor-gateway"
    assert [s.source for s in trajectory.steps] == ["system", "user", "agent", "agent"]
    ls, done = trajectory.steps[2:]
    assert ls.message == "" and ls.reasoning_content == "hmm" and ls.model_name == "served"
    assert [(c.tool_call_id, c.function_name, c.arguments) for c in ls.tool_calls] == [
        ("call_0_0", "bash", {"command": "ls"})]
    assert [(r.source_call_id, r.content) for r in ls.observation.results] == [("call_0_0", "a.txt")]
    assert ls.metrics.model_dump(exclude_none=True) == {
        "prompt_tokens": 10, "completion_tokens": 3, "completion_token_ids": [5, 6, 7],
        "logprobs": [-0.1, -0.2, -0.3], "extra": {"branch": 0, "trained": True, "weight_version": "2"}}
    assert done.message == "done" and done.metrics.prompt_tokens == 11
    assert trajectory.final_metrics.model_dump(exclude_none=True) == {
        "total_prompt_tokens": 21, "total_completion_tokens": 6, "total_steps": 4}
    assert trajectory.extra == {"exit_reason": "agent_done", "gateway": s.stats}


def test_a_tool_result_for_a_call_the_step_did_not_make_keeps_its_id_in_extra(tmp_path):
    """An agent may send back its own ids (the gateway ignores them when it matches turns): ATIF
    refuses a source_call_id that names no tool call of the step, so the id goes to extra."""
    s = session(tmp_path, [
        call(0, [{"role": "user", "content": "list files"}],
             {"role": "assistant", "content": None, "tool_calls": [tool_call("call_0_0", "ls")]}),
        call(1, [{"role": "tool", "tool_call_id": "toolu_renamed", "content": "a.txt"}],
             {"role": "assistant", "content": "done"}),
    ])
    [result] = written(s, tmp_path).steps[1].observation.results
    assert (result.source_call_id, result.content, result.extra) == (None, "a.txt", {"tool_call_id": "toolu_renamed"})


def test_a_session_without_a_delivered_call_writes_no_trajectory(tmp_path):
    """ATIF needs at least one step; a session whose every call failed has none to show."""
    s = session(tmp_path, [call(0, [{"role": "user", "content": "hi"}], None, delivered=False)])
    asyncio.run(s.flush())
    assert (tmp_path / "agent" / "gateway" / "session.json").is_file()
    assert not (tmp_path / "agent" / "trajectory.json").exists()
