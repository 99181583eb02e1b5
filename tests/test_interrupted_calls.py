"""A model call that a weight update interrupts goes on from where it stopped (issue 47).

Against our embedded policy server over HTTP, paused the way SGLang is (`/pause_generation`
aborts the calls in flight with the tokens they had; `/continue_generation`), with real weight
updates from disk between: the client keeps what each call had sampled, continues it from the
prompt plus those tokens, and returns one completion whose tokens each carry the logprob and
version of the weights that sampled them. The engine's own count of decoded tokens says whether
anything was thrown away. The joins a continuation needs (a stop string or a UTF-8 character
across the break) are checked on the tiny model's real tokenizer.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import httpx
import pytest
import torch
from helpers.samples import recompute_logprobs

from slime_harbor.policy.client import PolicyClient, continued, join
from slime_harbor.policy.sampling import Generation, SamplingParams
from slime_harbor.policy.server import EmbeddedPolicyServer
from slime_harbor.policy.tiny_model import build_tiny_model

PROMPT = [71, 127, 102, 1072, 280, 127, 114, 81, 305]
LONG = SamplingParams(max_new_tokens=240, ignore_eos=True, sampling_seed=1234)


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    with EmbeddedPolicyServer(tiny_model_dir) as running:
        yield running


@pytest.fixture(scope="module")
def other_weights(tmp_path_factory):
    """Two more versions of the tiny model (other seeds): far apart in every logprob."""
    root = tmp_path_factory.mktemp("versions")
    return {v: build_tiny_model(root / f"v{v}", seed=100 + v) for v in (1, 2)}


async def decoded(server, rid: str, n: int) -> None:
    """Wait until the engine has sampled at least n tokens of request `rid`."""
    deadline = time.monotonic() + 60
    while True:
        request = server.engine._active.get(rid)
        if request is not None and len(request.token_ids) >= n:
            return
        assert time.monotonic() < deadline, f"request {rid} never reached {n} tokens"
        await asyncio.sleep(0.001)


def pause(url: str, update_to: tuple[int, str] | None = None) -> int:
    """Pause as SGLang's updater does (abort the calls in flight), load new weights if given, continue."""
    aborted = httpx.post(f"{url}/pause_generation", json={"mode": "abort"}).json()["num_aborted_requests"]
    if update_to is not None:
        version, path = update_to
        reply = httpx.post(f"{url}/update_weights_from_disk", timeout=120,
                           json={"model_path": str(path), "weight_version": str(version)})
        assert reply.json()["success"], reply.text
    time.sleep(0.05)  # the client's continuation is waiting in the queue meanwhile
    httpx.post(f"{url}/continue_generation", json={})
    return aborted


def call_with_pauses(server, params: SamplingParams, at: list[int], updates: list, **client_options) -> Generation:
    """One call through PolicyClient, paused after the engine decoded `at[k]` of its tokens, with
    updates[k] (None: no update) loaded during pause k."""
    async def run():
        client = PolicyClient(server.url, reissue_aborted=True, **client_options)
        try:
            call = asyncio.ensure_future(client.generate(PROMPT, params, rid="interrupted"))
            for n, update in zip(at, updates):
                await decoded(server, "interrupted", n)
                assert await asyncio.to_thread(pause, server.url, update) == 1
            return await call
        finally:
            await client.aclose()

    return asyncio.run(run())


@contextlib.contextmanager
def submitted_prompts(server):
    """The prompts the engine is handed meanwhile (its own submit, observed)."""
    prompts, submit = [], server.engine.submit
    server.engine.submit = lambda prompt_ids, *args, **kwargs: prompts.append(list(prompt_ids)) or submit(
        prompt_ids, *args, **kwargs)
    try:
        yield prompts
    finally:
        del server.engine.submit


def uninterrupted(server, params: SamplingParams) -> Generation:
    async def run():
        client = PolicyClient(server.url)
        try:
            return await client.generate(PROMPT, params)
        finally:
            await client.aclose()

    return asyncio.run(run())


def restore(server, tiny_model_dir) -> None:
    """Back to the base weights, version 0."""
    pause(server.url, (0, tiny_model_dir))


def test_a_call_paused_without_an_update_comes_back_as_if_never_paused(server):
    """Same seed, same weights: the continued call holds exactly the tokens and logprobs of the
    call nobody paused (the seed stream carries on by position), the engine decoded no token
    twice, and only the prompt plus the kept tokens were prefilled again."""
    whole = uninterrupted(server, LONG)
    before = server.engine.stats.generated_tokens
    with submitted_prompts(server) as prompts:
        continued_call = call_with_pauses(server, LONG, at=[30, 120], updates=[None, None])
    decoded_now = server.engine.stats.generated_tokens - before
    assert continued_call.token_ids == whole.token_ids and continued_call.logprobs == pytest.approx(whole.logprobs, abs=1e-5)
    assert continued_call.reissued == 2 and continued_call.discarded_tokens == 0 and continued_call.finish_reason == "length"
    assert decoded_now == len(whole.token_ids) == LONG.max_new_tokens  # the engine's own count: nothing decoded twice
    assert continued_call.version_spans == [("0", 0, LONG.max_new_tokens)] and continued_call.interrupted
    # each continuation prefilled the prompt + what was kept (our server caches no prefix)
    assert len(prompts) == 3 and prompts[0] == PROMPT and all(p[:len(PROMPT)] == PROMPT for p in prompts)
    assert len(prompts[1]) >= len(PROMPT) + 30 and len(prompts[2]) >= len(PROMPT) + 120
    assert continued_call.reprefill_tokens == len(prompts[1]) + len(prompts[2])


def test_each_token_keeps_the_logprob_and_version_of_the_weights_that_sampled_it(server, tiny_model_dir,
                                                                                 other_weights):
    """Interrupted twice, with an update each time: one completion of max_new_tokens tokens in
    three spans (versions 0, 1, 2); every token's logprob is its own version's (within 1e-4 of
    that checkpoint's float32 recomputation) and farther from each other version's."""
    from transformers import AutoModelForCausalLM

    try:
        generation = call_with_pauses(server, LONG, at=[40, 100], updates=[(1, other_weights[1]), (2, other_weights[2])])
    finally:
        restore(server, tiny_model_dir)
    assert generation.finish_reason == "length" and len(generation.token_ids) == LONG.max_new_tokens
    assert [v for v, _, _ in generation.version_spans] == ["0", "1", "2"] and generation.weight_version == "0"
    assert generation.discarded_tokens == 0 and generation.interrupted
    dirs = {"0": tiny_model_dir, "1": other_weights[1], "2": other_weights[2]}
    n = len(generation.token_ids)
    recomputed = {v: recompute_logprobs(AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval(),
                                        PROMPT + generation.token_ids, 1.0)[-n:] for v, d in dirs.items()}
    served = torch.tensor(generation.logprobs)
    for version, start, end in generation.version_spans:
        own = (recomputed[version][start:end] - served[start:end]).abs()
        assert own.max().item() < 1e-4, (version, own.max().item())
        for other in dirs.keys() - {version}:
            assert ((recomputed[other][start:end] - served[start:end]).abs() > own).all(), (version, other)


def test_off_it_is_sampled_again_whole_and_what_it_had_is_counted_as_discarded(server, tiny_model_dir, other_weights):
    """--keep-interrupted off: the call is sampled again from its start by the new weights; the
    tokens the engine had decoded before the pause are the call's discarded_tokens, to the token."""
    before = server.engine.stats.generated_tokens
    try:
        generation = call_with_pauses(server, LONG, at=[50], updates=[(1, other_weights[1])], keep_interrupted=False)
    finally:
        restore(server, tiny_model_dir)
    decoded_now = server.engine.stats.generated_tokens - before
    assert generation.version_spans == [("1", 0, LONG.max_new_tokens)] and generation.reissued == 1
    assert generation.discarded_tokens >= 50 and decoded_now == LONG.max_new_tokens + generation.discarded_tokens
    assert generation.reprefill_tokens == len(PROMPT)


def test_top_p_replay_arrays_are_joined(server):
    """With top-p replay, the continued call's kept ids and offsets are those of the call nobody
    paused (offsets shifted past the break), and its logprobs renormalised the same way."""
    params = SamplingParams(max_new_tokens=160, ignore_eos=True, sampling_seed=99, top_p=0.9,
                            return_top_p_token_ids=True)
    whole = uninterrupted(server, params)
    continued_call = call_with_pauses(server, params, at=[60], updates=[None])
    assert continued_call.token_ids == whole.token_ids
    assert continued_call.top_p_token_offsets == whole.top_p_token_offsets
    # the same kept set per token (two ids of equal probability may swap places: a prefill's
    # logits and a decode step's differ in the last bits)
    for ids, offsets in ((continued_call.top_p_token_ids, continued_call.top_p_token_offsets),
                         (whole.top_p_token_ids, whole.top_p_token_offsets)):
        assert len(ids) == offsets[-1]
    sets = [[set(g.top_p_token_ids[a:b]) for a, b in zip(g.top_p_token_offsets, g.top_p_token_offsets[1:])]
            for g in (continued_call, whole)]
    assert sets[0] == sets[1]
    assert continued_call.logprobs == pytest.approx(whole.logprobs, abs=1e-5)


def test_a_continuation_asks_for_what_is_left_of_the_budget_with_the_seed_stream_going_on():
    params = SamplingParams(max_new_tokens=100, sampling_seed=7)
    assert continued(params, 30, "sglang").max_new_tokens == 70
    assert continued(params, 30, "sglang").sampling_seed == 7  # keyed by position on SGLang and ours
    assert continued(params, 30, "openai").sampling_seed not in (7, None)  # vLLM draws in order: a seed of its own
    assert continued(params, 100, "sglang").max_new_tokens == 0


def parts(tokenizer, text: str, split_at: int) -> tuple[list[int], Generation, Generation]:
    ids = tokenizer.encode(text, add_special_tokens=False)
    kept = Generation(token_ids=ids[:split_at], logprobs=[-1.0] * split_at, finish_reason="abort", rid="r",
                      text=tokenizer.decode(ids[:split_at]), version_spans=[("0", 0, split_at)])
    rest = Generation(token_ids=ids[split_at:], logprobs=[-2.0] * (len(ids) - split_at), finish_reason="length",
                      rid="r", text=tokenizer.decode(ids[split_at:]), version_spans=[("1", 0, len(ids) - split_at)])
    return ids, kept, rest


def test_a_stop_string_across_the_break_ends_the_call_there(tokenizer):
    """The server saw only the tokens after the break, so it missed " STOP" begun before it: the
    joined call ends with it (finish stop), the tokens after it dropped."""
    ids, kept, rest = parts(tokenizer, "hello STOP and more words after it", 0)
    stop_end = len(tokenizer.encode("hello STOP", add_special_tokens=False))
    split = stop_end - 2  # " S" "T" kept, "O" "P" sampled after the break
    ids, kept, rest = parts(tokenizer, "hello STOP and more words after it", split)
    client = PolicyClient("http://127.0.0.1:1", tokenizer=tokenizer)
    whole = client._settle_joins(join(kept, rest), SamplingParams(stop=[" STOP"]), breaks=[split])
    assert whole.token_ids == ids[:stop_end] and whole.finish_reason == "stop" and whole.matched_stop == " STOP"
    assert whole.text == "hello STOP" and whole.version_spans == [("0", 0, split), ("1", split, stop_end)]


def test_text_is_decoded_from_the_joined_ids_when_a_character_is_split(tokenizer):
    """'é' is two byte tokens here; a break between them leaves each part's text a replacement
    character, the joined ids decode to 'é'."""
    text = "caf\u00e9 ok"
    ids = tokenizer.encode(text, add_special_tokens=False)
    split = next(i for i in range(1, len(ids)) if "\ufffd" in tokenizer.decode(ids[:i]))
    _, kept, rest = parts(tokenizer, text, split)
    assert "\ufffd" in kept.text + rest.text
    client = PolicyClient("http://127.0.0.1:1", tokenizer=tokenizer)
    assert client._settle_joins(join(kept, rest), SamplingParams(), breaks=[split]).text == text


@pytest.mark.parametrize("pause", ["in_place", "keep"])
def test_pauses_that_decode_on_from_the_old_kv_cache_are_refused(pause, tmp_path):
    """SGLang's in_place and vLLM's keep go on decoding over the old weights' KV cache under the
    new weights: tokens of neither version, whose logprobs no checkpoint gives. Refused in one line."""
    from slime_harbor.exits import ConfigError
    from slime_harbor.policy.weights import WeightSync
    from slime_harbor.trainers.local_config import LocalTrainConfig, check_train_config

    with pytest.raises(ValueError, match=f"pause must be one of abort, retract, wait, got '{pause}'"):
        WeightSync("http://127.0.0.1:1", "disk", tmp_path, pause=pause)
    with pytest.raises(ConfigError, match="KV cache: tokens of neither version") as refused:
        check_train_config(LocalTrainConfig(update_pause=pause))
    assert "\n" not in str(refused.value)
    with pytest.raises(ConfigError, match="keep_interrupted must be on or off"):
        check_train_config(LocalTrainConfig(keep_interrupted="yes"))


def test_the_converter_places_each_calls_spans_on_the_samples_response():
    """Two turns bridged by three observation tokens: the second call's spans move past the first
    call's tokens and the observation; each call's weight_versions entry is its oldest version."""
    from slime_harbor.converter import split_into_segments

    detail = {"prompt_token_ids": [[1, 2], [1, 2, 10, 11, 12, 20, 21, 22]],
              "completion_token_ids": [[10, 11, 12], [30, 31, 32, 33]],
              "logprobs": [[-1.0] * 3, [-2.0] * 4],
              "extra": {"version_spans": [[("0", 0, 3)], [("0", 0, 1), ("1", 1, 4)]]}}
    (segment,), drift = split_into_segments(detail)
    assert drift == 0 and segment.loss_mask == [1, 1, 1, 0, 0, 0, 1, 1, 1, 1]
    assert segment.version_spans == [[("0", 0, 3)], [("0", 6, 7), ("1", 7, 10)]]


def test_slimes_mask_offpolicy_masks_what_a_call_sampled_before_its_last_update():
    """--mask-offpolicy-in-partial-rollout: only a call's last version trains; the earlier tokens
    get loss_mask 0, logprob 0.0 and an empty top-p set, and the sample stays well formed."""
    from slime_harbor.samples import SampleStatus, TrainingSample, mask_older_tokens

    sample = TrainingSample(tokens=[1, 10, 11, 12, 5, 30, 31], response_length=6, loss_mask=[1, 1, 1, 0, 1, 1],
                            rollout_log_probs=[-1.0, -1.0, -1.0, 0.0, -2.0, -2.0], reward=1.0,
                            status=SampleStatus.COMPLETED, rollout_top_p_token_ids=[10, 9, 11, 12, 30, 31, 8],
                            rollout_top_p_token_offsets=[0, 2, 3, 4, 4, 5, 7],
                            metadata={"version_spans": [[("0", 0, 2), ("1", 2, 3)], [("1", 4, 6)]]})
    assert mask_older_tokens(sample) == 2
    assert sample.loss_mask == [0, 0, 1, 0, 1, 1] and sample.rollout_log_probs == [0.0, 0.0, -1.0, 0.0, -2.0, -2.0]
    assert sample.rollout_top_p_token_ids == [12, 30, 31, 8] and sample.rollout_top_p_token_offsets == [0, 0, 0, 1, 1, 2, 4]
    sample.check()


def test_a_steps_record_counts_what_updates_did_to_its_episodes():
    """metrics.json's weight_sync figures sum the episodes' counts, and the tokens of the
    episodes masked as stale; the step line says them."""
    from helpers.samples import make_episode

    from slime_harbor.trainers.training_run import step_line, weight_sync_figures

    fresh = make_episode(metadata={"weight_sync": {"interrupted_calls": 2, "discarded_tokens": 0, "reprefill_tokens": 40}})
    stale = make_episode(index=1, metadata={"weight_sync": {"interrupted_calls": 1, "discarded_tokens": 7,
                                                           "reprefill_tokens": 9}})
    stale.masked_by = "stale"
    figures = weight_sync_figures([fresh, stale])
    assert figures == {"weight_sync/interrupted_calls": 3, "weight_sync/discarded_tokens": 7,
                       "weight_sync/reprefill_tokens": 49, "weight_sync/stale_masked_tokens": 2}
    record = {"step": 1, "skipped": "no samples", "reward_mean": None, "pass_rate": None, "aborted": 0, "n_samples": 2,
              "timings": {"rollout_s": 1.0, "train_s": 1.0}, **figures}
    assert "interrupted calls 3, tokens discarded 7, prefilled again 49" in step_line(record)


def test_sglangs_version_spans_are_read_as_it_sends_them():
    """meta_info.weight_versions as SGLang 0.5.23 writes it (dicts; an empty span where a version
    changed before the first token), else the one weight_version; a malformed list is not read."""
    from slime_harbor.policy.client import version_spans

    meta = {"weight_versions": [{"version": "1", "start": 0, "end": 0}, {"version": "2", "start": 0, "end": 3},
                                {"version": "3", "start": 3, "end": 5}], "weight_version": "3"}
    assert version_spans(meta, 5) == [("2", 0, 3), ("3", 3, 5)]
    assert version_spans({"weight_versions": [["x"]], "weight_version": "3"}, 5) == [("3", 0, 5)]
    assert version_spans({"weight_version": "0"}, 0) == [] and version_spans({}, 4) is None
