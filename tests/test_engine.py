"""The batching sampler: logprobs a trainer can recompute, sampling settings, stops, aborts, weights."""

import threading
import time

import pytest
import torch
from transformers import AutoModelForCausalLM

from slime_harbor.policy.embedded_engine import EngineConfig, SamplingEngine
from slime_harbor.policy.sampling import SamplingParams
from slime_harbor.policy.tiny_model import IM_END, TinyModelConfig, build_tiny_model
from slime_harbor.samples import top_p_offsets_ok


@pytest.fixture
def engine(tiny_model_dir):
    with SamplingEngine.from_pretrained(tiny_model_dir) as engine:
        yield engine


def prompts(tokenizer):
    texts = ["ls", "THOUGHT: I need to look at the files first.", "Task: count the lines\n$ wc -l data.csv", "x" * 70]
    return [tokenizer.encode(t) for t in texts]


def wait_for(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.002)


def recomputed_logprobs(model, generation, temperature):
    """What the trainer computes: log_softmax(model(tokens).logits / T), one forward pass, no padding."""
    tokens = torch.tensor([generation.prompt_ids + generation.token_ids])
    with torch.no_grad():
        logits = model(tokens).logits[0].float()
    logprobs = torch.log_softmax(logits / (temperature or 1.0), dim=-1)
    start = len(generation.prompt_ids) - 1
    targets = torch.tensor(generation.token_ids)
    return logprobs[start : start + len(targets)], targets


def test_batched_logprobs_match_one_forward_pass(engine, model, tokenizer):
    params = SamplingParams(temperature=0.7, top_k=20, top_p=0.8, max_new_tokens=40, ignore_eos=True)
    futures = [engine.submit(p, params) for p in prompts(tokenizer)]
    wait_for(lambda: engine.stats.decode_steps >= 2)
    # A late request joins the running batch: KV caches of different lengths are merged.
    futures.append(engine.submit(tokenizer.encode("echo late joiner"), params))
    generations = [f.result(timeout=60) for f in futures]

    assert engine.stats.prefills == 2
    assert engine.stats.rows_per_decode_step[5] > 0
    for generation in generations:
        assert len(generation.token_ids) == len(generation.logprobs) == 40
        full, targets = recomputed_logprobs(model, generation, params.temperature)
        recomputed = full.gather(-1, targets[:, None])[:, 0]
        assert (recomputed - torch.tensor(generation.logprobs)).abs().mean() < 1e-4
        # Sampling was truncated: every token is among the top 20 and inside the top-0.8 nucleus.
        ranks = (full > full.gather(-1, targets[:, None])).sum(-1)
        assert (ranks < 20).all()
        sorted_probs = full.exp().sort(-1, descending=True).values
        mass_before = sorted_probs.cumsum(-1).gather(-1, ranks[:, None])[:, 0] - recomputed.exp()
        assert (mass_before < 0.8 + 1e-4).all()
        # ...but the reported logprob is the untruncated one: truncation would raise it.
        assert (torch.tensor(generation.logprobs) <= 1e-6).all()
        assert any(lp < -1.0 for lp in generation.logprobs)


def test_temperature_zero_is_greedy_with_raw_logprobs(engine, model, tokenizer):
    generation = engine.generate(
        prompts(tokenizer)[1], SamplingParams(temperature=0, max_new_tokens=20, ignore_eos=True)
    )
    full, targets = recomputed_logprobs(model, generation, 0)
    assert targets.tolist() == full.argmax(-1).tolist()
    assert torch.allclose(full.gather(-1, targets[:, None])[:, 0], torch.tensor(generation.logprobs), atol=1e-4)


def test_high_temperature_logprobs_use_scaled_logits(engine, model, tokenizer):
    generation = engine.generate(
        prompts(tokenizer)[2], SamplingParams(temperature=2.0, max_new_tokens=20, ignore_eos=True)
    )
    scaled, targets = recomputed_logprobs(model, generation, 2.0)
    unscaled, _ = recomputed_logprobs(model, generation, 1.0)
    reported = torch.tensor(generation.logprobs)
    assert (scaled.gather(-1, targets[:, None])[:, 0] - reported).abs().mean() < 1e-4
    assert (unscaled.gather(-1, targets[:, None])[:, 0] - reported).abs().mean() > 0.1


def test_seed_fixes_the_sample_whatever_shares_the_batch(engine, tokenizer):
    prompt = prompts(tokenizer)[1]
    seeded = SamplingParams(temperature=1.0, max_new_tokens=30, ignore_eos=True, sampling_seed=1234)
    alone = engine.generate(prompt, seeded)
    crowd = [engine.submit(p, SamplingParams(max_new_tokens=30, ignore_eos=True)) for p in prompts(tokenizer)]
    batched = engine.submit(prompt, seeded)
    assert batched.result(timeout=60).token_ids == alone.token_ids
    unseeded = [f.result(timeout=60).token_ids for f in crowd]
    assert (
        engine.generate(prompt, SamplingParams(max_new_tokens=30, ignore_eos=True, sampling_seed=99)).token_ids
        != alone.token_ids
    )
    assert len({tuple(ids) for ids in unseeded}) == len(unseeded)


def test_stop_token_is_kept_in_ids_and_trimmed_from_text(engine, tokenizer):
    prompt = prompts(tokenizer)[2]
    greedy = engine.generate(prompt, SamplingParams(temperature=0, max_new_tokens=10, ignore_eos=True)).token_ids
    stop_id = greedy[3]
    cut = greedy.index(stop_id) + 1
    params = SamplingParams(temperature=0, max_new_tokens=10, stop_token_ids=[stop_id])
    generation = engine.generate(prompt, params)
    assert generation.token_ids == greedy[:cut]
    assert (generation.finish_reason, generation.matched_stop) == ("stop", stop_id)
    assert generation.text == tokenizer.decode(greedy[: cut - 1])
    kept = engine.generate(
        prompt, SamplingParams(temperature=0, max_new_tokens=10, stop_token_ids=[stop_id], no_stop_trim=True)
    )
    assert kept.text == tokenizer.decode(greedy[:cut])
    ignored = engine.generate(
        prompt, SamplingParams(temperature=0, max_new_tokens=10, stop_token_ids=[stop_id], ignore_eos=True)
    )
    assert ignored.token_ids == greedy and ignored.finish_reason == "length"


def test_eos_ends_the_turn(tiny_model_dir, tokenizer):
    # Make <|im_end|> the greedy choice: give it a copy of the greedy token's output row, a bit longer.
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    prompt = prompts(tokenizer)[1]
    with torch.no_grad():
        first = int(model(torch.tensor([prompt])).logits[0, -1].argmax())
        head = model.get_output_embeddings().weight.detach().clone()
        assert float(model(torch.tensor([prompt])).logits[0, -1, first]) > 0
        head[tokenizer.eos_token_id] = head[first] * 1.5
        model.lm_head.weight = torch.nn.Parameter(head)  # untied from the input embeddings
    with SamplingEngine(model, tokenizer) as engine:
        generation = engine.generate(prompt, SamplingParams(temperature=0, max_new_tokens=8))
        assert generation.token_ids == [tokenizer.eos_token_id]
        assert (generation.finish_reason, generation.matched_stop) == ("stop", tokenizer.eos_token_id)
        assert generation.text == ""
        raw = engine.generate(
            prompt, SamplingParams(temperature=0, max_new_tokens=8, no_stop_trim=True, skip_special_tokens=False)
        )
        assert raw.text == IM_END
        ignored = engine.generate(prompt, SamplingParams(temperature=0, max_new_tokens=8, ignore_eos=True))
        assert ignored.finish_reason == "length" and len(ignored.token_ids) == 8


def test_stop_string_ends_generation(engine, tokenizer):
    prompt = prompts(tokenizer)[0]
    greedy = dict(temperature=0, max_new_tokens=16, ignore_eos=True, skip_special_tokens=False)
    full = engine.generate(prompt, SamplingParams(**greedy))
    text = tokenizer.decode(full.token_ids)
    # A stop string made of the text of tokens 6 and 7 (checked not to occur earlier).
    stop = tokenizer.decode(full.token_ids[6:8])
    assert stop and stop not in tokenizer.decode(full.token_ids[:6]) + stop[:-1]
    generation = engine.generate(prompt, SamplingParams(**greedy, stop=[stop]))
    assert (generation.finish_reason, generation.matched_stop) == ("stop", stop)
    assert generation.token_ids == full.token_ids[: len(generation.token_ids)]
    assert len(generation.token_ids) <= 8
    assert generation.text == text[: text.index(stop)]
    kept = engine.generate(prompt, SamplingParams(**greedy, stop=stop, no_stop_trim=True))
    assert kept.text == tokenizer.decode(generation.token_ids) and kept.text.endswith(stop)


def test_length_limits(tiny_model_dir, tokenizer):
    prompt = prompts(tokenizer)[1]
    with SamplingEngine.from_pretrained(tiny_model_dir, EngineConfig(context_length=len(prompt) + 5)) as engine:
        generation = engine.generate(prompt, SamplingParams(max_new_tokens=100, ignore_eos=True))
        assert len(generation.token_ids) == 5
        assert (generation.finish_reason, generation.matched_stop) == ("length", None)
        with pytest.raises(ValueError, match="maximum context length"):
            engine.submit(prompt + [1] * 5)
        capped = engine.generate(prompt, SamplingParams(max_new_tokens=3, ignore_eos=True))
        assert len(capped.token_ids) == 3 and capped.finish_reason == "length"
        nothing = engine.generate(prompt, SamplingParams(max_new_tokens=0))
        assert nothing.token_ids == [] and nothing.finish_reason == "length"
        with pytest.raises(ValueError):
            engine.submit([])


def test_abort_running_and_queued_requests(tiny_model_dir, tokenizer):
    endless = SamplingParams(max_new_tokens=10**6, ignore_eos=True)
    with SamplingEngine.from_pretrained(tiny_model_dir, EngineConfig(max_batch_size=1)) as engine:
        running = engine.submit(prompts(tokenizer)[0], endless, rid="running")
        queued = engine.submit(prompts(tokenizer)[1], endless, rid="queued")
        wait_for(lambda: engine.stats.decode_steps >= 3)
        assert engine.num_pending() == (1, 1)
        assert engine.abort("queued")
        aborted = queued.result(timeout=5)
        assert aborted.finish_reason == "abort" and aborted.token_ids == []
        assert engine.abort("running")
        partial = running.result(timeout=5)
        assert partial.finish_reason == "abort"
        assert len(partial.token_ids) == len(partial.logprobs) > 0
        assert not engine.abort("running")  # already gone
        futures = [engine.submit(p, endless) for p in prompts(tokenizer)]
        assert engine.abort_all() == len(futures)
        assert all(f.result(timeout=5).finish_reason == "abort" for f in futures)
        assert engine.num_pending() == (0, 0)


def test_duplicate_rid_is_refused(engine, tokenizer):
    engine.submit(prompts(tokenizer)[0], SamplingParams(max_new_tokens=10**6, ignore_eos=True), rid="same")
    with pytest.raises(ValueError, match="already running"):
        engine.submit(prompts(tokenizer)[0], rid="same")
    engine.abort("same")


def test_update_model_swaps_weights_between_steps(engine, tmp_path, tokenizer):
    prompt = prompts(tokenizer)[1]
    greedy = SamplingParams(temperature=0, max_new_tokens=12, ignore_eos=True)
    before = engine.generate(prompt, greedy)
    other = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path, seed=7), dtype=torch.float32)
    with SamplingEngine(other, tokenizer) as reference:
        expected = reference.generate(prompt, greedy).token_ids
    assert engine.update_model(other) == 1
    after = engine.generate(prompt, greedy)
    assert after.token_ids == expected != before.token_ids
    assert (before.weight_version, after.weight_version) == ("0", "1")


def test_a_weight_update_waits_for_the_calls_running_and_each_call_has_one_version(engine, model, tmp_path, tokenizer):
    """update_model during a call: the call finishes on the old weights (its logprobs are the old
    model's, its version 0), a call submitted meanwhile waits and is sampled by the new weights
    only (version 1); the update returns once the running call is done."""
    other = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path, seed=7), dtype=torch.float32).eval()
    params = SamplingParams(max_new_tokens=150, ignore_eos=True)
    running = engine.submit(prompts(tokenizer)[1], params)
    wait_for(lambda: engine.stats.decode_steps >= 2)
    updated = []
    updater = threading.Thread(target=lambda: updated.append(engine.update_model(other, version=5)))
    updater.start()
    wait_for(lambda: engine._draining)
    waiting = engine.submit(prompts(tokenizer)[2], SamplingParams(max_new_tokens=20, ignore_eos=True))
    first = running.result(timeout=60)
    updater.join(timeout=60)
    second = waiting.result(timeout=60)
    assert updated == [5] and engine.weight_version == 5
    assert (first.weight_version, second.weight_version) == ("0", "5") and len(first.token_ids) == 150
    for generation, sampler in ((first, model), (second, other)):  # each call, every token, by one model
        full, targets = recomputed_logprobs(sampler, generation, 1.0)
        assert (full.gather(-1, targets[:, None])[:, 0] - torch.tensor(generation.logprobs)).abs().max() < 1e-4


def test_pause_generation_aborts_the_calls_in_flight_and_holds_new_ones(engine, tokenizer):
    """SGLang's pause_generation (SLiME's weight updates): in-flight calls end aborted, new ones
    wait until continue_generation."""
    running = engine.submit(prompts(tokenizer)[0], SamplingParams(max_new_tokens=10**6, ignore_eos=True))
    wait_for(lambda: engine.stats.decode_steps >= 2)
    assert engine.pause_generation() == 1
    assert running.result(timeout=10).finish_reason == "abort"
    held = engine.submit(prompts(tokenizer)[1], SamplingParams(max_new_tokens=5, ignore_eos=True))
    time.sleep(0.3)
    assert not held.done() and engine.num_pending() == (0, 1)
    engine.update_model(engine.model)  # nothing running: the update does not wait for the held call
    engine.continue_generation()
    generation = held.result(timeout=10)
    assert len(generation.token_ids) == 5 and generation.weight_version == "1"


def test_paused_engine_makes_no_progress(engine, tokenizer):
    with engine.paused():
        future = engine.submit(prompts(tokenizer)[0], SamplingParams(max_new_tokens=5))
        time.sleep(0.2)
        assert not future.done()
    assert len(future.result(timeout=10).token_ids) > 0


def test_close_aborts_pending_work_and_stops_the_thread(tiny_model_dir, tokenizer):
    before = set(threading.enumerate())
    engine = SamplingEngine.from_pretrained(tiny_model_dir)
    future = engine.submit(prompts(tokenizer)[0], SamplingParams(max_new_tokens=10**6, ignore_eos=True))
    wait_for(lambda: engine.stats.decode_steps >= 2)
    engine.close()
    assert future.result(timeout=1).finish_reason == "abort"
    assert set(threading.enumerate()) <= before
    with pytest.raises(RuntimeError):
        engine.submit(prompts(tokenizer)[0])


def test_a_failing_step_fails_its_requests_and_the_engine_goes_on(engine, tmp_path, tokenizer):
    # Swapping in a model with another KV shape mid-generation breaks the running rows' cache.
    running = engine.submit(prompts(tokenizer)[0], SamplingParams(max_new_tokens=10**6, ignore_eos=True))
    wait_for(lambda: engine.stats.decode_steps >= 2)
    other_shape = build_tiny_model(tmp_path, config=TinyModelConfig(head_dim=16))
    with engine.paused():  # a trainer replacing the module in place, not update_model (which waits for the row)
        engine.model = engine._prepare(AutoModelForCausalLM.from_pretrained(other_shape, dtype=torch.float32))
    with pytest.raises(RuntimeError):
        running.result(timeout=10)
    assert engine.num_pending() == (0, 0)
    assert len(engine.generate(prompts(tokenizer)[1], SamplingParams(max_new_tokens=4), timeout=10).token_ids) > 0


def nucleus(logprobs_row: torch.Tensor, top_p: float) -> set[int]:
    """The top-p set from the trainer's probabilities: most likely first, until the mass before a
    token reaches top_p (the first token always kept)."""
    probs, order = logprobs_row.exp().sort(descending=True)
    before = probs.cumsum(-1) - probs
    return set(order[before < top_p].tolist())


def kept_per_token(generation) -> list[list[int]]:
    """A Generation's flat kept ids, split per token by their offsets (checked as SLiME checks them)."""
    ids, offsets = generation.top_p_token_ids, generation.top_p_token_offsets
    assert ids is not None and top_p_offsets_ok(ids, offsets, len(generation.token_ids))
    return [ids[a:b] for a, b in zip(offsets, offsets[1:])]


def test_top_p_replay_reports_the_kept_ids_and_renormalised_logprobs(engine, model, tokenizer):
    params = SamplingParams(temperature=1.0, top_p=0.5, max_new_tokens=30, ignore_eos=True, return_top_p_token_ids=True)
    generation = engine.generate(prompts(tokenizer)[1], params)
    kept = kept_per_token(generation)
    assert len(kept) == len(generation.token_ids) == 30
    full, targets = recomputed_logprobs(model, generation, 1.0)
    vocab = full.shape[-1]
    for i, (token, ids) in enumerate(zip(generation.token_ids, kept)):
        assert token in ids and len(set(ids)) == len(ids)
        assert 0 < len(ids) < vocab
        assert set(ids) == nucleus(full[i], 0.5)  # exactly the set the sampler drew from
        assert full[i, ids].tolist() == sorted(full[i, ids].tolist(), reverse=True)  # most likely first
    # The logprob is renormalised over the kept set, as the trainer recomputes it under the mask.
    renormalised = [float(full[i, t] - torch.logsumexp(full[i, ids], -1)) for i, (t, ids) in enumerate(zip(targets, kept))]
    assert max(abs(a - b) for a, b in zip(renormalised, generation.logprobs)) < 1e-4
    assert sum(len(ids) for ids in kept) / len(kept) < vocab / 4  # top-p 0.5 really truncates


def test_top_p_replay_with_top_k_greedy_and_no_filter(engine, model, tokenizer):
    prompt = prompts(tokenizer)[2]
    top_k = engine.generate(
        prompt, SamplingParams(top_k=5, max_new_tokens=10, ignore_eos=True, return_top_p_token_ids=True)
    )
    assert all(len(ids) == 5 and t in ids for t, ids in zip(top_k.token_ids, kept_per_token(top_k)))
    greedy = engine.generate(
        prompt, SamplingParams(temperature=0, max_new_tokens=10, ignore_eos=True, return_top_p_token_ids=True)
    )
    assert greedy.top_p_token_ids == greedy.token_ids and greedy.top_p_token_offsets == list(range(11))
    unfiltered = engine.generate(prompt, SamplingParams(max_new_tokens=5, ignore_eos=True, return_top_p_token_ids=True))
    # Nothing truncated: no kept sets, like the patched SGLang.
    assert unfiltered.top_p_token_ids is unfiltered.top_p_token_offsets is None
    not_asked = engine.generate(prompt, SamplingParams(top_p=0.5, max_new_tokens=5, ignore_eos=True))
    assert not_asked.top_p_token_ids is not_asked.top_p_token_offsets is None
