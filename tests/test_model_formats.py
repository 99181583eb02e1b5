"""make-model per chat format: each format's tiny checkpoint loads with the Auto classes, records
its format, speaks it through its `renderers` renderer, runs a forward pass on a rendered prompt,
stops where the renderer stops, and names its stand-in architecture where it has one."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from slime_harbor.policy.chat_formats import CHECKPOINT_RECORD, FORMATS, choose_renderer
from slime_harbor.policy.format_tokenizers import harmony_offline
from slime_harbor.policy.tiny_model import ARCHITECTURES, build_tiny_model, ensure_tiny_model

TOOLS = [{"type": "function", "function": {
    "name": "bash", "description": "Run a command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
PROMPT = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "List files."}]
# Kimi K2 writes a call's id as functions.NAME:INDEX and parses the name from it.
CALL = {"role": "assistant", "content": "", "reasoning_content": "need ls", "tool_calls": [
    {"id": "functions.bash:0", "type": "function", "function": {"name": "bash", "arguments": {"command": "ls -la"}}}]}

# The real model_type of each stand-in (the others are built as their family's own architecture).
STAND_INS = {"deepseek-v4": "deepseek_v4", "kimi-k2": "kimi_k2"}
OWN_ARCHITECTURE = {"qwen3": "Qwen3ForCausalLM", "qwen3.5": "Qwen3_5ForCausalLM", "qwen3.6": "Qwen3_5MoeForCausalLM",
                    "glm-4.5": "Glm4MoeForCausalLM", "glm-5": "GlmMoeDsaForCausalLM",
                    "deepseek-v3": "DeepseekV3ForCausalLM", "deepseek-r1": "DeepseekV3ForCausalLM",
                    "gpt-oss": "GptOssForCausalLM", "llama-3": "LlamaForCausalLM", "minimax-m2": "MiniMaxM2ForCausalLM",
                    "nemotron-3": "NemotronHForCausalLM"}
# Where the vocabulary is the family's real one: its size and an id we know.
REAL_VOCAB = {"deepseek-v3": (129280, "<｜end▁of▁sentence｜>", 1), "qwen3.5": (248077, "<|im_end|>", 248046),
              "qwen3.6": (248077, "<|im_end|>", 248046), "gpt-oss": (201088, "<|start|>", 200006),
              "llama-3": (128256, "<|eot_id|>", 128009)}


@pytest.fixture(scope="session")
def format_dirs(tmp_path_factory):
    """Every format's checkpoint, built once per session (seed 0)."""
    root = tmp_path_factory.mktemp("formats")
    return {name: build_tiny_model(root / name, seed=0, renderer=name) for name in FORMATS}


def test_every_format_has_a_recipe():
    assert set(ARCHITECTURES) == set(FORMATS)


@pytest.mark.parametrize("name", list(FORMATS))
def test_format_checkpoint_loads_renders_parses_and_runs(format_dirs, name, monkeypatch):
    from renderers import create_renderer
    from renderers.configs import _config_class_for

    directory = format_dirs[name]
    record = json.loads((directory / CHECKPOINT_RECORD).read_text())
    assert (record["renderer"], record["seed"], record["stand_in_for"]) == (name, 0, STAND_INS.get(name))
    assert choose_renderer(directory) == name  # no flag: the record decides

    model = AutoModelForCausalLM.from_pretrained(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    assert model.config.vocab_size == len(tokenizer) == record["vocab_size"]
    config = json.loads((directory / "config.json").read_text())
    if name in STAND_INS:
        assert config["slime_harbor_stand_in_for"] == STAND_INS[name]
    else:
        assert "slime_harbor_stand_in_for" not in config
        assert type(model).__name__ == OWN_ARCHITECTURE[name] == record["architecture"]
    if name in REAL_VOCAB:
        size, token, token_id = REAL_VOCAB[name]
        assert (len(tokenizer), tokenizer.convert_tokens_to_ids(token)) == (size, token_id)

    if name == "gpt-oss":
        monkeypatch.delenv("TIKTOKEN_ENCODINGS_BASE", raising=False)  # restored after the test
        harmony_offline()
    renderer = create_renderer(tokenizer, _config_class_for(name)(thinking_retention="all"))
    prompt = renderer.render_ids(PROMPT, tools=TOOLS, add_generation_prompt=True)
    assert tokenizer.encode(tokenizer.decode(prompt), add_special_tokens=False) == prompt  # the ids are this vocab's
    assert set(renderer.get_stop_token_ids()) <= set(model.generation_config.eos_token_id)

    # A reply with a tool call, as the format writes one (the renderer's own rendering of it).
    history = renderer.render_ids(PROMPT + [CALL], tools=TOOLS)
    shared = next((i for i, (a, b) in enumerate(zip(prompt, history)) if a != b), min(len(prompt), len(history)))
    reply = history[shared:]
    if name == "deepseek-r1":  # R1's history drops reasoning, its generation prompt opens <think>
        reply = tokenizer.encode("need ls</think>", add_special_tokens=False) + reply
    parsed = renderer.parse_response(reply, prompt_ids=prompt, tools=TOOLS)
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("bash", {"command": "ls -la"})]

    with torch.no_grad():
        logits = model(torch.tensor([prompt[-64:] + reply])).logits
    assert logits.shape[-1] == len(tokenizer) and torch.isfinite(logits).all()


def test_format_build_is_deterministic_and_cached_per_format(tmp_path, monkeypatch, format_dirs):
    monkeypatch.setenv("SLIME_HARBOR_CACHE", str(tmp_path / "cache"))
    again = build_tiny_model(tmp_path / "again", seed=0, renderer="glm-5")
    assert {p.name: p.read_bytes() for p in again.iterdir()} == {
        p.name: p.read_bytes() for p in format_dirs["glm-5"].iterdir()}
    cached = ensure_tiny_model(0, renderer="minimax-m2")
    assert "minimax-m2" in cached.name and choose_renderer(cached) == "minimax-m2"
    assert ensure_tiny_model(0, renderer="minimax-m2") == cached and ensure_tiny_model(0) != cached
    with pytest.raises(ValueError, match="no tiny model for chat format"):
        build_tiny_model(tmp_path / "x", renderer="bogus")


def test_make_model_cli_takes_a_renderer(tmp_path, capsys):
    from slime_harbor.cli import main

    main(["make-model", "--out", str(tmp_path / "m"), "--renderer", "kimi-k2"])
    assert capsys.readouterr().out.strip() == str(tmp_path / "m")
    assert choose_renderer(tmp_path / "m") == "kimi-k2"
    with pytest.raises(SystemExit):
        main(["make-model", "--out", str(tmp_path / "n"), "--renderer", "bogus"])
    assert "invalid choice: 'bogus'" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["kimi-k2", "glm-5", "minimax-m2", "llama-3"])
def test_embedded_engine_serves_the_format_architectures(format_dirs, name):
    """The engine's KV cache handling (left-padded merge of a request that joins a running batch)
    on each built architecture: DeepSeek-V3's MLA (keys 48 wide, values 32; kimi-k2 is built as
    it), GLM-4.5's and MiniMax-M2's MoE, Llama. Its logprobs are a plain forward pass's."""
    import time

    from slime_harbor.policy.embedded_engine import EngineConfig, SamplingEngine
    from slime_harbor.policy.sampling import SamplingParams

    model = AutoModelForCausalLM.from_pretrained(format_dirs[name])
    tokenizer = AutoTokenizer.from_pretrained(format_dirs[name])
    prompts = [tokenizer.encode(t, add_special_tokens=False)
               for t in ("THOUGHT: I need to look at the files in the repository first", "ls -la")]
    engine = SamplingEngine(model, tokenizer, EngineConfig(batch_window_s=0))
    try:
        params = SamplingParams(max_new_tokens=80, ignore_eos=True, sampling_seed=7)
        first = engine.submit(prompts[0], params)
        deadline = time.monotonic() + 30
        while engine.stats.decode_steps < 1 and time.monotonic() < deadline:
            time.sleep(0.001)
        with engine.paused():
            assert not first.done()
            second = engine.submit(prompts[1], SamplingParams(max_new_tokens=8, ignore_eos=True, sampling_seed=7))
        generations = [first.result(timeout=60), second.result(timeout=60)]
    finally:
        engine.close()
    assert engine.stats.prefills == 2 and engine.stats.max_rows_per_step == 2  # the second joined the first
    reference = AutoModelForCausalLM.from_pretrained(format_dirs[name])
    for prompt, generation in zip(prompts, generations, strict=True):
        with torch.no_grad():
            logprobs = reference(torch.tensor([prompt + generation.token_ids])).logits[0].log_softmax(-1)
        recomputed = logprobs[len(prompt) - 1:-1].gather(-1, torch.tensor(generation.token_ids)[:, None])[:, 0]
        assert torch.allclose(recomputed, torch.tensor(generation.logprobs), atol=1e-4)
