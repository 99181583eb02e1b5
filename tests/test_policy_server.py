"""The policy server over real HTTP: SGLang's /generate as SLiME reads it, OpenAI chat as Harbor's
LiteLLM client reads it, aborts, concurrency, and clean start/stop."""

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
import torch

from slime_harbor.policy.server import EmbeddedPolicyServer

ENDLESS = {"max_new_tokens": 10**6, "ignore_eos": True}


def recomputed(model, prompt_ids, output_ids, temperature):
    """The trainer's logprobs: one forward pass over prompt + output, log_softmax(logits / T)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + output_ids])).logits[0]
    logprobs = torch.log_softmax(logits / temperature, dim=-1)[len(prompt_ids) - 1 : -1]
    return logprobs.gather(-1, torch.tensor(output_ids)[:, None])[:, 0]


def post(url, path, body, timeout=60):
    return httpx.post(url + path, json=body, timeout=timeout)


def test_generate_speaks_sglang_as_slime_reads_it(policy_server, tokenizer, model):
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "list files"}], add_generation_prompt=True, tokenize=False
    )
    prompt_ids = tokenizer.encode(rendered, add_special_tokens=False)
    # What slime.rollout.sglang_rollout.generate sends.
    sampling_params = {
        "temperature": 0.8,
        "top_p": 0.9,
        "top_k": 20,
        "max_new_tokens": 24,
        "stop": None,
        "stop_token_ids": None,
        "skip_special_tokens": False,
        "no_stop_trim": True,
        "spaces_between_special_tokens": False,
        "custom_params": {"return_top_p_token_ids": True},
    }
    reply = post(
        policy_server,
        "/generate",
        {"input_ids": prompt_ids, "sampling_params": sampling_params, "return_logprob": True, "rid": "r1"},
    )
    assert reply.status_code == 200, reply.text
    body = reply.json()
    meta = body["meta_info"]
    assert meta["id"] == "r1"
    assert meta["prompt_tokens"] == len(prompt_ids)
    assert meta["finish_reason"]["type"] in ("stop", "length")
    pairs = meta["output_token_logprobs"]
    assert meta["completion_tokens"] == len(pairs) == len(body["output_ids"]) > 0
    assert all(len(p) == 3 and p[2] is None for p in pairs)
    output_ids = [p[1] for p in pairs]
    assert output_ids == body["output_ids"]
    assert body["text"] == tokenizer.decode(output_ids)  # no_stop_trim, special tokens kept
    expected = recomputed(model, prompt_ids, output_ids, 0.8)
    assert (expected - torch.tensor([p[0] for p in pairs])).abs().mean() < 1e-4
    assert isinstance(meta["weight_version"], str)


def test_generate_from_text_and_without_logprobs(policy_server, tokenizer):
    body = post(
        policy_server,
        "/generate",
        {"text": "THOUGHT:", "sampling_params": {"max_new_tokens": 5, **{"ignore_eos": True}}},
    ).json()
    assert "output_token_logprobs" not in body["meta_info"]
    assert body["meta_info"]["prompt_tokens"] == len(tokenizer.encode("THOUGHT:"))
    assert body["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
    assert len(body["output_ids"]) == 5


def test_stop_strings_and_stop_token_ids_over_http(policy_server, tokenizer):
    greedy = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True, "skip_special_tokens": False}
    full = post(policy_server, "/generate", {"text": "ls -la", "sampling_params": greedy}).json()["output_ids"]
    by_token = post(
        policy_server,
        "/generate",
        {"text": "ls -la", "sampling_params": {**greedy, "ignore_eos": False, "stop_token_ids": [full[2]]}},
    ).json()
    cut = full.index(full[2]) + 1
    assert by_token["output_ids"] == full[:cut]
    assert by_token["meta_info"]["finish_reason"] == {"type": "stop", "matched": full[2]}
    stop = tokenizer.decode(full[4:6])
    by_string = post(policy_server, "/generate", {"text": "ls -la", "sampling_params": {**greedy, "stop": stop}}).json()
    assert by_string["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert stop not in by_string["text"]


async def _abort_while_running(url):
    async with httpx.AsyncClient(timeout=60) as client:
        running = asyncio.create_task(
            client.post(
                url + "/generate",
                json={"text": "a", "sampling_params": ENDLESS, "return_logprob": True, "rid": "long-1"},
            )
        )
        others = [
            asyncio.create_task(
                client.post(url + "/generate", json={"text": "b", "sampling_params": ENDLESS, "rid": f"other-{i}"})
            )
            for i in range(2)
        ]
        while (await client.get(url + "/v1/loads")).json()["num_running_reqs"] < 3:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        assert (await client.post(url + "/abort_request", json={"rid": "long-1"})).json() == {"aborted": 1}
        aborted = (await running).json()
        assert not any(task.done() for task in others)
        assert (await client.post(url + "/abort_request", json={"abort_all": True})).json() == {"aborted": 2}
        return aborted, [(await task).json() for task in others]


def test_abort_request_ends_running_generations(policy_server):
    aborted, others = asyncio.run(_abort_while_running(policy_server))
    assert aborted["meta_info"]["finish_reason"]["type"] == "abort"
    assert len(aborted["meta_info"]["output_token_logprobs"]) == len(aborted["output_ids"]) > 0
    assert all(o["meta_info"]["finish_reason"]["type"] == "abort" for o in others)
    assert post(policy_server, "/abort_request", {"rid": "long-1"}).json() == {"aborted": 0}


@pytest.mark.parametrize(
    "body, message",
    [
        ({"input_ids": [1, 2], "sampling_params": {"repetition_penalty": 1.2}}, "repetition_penalty"),
        ({"input_ids": [1, 2], "sampling_params": {"bogus": 1}}, "bogus"),
        ({"input_ids": [1, 2], "sampling_params": {"temperature": -1}}, "temperature"),
        ({"input_ids": [], "sampling_params": {}}, "empty"),
        ({"input_ids": [[1, 2]], "sampling_params": {}}, "batched"),
        ({"input_ids": [10**7]}, "token ids"),
        ({"input_ids": [1], "stream": True}, "stream"),
        ({"sampling_params": {}}, "input_ids"),
    ],
)
def test_bad_generate_requests_get_400(policy_server, body, message):
    reply = post(policy_server, "/generate", body)
    assert reply.status_code == 400
    assert message in reply.json()["error"]["message"]


def test_status_endpoints(policy_server, tiny_model_dir):
    assert httpx.get(policy_server + "/health").status_code == 200
    assert httpx.get(policy_server + "/health_generate", timeout=30).status_code == 200
    models = httpx.get(policy_server + "/v1/models").json()["data"]
    assert [m["id"] for m in models] == [tiny_model_dir.name]
    assert models[0]["max_model_len"] == 32768
    assert httpx.get(policy_server + "/v1/loads").json() == {"num_running_reqs": 0, "num_waiting_reqs": 0}


def test_chat_completions_through_litellm_carry_token_ids_and_logprobs(policy_server, tokenizer, model):
    import litellm

    messages = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Count the files."}]
    response = asyncio.run(
        litellm.acompletion(
            model="hosted_vllm/tiny",
            api_base=policy_server + "/v1",
            messages=messages,
            logprobs=True,
            extra_body={"return_token_ids": True},
            temperature=0.7,
            top_p=0.95,
            max_tokens=16,
        )
    )
    prompt_ids = response.prompt_token_ids
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert prompt_ids == tokenizer.encode(rendered, add_special_tokens=False)
    choice = response.choices[0]
    token_ids = choice.provider_specific_fields["token_ids"]
    logprobs = [entry.logprob for entry in choice.logprobs.content]
    assert len(token_ids) == len(logprobs) == response.usage.completion_tokens > 0
    assert response.usage.prompt_tokens == len(prompt_ids)
    assert (recomputed(model, prompt_ids, token_ids, 0.7) - torch.tensor(logprobs)).abs().mean() < 1e-4
    # Each entry's bytes are exactly its token's bytes: together they spell the output.
    raw = b"".join(bytes(entry.bytes) for entry in choice.logprobs.content)
    assert raw.decode("utf-8", errors="replace") == tokenizer.decode(token_ids, skip_special_tokens=False)
    if choice.finish_reason == "length":
        assert len(token_ids) == 16


def test_chat_honours_stop_max_tokens_and_context_limit(policy_server, tokenizer):
    chat = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0,
        "return_token_ids": True,
    }
    full = post(policy_server, "/v1/chat/completions", {**chat, "max_tokens": 10, "ignore_eos": True}).json()
    assert full["choices"][0]["finish_reason"] == "length"
    assert len(full["choices"][0]["token_ids"]) == full["usage"]["completion_tokens"] == 10
    assert full["choices"][0]["logprobs"] is None  # not asked for
    text = full["choices"][0]["message"]["content"]
    stop = text[5:8]
    stopped = post(policy_server, "/v1/chat/completions", {**chat, "max_tokens": 10, "stop": [stop]}).json()
    assert stopped["choices"][0]["finish_reason"] == "stop"
    assert stopped["choices"][0]["message"]["content"] == text[: text.index(stop)]
    huge = post(
        policy_server, "/v1/chat/completions", {**chat, "messages": [{"role": "user", "content": "ls " * 40000}]}
    )
    assert huge.status_code == 400
    assert "maximum context length" in huge.json()["error"]["message"]


def test_harbor_litellm_collects_rollout_details(policy_server, tokenizer):
    from harbor.llms.lite_llm import LiteLLM

    # Stop at the first greedy token so the call ends with "stop" (Harbor raises on "length").
    first = post(
        policy_server,
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "go"}], "temperature": 0, "max_tokens": 1, "return_token_ids": True},
    )
    stop_id = first.json()["choices"][0]["token_ids"][0]
    llm = LiteLLM(
        model_name="hosted_vllm/tiny-policy",
        api_base=policy_server + "/v1",
        temperature=0.0,
        collect_rollout_details=True,
        model_info={
            "max_input_tokens": 32768,
            "max_output_tokens": 1024,
            "input_cost_per_token": 0.0,
            "output_cost_per_token": 0.0,
        },
        extra_body={"stop_token_ids": [stop_id]},
    )
    response = asyncio.run(llm.call(prompt="go", message_history=[]))
    assert response.completion_token_ids == [stop_id]
    assert len(response.logprobs) == 1 and response.logprobs[0] <= 0
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "go"}], add_generation_prompt=True, tokenize=False
    )
    assert response.prompt_token_ids == tokenizer.encode(rendered, add_special_tokens=False)


async def _concurrent_generates(url, n, max_new_tokens):
    async with httpx.AsyncClient(timeout=120) as client:
        body = {
            "text": "THOUGHT:",
            "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True},
            "return_logprob": True,
        }
        replies = await asyncio.gather(*(client.post(url + "/generate", json=body) for _ in range(n)))
    return [r.json() for r in replies]


def test_concurrent_requests_share_forward_passes(tiny_model_dir):
    with EmbeddedPolicyServer(tiny_model_dir) as server:
        replies = asyncio.run(_concurrent_generates(server.url, 8, 32))
        assert all(len(r["output_ids"]) == 32 for r in replies)
        assert len({tuple(r["output_ids"]) for r in replies}) == 8  # independent samples
        stats = server.engine.stats
        assert stats.max_rows_per_step >= 4
        assert stats.decode_steps < 8 * 31  # batched, not one request after the other


def test_embedded_server_stops_cleanly(tiny_model_dir):
    threads_before = set(threading.enumerate())
    server = EmbeddedPolicyServer(tiny_model_dir, model_name="named")
    assert httpx.get(server.url + "/v1/models").json()["data"][0]["id"] == "named"
    server.stop()
    assert set(threading.enumerate()) <= threads_before
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.url + "/health")


def test_embedded_server_can_serve_a_callers_engine(tiny_model_dir):
    from slime_harbor.policy.engine import SamplingEngine

    with SamplingEngine.from_pretrained(tiny_model_dir) as engine:
        with EmbeddedPolicyServer(engine=engine) as server:
            assert (
                post(
                    server.url, "/generate", {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}}
                ).status_code
                == 200
            )
        assert len(engine.generate([1, 2], timeout=30).output_ids) > 0  # still the caller's, still open


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_blocks_until_terminated(tiny_model_dir):
    port = _free_port()
    code = f"from slime_harbor.policy.server import serve; serve({str(tiny_model_dir)!r}, port={port})"
    process = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ}
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, process.stderr.read().decode()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.1)
        reply = post(f"http://127.0.0.1:{port}", "/generate", {"text": "ls", "sampling_params": {"max_new_tokens": 3}})
        assert reply.status_code == 200
        # uvicorn shuts down gracefully, then re-raises the signal: the usual "killed by SIGTERM".
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) in (0, -signal.SIGTERM)
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{port}/health")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
