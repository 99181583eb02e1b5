"""The tiny policy: deterministic build, loads like a Qwen3 checkpoint, byte-exact tokenizer."""

import random
import time

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen3ForCausalLM

from slime_harbor.policy.tiny_model import (
    ENDOFTEXT,
    FORMAT_TOKENS,
    IM_END,
    IM_START,
    TinyModelConfig,
    build_tiny_model,
    ensure_tiny_model,
    recipe_hash,
)


def _files(directory):
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_same_seed_gives_identical_files_and_other_seed_other_weights(tmp_path, tiny_model_dir):
    started = time.monotonic()
    again = build_tiny_model(tmp_path / "again", seed=0)
    assert time.monotonic() - started < 10
    assert _files(again) == _files(tiny_model_dir)
    assert {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"} <= set(_files(again))

    other = _files(build_tiny_model(tmp_path / "other", seed=1))
    assert other["model.safetensors"] != _files(again)["model.safetensors"]
    assert other["tokenizer.json"] == _files(again)["tokenizer.json"]  # the tokenizer does not depend on the seed


def test_loads_with_auto_classes_as_a_qwen3_policy(tiny_model_dir, tokenizer):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert isinstance(model, Qwen3ForCausalLM)
    assert isinstance(tokenizer, PreTrainedTokenizerFast)
    assert 2000 <= len(tokenizer) <= 4096
    assert model.config.vocab_size == len(tokenizer)
    assert tokenizer.eos_token == IM_END and tokenizer.pad_token == ENDOFTEXT
    # Qwen3's order: the special tokens, then its tool-call / tool-response / think tokens.
    assert [tokenizer.convert_ids_to_tokens(i) for i in range(len(tokenizer) - 9, len(tokenizer))] == [
        ENDOFTEXT,
        IM_START,
        IM_END,
        "<tool_call>",
        "</tool_call>",
        "<tool_response>",
        "</tool_response>",
        "<think>",
        "</think>",
    ]
    assert set(model.generation_config.eos_token_id) == {tokenizer.eos_token_id, tokenizer.pad_token_id}

    ids = tokenizer("THOUGHT: list the files\n```bash\nls -la\n```", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], len(tokenizer))
    assert torch.isfinite(logits).all()
    # Not a flat distribution: sampling, top-k and top-p all have something to do.
    entropy = -(logits.log_softmax(-1).exp() * logits.log_softmax(-1)).sum(-1)
    assert 0.5 < entropy.mean() < 6.0


def test_agent_text_uses_learned_merges(tokenizer):
    text = "THOUGHT: I will run the tests.\n\n```bash\ngrep -rn import src && python -m pytest -q tests/\n```"
    assert len(tokenizer.encode(text)) < len(text.encode()) / 2


@pytest.mark.parametrize("seed", range(5))
def test_any_text_round_trips_exactly(tokenizer, seed):
    rng = random.Random(seed)
    alphabets = [
        [chr(c) for c in range(0, 0x80)],  # ASCII with control characters
        list("äöüßéè€ñ中文日本語한국어🙂🎉👍🏽\u200b\u00a0\t\r\n "),
        [chr(rng.randrange(0x80, 0x2FFFF)) for _ in range(200)],
    ]
    chars = [c for alphabet in alphabets for c in alphabet if not 0xD800 <= ord(c) <= 0xDFFF]
    text = "".join(rng.choice(chars) for _ in range(300))
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text


def test_special_tokens_are_single_tokens(tokenizer):
    ids = tokenizer.encode(f"{IM_START}user\nhi{IM_END}", add_special_tokens=False)
    assert ids[0] == tokenizer.convert_tokens_to_ids(IM_START)
    assert ids[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(ids, skip_special_tokens=True) == "user\nhi"
    # The format tokens are single tokens too, and (as in Qwen3) not special: decoding keeps them.
    text = "<think>\nhm\n</think>\n\n<tool_call>\n{}\n</tool_call><tool_response>\nx\n</tool_response>"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert set(tokenizer.convert_tokens_to_ids(FORMAT_TOKENS)) <= set(ids)
    assert tokenizer.decode(ids, skip_special_tokens=True) == text


TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run a command.",
                                           "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}]


def test_chat_template_is_qwen3s(tokenizer):
    messages = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "List files."},
        {"role": "assistant", "content": "THOUGHT: ok\n```bash\nls\n```"},
        {"role": "user", "content": "done?"},
    ]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == (
        "<|im_start|>system\nYou are an agent.<|im_end|>\n"
        "<|im_start|>user\nList files.<|im_end|>\n"
        "<|im_start|>assistant\nTHOUGHT: ok\n```bash\nls\n```<|im_end|>\n"
        "<|im_start|>user\ndone?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    without = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert rendered == without + "<|im_start|>assistant\n"
    no_thinking = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                enable_thinking=False)
    assert no_thinking == rendered + "<think>\n\n</think>\n\n"

    # Tools, a tool call with reasoning after the last query, and its result, as Qwen3 renders them.
    turns = [
        {"role": "user", "content": "List files."},
        {"role": "assistant", "content": "Listing.", "reasoning_content": "need ls",
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": {"command": "ls"}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
    ]
    rendered = tokenizer.apply_chat_template(turns, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert rendered.startswith("<|im_start|>system\n# Tools\n\nYou may call one or more functions")
    assert '\n<tools>\n{"type": "function", "function": {"name": "bash"' in rendered
    assert rendered.endswith(
        "<|im_start|>user\nList files.<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nneed ls\n</think>\n\nListing.\n"
        '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\na.txt\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_renderers_qwen3_renders_and_parses_like_the_template(tokenizer):
    """PyPI renderers' Qwen3Renderer (the gateway's) gives the template's exact tokens and parses
    the format back."""
    from renderers import create_renderer
    from renderers.configs import Qwen3RendererConfig

    renderer = create_renderer(tokenizer, Qwen3RendererConfig(thinking_retention="all"))
    turns = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "List files."},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": {"command": "ls"}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
    ]
    template = tokenizer.apply_chat_template(turns, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert renderer.render_ids(turns, tools=TOOLS, add_generation_prompt=True) == tokenizer.encode(
        template, add_special_tokens=False
    )
    reply = tokenizer.encode('<think>\nlook\n</think>\n\nNow cat.\n<tool_call>\n{"name": "bash", '
                             '"arguments": {"command": "cat a.txt"}}\n</tool_call><|im_end|>', add_special_tokens=False)
    parsed = renderer.parse_response(reply)
    assert (parsed.content, parsed.reasoning_content) == ("Now cat.", "look")
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("bash", {"command": "cat a.txt"})]


def test_a_cached_model_is_rebuilt_when_its_recipe_changes(tmp_path, monkeypatch):
    import json

    from slime_harbor.policy import tiny_model

    monkeypatch.setenv("SLIME_HARBOR_CACHE", str(tmp_path))
    built = ensure_tiny_model(0)
    assert recipe_hash() in built.name and json.loads((built / "tiny_model.json").read_text())["recipe"] == recipe_hash()
    stamp = (built / "tiny_model.json").stat().st_mtime_ns
    assert ensure_tiny_model(0) == built and (built / "tiny_model.json").stat().st_mtime_ns == stamp  # reused
    # A stamp from another recipe (or none: a build cut off half-way) means: build again.
    (built / "tiny_model.json").write_text(json.dumps({"recipe": "older"}))
    assert ensure_tiny_model(0) == built
    assert json.loads((built / "tiny_model.json").read_text())["recipe"] == recipe_hash()
    # A recipe change (here the template) gives another fingerprint, hence another cache dir.
    monkeypatch.setattr(tiny_model, "CHAT_TEMPLATE", tiny_model.CHAT_TEMPLATE + " ")
    assert recipe_hash() not in built.name and ensure_tiny_model(0) != built


def test_config_shapes_the_model(tmp_path):
    config = TinyModelConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, max_position_embeddings=512)
    model = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path, config=config))
    assert (model.config.hidden_size, model.config.num_hidden_layers) == (64, 1)
    assert model.config.max_position_embeddings == 512
