"""SFT episodes in Harbor's mini-swe-agent's own format (slime_harbor.trainers.agent_sft), what
`slime-harbor demo --agent mini-swe-agent` warm-starts on: read off a real trial of the agent in
bubblewrap, and equal, token for token, to what the recording gateway holds when mini-swe-agent
runs the same episode through it (a scripted upstream speaking SGLang's /generate answers with the
episode's replies, so the trial is the real chain: mini-swe-agent, the sandbox's forward, the
gateway, the converter; and the oracle command it runs earns the verifier's reward)."""

from __future__ import annotations

import asyncio
import http.server
import json
import threading

import pytest

from slime_harbor.policy.chat_formats import bash_call_text
from slime_harbor.policy.renderer import make_renderer
from slime_harbor.tasks import families as task_families
from slime_harbor.trainers import agent_sft

FAMILY = "rename-file"


@pytest.fixture(scope="module")
def instance():
    return task_families.instances(FAMILY, 1, 7, "train")[0]


@pytest.fixture(scope="module")
def format_work(tmp_path_factory):
    return tmp_path_factory.mktemp("fmt") / "w"


@pytest.fixture(scope="module")
def captured(instance, format_work, tiny_model_dir):
    return agent_sft.capture_format("mini-swe-agent", "local", instance, format_work, model_dir=tiny_model_dir)


def _renderer(model_dir):
    from transformers import AutoTokenizer

    from slime_harbor.policy.renderer import make_renderer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return make_renderer(model_dir, tokenizer), tokenizer


class ScriptedGenerate:
    """SGLang's /generate on loopback answering each call of a session with the next of `replies`
    (token ids), as SGLang formats a reply."""

    def __init__(self, replies: list[list[int]]):
        self.prompts: list[list[int]] = []
        scripted = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _json(self, payload):
                data = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._json({})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                if self.path != "/generate":
                    return self._json({})
                scripted.prompts.append(body["input_ids"])
                ids = replies[min(len(scripted.prompts), len(replies)) - 1]
                meta = {"id": body.get("rid"), "finish_reason": {"type": "stop", "matched": ids[-1]},
                        "prompt_tokens": len(body["input_ids"]), "completion_tokens": len(ids), "cached_tokens": 0,
                        "weight_version": "0", "output_token_logprobs": [[-0.5, t, None] for t in ids]}  # fmt: skip
                self._json({"text": "", "output_ids": ids, "meta_info": meta})

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_reply_is_a_bash_tool_call_in_the_qwen3_format():
    text = bash_call_text("qwen3", "mv a b")
    assert text.startswith("<tool_call>\n") and text.endswith("\n</tool_call><|im_end|>")
    assert json.loads(text.split("\n")[1]) == {"name": "bash", "arguments": {"command": "mv a b"}}


def test_the_scripted_policy_answers_through_the_gateway_with_bash_tool_calls(tiny_model_dir, tmp_path):
    """A Gateway built around an upstream object (ScriptedPolicy) serves it like a policy server:
    the scripted token ids come back as OpenAI tool calls, one command per call, then the last again."""
    import openai
    from transformers import AutoTokenizer

    from slime_harbor.gateway.server import Gateway

    with pytest.raises(ValueError, match="one upstream"):
        Gateway(None, tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    policy = agent_sft.ScriptedPolicy(["ls -la", agent_sft.SUBMIT], make_renderer(tiny_model_dir, tokenizer), tokenizer)
    with pytest.raises(ValueError, match="one upstream"):
        Gateway("http://127.0.0.1:1", tiny_model_dir, upstream=policy)
    with pytest.raises(ValueError, match="lora_name"):
        Gateway(None, tiny_model_dir, lora_name="adapter", upstream=policy)
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
    messages = [{"role": "user", "content": "list the files"}]

    async def main():
        gateway = agent_sft.RecordingGateway(None, tiny_model_dir, upstream=policy)
        await gateway.start()
        try:
            session = gateway.open_session("s", record_dir=tmp_path / "gateway")
            client = openai.AsyncOpenAI(base_url=session.openai_base_url(), api_key="k", max_retries=0)
            commands = []
            for _ in range(3):
                reply = await client.chat.completions.create(model="policy", messages=messages, tools=tools)
                (call,) = reply.choices[0].message.tool_calls
                commands.append(json.loads(call.function.arguments)["command"])
                assert call.function.name == "bash" and reply.choices[0].finish_reason == "tool_calls"
                messages.extend([reply.choices[0].message.model_dump(exclude_none=True),
                                 {"role": "tool", "tool_call_id": call.id, "content": "ok"}])
            await client.close()
            return commands, gateway.requests, session
        finally:
            await gateway.aclose()

    commands, requests, session = asyncio.run(main())
    assert commands == ["ls -la", agent_sft.SUBMIT, agent_sft.SUBMIT]
    assert [r["messages"] for r in requests] == [messages[: 1 + 2 * k] for k in range(3)]  # as sent
    assert requests[0]["tools"] == tools
    replies = [tokenizer.encode(bash_call_text("qwen3", c), add_special_tokens=False)
               for c in ("ls -la", agent_sft.SUBMIT, agent_sft.SUBMIT)]
    assert session.stats["branches"] == 1 and [c.completion_ids for c in session.calls] == replies
    assert policy.prompts == [c.prompt_ids for c in session.calls]


@pytest.mark.slow
def test_the_format_is_read_off_a_real_mini_swe_agent_trial(captured, instance, format_work, tmp_path):
    roles = [m["role"] for m in captured.first_messages]
    assert roles == ["system", "user"] and instance.instruction in captured.first_messages[1]["content"]
    assert agent_sft.SUBMIT in captured.first_messages[1]["content"]  # its own instructions name it
    assert [t["function"]["name"] for t in captured.tools] == ["bash"]
    (observation,) = captured.observation_messages
    assert observation["role"] == "tool" and json.loads(observation["content"]) == {"returncode": 0, "output": ""}
    other = task_families.instances("make-dirs", 1, 3, "train")[0]
    messages = captured.messages_for(other.instruction)
    assert other.instruction in messages[1]["content"] and instance.instruction not in messages[1]["content"]
    recorded = format_work / "trials" / agent_sft.FORMAT_TRIAL / "agent" / "gateway" / "calls.jsonl"
    calls = [json.loads(line) for line in recorded.read_text().splitlines()]  # it ran through the gateway
    assert [(c["call"], c["branch"], c["delivered"]) for c in calls] == [(0, 0, True), (1, 0, True)]
    with pytest.raises(ValueError, match="no SFT format for agent 'terminus-2'"):
        agent_sft.capture_format("terminus-2", "local", instance, tmp_path / "w")


@pytest.mark.slow
def test_an_oracle_episode_is_the_tokens_the_gateway_holds_for_it(captured, tmp_path, tiny_model_dir):
    """mini-swe-agent runs an instance (not the captured one) through the gateway, the upstream
    answering with the oracle episode's replies: the sample's tokens are the episode's, its loss
    mask is the episode's, and the verifier pays the oracle command."""
    from helpers.rollout import config

    from slime_harbor.rollout import run_rollouts
    from slime_harbor.samples import SampleStatus, read_jsonl

    renderer, tokenizer = _renderer(tiny_model_dir)
    inst = task_families.instances(FAMILY, 2, 11, "train")[1]
    tokens, mask = agent_sft.oracle_agent_episode(captured, renderer, tokenizer, inst)
    replies = [tokenizer.encode(bash_call_text("qwen3", c), add_special_tokens=False) for c in (inst.command, agent_sft.SUBMIT)]
    task_families.write_task(inst, tmp_path / "tasks")
    upstream = ScriptedGenerate(replies)
    try:
        cfg = config(tmp_path, upstream.url, tiny_model_dir, agent="mini-swe-agent", env="local",
                     tasks_dir=tmp_path / "tasks", task_names=[inst.name], n_samples=1, step_limit=3,
                     max_new_tokens=80)  # fmt: skip
        summary = asyncio.run(run_rollouts(cfg))
    finally:
        upstream.close()
    assert summary["errors"] == {}, summary["errors"]
    (sample,) = read_jsonl(cfg.out_dir / "samples.jsonl")
    assert sample.status == SampleStatus.COMPLETED and sample.reward == 1.0
    assert sample.tokens == tokens
    assert sample.loss_mask == mask[len(sample.prompt_ids):] and sum(mask) == sum(len(r) for r in replies)
    assert upstream.prompts[0] == tokens[: len(upstream.prompts[0])]


def test_demo_takes_the_agents_defaults_and_refuses_an_agent_without_an_sft_format():
    from helpers.cli import assert_one_line_error, run_cli

    from slime_harbor.cli import build_parser
    from slime_harbor.trainers.demo import DEMO_DEFAULTS, demo_defaults

    assert demo_defaults() == DEMO_DEFAULTS
    tuned = demo_defaults("mini-swe-agent")
    assert tuned.agent == "mini-swe-agent" and tuned.max_new_tokens == 64 > DEMO_DEFAULTS.max_new_tokens
    parsed = build_parser("mini-swe-agent").parse_args(["demo", "--agent", "mini-swe-agent", "--seed", "3"])
    assert parsed.max_new_tokens == 64 and parsed.seed == 3
    parsed = build_parser("mini-swe-agent").parse_args(["demo", "--agent=mini-swe-agent", "--max-new-tokens", "70"])
    assert parsed.max_new_tokens == 70
    assert_one_line_error(run_cli("demo", "--agent", "terminus-2"), 2, "demo --agent", "terminus-2", "train-local")


def test_warm_start_learns_the_native_format_first_then_the_agents(tmp_path, tiny_model_dir):
    """sft_native_steps: SFT on the native episodes first, then on mini-swe-agent's own, from
    where the first stage ended (both stages move the weights; the result says how many steps each)."""
    import dataclasses

    import torch
    from transformers import AutoModelForCausalLM

    from slime_harbor.trainers.demo import demo_defaults, sft_warm_start

    cfg = dataclasses.replace(demo_defaults("mini-swe-agent"), out=tmp_path, families=[FAMILY], sft_instances=4,
                              sft_native_steps=2, sft_max_steps=1, sft_check_every=1, sft_batch_size=2)
    probe = task_families.instances(FAMILY, 1, 7, "train")
    result = sft_warm_start(cfg, tiny_model_dir, tmp_path / "sft", probe)
    assert result["native_steps"] == 2 and result["steps"] == 1

    def weights(d):
        return AutoModelForCausalLM.from_pretrained(d).model.embed_tokens.weight

    base, native, final = weights(tiny_model_dir), weights(tmp_path / "sft-native"), weights(tmp_path / "sft")
    assert not torch.equal(base, native) and not torch.equal(native, final)
    assert cfg.sft_native_steps == 2 and demo_defaults().sft_native_steps == 0  # the native demo has no first stage
