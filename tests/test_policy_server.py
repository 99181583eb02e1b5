"""The policy server over real HTTP: SGLang's /generate as SLiME reads it, aborts, the client,
concurrency, and clean start/stop. (It serves no chat completions: those are the gateway's,
tests/test_gateway.py.)"""

import array
import asyncio
import base64
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
import torch

from helpers.servers import free_port
from slime_harbor.policy.server import EmbeddedPolicyServer

ENDLESS = {"max_new_tokens": 10**6, "ignore_eos": True}


def recomputed(model, prompt_ids, output_ids, temperature):
    """The trainer's logprobs: one forward pass over prompt + output, log_softmax(logits / T)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + output_ids])).logits[0]
    logprobs = torch.log_softmax(logits / temperature, dim=-1)[len(prompt_ids) - 1 : -1]
    return logprobs.gather(-1, torch.tensor(output_ids)[:, None])[:, 0]


def full_logprobs(model, prompt_ids, output_ids, temperature):
    """log_softmax(logits / T) over the whole vocab at each output position: [len(output), V]."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + output_ids])).logits[0]
    return torch.log_softmax(logits / temperature, dim=-1)[len(prompt_ids) - 1 : -1]


def decode_top_p(meta) -> list[list[int]]:
    """meta_info's top_p_token_ids / top_p_token_offsets (base64 int32) -> kept ids per token."""
    ids = array.array("i", base64.b64decode(meta["top_p_token_ids"])).tolist()
    offsets = array.array("i", base64.b64decode(meta["top_p_token_offsets"])).tolist()
    assert offsets[0] == 0 and offsets[-1] == len(ids) and offsets == sorted(offsets)
    return [ids[a:b] for a, b in zip(offsets, offsets[1:])]


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
    # Top-p replay (custom_params): kept ids per token, base64 int32 as SLiME's SGLang patch sends them,
    # and each logprob renormalised over its kept set, as SLiME's trainer recomputes it.
    kept = decode_top_p(meta)
    assert len(kept) == len(output_ids) and all(t in ids and 0 < len(ids) <= 20 for t, ids in zip(output_ids, kept))
    full = full_logprobs(model, prompt_ids, output_ids, 0.8)
    expected = torch.tensor([float(full[i, t] - full[i, ids].logsumexp(-1)) for i, (t, ids) in enumerate(zip(output_ids, kept))])
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


def test_top_p_replay_is_what_slimes_sample_reads(policy_server, tokenizer):
    """top_p 0.5 with return_top_p_token_ids, read back by SLiME's own Sample code: every sampled id
    is in its kept set, the sets are smaller than the vocab, and SLiME accepts the layout after an
    observation (non-trainable tokens get empty sets) and a second turn."""
    types = pytest.importorskip("slime.utils.types", reason="slime is not importable (PYTHONPATH=/work/slime)")
    pytest.importorskip("pybase64", reason="SLiME decodes base64 meta arrays with pybase64")
    params = {"temperature": 1.0, "top_p": 0.5, "max_new_tokens": 16, "ignore_eos": True,
              "custom_params": {"return_top_p_token_ids": True}}
    prompt = tokenizer.encode("THOUGHT: list the files")
    sample = types.Sample(tokens=list(prompt))
    for turn in range(2):
        reply = post(policy_server, "/generate", {"input_ids": sample.tokens, "sampling_params": params,
                                                  "return_logprob": True}).json()
        meta = reply["meta_info"]
        pairs = meta["output_token_logprobs"]
        kept = decode_top_p(meta)
        assert all(p[1] in ids and 0 < len(ids) < len(tokenizer) for p, ids in zip(pairs, kept))
        ids_t, offsets_t = types._extract_rollout_top_p_token_data(meta, expected_num_tokens=len(pairs))
        assert [ids_t[a:b].tolist() for a, b in zip(offsets_t[:-1].tolist(), offsets_t[1:].tolist())] == kept
        sample.append_response_tokens(None, tokens=[p[1] for p in pairs], log_probs=[p[0] for p in pairs],
                                      trainable=True, meta_info=meta, text=reply["text"])
        if turn == 0:
            sample.append_response_tokens(None, tokens=tokenizer.encode("\n<output>a.txt</output>\n"), trainable=False)
    offsets = sample.rollout_top_p_token_offsets.tolist()
    assert len(offsets) == sample.response_length + 1 and offsets[-1] == len(sample.rollout_top_p_token_ids)
    spans = [b - a for a, b in zip(offsets, offsets[1:])]
    assert [n > 0 for n in spans] == [bool(m) for m in sample.loss_mask]  # observation tokens: empty sets
    sample._validate_response_metadata_lengths()


def test_without_top_p_replay_meta_info_has_no_kept_ids(policy_server):
    for params in ({"top_p": 0.5}, {"custom_params": {"return_top_p_token_ids": True}}):  # not asked; no filter
        meta = post(policy_server, "/generate", {"input_ids": [5, 6, 7], "return_logprob": True,
                                                 "sampling_params": {"max_new_tokens": 4, **params}}).json()["meta_info"]
        assert "top_p_token_ids" not in meta and "top_p_token_offsets" not in meta


async def _seeded_alone_and_in_a_crowd(url, prompt, seeded):
    async with httpx.AsyncClient(timeout=60) as client:
        async def generate(params, rid):
            body = {"input_ids": prompt, "sampling_params": params, "return_logprob": True, "rid": rid}
            return (await client.post(url + "/generate", json=body)).json()["meta_info"]["output_token_logprobs"]

        alone = await generate(seeded, "alone")
        crowd = [asyncio.create_task(generate({**seeded, "sampling_seed": None}, f"crowd-{i}")) for i in range(4)]
        while (await client.get(url + "/v1/loads")).json()["num_running_reqs"] < 4:
            await asyncio.sleep(0.005)
        batched = await generate(seeded, "batched")  # joins a running batch of 4 unseeded rows
        return alone, batched, await asyncio.gather(*crowd)


def test_sampling_seed_fixes_tokens_and_logprobs_alone_or_batched(tiny_model_dir, tokenizer):
    seeded = {"temperature": 1.0, "top_p": 0.9, "max_new_tokens": 24, "ignore_eos": True, "sampling_seed": 42,
              "custom_params": {"return_top_p_token_ids": True}}
    with EmbeddedPolicyServer(tiny_model_dir) as server:
        prompt = tokenizer.encode("Task: count the lines")
        alone, batched, crowd = asyncio.run(_seeded_alone_and_in_a_crowd(server.url, prompt, seeded))
        assert server.engine.stats.max_rows_per_step >= 5
        assert [p[1] for p in batched] == [p[1] for p in alone]
        assert max(abs(a[0] - b[0]) for a, b in zip(alone, batched)) < 1e-4
        assert len({tuple(p[1] for p in c) for c in crowd}) == 4  # unseeded requests stay random
        other_seed = post(server.url, "/generate", {"input_ids": prompt, "return_logprob": True,
                                                    "sampling_params": {**seeded, "sampling_seed": 43}}).json()
        assert other_seed["output_ids"] != [p[1] for p in alone]


def test_slimes_sampling_params_and_routing_header(policy_server, tokenizer):
    """Exactly what SLiME's generate sends, routing header included; the text follows SGLang:
    special tokens kept or skipped, stop string / stop token kept (no_stop_trim) or trimmed."""
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    greedy = {"temperature": 0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 12, "stop": None,
              "stop_token_ids": None, "skip_special_tokens": False, "no_stop_trim": True,
              "spaces_between_special_tokens": False, "ignore_eos": True}
    headers = {"X-SMG-Routing-Key": "session-1234"}

    def generate(**overrides):
        reply = httpx.post(policy_server + "/generate", headers=headers, timeout=60,
                           json={"input_ids": prompt_ids, "sampling_params": {**greedy, **overrides}, "return_logprob": True})
        assert reply.status_code == 200, reply.text
        return reply.json()

    full = generate()
    ids = full["output_ids"]
    assert full["text"] == tokenizer.decode(ids, skip_special_tokens=False, spaces_between_special_tokens=False)
    # (skip_special_tokens=True is test_engine's test_eos_ends_the_turn: this model emits no special
    # token greedily here. spaces_between_special_tokens changes nothing for a fast tokenizer, as in SGLang.)
    # stop_token_ids: ends on that token, kept in the ids; no_stop_trim keeps it in the text too.
    stop_id = ids[3]
    by_token = generate(stop_token_ids=[stop_id], ignore_eos=False)
    assert by_token["output_ids"] == ids[: ids.index(stop_id) + 1]
    assert by_token["text"] == tokenizer.decode(by_token["output_ids"], skip_special_tokens=False)
    trimmed = generate(stop_token_ids=[stop_id], ignore_eos=False, no_stop_trim=False)
    assert trimmed["text"] == tokenizer.decode(by_token["output_ids"][:-1], skip_special_tokens=False)
    # stop strings: the same, by text.
    stop = tokenizer.decode(ids[5:7], skip_special_tokens=False)
    by_string = generate(stop=[stop])
    assert by_string["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert by_string["text"].endswith(stop) and stop not in generate(stop=[stop], no_stop_trim=False)["text"]


async def _client_turns(url, params, routing_key):
    from slime_harbor.policy.client import PolicyClient

    client = PolicyClient(url)
    try:
        return [await client.generate([5, 6, 7], params, routing_key=routing_key) for _ in range(2)]
    finally:
        await client.aclose()


def test_client_passes_seed_top_p_and_routing_key(policy_server):
    from slime_harbor.policy.sampling import SamplingParams

    params = SamplingParams(top_p=0.6, max_new_tokens=10, sampling_seed=5, return_top_p_token_ids=True,
                            stop_token_ids=[3])
    first, second = asyncio.run(_client_turns(policy_server, params, "session-1"))
    assert first.token_ids == second.token_ids and first.logprobs == pytest.approx(second.logprobs, abs=1e-5)
    ids, offsets = first.top_p_token_ids, first.top_p_token_offsets
    assert len(offsets) == len(first.token_ids) + 1 and offsets[0] == 0 and offsets[-1] == len(ids)
    assert all(t in ids[a:b] for t, a, b in zip(first.token_ids, offsets, offsets[1:]))
    assert 3 not in first.token_ids[:-1]  # stop_token_ids reached the server
    plain = asyncio.run(_client_turns(policy_server, SamplingParams(max_new_tokens=4), None))[0]
    assert plain.top_p_token_ids is None and plain.top_p_token_offsets is None


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
    assert aborted["meta_info"]["finish_reason"] == {"type": "abort", "message": "aborted by request"}  # SGLang's
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
        ({"input_ids": [1, 2], "sampling_params": {"custom_params": 5}}, "custom_params"),
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
    from slime_harbor.policy.embedded_engine import SamplingEngine

    with SamplingEngine.from_pretrained(tiny_model_dir) as engine:
        with EmbeddedPolicyServer(engine=engine) as server:
            assert (
                post(
                    server.url, "/generate", {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}}
                ).status_code
                == 200
            )
        assert len(engine.generate([1, 2], timeout=30).token_ids) > 0  # still the caller's, still open



def test_serve_blocks_until_terminated(tiny_model_dir):
    port = free_port()
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


def test_update_routes_need_the_runs_admin_key(tiny_model_dir, model, tmp_path, monkeypatch, capsys):
    """With an admin key (SLIME_HARBOR_ADMIN_KEY, or train-local's own random one) the routes that swap
    or label the served weights answer 401 without it and 403 to another key: a sandbox or node that
    reaches the port cannot push weights. Sampling stays open; the trainer's push sends the key."""
    from transformers import AutoTokenizer

    from slime_harbor.cli import main
    from slime_harbor.policy.engines.abilities import ADMIN_KEY_VAR, WeightSyncError
    from slime_harbor.policy.server import UPDATE_ROUTES
    from slime_harbor.policy.weights import WeightSync

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    monkeypatch.setenv(ADMIN_KEY_VAR, "sk-run-admin")
    with EmbeddedPolicyServer(tiny_model_dir) as server:  # the key from the environment
        answers = {}
        for path in sorted(UPDATE_ROUTES):
            for who, headers in (("none", {}), ("other", {"Authorization": "Bearer sk-sandbox"})):
                answers[path, who] = httpx.post(server.url + path, json={}, headers=headers).status_code
        assert answers == {(p, who): {"none": 401, "other": 403}[who] for p in UPDATE_ROUTES for who in ("none", "other")}
        assert httpx.post(server.url + "/generate", json={"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}},
                          timeout=60).status_code == 200
        assert WeightSync(server.url, "disk", tmp_path / "pushed").push(model, tokenizer, 1) is True
        assert server.engine.weight_version == 1
        monkeypatch.delenv(ADMIN_KEY_VAR)  # a caller without the key: refused, the weights stay
        with pytest.raises(WeightSyncError, match="HTTP 401"):
            WeightSync(server.url, "disk", tmp_path / "pushed2").push(model, tokenizer, 2)
        assert server.engine.weight_version == 1

    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:  # beyond loopback without a key: refused before loading
        main(["serve", "--model", str(tiny_model_dir), "--host", "0.0.0.0", "--port", str(free_port())])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and ADMIN_KEY_VAR in err
