"""The embedded engine on today's architectures: hybrid linear attention (Qwen3.5/3.6, Qwen3-Next),
sliding windows with sinks (gpt-oss), Mamba2 (Nemotron-H), sparse attention with an indexer (GLM-5),
each a tiny random model with every layer kind of the real one. Requests join a running batch and
leave it; every sampled logprob is the trainer's float32 recomputation, before and after a weight
update. An architecture the engine does not know is refused in one line."""

import copy
import time

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from slime_harbor.exits import ConfigError
from slime_harbor.policy import cache_layers
from slime_harbor.policy.embedded_engine import EngineConfig, SamplingEngine
from slime_harbor.policy.sampling import SamplingParams

WINDOW, INDEX_TOPK = 8, 4  # the prompts (5 to 37 tokens) and generations cross both
LINEAR = dict(linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
              linear_num_value_heads=4)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)
HYBRID = ["linear_attention", "full_attention", "linear_attention", "full_attention"]

ARCHITECTURES = {
    "qwen3_5_text": dict(num_hidden_layers=4, layer_types=HYBRID, **LINEAR),
    "qwen3_5_moe_text": dict(num_hidden_layers=4, layer_types=HYBRID, **LINEAR, **MOE),
    "qwen3_next": dict(num_hidden_layers=4, layer_types=HYBRID, **LINEAR, **MOE),
    "gpt_oss": dict(num_hidden_layers=4, sliding_window=WINDOW, num_local_experts=4, num_experts_per_tok=2,
                    layer_types=["sliding_attention", "full_attention"] * 2,
                    rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 8.0,
                                     "original_max_position_embeddings": 64, "beta_fast": 32.0, "beta_slow": 1.0,
                                     "truncate": False}),
    # Mamba2, attention, MoE, Mamba2, MLP; chunk_size 16 so a prompt spans several scan chunks.
    "nemotron_h": dict(layers_block_type=["linear_attention", "full_attention", "moe", "linear_attention", "mlp"],
                       ssm_state_size=16, mamba_num_heads=4, mamba_head_dim=16, n_groups=2, conv_kernel=4,
                       chunk_size=16, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                       moe_shared_expert_intermediate_size=32),
    # A dense layer then MoE ones; layers 1 and 3 reuse the indexer top-k of the layer before.
    "glm_moe_dsa": dict(num_hidden_layers=4, num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=32,
                        qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, index_topk=INDEX_TOPK,
                        index_head_dim=16, index_n_heads=8, n_routed_experts=4, num_experts_per_tok=2,
                        moe_intermediate_size=32, first_k_dense_replace=1,
                        indexer_types=["full", "shared", "full", "shared"]),
    # Attention-only architectures of the served table that no other test builds.
    "qwen2": dict(num_hidden_layers=2),
    "qwen3_moe": dict(num_hidden_layers=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32),
}
# The knob that makes each a kind of its own, and a value that switches it off: the model must differ.
KNOBS = {"gpt_oss": ("sliding_window", 10**4), "glm_moe_dsa": ("index_topk", 10**4)}


def tiny_config(model_type: str, vocab_size: int, **changes):
    extra = {**ARCHITECTURES[model_type], **changes}
    common = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=96, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, max_position_embeddings=512, tie_word_embeddings=False,
                  initializer_range=0.1)
    return AutoConfig.for_model(model_type, **{**common, **extra})


def tiny_model(config, seed=0):
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


@pytest.fixture(scope="module", params=list(ARCHITECTURES))
def arch(request, tokenizer):
    """(model_type, its tiny model): seeded, float32, the tokenizer's vocabulary."""
    config = tiny_config(request.param, len(tokenizer))
    return request.param, tiny_model(config)


def recomputed(model, generation, temperature) -> torch.Tensor:
    """The trainer's logprobs of the sampled tokens: log_softmax(model(ids).logits / T), one pass."""
    ids = generation.prompt_ids + generation.token_ids
    with torch.no_grad():
        logprobs = (model(torch.tensor([ids])).logits[0].float() / temperature).log_softmax(-1)
    start = len(generation.prompt_ids) - 1
    return logprobs[start:-1].gather(-1, torch.tensor(generation.token_ids)[:, None])[:, 0]


def gap(model, generations, temperatures=None) -> float:
    """The largest |sampled logprob - the trainer's| over `generations` (sampled at `temperatures`, default 1)."""
    temperatures = temperatures or [1.0] * len(generations)
    return max(float((recomputed(model, g, t) - torch.tensor(g.logprobs)).abs().max())
               for g, t in zip(generations, temperatures, strict=True))


def prompts(tokenizer, n_tokens):
    text = "THOUGHT: list the files, then count the lines of data.csv and print the total. " * 3
    ids = tokenizer.encode(text)
    return [ids[i:i + n] for i, n in enumerate(n_tokens)]


def wait_for(condition, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.001)


def test_requests_joining_and_leaving_a_running_batch_sample_the_trainers_logprobs(arch, tokenizer):
    model_type, model = arch
    first, late = prompts(tokenizer, [37, 9]), prompts(tokenizer, [22, 5])
    seeded = SamplingParams(max_new_tokens=24, ignore_eos=True, sampling_seed=11)
    with SamplingEngine(model, tokenizer, EngineConfig(batch_window_s=0)) as engine:
        running = [engine.submit(first[0], SamplingParams(max_new_tokens=20, ignore_eos=True)),
                   engine.submit(first[1], SamplingParams(max_new_tokens=6, ignore_eos=True))]
        wait_for(lambda: engine.stats.decode_steps >= 2)
        with engine.paused():  # the two late ones join the rows decoding now, at once
            assert not running[0].done()
            running += [engine.submit(late[0], seeded),
                        engine.submit(late[1], SamplingParams(temperature=0.7, top_k=20, max_new_tokens=12))]
        generations = [f.result(timeout=60) for f in running]
        assert engine.stats.max_rows_per_step >= 3  # the late requests shared decode steps with the first
        alone = engine.generate(late[0], seeded, timeout=60)
    assert alone.token_ids == generations[2].token_ids
    largest = gap(model, generations + [alone], [1.0, 1.0, 1.0, 0.7, 1.0])
    print(f"{model_type}: largest logprob gap {largest:.1e}")  # pytest -s shows the figures
    assert largest < 1e-3
    if model_type in KNOBS:  # the window / top-k really shapes what the model computes on these lengths
        name, off = KNOBS[model_type]
        unlimited = tiny_model(tiny_config(model_type, len(tokenizer), **{name: off}))
        assert gap(unlimited, generations[:1]) > 1e-2


def test_weight_updates_serve_the_new_weights(arch, tokenizer, tmp_path):
    """update_model, then a LoRA adapter beside the base in one batch, then update_weights_from_disk:
    every request is sampled, to the trainer's logprobs, by the weights it was admitted under."""
    from peft import LoraConfig, get_peft_model

    model_type, model = arch
    perturbed = copy.deepcopy(model)
    with torch.no_grad():
        for parameter in perturbed.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    # The local trainer's default targets (LocalTrainConfig.lora_target_modules): peft mixes adapters in
    # one batch only on plain Linear layers, not on MoE experts' parameters.
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                      init_lora_weights=False)
    with_adapter = get_peft_model(copy.deepcopy(perturbed), lora).eval()
    with_adapter.save_pretrained(tmp_path / "adapter")
    model.save_pretrained(tmp_path / "base")
    long, short = prompts(tokenizer, [30, 12])
    params = SamplingParams(max_new_tokens=16, ignore_eos=True, sampling_seed=3)
    with SamplingEngine(model, tokenizer, EngineConfig(batch_window_s=0)) as engine:
        before = engine.generate(long, params, timeout=60)
        assert engine.update_model(copy.deepcopy(perturbed)) == 1
        after = [f.result(timeout=60) for f in [engine.submit(long, params), engine.submit(short, params)]]
        engine.load_lora_adapter("a", str(tmp_path / "adapter"))
        mixed = [f.result(timeout=60) for f in [engine.submit(long, params, lora="a"), engine.submit(short, params)]]
        engine.unload_lora_adapter("a")
        assert engine.update_weights_from_disk(str(tmp_path / "base")) == 2
        back = engine.generate(long, params, timeout=60)
    assert after[0].weight_version == "1" and back.weight_version == "2"
    gaps = [gap(perturbed, after), gap(with_adapter, mixed[:1]), gap(perturbed, mixed[1:]), gap(model, [before, back])]
    print(f"{model_type}: largest logprob gap after weight updates {max(gaps):.1e}")
    assert max(gaps) < 1e-3 and back.token_ids == before.token_ids
    assert gap(model, after[:1]) > 1e-2 and gap(perturbed, mixed[:1]) > 1e-2  # each update changed the model


def test_requests_of_a_recurrent_model_are_prefilled_each_alone(tokenizer):
    """Requests admitted together are prefilled one by one when the model has recurrent layers: a
    bias between the padding mask and the recurrence (Nemotron-H's in_proj with use_bias) would
    carry a left-padded row's padding into its state."""
    model = tiny_model(tiny_config("nemotron_h", len(tokenizer), use_bias=True))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("in_proj.bias"):
                parameter.normal_(0, 0.5)
    with SamplingEngine(model, tokenizer, EngineConfig(batch_window_s=0)) as engine:
        with engine.paused():  # all three are admitted at the same step
            futures = [engine.submit(p, SamplingParams(max_new_tokens=8, ignore_eos=True))
                       for p in prompts(tokenizer, [30, 6, 17])]
        generations = [f.result(timeout=60) for f in futures]
        assert engine.stats.prefills == 3 and engine.stats.max_rows_per_step == 3
    assert gap(model, generations) < 1e-3


def test_an_architecture_the_engine_does_not_serve_is_refused_in_one_line(tmp_path, capsys):
    from slime_harbor.cli import main

    config = AutoConfig.for_model("mamba", vocab_size=64, hidden_size=32, num_hidden_layers=1, state_size=4)
    with pytest.raises(ConfigError, match="does not serve the 'mamba' architecture"):
        SamplingEngine(AutoModelForCausalLM.from_config(config), None)
    config.save_pretrained(tmp_path / "mamba")  # the server refuses it from config.json, before any weight is read
    # Kimi K2's checkpoints name an architecture of remote code, which transformers cannot build.
    (tmp_path / "kimi").mkdir()
    (tmp_path / "kimi" / "config.json").write_text('{"model_type": "kimi_k2"}')
    for name, model_type in (("mamba", "mamba"), ("kimi", "kimi_k2")):
        with pytest.raises(SystemExit):
            main(["serve", "--model", str(tmp_path / name)])
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"does not serve the {model_type!r} architecture" in err
    # A served architecture whose cache holds a kind of layer the engine has no rule for.
    hybrid = AutoConfig.for_model("qwen3", vocab_size=64, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=2, num_key_value_heads=1, layer_types=["hybrid"] * 2)
    with pytest.raises(ConfigError, match="cannot batch the LinearAttentionAndFullAttentionLayer"):
        cache_layers.layer_kinds(hybrid)
