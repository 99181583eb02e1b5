"""The model gateway on the tiny model behind the embedded policy server: OpenAI chat completions
(the real `openai` SDK as the client, raw httpx for the wire), token-exact branches, recording,
the converter's samples, and every fault."""

from __future__ import annotations

import asyncio
import json
import shutil

import httpx
import openai
import pytest

from slime_harbor.converter import trial_to_episode
from slime_harbor.gateway.server import Gateway
from slime_harbor.policy.renderer import RendererError
from slime_harbor.policy.sampling import SamplingParams
from slime_harbor.samples import SampleStatus
from helpers.servers import free_port, port_is_free
from helpers.trial_results import linear_detail, make_result
from helpers.samples import check_sample_against_model
from helpers.tool_gateway import observation, RUN, run_with_gateway, SYSTEM, TASK, TOOLS, TURNS


def sdk(session, **kwargs) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=session.openai_base_url(), api_key="any-key", max_retries=0, **kwargs)


def first_messages():
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]


def echoed(message) -> dict:
    """The assistant message as a harness sends it back: content whitespace changed, reasoning
    dropped, tool-call arguments re-serialised (other key order and spacing), ids kept."""
    out = {"role": "assistant", "content": "  " + (message.content or "").strip() + "\n"}
    if message.tool_calls:
        out["tool_calls"] = []
        for call in message.tool_calls:
            args = json.loads(call.function.arguments)
            reordered = dict(reversed(list(args.items())))
            out["tool_calls"].append({"id": call.id, "type": "function", "function": {
                "name": call.function.name, "arguments": json.dumps(reordered, indent=2)}})
    return out


def tool_results(message, k: int) -> list[dict]:
    if not message.tool_calls:
        return [{"role": "user", "content": observation(k)}]
    return [{"role": "tool", "tool_call_id": c.id, "content": observation(k)} for c in message.tool_calls]


def test_append_only_conversation_is_one_exact_sample(tool_server, tool_model_dir, tool_model, tmp_path):
    """10 turns, streamed and not, the client re-serialising what it got: one branch, one sample,
    usage.completion_tokens == trained tokens, logprobs == the model's on the sample's tokens."""
    async def scenario(gateway):
        session = gateway.open_session("ep1", tmp_path / "agent" / "gateway", RUN)
        client = sdk(session)
        messages, usages, tool_turns = first_messages(), [], 0
        # What each call costs the renderer: the whole history is rendered once, by the first
        # call; a continuation is bridged from the tail of the previous prompt, whatever its length.
        full_renders, bridged_from = [], []
        render_ids, bridge = gateway.renderer.render_ids, gateway.renderer.bridge_to_next_turn
        gateway.renderer.render_ids = lambda *a, **k: full_renders.append(1) or render_ids(*a, **k)
        gateway.renderer.bridge_to_next_turn = lambda prev, *a, **k: bridged_from.append(len(prev)) or bridge(
            prev, *a, **k)
        for k in range(TURNS):
            if k % 2:
                stream = await client.chat.completions.create(
                    model="whatever", messages=messages, tools=TOOLS, stream=True,
                    stream_options={"include_usage": True}, temperature=0.0, top_p=0.5)
                message, usage = await collect(stream)
            else:
                reply = await client.chat.completions.create(model="whatever", messages=messages, tools=TOOLS)
                message, usage = reply.choices[0].message, reply.usage
                assert reply.choices[0].finish_reason == (
                    "tool_calls" if message.tool_calls else "length" if usage.completion_tokens == 64 else "stop")
            tool_turns += bool(message.tool_calls)
            usages.append(usage)
            messages = messages + [echoed(message)] + tool_results(message, k)
        await client.close()
        await gateway.close_session("ep1")
        gateway.renderer.render_ids, gateway.renderer.bridge_to_next_turn = render_ids, bridge
        assert len(full_renders) == 1 and len(bridged_from) == TURNS - 1
        assert max(bridged_from) < 16 < len(session.calls[1].prompt_ids)
        # Each prompt is the renderer's bridge over the WHOLE previous prompt (the gateway bridges
        # from the last turn's tail only, for speed: it must give the same tokens).
        for before, after in zip(session.calls, session.calls[1:]):
            full = gateway.renderer.bridge_to_next_turn(before.prompt_ids, before.completion_ids, after.new_messages,
                                                        tools=TOOLS)
            assert full.token_ids == after.prompt_ids
        return session, usages, tool_turns

    (session, usages, tool_turns), port = run_with_gateway(tool_server, tool_model_dir, scenario)
    assert tool_turns >= TURNS - 2  # the re-serialised tool calls are really exercised
    details = session.rollout_details()
    assert len(details) == 1 and session.stats == {
        "calls": TURNS, "delivered": TURNS, "trained": TURNS, "superseded_retries": 0, "undelivered": 0,
        "branches": 1, "side_calls": 0, "errors": 0}
    assert [len(c) for c in details[0]["completion_token_ids"]] == [u.completion_tokens for u in usages]
    assert [len(p) for p in details[0]["prompt_token_ids"]] == [u.prompt_tokens for u in usages]
    samples = trial_to_episode(make_result(rewards={"reward": 1.0}), recorded=session, rollout_id=7).samples
    assert len(samples) == 1
    sample = samples[0]
    assert not sample.remove_sample and sample.status == SampleStatus.COMPLETED and sample.rollout_id == 7
    assert sum(sample.loss_mask) == sum(u.completion_tokens for u in usages)
    assert sample.metadata["n_branches"] == 1 and sample.metadata["drift_count"] == 0
    assert sample.weight_versions == ["0"] * TURNS
    # The run's sampling (temperature 0.3) was used, not the request's temperature 0 / top_p 0.5.
    assert check_sample_against_model(sample, tool_model, temperature=RUN.temperature) < 1e-4
    # Recording: one calls.jsonl line per call, and an ATIF trajectory Harbor's own model accepts.
    lines = [json.loads(line) for line in (tmp_path / "agent" / "gateway" / "calls.jsonl").read_text().splitlines()]
    assert [(r["call"], r["delivered"], r["trained"], r["usage"]["completion_tokens"]) for r in lines] == [
        (k, True, True, u.completion_tokens) for k, u in enumerate(usages)]
    assert all(r["weight_version"] == "0" and r["latency_s"] > 0 for r in lines)
    # A continuation's line holds only its new prompt tokens, after a prefix of the call it extends;
    # read back, every prompt is the one sampled.
    assert "prompt_ids" in lines[0] and all("prompt_ids" not in r for r in lines[1:])
    assert all(len(r["prompt_new_ids"]) < 64 for r in lines[1:])
    assert recorded_prompts(lines) == [c.prompt_ids for c in session.calls]
    from harbor.models.trajectories.trajectory import Trajectory

    trajectory = Trajectory.model_validate_json((tmp_path / "agent" / "trajectory.json").read_text())
    agent_steps = [s for s in trajectory.steps if s.source == "agent"]
    assert len(agent_steps) == TURNS and [s.source for s in trajectory.steps[:2]] == ["system", "user"]
    assert port_is_free(port)


def recorded_prompts(lines: list[dict]) -> list[list[int]]:
    """Each calls.jsonl line's prompt: whole, or a prefix of an earlier call's prompt + completion
    followed by its new ids."""
    prompts, full = [], {}
    for line in lines:
        if "prompt_ids" in line:
            prompt = line["prompt_ids"]
        else:
            prefix = line["prompt_prefix"]
            prompt = full[prefix["call"]][: prefix["tokens"]] + line["prompt_new_ids"]
        prompts.append(prompt)
        full[line["call"]] = prompt + line["completion_ids"]
    return prompts


async def collect(stream):
    """Assemble an SDK chat stream into (message, usage) the way an agent harness does."""
    role, content, reasoning, calls, usage, finish = None, "", "", {}, None, None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            delta = choice.delta
            role = role or delta.role
            content += delta.content or ""
            reasoning += getattr(delta, "reasoning_content", None) or ""
            for tc in delta.tool_calls or []:
                entry = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                entry["id"] = tc.id or entry["id"]
                entry["name"] += (tc.function.name or "") if tc.function else ""
                entry["arguments"] += (tc.function.arguments or "") if tc.function else ""
            finish = choice.finish_reason or finish
    assert role == "assistant" and usage is not None
    assert finish == ("tool_calls" if calls else "stop") or finish == "length"
    message = openai.types.chat.ChatCompletionMessage.model_validate({
        "role": "assistant", "content": content or None,
        "tool_calls": [{"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                       for _, c in sorted(calls.items())] or None})
    return message, usage


def test_reply_is_parsed_into_openai_fields_and_the_wire_is_sse(tool_server, tool_model_dir, tokenizer, tmp_path):
    async def scenario(gateway):
        session = gateway.open_session("wire", tmp_path / "gw", RUN)
        client = sdk(session)
        reply = await client.chat.completions.create(model="m", messages=first_messages(), tools=TOOLS)
        models = await client.models.list()
        await client.close()
        async with httpx.AsyncClient(timeout=60) as http:
            # No session in the path: the session's API key finds it.
            body = {"model": "m", "messages": first_messages(), "tools": TOOLS, "stream": True,
                    "stream_options": {"include_usage": True}, "some_future_field": {"x": 1}}
            async with http.stream("POST", gateway.base_url + "/v1/chat/completions", json=body,
                                   headers={"Authorization": f"Bearer {session.api_key}"}) as response:
                assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
                assert response.headers["cache-control"] == "no-cache" and response.headers["x-accel-buffering"] == "no"
                lines = [line async for line in response.aiter_lines() if line]
        return session, reply, models, lines

    (session, reply, models, lines), _ = run_with_gateway(tool_server, tool_model_dir, scenario)
    message = reply.choices[0].message
    assert message.content == "I will list the files." and message.reasoning_content == "look first"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == [
        ("bash", {"command": "ls -la", "timeout": 10})]
    assert reply.choices[0].finish_reason == "tool_calls"
    # The prompt is the model's own chat template with the tools, token for token.
    rendered = tokenizer.apply_chat_template(first_messages(), tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert session.calls[0].prompt_ids == tokenizer.encode(rendered, add_special_tokens=False)
    assert reply.usage.completion_tokens == len(session.calls[0].completion_ids)
    assert [m.id for m in models.data] == ["policy"]

    assert all(line.startswith("data: ") for line in lines) and lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("content") or "" for d in deltas) == "I will list the files."
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == "look first"
    tool_deltas = [tc for d in deltas for tc in d.get("tool_calls") or []]
    assert tool_deltas[0]["index"] == 0 and tool_deltas[0]["id"] and tool_deltas[0]["function"]["name"] == "bash"
    assert json.loads("".join(tc["function"].get("arguments") or "" for tc in tool_deltas)) == {
        "command": "ls -la", "timeout": 10}
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "tool_calls"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == len(session.calls[1].completion_ids)
    # The streamed request repeats the first one exactly: a retry, which supersedes the first reply.
    assert session.stats["trained"] == 1 and session.stats["superseded_retries"] == 1
    assert session.calls[0].superseded_by == 1 and session.rollout_details()[0]["extra"]["call_index"] == [1]


def test_chat_requests_stop_and_max_tokens_reach_the_sampler(tool_server, tool_model_dir, tmp_path):
    """A chat request's `stop` (a string or a list) ends the reply before the stop string with
    finish_reason stop; its `max_tokens` ends it there with finish_reason length."""
    asks = {"stop list": {"stop": ["list"]}, "stop string": {"stop": "list"}, "max_tokens": {"max_tokens": 3}}

    async def scenario(gateway):
        out = {}
        for k, (name, extra) in enumerate(asks.items()):
            session = gateway.open_session(f"ask{k}", tmp_path / f"gw{k}", RUN)
            client = sdk(session)
            out[name] = await client.chat.completions.create(model="m", messages=first_messages(), tools=TOOLS,
                                                             **extra), session.calls[0]
            await client.close()
        return out

    out, _ = run_with_gateway(tool_server, tool_model_dir, scenario)
    for name in ("stop list", "stop string"):
        reply, call = out[name]
        message = reply.choices[0].message
        assert reply.choices[0].finish_reason == "stop" and not message.tool_calls, name
        assert message.content == "I will " and message.reasoning_content == "look first", name
        assert reply.usage.completion_tokens == len(call.completion_ids)  # the tokens keep the stop string
    reply, call = out["max_tokens"]
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == len(call.completion_ids) == 3


def test_compaction_makes_a_second_sample_of_the_same_episode(tool_server, tool_model_dir, tool_model, tmp_path):
    async def scenario(gateway):
        session = gateway.open_session("compact", tmp_path / "gw", RUN)
        client = sdk(session)
        messages = first_messages()
        for k in range(5):
            if k == 3:  # the harness summarises the history so far into one user message
                messages = first_messages() + [{"role": "user", "content": "Summary: you listed the files 3 times."}]
            reply = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
            message = reply.choices[0].message
            messages = messages + [echoed(message)] + tool_results(message, k)
        await client.close()
        return session

    session, _ = run_with_gateway(tool_server, tool_model_dir, scenario)
    details = session.rollout_details()
    assert [len(d["completion_token_ids"]) for d in details] == [3, 2] and session.stats["branches"] == 2
    samples = trial_to_episode(make_result(rewards={"reward": 1.0}), recorded=session, rollout_id=3).samples
    assert len(samples) == 2 and {s.rollout_id for s in samples} == {3}
    assert all(not s.remove_sample and s.reward == 1.0 for s in samples)
    assert [s.metadata["turn_indices"] for s in samples] == [[0, 1, 2], [0, 1]]
    for sample in samples:
        assert check_sample_against_model(sample, tool_model, temperature=RUN.temperature) < 1e-4


def test_identical_retry_supersedes_and_undelivered_replies_are_not_trained(base_server, tiny_model_dir, tmp_path):
    async def scenario(gateway):
        session = gateway.open_session("retry", tmp_path / "gw", SamplingParams(max_new_tokens=16))
        client = sdk(session)
        messages = first_messages()
        first = await client.chat.completions.create(model="m", messages=messages)
        again = await client.chat.completions.create(model="m", messages=messages)  # e.g. a client timeout
        messages = messages + [echoed(again.choices[0].message), {"role": "user", "content": "go on"}]
        # A streamed reply the client walks away from mid-stream: recorded, never trained.
        session.sampling = SamplingParams(max_new_tokens=2000)
        async with httpx.AsyncClient(timeout=60) as http:
            async with http.stream("POST", session.openai_base_url() + "/chat/completions",
                                   json={"messages": messages, "stream": True}) as response:
                async for line in response.aiter_lines():
                    assert json.loads(line[6:])["choices"][0]["delta"]["role"] == "assistant"
                    break
        for _ in range(600):
            if session.stats["undelivered"]:
                break
            await asyncio.sleep(0.05)
        session.sampling = SamplingParams(max_new_tokens=16)
        last = await client.chat.completions.create(model="m", messages=messages)
        await client.close()
        return session, first, again, last

    (session, first, again, last), _ = run_with_gateway(base_server, tiny_model_dir, scenario)
    assert session.stats == {"calls": 4, "delivered": 3, "trained": 2, "superseded_retries": 1, "undelivered": 1,
                             "branches": 1, "side_calls": 0, "errors": 0}
    assert session.calls[2].error and not session.calls[2].trained and not session.calls[2].delivered
    (detail,) = session.rollout_details()
    assert [len(c) for c in detail["completion_token_ids"]] == [again.usage.completion_tokens, last.usage.completion_tokens]
    assert detail["extra"]["call_index"] == [1, 3]
    sample = trial_to_episode(make_result(rewards={"reward": 0.0}), recorded=session).samples[0]
    assert sum(sample.loss_mask) == again.usage.completion_tokens + last.usage.completion_tokens
    assert first.usage.completion_tokens == len(session.calls[0].completion_ids) and session.calls[0].superseded_by == 1
    lines = [json.loads(line) for line in (tmp_path / "gw" / "calls.jsonl").read_text().splitlines()]
    calls = sorted((r for r in lines if "call" in r and "event" not in r), key=lambda r: r["call"])
    assert calls[1]["prompt_prefix"] == {"call": 0, "tokens": len(session.calls[0].prompt_ids)}  # the retry
    assert recorded_prompts(calls) == [c.prompt_ids for c in session.calls]


def test_side_calls_without_tools_are_served_and_recorded_but_not_trained(base_server, tiny_model_dir, tmp_path):
    """Claude Code asks for a session title and command checks without tools beside its main,
    tool-carrying conversation: those replies are delivered, recorded and not trained."""
    async def scenario(gateway):
        session = gateway.open_session("side", tmp_path / "gw", SamplingParams(max_new_tokens=8))
        client = sdk(session)
        messages = first_messages()
        main = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        title = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Give this conversation a title."}])
        messages = messages + [echoed(main.choices[0].message), {"role": "user", "content": "go on"}]
        await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        await client.close()
        return session, title

    (session, title), _ = run_with_gateway(base_server, tiny_model_dir, scenario)
    assert title.choices[0].message.content is not None  # served
    stats = session.stats
    assert stats["delivered"] == 3 and stats["trained"] == 2 and stats["side_calls"] == 1, stats
    assert session.calls[1].side_call and not session.calls[1].trained
    (detail,) = session.rollout_details()
    assert detail["extra"]["call_index"] == [0, 2]
    (sample,) = trial_to_episode(make_result(rewards={"reward": 0.0}), recorded=session).samples
    assert sum(sample.loss_mask) == len(session.calls[0].completion_ids) + len(session.calls[2].completion_ids)
    lines = [json.loads(line) for line in (tmp_path / "gw" / "calls.jsonl").read_text().splitlines()]
    assert {"event": "side_call", "session": "side", "call": 1} in lines
    summary = json.loads((tmp_path / "gw" / "session.json").read_text())
    assert summary["stats"]["side_calls"] == 1 and summary["calls"][1]["side_call"] is True


def test_a_session_without_tools_has_no_side_calls(base_server, tiny_model_dir, tmp_path):
    """terminus-2 sends no tools at all: every call is its main conversation and trains."""
    async def scenario(gateway):
        session = gateway.open_session("plain", tmp_path / "gw", SamplingParams(max_new_tokens=8))
        client = sdk(session)
        await client.chat.completions.create(model="m", messages=first_messages())
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "a title?"}])
        await client.close()
        return session

    session, _ = run_with_gateway(base_server, tiny_model_dir, scenario)
    assert session.stats["trained"] == 2 and session.stats["side_calls"] == 0
    assert len(session.rollout_details()) == 2


def test_the_requests_temperature_and_top_p_are_not_the_policys(base_server, tiny_model_dir, model, tmp_path):
    """A client asking for temperature 0 and top_p 0.5 still gets the run's sampling (temperature
    0.7, no top-p filter): a session recording top-p replay gets no kept sets, and the logprobs are
    the model's at 0.7 over the whole vocabulary, not greedy's nor renormalised over a nucleus."""
    run = SamplingParams(temperature=0.7, max_new_tokens=8, return_top_p_token_ids=True)

    async def scenario(gateway):
        session = gateway.open_session("sampling", tmp_path / "gw", run)
        client = sdk(session)
        await client.chat.completions.create(model="m", messages=first_messages(), temperature=0.0, top_p=0.5)
        await client.close()
        return session

    session, _ = run_with_gateway(base_server, tiny_model_dir, scenario)
    (detail,) = session.rollout_details()
    assert detail["extra"]["top_p_token_ids"] == [None] and detail["extra"]["top_p_token_offsets"] == [None]
    (sample,) = trial_to_episode(make_result(rewards={"reward": 1.0}), recorded=session).samples
    assert sample.rollout_top_p_token_ids is None
    assert check_sample_against_model(sample, model, temperature=0.7) < 1e-4


def test_the_sessions_step_limit_refuses_the_next_call_and_truncates(base_server, tiny_model_dir, tmp_path):
    """An agent without a turn limit of its own (Codex): the gateway refuses the call after
    max_calls delivered ones with a 400 coded step_limit_reached; the episode is scored truncated."""
    from slime_harbor.gateway.session import STEP_LIMIT_CODE

    async def scenario(gateway):
        session = gateway.open_session("limit", tmp_path / "gw", SamplingParams(max_new_tokens=8))
        session.max_calls = 2
        client = sdk(session)
        messages = first_messages()
        for _ in range(2):
            reply = await client.chat.completions.create(model="m", messages=messages)
            messages = messages + [echoed(reply.choices[0].message), {"role": "user", "content": "go on"}]
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(model="m", messages=messages)
        await client.close()
        return session, refused.value

    (session, error), _ = run_with_gateway(base_server, tiny_model_dir, scenario)
    assert error.code == STEP_LIMIT_CODE and "step limit (2 model calls)" in error.message
    assert session.exit_reason == "step_limit" and session.stats["calls"] == 2 and session.stats["trained"] == 2
    (sample,) = trial_to_episode(make_result(rewards={"reward": 1.0}), recorded=session).samples
    assert sample.status == SampleStatus.TRUNCATED and sample.reward == 1.0 and not sample.remove_sample


def test_side_calls_neither_count_toward_the_step_limit_nor_are_refused(base_server, tiny_model_dir, tmp_path):
    """A call without tools in a session whose conversation has tools (a title, a loop check) is
    served after the limit is reached, and the main conversation's calls alone use it up."""
    from slime_harbor.gateway.session import STEP_LIMIT_CODE

    async def scenario(gateway):
        session = gateway.open_session("side-limit", tmp_path / "gw", SamplingParams(max_new_tokens=8))
        session.max_calls = 2
        client = sdk(session)
        messages = first_messages()
        await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "a title?"}])
        reply = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)  # step 2 of 2
        messages = messages + [echoed(reply.choices[0].message), {"role": "user", "content": "go on"}]
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "looping?"}])
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        await client.close()
        return session, refused.value

    (session, error), _ = run_with_gateway(base_server, tiny_model_dir, scenario)
    assert error.code == STEP_LIMIT_CODE and session.exit_reason == "step_limit"
    assert session.stats["calls"] == 4 and session.stats["side_calls"] == 2


def test_policy_down_is_a_503_and_an_aborted_episode(tiny_model_dir, tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"  # a port nobody listens on

    async def scenario(gateway):
        session = gateway.open_session("down", tmp_path / "gw")
        client = sdk(session)
        with pytest.raises(openai.APIStatusError) as error:
            await client.chat.completions.create(model="m", messages=first_messages())
        await client.close()
        return session, error.value

    (session, error), port = run_with_gateway(dead, tiny_model_dir, scenario)
    assert error.status_code == 503 and "unavailable" in error.message
    assert session.exit_reason == "policy_unavailable" and session.stats["trained"] == 0
    (sample,) = trial_to_episode(make_result(rewards={"reward": 0.0}), recorded=session).samples
    assert sample.status == SampleStatus.ABORTED and sample.remove_sample and sample.reward is None
    # The agent's calls went through the gateway (one, refused): the session owns the episode's
    # tokens, so a record the agent kept of its own is not trained in their place.
    assert session.stats["calls"] == 1
    (own,) = trial_to_episode(make_result(linear_detail(), {"reward": 0.0}), recorded=session).samples
    assert own.tokens == [] and own.metadata["no_tokens"] and own.remove_sample
    assert port_is_free(port)


def test_a_prompt_over_the_window_is_vllms_400_and_a_truncated_episode(base_server, tiny_model_dir, tmp_path):
    async def scenario(gateway):
        session = gateway.open_session("ctx", tmp_path / "gw", max_context_len=20)
        with pytest.raises(openai.BadRequestError) as sdk_error:
            await sdk(session).chat.completions.create(model="m", messages=first_messages())
        import litellm  # Harbor's agents' client: it must see a context-window error

        with pytest.raises(litellm.ContextWindowExceededError):
            await litellm.acompletion(model="hosted_vllm/policy", api_base=session.openai_base_url(), api_key="k",
                                      messages=first_messages(), num_retries=0)
        return session, sdk_error.value

    (session, error), _ = run_with_gateway(base_server, tiny_model_dir, scenario)
    assert "maximum context length is 20 tokens. However, your request has" in error.message
    assert error.code == "context_length_exceeded" and session.exit_reason == "context_exceeded"
    (sample,) = trial_to_episode(make_result(rewards={"reward": 0.5}), recorded=session).samples
    assert sample.status == SampleStatus.TRUNCATED and sample.reward == 0.5


def test_bad_requests_get_openai_errors_never_a_500(base_server, tiny_model_dir, tmp_path):
    async def scenario(gateway):
        session = gateway.open_session("bad", tmp_path / "gw", SamplingParams(max_new_tokens=4))
        url = session.openai_base_url() + "/chat/completions"
        ok = {"messages": first_messages()}
        cases = {
            "not json": dict(content=b"{nope"),
            "no messages": dict(json={"model": "m"}),
            "bad role": dict(json={"messages": [{"role": "wizard", "content": "hi"}]}),
            "image part": dict(json={"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
            "n=2": dict(json={**ok, "n": 2}),
            "stream not bool": dict(json={**ok, "stream": "yes"}),
            "max_tokens": dict(json={**ok, "max_tokens": -3}),
            "tools": dict(json={**ok, "tools": "bash"}),
            "array body": dict(json=[ok]),
        }
        answers = {}
        async with httpx.AsyncClient(timeout=60) as http:
            for name, kwargs in cases.items():
                answers[name] = await http.post(url, **kwargs)
            answers["unknown session"] = await http.post(gateway.base_url + "/s/nobody/v1/chat/completions", json=ok)
            answers["unknown key"] = await http.post(gateway.base_url + "/v1/chat/completions", json=ok,
                                                     headers={"x-api-key": "nobody"})
            # The session's name is no key: only its secret finds it (Harbor scrubs the key from the records).
            answers["unknown key: the session's name"] = await http.post(
                gateway.base_url + "/v1/chat/completions", json=ok,
                headers={"Authorization": f"Bearer {session.session_id}"})
            answers["ok"] = await http.post(url, json={**ok, "n": 1, "max_tokens": 1000, "frobnicate": True})
        return session, answers

    (session, answers), _ = run_with_gateway(base_server, tiny_model_dir, scenario)
    for name, response in answers.items():
        if name == "ok":
            assert response.status_code == 200
            assert response.json()["usage"]["completion_tokens"] <= 4  # capped by the run's max_new_tokens
            continue
        assert response.status_code == (404 if name.startswith("unknown") else 400), (name, response.text)
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"], name
        assert "Traceback" not in response.text
    assert answers["n=2"].json()["error"]["param"] == "n"
    assert session.stats["calls"] == 1


def test_a_model_family_without_a_parser_is_one_clear_error(tiny_model_dir, tmp_path):
    other = tmp_path / "llama-like"
    shutil.copytree(tiny_model_dir, other)
    (other / "slime_harbor.json").unlink(missing_ok=True)  # no recorded format: model_type decides
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "model_type": "llama"}))
    # llama carries one format, llama-3, whose tokens this Qwen tokenizer lacks
    with pytest.raises(RendererError, match="lacks the llama-3 chat format's tokens"):
        Gateway("http://127.0.0.1:1", other)


def test_close_session_aborts_in_flight_calls_and_aclose_frees_the_port(base_server, tiny_model_dir, tmp_path):
    async def scenario(gateway):
        session = gateway.open_session("busy", tmp_path / "agent" / "gateway", SamplingParams(max_new_tokens=4000))
        call = asyncio.create_task(sdk(session).chat.completions.create(model="m", messages=first_messages()))
        for _ in range(600):  # until the upstream call is running
            if session.in_flight:
                break
            await asyncio.sleep(0.05)
        assert session.in_flight
        closed = await gateway.close_session("busy")
        with pytest.raises(openai.APIStatusError) as error:
            await call
        async with httpx.AsyncClient(timeout=30) as http:
            for _ in range(50):  # the engine drops an aborted request at its next step
                loads = (await http.get(base_server + "/v1/loads")).json()
                if loads["num_running_reqs"] == 0:
                    break
                await asyncio.sleep(0.1)
            after = await http.post(session.openai_base_url() + "/chat/completions", json={"messages": first_messages()})
        return closed, error.value, loads, after

    (session, error, loads, after), port = run_with_gateway(base_server, tiny_model_dir, scenario)
    assert error.status_code == 503 and loads["num_running_reqs"] == 0  # aborted upstream, not left running
    assert after.status_code == 404  # a closed session is gone
    assert session.stats["trained"] == 0 and session.stats["undelivered"] == 1
    lines = (tmp_path / "agent" / "gateway" / "calls.jsonl").read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["delivered"] is False
    assert json.loads((tmp_path / "agent" / "gateway" / "session.json").read_text())["stats"]["calls"] == 1
    assert port_is_free(port)
