"""make-model per chat format: each format's tiny checkpoint loads with the Auto classes, records
its format, speaks it through its `renderers` renderer, runs a forward pass on a rendered prompt,
stops where the renderer stops, and names its stand-in architecture where it has one. The hybrid
families' checkpoints carry every layer kind of their architecture, and train-local trains them."""

import json
import math

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


# Every layer kind of each hybrid family's architecture, as its tiny checkpoint's config.json declares
# them: attention and mixer kinds (layer_types; Nemotron-H's hybrid_override_pattern), MLP kinds
# (GLM-5's mlp_layer_types), MoE where the family's experts are in every layer.
LAYER_KINDS = {
    "qwen3.5": {"linear_attention", "full_attention"},
    "qwen3.6": {"linear_attention", "full_attention", "moe"},
    "gpt-oss": {"sliding_attention", "full_attention", "moe"},
    "nemotron-3": {"mamba2", "moe", "attention"},
    "glm-5": {"indexed_attention", "dense", "sparse"},
}
NEMOTRON_H_LAYERS = {"M": "mamba2", "E": "moe", "*": "attention", "-": "mlp"}
# The windows a 40-token sequence crosses: a model that sees past them computes other logits there.
WINDOWS = {"gpt-oss": "sliding_window", "glm-5": "index_topk"}


def declared_layer_kinds(config: dict) -> set[str]:
    if "hybrid_override_pattern" in config:
        return {NEMOTRON_H_LAYERS[c] for c in config["hybrid_override_pattern"]}
    kinds = set(config["layer_types"]) | set(config.get("mlp_layer_types", ()))
    if config.get("num_experts", config.get("num_local_experts", 1)) > 1:
        kinds.add("moe")
    return kinds


@pytest.mark.parametrize("name", list(LAYER_KINDS))
def test_hybrid_checkpoint_has_every_layer_kind_of_its_family_and_runs(format_dirs, name):
    directory = format_dirs[name]
    config = json.loads((directory / "config.json").read_text())
    assert config["model_type"] == ARCHITECTURES[name].model_type
    assert declared_layer_kinds(config) == LAYER_KINDS[name]
    if name in ("qwen3.5", "qwen3.6"):  # SGLang places the full-attention layers by the interval
        interval = config["full_attention_interval"]
        assert config["layer_types"] == ["linear_attention" if (i + 1) % interval else "full_attention"
                                         for i in range(config["num_hidden_layers"])]
    if name == "nemotron-3":  # the family's own keys: SGLang and vLLM refuse transformers 5's layer names
        assert "layers_block_type" not in config and config["num_hidden_layers"] == len(config["hybrid_override_pattern"])

    model = AutoModelForCausalLM.from_pretrained(directory).eval()
    if name == "gpt-oss":
        assert all(layer.self_attn.sinks.numel() == config["num_attention_heads"] for layer in model.model.layers)
    ids = torch.randint(0, config["vocab_size"], (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, 40, config["vocab_size"]) and torch.isfinite(logits).all()
    if name in WINDOWS:
        window = config[WINDOWS[name]]
        assert window <= 8
        wider = AutoModelForCausalLM.from_pretrained(directory, **{WINDOWS[name]: 64}).eval()
        with torch.no_grad():
            seen_all = wider(ids).logits
        assert torch.allclose(logits[0, :window], seen_all[0, :window], atol=1e-5)  # inside the window
        assert not torch.allclose(logits[0, -1], seen_all[0, -1], atol=1e-3)  # past it


@pytest.mark.parametrize("name", list(LAYER_KINDS))
def test_train_local_puts_lora_on_the_attention_of_each_hybrid_and_trains_it(format_dirs, name):
    """train-local's default LoRA targets (q/k/v/o_proj) exist in every hybrid (in its attention
    layers only: gated delta-net and Mamba2 layers name theirs otherwise; GLM-5's MLA has o_proj),
    and one float32 GRPO step on two short samples changes the adapters."""
    from slime_harbor.samples import SampleStatus, TrainingSample
    from slime_harbor.trainers.learner import Policy, make_batch, token_logprobs, train_on_samples
    from slime_harbor.trainers.local_config import LocalTrainConfig

    directory = str(format_dirs[name])
    torch.manual_seed(0)
    cfg = LocalTrainConfig(model=directory, lr=1e-2, device="cpu", updates_per_rollout=1)
    policy = Policy.load(cfg, directory, "cpu")
    adapted = {n.split(".lora_A")[0].rsplit(".", 1)[-1] for n, _ in policy.model.named_parameters() if ".lora_A" in n}
    assert adapted and adapted <= set(cfg.lora_target_modules)
    before = [p.detach().clone() for p in policy.params]
    samples = []
    for index, (response, reward) in enumerate([("ls -la && cat README.md", 1.0), ("echo done", 0.0)]):
        prompt = policy.tokenizer.encode("List the files of the repository, then read its README.", add_special_tokens=False)
        reply = policy.tokenizer.encode(response, add_special_tokens=False)
        s = TrainingSample(tokens=prompt + reply, response_length=len(reply), loss_mask=[1] * len(reply),
                           rollout_log_probs=[0.0] * len(reply), reward=reward, status=SampleStatus.COMPLETED,
                           group_index=0, index=index, rollout_id=index)
        with torch.no_grad():
            s.rollout_log_probs = token_logprobs(policy.model, make_batch([s], [0.0]), 1.0)[0].tolist()
        samples.append(s)
    result = train_on_samples(policy, samples, cfg, "cpu")
    assert result["n_trained_samples"] == 2 and math.isfinite(result["loss"])
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.params))


@pytest.mark.parametrize("name", ["qwen3.5", "qwen3.6"])
def test_trained_vocab_speaks_the_format_as_the_real_tokenizer_does(format_dirs, tmp_path, name):
    """`make-model --trained-vocab` (the demo's checkpoint): a ~2k BPE with Qwen3.5's added tokens, in
    their order and flags. The renderer writes the same text with it as with the real 248k vocabulary,
    parses the same tool call, and the model has the real architecture."""
    from renderers import create_renderer
    from renderers.configs import _config_class_for

    from slime_harbor.cli import main

    main(["make-model", "--out", str(tmp_path / "m"), "--renderer", name, "--trained-vocab"])
    real_tokenizer, small_tokenizer = (AutoTokenizer.from_pretrained(d) for d in (format_dirs[name], tmp_path / "m"))
    record = json.loads((tmp_path / "m" / CHECKPOINT_RECORD).read_text())
    assert record["vocab_size"] == len(small_tokenizer) < 2100 and record["tokenizer"].startswith("trained")
    assert record["architecture"] == OWN_ARCHITECTURE[name] and choose_renderer(tmp_path / "m") == name
    real_added, small_added = (
        [(t.content, t.special) for _, t in sorted(tok.added_tokens_decoder.items())] for tok in (real_tokenizer, small_tokenizer))
    assert small_added == real_added and len(small_added) == 33

    texts, calls = [], []
    for tokenizer in (real_tokenizer, small_tokenizer):
        renderer = create_renderer(tokenizer, _config_class_for(name)(thinking_retention="all"))
        prompt = renderer.render_ids(PROMPT, tools=TOOLS, add_generation_prompt=True)
        history = renderer.render_ids(PROMPT + [CALL], tools=TOOLS)
        texts.append(tokenizer.decode(history))
        calls.append(renderer.parse_response(history[len(prompt):], prompt_ids=prompt, tools=TOOLS).tool_calls)
        assert set(renderer.get_stop_token_ids()) == {tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")}
    assert texts[0] == texts[1] and [(c.name, c.arguments) for c in calls[1]] == [("bash", {"command": "ls -la"})]
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "m").config.vocab_size == len(small_tokenizer)


def test_trained_vocab_is_refused_in_one_line_where_the_format_has_none(tmp_path, capsys):
    from slime_harbor.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["make-model", "--out", str(tmp_path / "m"), "--renderer", "gpt-oss", "--trained-vocab"])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1
    assert "no trained vocabulary for chat format 'gpt-oss' (openai-harmony renders it with o200k's own ids)" in err
