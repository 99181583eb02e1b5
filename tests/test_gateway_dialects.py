"""Anthropic Messages, OpenAI Responses and Google Gemini generateContent through the gateway, on
the SFT'd tiny tool-calling model behind the embedded policy server: the real `anthropic` and
`openai` SDKs as host-side clients that speak only that dialect, raw httpx for the wire (and for
Gemini, in gemini-cli's shapes). Same rules as chat completions: the policy's template, one
token-exact sample for an append-only conversation, a branch per compaction."""

from __future__ import annotations

import asyncio
import json

import anthropic
import httpx
import openai
import pytest
import websockets
from helpers.servers import free_port

from slime_harbor.converter import trial_to_episode
from slime_harbor.gateway.gemini import gemini_base_url
from slime_harbor.samples import SampleStatus
from helpers.trial_results import make_result
from helpers.tool_gateway import observation, RUN, run_with_gateway, SYSTEM, TASK, TOOLS
from helpers.dialects import (ANTHROPIC_TOOLS, RESPONSES_TOOLS, GEMINI_MODEL, session_root, claude_echo, claude_results,
                              claude_turn, codex_echo, codex_results, codex_turn, gemini_body, gemini_sse, gemini_turn,
                              gemini_echo, gemini_results)
from helpers.samples import check_sample_against_model

TURNS = 6


ENVIRONMENT = "# Environment\n - Primary working directory: /app\n - Platform: linux"


def chat_prompt(tokenizer, extra=()) -> list[int]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}, *extra]
    return tokenizer.encode(tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True,
                                                          tokenize=False), add_special_tokens=False)


def check_one_exact_sample(session, tool_model, usages: list[tuple[int, int]], tokenizer):
    """One branch, usage == the recorded tokens, the first prompt is the policy's template, and the
    trained sample's logprobs are the model's own."""
    details = session.rollout_details()
    assert len(details) == 1 and session.stats == {
        "calls": TURNS, "delivered": TURNS, "trained": TURNS, "superseded_retries": 0, "undelivered": 0,
        "branches": 1, "side_calls": 0, "errors": 0}
    assert [(len(p), len(c)) for p, c in zip(details[0]["prompt_token_ids"], details[0]["completion_token_ids"])] \
        == usages
    assert details[0]["prompt_token_ids"][0] == chat_prompt(tokenizer)
    (sample,) = trial_to_episode(make_result(rewards={"reward": 1.0}), recorded=session, rollout_id=5).samples
    assert not sample.remove_sample and sum(sample.loss_mask) == sum(n for _, n in usages)
    assert check_sample_against_model(sample, tool_model, temperature=RUN.temperature) < 1e-4


def check_compacted(session, tool_model):
    details = session.rollout_details()
    assert [len(d["completion_token_ids"]) for d in details] == [3, 2] and session.stats["branches"] == 2
    samples = trial_to_episode(make_result(rewards={"reward": 1.0}), recorded=session, rollout_id=3).samples
    assert len(samples) == 2 and {s.rollout_id for s in samples} == {3}
    for sample in samples:
        assert not sample.remove_sample
        assert check_sample_against_model(sample, tool_model, temperature=RUN.temperature) < 1e-4


# ---- Anthropic Messages ---------------------------------------------------------------------


def test_anthropic_append_only_conversation_is_one_exact_sample(tool_server, tool_model_dir, tool_model,
                                                                tokenizer, tmp_path):
    async def scenario(gateway):
        session = gateway.open_session("claude", tmp_path / "gw", RUN)
        client = anthropic.AsyncAnthropic(base_url=session_root(session), api_key="any-key", max_retries=0)
        messages, replies = [{"role": "user", "content": TASK}], []
        for k in range(TURNS):
            reply = await claude_turn(client, messages, k)
            replies.append(reply)
            messages = messages + [claude_echo(reply), claude_results(reply, k)]
        await client.close()
        await gateway.close_session("claude")
        return session, replies

    (session, replies), _ = run_with_gateway(tool_server, tool_model_dir, scenario)
    first = replies[0]
    assert [b.type for b in first.content] == ["thinking", "text", "tool_use"]
    assert first.content[0].thinking == "look first" and first.content[1].text == "I will list the files."
    assert (first.content[2].name, first.content[2].input) == ("bash", {"command": "ls -la", "timeout": 10})
    assert first.stop_reason == "tool_use" and first.role == "assistant"
    assert sum(any(b.type == "tool_use" for b in r.content) for r in replies) >= TURNS - 1
    check_one_exact_sample(session, tool_model, [(r.usage.input_tokens, r.usage.output_tokens) for r in replies],
                           tokenizer)
    lines = (tmp_path / "gw" / "calls.jsonl").read_text().splitlines()
    assert [json.loads(line)["trained"] for line in lines] == [True] * TURNS


def test_anthropic_compaction_makes_a_second_branch(tool_server, tool_model_dir, tool_model, tmp_path):
    async def scenario(gateway):
        session = gateway.open_session("claude-compact", tmp_path / "gw", RUN)
        client = anthropic.AsyncAnthropic(base_url=session_root(session), api_key="k", max_retries=0)
        messages = [{"role": "user", "content": TASK}]
        for k in range(5):
            if k == 3:  # Claude Code's /compact: the history becomes one summary
                messages = [{"role": "user", "content": TASK + "\n\nSummary: you listed the files 3 times."}]
            reply = await claude_turn(client, messages, k)
            messages = messages + [claude_echo(reply), claude_results(reply, k)]
        await client.close()
        return session

    session, _ = run_with_gateway(tool_server, tool_model_dir, scenario)
    check_compacted(session, tool_model)


def sse_events(lines: list[str]) -> list[tuple[str | None, dict]]:
    events, name = [], None
    for line in lines:
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: ") and line != "data: [DONE]":
            events.append((name, json.loads(line[6:])))
            name = None
    return events


def test_anthropic_wire_head_models_count_tokens_and_errors(tool_server, tool_model_dir, tokenizer, tmp_path):
    async def scenario(gateway):
        session = gateway.open_session("wire", tmp_path / "gw", RUN)
        body = {"model": "m", "max_tokens": 500, "system": SYSTEM, "tools": ANTHROPIC_TOOLS,
                "messages": [{"role": "user", "content": [{"type": "text", "text": TASK}]}]}
        headers = {"anthropic-version": "2023-06-01", "anthropic-beta": "prompt-caching-2024-07-31"}
        out = {}
        async with httpx.AsyncClient(timeout=120) as http:
            # No session in the path: the session's API key (x-api-key) finds it.
            async with http.stream("POST", gateway.base_url + "/v1/messages", json={**body, "stream": True},
                                   headers={**headers, "x-api-key": session.api_key}) as response:
                out["stream_status"] = response.status_code
                out["stream_type"] = response.headers["content-type"]
                out["lines"] = [line async for line in response.aiter_lines() if line]
            root = session_root(session)
            out["head"] = [(await http.head(url)).status_code for url in (gateway.base_url + "/", root)]
            out["models_anthropic"] = (await http.get(root + "/v1/models", headers=headers)).json()
            out["models_openai"] = (await http.get(root + "/v1/models")).json()
            out["count"] = (await http.post(root + "/v1/messages/count_tokens", json=body, headers=headers)).json()
            # Claude Code 2.1 sends its environment block as a system message after the first user turn.
            env_body = {**body, "messages": [*body["messages"], {"role": "system", "content": [
                {"type": "text", "text": ENVIRONMENT}]}]}
            out["count_env"] = (await http.post(root + "/v1/messages/count_tokens", json=env_body,
                                                headers=headers)).json()
            out["stop"] = (await http.post(root + "/v1/messages", json={**body, "stop_sequences": ["list"]},
                                           headers={"Authorization": "Bearer ignored"})).json()
            out["length"] = (await http.post(gateway.base_url + "/v1/messages", json={**body, "max_tokens": 3},
                                             headers={"Authorization": f"Bearer {session.api_key}"})).json()
            bad = {
                "not json": dict(content=b"{nope"),
                "no max_tokens": dict(json={k: v for k, v in body.items() if k != "max_tokens"}),
                "image block": dict(json={**body, "messages": [{"role": "user", "content": [
                    {"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}]}]}),
                "bad role": dict(json={**body, "messages": [{"role": "tool", "content": "hi"}]}),
                "bad max_tokens": dict(json={**body, "max_tokens": 0}),
            }
            out["bad"] = {name: await http.post(root + "/v1/messages", headers=headers, **kwargs)
                          for name, kwargs in bad.items()}
            out["bad"]["unknown session"] = await http.post(gateway.base_url + "/v1/messages", json=body,
                                                            headers={**headers, "x-api-key": "nobody"})
        client = anthropic.AsyncAnthropic(base_url=root, api_key="k", max_retries=0)
        with pytest.raises(anthropic.BadRequestError) as sdk_error:
            await client.messages.create(model="m", max_tokens=10, messages=[])
        out["sdk_error"] = sdk_error.value
        await client.close()
        return out

    out, _ = run_with_gateway(tool_server, tool_model_dir, scenario)
    assert out["stream_status"] == 200 and out["stream_type"].startswith("text/event-stream")
    assert all(line.startswith(("event: ", "data: ")) for line in out["lines"])
    events = sse_events(out["lines"])
    assert all(name == payload["type"] for name, payload in events)  # every data line has its event: line
    names = [name for name, _ in events if name != "ping"]
    assert names == ["message_start"] + ["content_block_start", "content_block_delta", "content_block_delta",
                                         "content_block_stop"] + ["content_block_start", "content_block_delta",
                                                                  "content_block_stop"] * 2 + [
        "message_delta", "message_stop"]
    payloads = [p for n, p in events if n != "ping"]
    assert payloads[0]["message"]["usage"]["input_tokens"] == len(chat_prompt(tokenizer))
    assert [p["content_block"]["type"] for p in payloads if p["type"] == "content_block_start"] == [
        "thinking", "text", "tool_use"]
    deltas = [p["delta"] for p in payloads if p["type"] == "content_block_delta"]
    assert [d["type"] for d in deltas] == ["thinking_delta", "signature_delta", "text_delta", "input_json_delta"]
    assert deltas[0]["thinking"] == "look first" and deltas[2]["text"] == "I will list the files."
    assert json.loads(deltas[3]["partial_json"]) == {"command": "ls -la", "timeout": 10}
    assert payloads[-2]["delta"]["stop_reason"] == "tool_use" and payloads[-2]["usage"]["output_tokens"] > 0

    assert out["head"] == [200, 200]
    assert out["models_anthropic"]["data"][0] == {"type": "model", "id": "policy", "display_name": "policy",
                                                  "created_at": "1970-01-01T00:00:00Z"}
    assert out["models_anthropic"]["has_more"] is False and "object" not in out["models_anthropic"]
    assert out["models_openai"]["object"] == "list" and out["models_openai"]["data"][0]["object"] == "model"
    assert out["count"] == {"input_tokens": len(chat_prompt(tokenizer))}
    env_turn = [{"role": "system", "content": ENVIRONMENT}]
    assert out["count_env"] == {"input_tokens": len(chat_prompt(tokenizer, env_turn))} != out["count"]
    stop = out["stop"]
    assert (stop["stop_reason"], stop["stop_sequence"]) == ("stop_sequence", "list")
    assert [b["type"] for b in stop["content"]] == ["thinking", "text"] and stop["content"][1]["text"] == "I will "
    length = out["length"]
    assert length["stop_reason"] == "max_tokens" and length["usage"]["output_tokens"] == 3

    for name, response in out["bad"].items():
        assert response.status_code == (404 if name == "unknown session" else 400), (name, response.text)
        error = response.json()
        assert error["type"] == "error" and error["error"]["message"], name
        assert error["error"]["type"] == ("not_found_error" if name == "unknown session" else "invalid_request_error")
    assert "max_tokens" in out["bad"]["no max_tokens"].json()["error"]["message"]
    assert "messages" in out["sdk_error"].message and out["sdk_error"].status_code == 400


# ---- OpenAI Responses -----------------------------------------------------------------------


def test_responses_append_only_conversation_is_one_exact_sample(tool_server, tool_model_dir, tool_model,
                                                                tokenizer, tmp_path):
    async def scenario(gateway):
        session = gateway.open_session("codex", tmp_path / "gw", RUN)
        client = openai.AsyncOpenAI(base_url=session.openai_base_url(), api_key="k", max_retries=0)
        items, replies = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": TASK}]}], []
        for k in range(TURNS):
            reply = await codex_turn(client, items, k)
            replies.append(reply)
            items = items + codex_echo(reply) + codex_results(reply, k)
        await client.close()
        await gateway.close_session("codex")
        return session, replies

    (session, replies), _ = run_with_gateway(tool_server, tool_model_dir, scenario)
    first = replies[0]
    assert [i.type for i in first.output] == ["reasoning", "message", "function_call"]
    assert first.output[0].summary[0].text == "look first" and first.output_text == "I will list the files."
    assert (first.output[2].name, json.loads(first.output[2].arguments)) == ("bash", {"command": "ls -la",
                                                                                      "timeout": 10})
    assert first.status == "completed" and first.output[2].call_id
    assert sum(any(i.type == "function_call" for i in r.output) for r in replies) >= TURNS - 1
    check_one_exact_sample(session, tool_model, [(r.usage.input_tokens, r.usage.output_tokens) for r in replies],
                           tokenizer)


def test_responses_compaction_makes_a_second_branch(tool_server, tool_model_dir, tool_model, tmp_path):
    async def scenario(gateway):
        session = gateway.open_session("codex-compact", tmp_path / "gw", RUN)
        client = openai.AsyncOpenAI(base_url=session.openai_base_url(), api_key="k", max_retries=0)
        items = [{"role": "user", "content": TASK}]
        for k in range(5):
            if k == 3:  # Codex's compaction: the history becomes one summary message
                items = [{"role": "user", "content": TASK + "\n\nSummary: you listed the files 3 times."}]
            reply = await codex_turn(client, items, k)
            items = items + codex_echo(reply) + codex_results(reply, k)
        await client.close()
        return session

    session, _ = run_with_gateway(tool_server, tool_model_dir, scenario)
    check_compacted(session, tool_model)


def test_responses_wire_errors_and_websocket_refusal(tool_server, tool_model_dir, tokenizer, tmp_path):
    async def scenario(gateway):
        session = gateway.open_session("rwire", tmp_path / "gw", RUN)
        body = {"model": "m", "instructions": SYSTEM, "input": TASK, "tools": RESPONSES_TOOLS, "store": False}
        out = {}
        async with httpx.AsyncClient(timeout=120) as http:
            async with http.stream("POST", gateway.base_url + "/v1/responses", json={**body, "stream": True},
                                   headers={"Authorization": f"Bearer {session.api_key}"}) as response:
                out["status"], out["type"] = response.status_code, response.headers["content-type"]
                out["lines"] = [line async for line in response.aiter_lines() if line]
            url = session.openai_base_url() + "/responses"
            out["length"] = (await http.post(url, json={**body, "max_output_tokens": 3})).json()
            bad = {
                "not json": dict(content=b"{nope"),
                "no input": dict(json={"model": "m"}),
                "previous_response_id": dict(json={**body, "previous_response_id": "resp_1"}),
                "image item": dict(json={**body, "input": [{"role": "user", "content": [
                    {"type": "input_image", "image_url": "http://x/y.png"}]}]}),
                "unknown item": dict(json={**body, "input": [{"type": "local_shell_call", "action": {}}]}),
                "bad max_output_tokens": dict(json={**body, "max_output_tokens": "lots"}),
            }
            out["bad"] = {name: await http.post(url, **kwargs) for name, kwargs in bad.items()}
            out["bad"]["unknown session"] = await http.post(gateway.base_url + "/s/nobody/v1/responses", json=body)
        with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
            async with websockets.connect(url.replace("http://", "ws://"), open_timeout=10):
                pass
        out["ws"] = refused.value.response
        return session, out

    (session, out), _ = run_with_gateway(tool_server, tool_model_dir, scenario)
    assert out["status"] == 200 and out["type"].startswith("text/event-stream")
    events = sse_events(out["lines"])
    assert all(name == payload["type"] for name, payload in events)
    assert [p["sequence_number"] for _, p in events] == list(range(len(events)))
    names = [n for n, _ in events if n != "response.in_progress"]
    assert names[0] == "response.created" and names[-1] == "response.completed"
    added = [p["item"]["type"] for n, p in events if n == "response.output_item.added"]
    done = [p["item"]["type"] for n, p in events if n == "response.output_item.done"]
    assert added == done == ["reasoning", "message", "function_call"]
    assert "".join(p["delta"] for n, p in events if n == "response.output_text.delta") == "I will list the files."
    arguments = "".join(p["delta"] for n, p in events if n == "response.function_call_arguments.delta")
    assert json.loads(arguments) == {"command": "ls -la", "timeout": 10}
    completed = events[-1][1]["response"]
    assert completed["status"] == "completed" and completed["usage"]["input_tokens"] == len(chat_prompt(tokenizer))
    assert completed["usage"]["output_tokens"] == len(session.calls[0].completion_ids)
    assert out["length"]["status"] == "incomplete" and out["length"]["usage"]["output_tokens"] == 3
    assert out["length"]["incomplete_details"] == {"reason": "max_output_tokens"}

    for name, response in out["bad"].items():
        assert response.status_code == (404 if name == "unknown session" else 400), (name, response.text)
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"], name
    assert out["bad"]["previous_response_id"].json()["error"]["param"] == "previous_response_id"
    assert out["ws"].status_code == 426
    assert json.loads(out["ws"].body)["error"]["code"] == "websocket_not_supported"
    assert session.stats["calls"] == 2  # the refused requests sampled nothing


# ---- Google Gemini generateContent ----------------------------------------------------------


def test_gemini_append_only_conversation_is_one_exact_sample(tool_server, tool_model_dir, tool_model, tokenizer,
                                                             tmp_path):
    """gemini-cli's turns, streamed and not, the session found by the URL root or its key in
    x-goog-api-key or ?key=: one token-exact sample, each prompt extending the previous prompt + completion."""
    async def scenario(gateway):
        session = gateway.open_session("gem", tmp_path / "gw", RUN)
        root = gemini_base_url(session)
        assert root == session_root(session)
        contents, replies = [{"role": "user", "parts": [{"text": TASK}]}], []
        keyed = [dict(), dict(headers={"x-goog-api-key": session.api_key}), dict(params={"key": session.api_key})]
        async with httpx.AsyncClient(timeout=120) as http:
            for k in range(TURNS):
                how = keyed[k % 3]
                reply = await gemini_turn(http, gateway.base_url if how else root, gemini_body(contents), k, **how)
                replies.append(reply)
                contents = contents + [gemini_echo(reply, k), gemini_results(reply, k)]
        await gateway.close_session("gem")
        return session, replies

    (session, replies), _ = run_with_gateway(tool_server, tool_model_dir, scenario)
    first = replies[0]
    assert first["candidates"][0]["content"]["parts"] == [
        {"text": "look first", "thought": True}, {"text": "I will list the files."},
        {"functionCall": {"id": "call_0_0", "name": "bash", "args": {"command": "ls -la", "timeout": 10}}}]
    assert first["candidates"][0]["finishReason"] == "STOP" and first["modelVersion"] == GEMINI_MODEL
    assert sum(any("functionCall" in p for p in r["candidates"][0]["content"]["parts"]) for r in replies) >= TURNS - 1
    usage = [(r["usageMetadata"]["promptTokenCount"], r["usageMetadata"]["candidatesTokenCount"]) for r in replies]
    assert all(r["usageMetadata"]["totalTokenCount"] == sum(u) for r, u in zip(replies, usage))
    check_one_exact_sample(session, tool_model, usage, tokenizer)
    (detail,) = session.rollout_details()
    prompts, completions = detail["prompt_token_ids"], detail["completion_token_ids"]
    for k in range(1, TURNS):  # no drift: each prompt is the previous prompt + the sampled tokens + more
        assert prompts[k][:len(prompts[k - 1]) + len(completions[k - 1])] == prompts[k - 1] + completions[k - 1]
    assert [c.completion_ids for c in session.calls] == completions
    # the tool results reached the prompt as their text
    assert observation(TURNS - 2) in tokenizer.decode(prompts[-1])
    assert '"output"' not in tokenizer.decode(prompts[-1])


def test_gemini_count_tokens_models_wire_errors_and_step_limit(tool_server, tool_model_dir, tokenizer, tmp_path):
    from slime_harbor.gateway.session import STEP_LIMIT_CODE

    async def scenario(gateway):
        session = gateway.open_session("gwire", tmp_path / "gw", RUN)
        session.max_calls = 4
        root = gemini_base_url(session)
        method = f"{root}/v1beta/models/{GEMINI_MODEL}"
        body = gemini_body([{"role": "user", "parts": [{"text": TASK}]}])
        out: dict = {"count": []}
        async with httpx.AsyncClient(timeout=120) as http:
            async def count(payload):  # a side call: no session needed, nothing recorded, not a step
                response = await http.post(f"{gateway.base_url}/v1beta/models/{GEMINI_MODEL}:countTokens",
                                           json=payload, headers={"x-goog-api-key": session.api_key})
                out["count"].append((response.status_code, response.json(), session.stats["calls"]))

            await count({"contents": body["contents"]})
            await count(body)
            await count({"generateContentRequest": {"model": f"models/{GEMINI_MODEL}", **body}})
            async with http.stream("POST", method + ":streamGenerateContent?alt=sse", json=body) as response:
                out["stream_type"] = response.headers["content-type"]
                out["lines"] = [line async for line in response.aiter_lines() if line]
            out["array"] = (await http.post(method + ":streamGenerateContent", json=body)).json()
            await count(body)
            out["length"] = (await http.post(method + ":generateContent", json={
                **body, "generationConfig": {"maxOutputTokens": 3}})).json()
            out["stop"] = (await http.post(method + ":generateContent", json={
                **body, "generationConfig": {"stopSequences": ["list"]}})).json()
            await count(body)
            out["models"] = (await http.get(root + "/v1beta/models")).json()
            out["model"] = (await http.get(method)).json()
            bad = {
                "not json": dict(content=b"{nope"),
                "no contents": dict(json={"contents": []}),
                "image part": dict(json={"contents": [{"role": "user", "parts": [
                    {"inlineData": {"mimeType": "image/png", "data": "AAAA"}}]}]}),
                "bad role": dict(json={"contents": [{"role": "tool", "parts": [{"text": "hi"}]}]}),
                "bad maxOutputTokens": dict(json={**body, "generationConfig": {"maxOutputTokens": 0}}),
                "two candidates": dict(json={**body, "generationConfig": {"candidateCount": 2}}),
            }
            out["bad"] = {name: await http.post(method + ":generateContent", **kwargs) for name, kwargs in bad.items()}
            out["bad"]["unknown method"] = await http.post(method + ":embedContent", json=body)
            out["bad"]["unknown session"] = await http.post(
                f"{gateway.base_url}/v1beta/models/{GEMINI_MODEL}:generateContent", json=body,
                headers={"x-goog-api-key": "nobody"})
            out["refused"] = await http.post(method + ":generateContent", json=body)  # the 5th step
            async with http.stream("POST", method + ":streamGenerateContent?alt=sse", json=body) as response:
                out["refused_stream"] = (response.status_code, json.loads(await response.aread()))
            await count(body)  # still served after the limit
        await gateway.close_session("gwire")
        return session, out

    (session, out), _ = run_with_gateway(tool_server, tool_model_dir, scenario)
    n_prompt = len(chat_prompt(tokenizer))
    bare = tokenizer.apply_chat_template([{"role": "user", "content": TASK}], add_generation_prompt=True,
                                         tokenize=False)  # contents alone: no system, no tools
    assert out["count"][0] == (200, {"totalTokens": len(tokenizer.encode(bare, add_special_tokens=False))}, 0)
    assert [c[:2] for c in out["count"][1:]] == [(200, {"totalTokens": n_prompt})] * 5
    assert [c[2] for c in out["count"]] == [0, 0, 0, 2, 4, 4]  # sampled calls only

    assert out["stream_type"].startswith("text/event-stream")
    chunks = gemini_sse(out["lines"])
    assert [list(c["candidates"][0]["content"]["parts"][0]) for c in chunks] == [["text", "thought"], ["text"],
                                                                                ["functionCall"]]
    assert [c["candidates"][0].get("finishReason") for c in chunks] == [None, None, "STOP"]
    assert "usageMetadata" not in chunks[0] and chunks[-1]["usageMetadata"]["promptTokenCount"] == n_prompt
    assert chunks[-1]["usageMetadata"]["candidatesTokenCount"] == len(session.calls[0].completion_ids)
    assert chunks[-1]["candidates"][0]["content"]["parts"][0]["functionCall"]["args"] == {"command": "ls -la",
                                                                                        "timeout": 10}
    assert isinstance(out["array"], list) and len(out["array"]) == 1
    assert out["array"][0]["candidates"][0]["content"]["parts"][1] == {"text": "I will list the files."}
    length = out["length"]
    assert length["candidates"][0]["finishReason"] == "MAX_TOKENS"
    assert length["usageMetadata"]["candidatesTokenCount"] == 3
    stop = out["stop"]["candidates"][0]
    assert stop["finishReason"] == "STOP" and stop["content"]["parts"][1] == {"text": "I will "}
    assert out["models"]["models"][0]["name"] == "models/policy"
    assert out["model"]["name"] == f"models/{GEMINI_MODEL}" and "generateContent" in out["model"][
        "supportedGenerationMethods"]

    for name, response in out["bad"].items():
        status = 404 if name.startswith("unknown") else 400
        assert response.status_code == status, (name, response.text)
        error = response.json()["error"]
        assert error["code"] == status and error["message"], name
        assert error["status"] == ("NOT_FOUND" if status == 404 else "INVALID_ARGUMENT"), name

    for status, payload in [(out["refused"].status_code, out["refused"].json()), out["refused_stream"]]:
        assert status == 400 and payload["error"]["status"] == "INVALID_ARGUMENT"
        assert STEP_LIMIT_CODE in payload["error"]["message"] and "step limit (4 model calls)" in payload["error"][
            "message"]
        assert payload["error"]["details"][0]["reason"] == STEP_LIMIT_CODE
    assert session.exit_reason == "step_limit"
    # the same request four times: identical retries, each superseding the last (one trained)
    assert session.stats["calls"] == session.stats["delivered"] == 4 and session.stats["trained"] == 1
    assert session.stats["superseded_retries"] == 3
    lines = [json.loads(line) for line in (tmp_path / "gw" / "calls.jsonl").read_text().splitlines()]
    assert [line["delivered"] for line in lines if "event" not in line] == [True] * 4


def test_gemini_policy_down_is_unavailable_streamed_or_not(tiny_model_dir, tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"  # a port nobody listens on

    async def scenario(gateway):
        session = gateway.open_session("down-gem", tmp_path / "gw")
        method = f"{gemini_base_url(session)}/v1beta/models/{GEMINI_MODEL}"
        body = {"contents": [{"role": "user", "parts": [{"text": TASK}]}]}
        async with httpx.AsyncClient(timeout=60) as http:
            async with http.stream("POST", method + ":streamGenerateContent?alt=sse", json=body) as response:
                streamed = (response.status_code, [line async for line in response.aiter_lines() if line])
            plain = await http.post(method + ":generateContent", json=body)
        return session, streamed, plain

    (session, streamed, plain), _ = run_with_gateway(dead, tiny_model_dir, scenario)
    assert streamed[0] == 200
    (event,) = gemini_sse(streamed[1])
    assert event["error"]["code"] == 503 and event["error"]["status"] == "UNAVAILABLE"
    assert "unavailable" in event["error"]["message"]
    assert plain.status_code == 503 and plain.json()["error"]["status"] == "UNAVAILABLE"
    assert session.exit_reason == "policy_unavailable" and session.stats["trained"] == 0


# ---- both: faults -----------------------------------------------------------------------------

def test_policy_down_is_each_dialects_error_streamed_or_not(tiny_model_dir, tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"  # a port nobody listens on

    async def scenario(gateway):
        claude_session = gateway.open_session("down-claude", tmp_path / "claude")
        codex_session = gateway.open_session("down-codex", tmp_path / "codex")
        errors = {}
        async with httpx.AsyncClient(timeout=60) as http:  # a stream's first call: the error is in the stream
            for name, url, body in [
                ("anthropic stream", session_root(claude_session) + "/v1/messages",
                 {"max_tokens": 5, "stream": True, "messages": [{"role": "user", "content": TASK}]}),
                ("responses stream", codex_session.openai_base_url() + "/responses", {"input": TASK, "stream": True}),
            ]:
                async with http.stream("POST", url, json=body) as response:
                    assert response.status_code == 200
                    errors[name] = sse_events([line async for line in response.aiter_lines() if line])
        claude = anthropic.AsyncAnthropic(base_url=session_root(claude_session), api_key="k", max_retries=0)
        codex = openai.AsyncOpenAI(base_url=codex_session.openai_base_url(), api_key="k", max_retries=0)
        with pytest.raises(anthropic.APIStatusError) as error:
            await claude.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": TASK}])
        errors["anthropic"] = error.value
        with pytest.raises(openai.APIStatusError) as error:
            await codex.responses.create(model="m", input=TASK)
        errors["responses"] = error.value
        await claude.close()
        await codex.close()
        return [claude_session, codex_session], errors

    (sessions, errors), _ = run_with_gateway(dead, tiny_model_dir, scenario)
    assert [name for name, _ in errors["anthropic stream"]] == ["message_start", "error"]
    assert errors["anthropic stream"][1][1]["error"]["type"] == "api_error"
    assert "unavailable" in errors["anthropic stream"][1][1]["error"]["message"]
    assert [name for name, _ in errors["responses stream"]] == ["response.created", "response.in_progress",
                                                                 "response.failed"]
    assert "unavailable" in errors["responses stream"][-1][1]["response"]["error"]["message"]
    assert errors["anthropic"].status_code == 503 and errors["anthropic"].body["type"] == "error"
    assert "unavailable" in errors["anthropic"].body["error"]["message"]
    assert errors["responses"].status_code == 503 and "unavailable" in errors["responses"].message
    for session in sessions:
        assert session.exit_reason == "policy_unavailable" and session.stats["trained"] == 0
        (sample,) = trial_to_episode(make_result(rewards={"reward": 0.0}), recorded=session).samples
        assert sample.status == SampleStatus.ABORTED and sample.remove_sample


def test_a_stream_the_client_leaves_is_recorded_not_trained(base_server, tiny_model_dir, tmp_path):
    """Claude Code / Codex hanging up mid-stream: the upstream request is aborted, the call is
    recorded as undelivered and nothing is trained; the OpenAI base URL used as an Anthropic base
    URL (/v1/v1/messages) reaches the session too."""
    from slime_harbor.policy.sampling import SamplingParams

    async def scenario(gateway):
        session = gateway.open_session("gone", tmp_path / "gw", SamplingParams(max_new_tokens=2000))
        requests = [
            (session.openai_base_url() + "/v1/messages",
             {"max_tokens": 2000, "stream": True, "messages": [{"role": "user", "content": TASK}]}),
            (session.openai_base_url() + "/responses", {"input": TASK, "stream": True}),
        ]
        async with httpx.AsyncClient(timeout=60) as http:
            for url, body in requests:
                async with http.stream("POST", url, json=body) as response:
                    assert response.status_code == 200
                    async for line in response.aiter_lines():
                        assert "message_start" in line or "response.created" in line
                        break
        for _ in range(600):
            if session.stats["undelivered"] == 2 and not session.in_flight:
                break
            await asyncio.sleep(0.05)
        return session

    session, _ = run_with_gateway(base_server, tiny_model_dir, scenario)
    assert session.stats["calls"] == 2 and session.stats["undelivered"] == 2 and session.stats["trained"] == 0
    assert all(call.error for call in session.calls) and session.rollout_details() == []


def test_streams_keep_alive_while_the_policy_samples(base_server, tiny_model_dir, tmp_path, monkeypatch):
    """A long generation: Anthropic `ping` events and Responses `response.in_progress` events (with
    consecutive sequence numbers) until the reply, which both SDKs still assemble."""
    import slime_harbor.gateway.turn as turn
    from slime_harbor.policy.sampling import SamplingParams

    monkeypatch.setattr(turn, "KEEPALIVE_S", 0.005)

    async def scenario(gateway):
        session = gateway.open_session("alive", tmp_path / "gw", SamplingParams(max_new_tokens=200))
        out = {}
        async with httpx.AsyncClient(timeout=60) as http:
            for name, url, body in [
                ("anthropic", session_root(session) + "/v1/messages",
                 {"max_tokens": 200, "stream": True, "messages": [{"role": "user", "content": TASK}]}),
                ("responses", session.openai_base_url() + "/responses", {"input": "Again: " + TASK, "stream": True}),
            ]:
                async with http.stream("POST", url, json=body) as response:
                    out[name] = sse_events([line async for line in response.aiter_lines() if line])
        claude = anthropic.AsyncAnthropic(base_url=session_root(session), api_key="k", max_retries=0)
        async with claude.messages.stream(model="m", max_tokens=200,
                                          messages=[{"role": "user", "content": "Once more: " + TASK}]) as stream:
            out["sdk"] = await stream.get_final_message()
        await claude.close()
        return session, out

    (session, out), _ = run_with_gateway(base_server, tiny_model_dir, scenario)
    names = [name for name, _ in out["anthropic"]]
    assert names[0] == "message_start" and names[1] == "ping" and names[-1] == "message_stop"
    names = [name for name, _ in out["responses"]]
    assert names[:3] == ["response.created", "response.in_progress", "response.in_progress"]
    assert names[-1] == "response.completed"
    assert [p["sequence_number"] for _, p in out["responses"]] == list(range(len(names)))
    assert out["sdk"].usage.output_tokens == len(session.calls[2].completion_ids) > 0
    assert session.stats["trained"] == 3


def test_a_prompt_over_the_window_is_each_dialects_400_and_one_end(base_server, tiny_model_dir, tmp_path):
    """Every dialect, streamed or not, refuses a prompt over the session's window with a 400 before
    anything is sampled, and the session records why it ended. However the agent then ends its run
    (it says nothing; it exits non-zero, as installed agents do on a 400, which Harbor verifies; it
    raised and the rollout ended its run at the limit, keeping the error; it names the limit
    itself), the converter ends the episode the same: truncated, scored, `context_exceeded`, and
    nothing trained."""
    from slime_harbor.episode import CONTEXT_EXCEEDED

    def requests(session, stream: bool) -> tuple[str, dict]:
        root = session.openai_base_url().removesuffix("/v1")
        user = [{"role": "user", "content": TASK}]
        if session.session_id.startswith("chat"):
            return root + "/v1/chat/completions", {"messages": [{"role": "system", "content": SYSTEM}, *user],
                                                   "tools": TOOLS, "stream": stream}
        if session.session_id.startswith("anthropic"):
            return root + "/v1/messages", {"max_tokens": 5, "system": SYSTEM, "messages": user,
                                           "tools": ANTHROPIC_TOOLS, "stream": stream}
        if session.session_id.startswith("responses"):
            return root + "/v1/responses", {"instructions": SYSTEM, "input": TASK, "tools": RESPONSES_TOOLS,
                                            "stream": stream}
        method = "streamGenerateContent?alt=sse" if stream else "generateContent"
        return f"{gemini_base_url(session)}/v1beta/models/{GEMINI_MODEL}:{method}", \
            gemini_body([{"role": "user", "parts": [{"text": TASK}]}])

    async def scenario(gateway):
        sessions, answers = [], {}
        async with httpx.AsyncClient(timeout=60) as http:
            for dialect in ("chat", "anthropic", "responses", "gemini"):
                for stream in (False, True):
                    session = gateway.open_session(f"{dialect}-{stream}", tmp_path / f"{dialect}-{stream}",
                                                   max_context_len=20)
                    url, body = requests(session, stream)
                    answers[session.session_id] = await http.post(url, json=body)
                    sessions.append(session)
        return sessions, answers

    (sessions, answers), _ = run_with_gateway(base_server, tiny_model_dir, scenario)
    endings = {
        "says nothing": make_result(rewards={"reward": 0.0}, exit_status=None),
        "exits non-zero": make_result(rewards={"reward": 0.0}, exc_type="NonZeroAgentExitCodeError", exit_status=None),
        "names the limit": make_result(rewards={"reward": 0.0}, exit_status=CONTEXT_EXCEEDED),
    }
    endings["raised, its run ended at the limit"] = make_result(rewards={"reward": 0.0}, exit_status=None)
    endings["raised, its run ended at the limit"].agent_result.metadata["agent_error"] = "BadRequestError: 400"
    for session in sessions:
        answer = answers[session.session_id]
        assert answer.status_code == 400 and "maximum context length is 20 tokens" in answer.text, answer.text
        assert session.exit_reason == CONTEXT_EXCEEDED and session.stats["trained"] == 0
        for how, result in endings.items():
            (sample,) = trial_to_episode(result, recorded=session).samples
            assert (sample.status, sample.metadata["exit_status"], sample.metadata["status_reason"], sample.reward) \
                == (SampleStatus.TRUNCATED, CONTEXT_EXCEEDED, CONTEXT_EXCEEDED, 0.0), (session.session_id, how)
            assert sample.tokens == [] and sample.remove_sample, (session.session_id, how)
