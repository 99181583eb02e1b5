"""A tiny Qwen3-architecture policy, built offline, for tests and CPU demos.

No weights can be downloaded here, so the policy the rest of slime-harbor trains and serves in
tests is made from scratch: a byte-level BPE tokenizer trained on the small corpus below (shell,
Python, task text and the agents' answer formats) plus a randomly initialised Qwen3ForCausalLM.
It is saved in Hugging Face format, so everything that loads a real Qwen3 checkpoint
(AutoTokenizer, AutoModelForCausalLM, the chat template) loads this one the same way.

The model knows nothing; what matters is that it is a real causal LM with a real tokenizer, so
token ids, logprobs, chat rendering and weight updates are exercised exactly as with Qwen3.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from slime_harbor.cache import cache_dir
from slime_harbor.policy.format_tokenizers import CORPUS, WORDS, training_lines

# Qwen's special tokens. eos is <|im_end|> (the end of an assistant turn), pad is <|endoftext|>.
ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END]
# Qwen3's added (non-special) tokens of its tool-call and reasoning format, in Qwen3's vocab order
# (<tool_call> 151657 ... </think> 151668): single tokens, kept when decoding with
# skip_special_tokens, so renderers' Qwen3Renderer and tool-call parsers work on this tokenizer.
TOOL_CALL, TOOL_CALL_END = "<tool_call>", "</tool_call>"
TOOL_RESPONSE, TOOL_RESPONSE_END = "<tool_response>", "</tool_response>"
THINK, THINK_END = "<think>", "</think>"
FORMAT_TOKENS = [TOOL_CALL, TOOL_CALL_END, TOOL_RESPONSE, TOOL_RESPONSE_END, THINK, THINK_END]

# Qwen3's own chat template (as shipped in Qwen/Qwen3-* tokenizer_config.json): tools in the system
# turn, <tool_call> JSON in assistant turns, tool results as <tool_response> in a user turn, <think>
# blocks after the last user query, enable_thinking=False prefilling an empty think block.
CHAT_TEMPLATE = QWEN3_CHAT_TEMPLATE = r'''{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}'''

# Bump when the build changes in a way the fields of TinyModelConfig do not show (corpus, tokens,
# template, init): cached models built by an older recipe are then rebuilt (ensure_tiny_model).
RECIPE_VERSION = 2


@dataclass
class TinyModelConfig:
    """Shape of the tiny policy. Defaults build in about a second and run fast on 2 CPU cores."""

    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2  # grouped-query attention, as in Qwen3
    head_dim: int = 32
    bpe_vocab_size: int = 2048  # target size of the trained BPE vocab (the corpus may give fewer)
    max_position_embeddings: int = 32768  # context length the server enforces
    initializer_range: float = 0.3  # next-token entropy ~3.5 nats: varied samples, top-p that bites
    trained_vocab: bool = False
    """A BPE trained here with the family's added tokens where its real tokenizer ships too
    (format_tokenizers.TRAINED_ON_REQUEST: qwen3.5 / qwen3.6). A ~2k vocabulary, where the real
    248k makes the LM head ~95% of a CPU training step; the demo builds its checkpoint so. Formats
    with no real tokenizer here (qwen3, GLM, Kimi, ...) are trained either way."""


def build_tokenizer(config: TinyModelConfig | None = None):
    """Train the byte-level BPE tokenizer and wrap it as a PreTrainedTokenizerFast."""
    config = config or TinyModelConfig()
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    # Byte-level: every byte string has a token sequence, and decoding gives the bytes back.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=config.bpe_vocab_size,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(training_lines(), trainer=trainer)
    # Added after training so they sit at the end of the vocab, as in Qwen: the special tokens,
    # then the format tokens as plain added tokens (Qwen3 marks them special=False).
    tokenizer.add_special_tokens(SPECIAL_TOKENS)
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in FORMAT_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        chat_template=CHAT_TEMPLATE,
        model_max_length=config.max_position_embeddings,
        clean_up_tokenization_spaces=False,
    )


# Each chat format's tiny checkpoint: the transformers architecture it is built as, its family's own
# with one layer of every kind the family has (linear attention, Mamba2, sliding windows, a sparse-
# attention indexer, MoE), or a stand-in, named with the real model_type: DeepSeek-V4 is built as
# DeepSeek-V3 (its own deepseek_v4 not yet), and Kimi K2's checkpoints are DeepseekV3ForCausalLM
# under their own model_type (remote code), so its stand-in is that very architecture.
# Qwen3.5 and 3.6 are their text-only types (qwen3_5_text, qwen3_5_moe_text): the
# multimodal qwen3_5 / qwen3_5_moe load through AutoModelForCausalLM as these text models, and save
# back as them, so a trained checkpoint would change its type; the vision tower would be weights
# nothing here runs.
@dataclass(frozen=True)
class Architecture:
    model_type: str
    stand_in_for: str | None = None
    tied: bool = True
    """The LM head is the embedding (tie_word_embeddings), as the family's small checkpoints have it.
    GLM-4.5/5, DeepSeek-V3 (Kimi K2), MiniMax-M2, Qwen3.6-35B-A3B, gpt-oss and Nemotron 3 ship untied
    heads, and SGLang's and vLLM's glm4_moe never load a tied one: they served a head never loaded
    (logprobs 21-24 nats from the trainer's, bench/model_formats.py)."""


ARCHITECTURES: dict[str, Architecture] = {
    "qwen3": Architecture("qwen3"),
    "qwen3.5": Architecture("qwen3_5_text"),
    "qwen3.6": Architecture("qwen3_5_moe_text", tied=False),
    "glm-4.5": Architecture("glm4_moe", tied=False),
    "glm-5": Architecture("glm_moe_dsa", tied=False),
    "deepseek-v3": Architecture("deepseek_v3", tied=False),
    "deepseek-r1": Architecture("deepseek_v3", tied=False),
    "deepseek-v4": Architecture("deepseek_v3", stand_in_for="deepseek_v4", tied=False),
    "kimi-k2": Architecture("deepseek_v3", stand_in_for="kimi_k2", tied=False),
    "gpt-oss": Architecture("gpt_oss", tied=False),
    "llama-3": Architecture("llama"),
    "minimax-m2": Architecture("minimax_m2", tied=False),
    "nemotron-3": Architecture("nemotron_h", tied=False),
}

# The MoE and MLA shapes of the tiny MoE architectures: few, small experts.
MOE = {"experts": 4, "experts_per_token": 2, "expert_intermediate_size": 64}
MLA = {"kv_lora_rank": 32, "q_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32}
# The layer kinds of the hybrid families, small enough that a test sequence (40 tokens and more)
# crosses every one of them: gpt-oss's sliding layers see 8 tokens (its own see 128), GLM-5's
# indexer keeps 4 tokens per query (its own 2048), and Qwen3.5/3.6 put a full-attention layer after
# each gated delta-net layer (their own after every 3). Nemotron 3's pattern (Mamba2 M, MoE E,
# attention *) is its own in small: each mixer layer followed by an MoE one.
SLIDING_WINDOW = 8
# 16 indexer heads (GLM-5's: 32): a key's score sums ReLU(q.k) over heads, so with 4 heads one key
# in 16 scores exactly 0, and the top-4 among such ties is picked one way by a whole-sequence
# forward and another by a decode step: the engine's logprobs were 0.34 nats off the trainer's alone
# (1.3e-05 with 16).
INDEXER = {"index_topk": 4, "index_head_dim": 32, "index_n_heads": 16}
FULL_ATTENTION_INTERVAL = 2
GATED_DELTA_NET = {"linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 32,
                   "linear_value_head_dim": 32, "linear_conv_kernel_dim": 4}
NEMOTRON_H_PATTERN = "ME*E"
MAMBA2 = {"mamba_num_heads": 4, "mamba_head_dim": 32, "n_groups": 2, "ssm_state_size": 16}
# gpt-oss's YaRN (its config.json's), factor = the context over the original, as DEEPSEEK_YARN's.
GPT_OSS_YARN = {"rope_type": "yarn", "rope_theta": 150000.0, "original_max_position_embeddings": 4096,
                "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}
# DeepSeek-V3's own kind of rope scaling (YaRN, as its config.json has it), which SGLang's MLA on CPU
# requires; its factor is the model's context over the original (DeepSeek-V3: 163840 / 4096 = 40).
DEEPSEEK_YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "original_max_position_embeddings": 4096,
                 "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}
# Keys the families' own config.json files carry that transformers' config classes leave out and
# SGLang and vLLM read (they refused the tiny checkpoints without them, or would compute another
# model), with the values that say what transformers' model computes: sigmoid expert scores with a
# correction bias (noaux_tc), every layer past the first an MoE one, MiniMax-M2's per-layer q/k norm;
# Qwen3.5/3.6's gated attention output and where their full-attention layers are (SGLang reads
# full_attention_interval, not layer_types); GLM-5's interleaved rope in its attention and its
# indexer (vLLM's DeepSeek-V3.2 indexer is NeoX-style unless told); gpt-oss's top-k and pre-YaRN
# context under the names its config.json (and OpenAI's reference code) has them.
REAL_CONFIG_KEYS = {
    "deepseek_v3": {"topk_method": "noaux_tc", "scoring_func": "sigmoid", "moe_layer_freq": 1},
    "minimax_m2": {"scoring_func": "sigmoid", "use_routing_bias": True, "use_qk_norm": True, "qk_norm_type": "per_layer"},
    "qwen3_5_text": {"attn_output_gate": True, "full_attention_interval": FULL_ATTENTION_INTERVAL},
    "qwen3_5_moe_text": {"attn_output_gate": True, "full_attention_interval": FULL_ATTENTION_INTERVAL},
    "glm_moe_dsa": {"topk_method": "noaux_tc", "scoring_func": "sigmoid", "moe_layer_freq": 1, "rope_interleave": True,
                    "indexer_rope_interleave": True},
    "gpt_oss": {"experts_per_token": MOE["experts_per_token"],
                "initial_context_length": GPT_OSS_YARN["original_max_position_embeddings"]},
}
# Bump when a non-qwen3 format's build changes in a way the inputs of format_recipe_hash do not show.
FORMAT_RECIPE_VERSION = 3


def _model(arch: Architecture, config: TinyModelConfig, vocab_size: int, eos_id: int, pad_id: int | None,
           bos_id: int | None):
    """The randomly initialised model of a format's architecture (under the caller's RNG state)."""
    import transformers

    common = dict(
        vocab_size=vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        max_position_embeddings=config.max_position_embeddings,
        initializer_range=config.initializer_range,
        tie_word_embeddings=arch.tied,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        torch_dtype="float32",
    )
    gqa = dict(num_key_value_heads=config.num_key_value_heads, head_dim=config.head_dim)
    if arch.model_type == "qwen3":
        model_config = transformers.Qwen3Config(**common, **gqa)
    elif arch.model_type == "llama":
        model_config = transformers.LlamaConfig(**common, **gqa, rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    elif arch.model_type == "glm4_moe":
        model_config = transformers.Glm4MoeConfig(
            **common, **gqa, attention_bias=True, partial_rotary_factor=0.5, first_k_dense_replace=1,
            n_routed_experts=MOE["experts"], num_experts_per_tok=MOE["experts_per_token"], n_shared_experts=1,
            moe_intermediate_size=MOE["expert_intermediate_size"], num_mtp_layers=0,
        )
    elif arch.model_type == "deepseek_v3":
        model_config = transformers.DeepseekV3Config(
            **common, num_key_value_heads=config.num_attention_heads, first_k_dense_replace=1, n_group=1,
            topk_group=1, n_routed_experts=MOE["experts"], num_experts_per_tok=MOE["experts_per_token"],
            n_shared_experts=1, moe_intermediate_size=MOE["expert_intermediate_size"], num_mtp_layers=0, **MLA,
            rope_parameters={**DEEPSEEK_YARN, "factor": config.max_position_embeddings
                             / DEEPSEEK_YARN["original_max_position_embeddings"]},
        )
    elif arch.model_type == "minimax_m2":
        model_config = transformers.MiniMaxM2Config(
            **{**common, "intermediate_size": MOE["expert_intermediate_size"]}, **gqa,
            num_local_experts=MOE["experts"], num_experts_per_tok=MOE["experts_per_token"],
            rope_parameters={"rope_type": "default", "rope_theta": 5000000.0, "partial_rotary_factor": 0.5},
        )
        model_config.rotary_dim = config.head_dim // 2  # the partial rotary factor, as MiniMax-M2's config.json says it
    elif arch.model_type == "qwen3_5_text":
        model_config = transformers.Qwen3_5TextConfig(
            **common, **gqa, **GATED_DELTA_NET, full_attention_interval=FULL_ATTENTION_INTERVAL)
    elif arch.model_type == "qwen3_5_moe_text":
        model_config = transformers.Qwen3_5MoeTextConfig(
            **common, **gqa, **GATED_DELTA_NET, full_attention_interval=FULL_ATTENTION_INTERVAL,
            num_experts=MOE["experts"], num_experts_per_tok=MOE["experts_per_token"],
            moe_intermediate_size=MOE["expert_intermediate_size"],
            shared_expert_intermediate_size=MOE["expert_intermediate_size"],
        )
    elif arch.model_type == "gpt_oss":
        # Every layer an MoE one (intermediate_size is an expert's), sliding and full attention
        # alternating (transformers' default layer_types, as gpt-oss's), each head with its sink.
        model_config = transformers.GptOssConfig(
            **{**common, "intermediate_size": MOE["expert_intermediate_size"]}, **gqa, sliding_window=SLIDING_WINDOW,
            num_local_experts=MOE["experts"], num_experts_per_tok=MOE["experts_per_token"],
            rope_parameters={**GPT_OSS_YARN, "factor": config.max_position_embeddings
                             / GPT_OSS_YARN["original_max_position_embeddings"]},
        )
    elif arch.model_type == "nemotron_h":
        # The pattern sets the layer count; num_hidden_layers is not a field of NemotronHConfig.
        model_config = transformers.NemotronHConfig(
            **{k: v for k, v in common.items() if k != "num_hidden_layers"}, **gqa, **MAMBA2,
            hybrid_override_pattern=NEMOTRON_H_PATTERN, n_routed_experts=MOE["experts"],
            num_experts_per_tok=MOE["experts_per_token"], moe_intermediate_size=MOE["expert_intermediate_size"],
            moe_shared_expert_intermediate_size=MOE["expert_intermediate_size"],
        )
    elif arch.model_type == "glm_moe_dsa":
        model_config = transformers.GlmMoeDsaConfig(
            **common, num_key_value_heads=config.num_attention_heads, first_k_dense_replace=1, n_group=1,
            topk_group=1, n_routed_experts=MOE["experts"], num_experts_per_tok=MOE["experts_per_token"],
            n_shared_experts=1, moe_intermediate_size=MOE["expert_intermediate_size"], **MLA, **INDEXER,
        )
    else:
        raise ValueError(f"no tiny-model recipe for architecture {arch.model_type!r}")
    for key, value in REAL_CONFIG_KEYS.get(arch.model_type, {}).items():
        setattr(model_config, key, value)
    if arch.stand_in_for:
        model_config.slime_harbor_stand_in_for = arch.stand_in_for
    return transformers.AutoModelForCausalLM.from_config(model_config)


def build_tiny_model(out_dir: str | Path, seed: int = 0, config: TinyModelConfig | None = None,
                     renderer: str = "qwen3") -> Path:
    """Write the tiny policy of chat format `renderer` (a name in chat_formats.FORMATS; weights,
    config, tokenizer) to `out_dir`, and record the format in its slime_harbor.json.

    qwen3 is the tokenizer trained here with Qwen3's chat template on Qwen3ForCausalLM, as always;
    every other format gets its family's tokenizer (format_tokenizers) and the architecture in
    ARCHITECTURES. The same seed, config and format give byte-identical files. Returns `out_dir`.
    """
    if renderer not in ARCHITECTURES:
        raise ValueError(f"no tiny model for chat format {renderer!r}; one of: {', '.join(ARCHITECTURES)}")
    config = config or TinyModelConfig()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if renderer == "qwen3":
        _build_qwen3(out, seed, config)
        source, recipe = "trained byte-level BPE + Qwen3's special and format tokens", recipe_hash(config)
    else:
        source = _build_format(out, seed, config, renderer)
        recipe = format_recipe_hash(renderer, config)
    from slime_harbor.policy.chat_formats import CHECKPOINT_RECORD

    arch = ARCHITECTURES[renderer]
    model_config = json.loads((out / "config.json").read_text())
    record = {
        "renderer": renderer,
        "seed": seed,
        "recipe": recipe,
        "tokenizer": source,
        "vocab_size": model_config["vocab_size"],
        "architecture": model_config["architectures"][0],
        "model_type": arch.model_type,
        "stand_in_for": arch.stand_in_for,
    }
    # Written last: a build cut off half-way has none (ensure_tiny_model builds it again).
    (out / CHECKPOINT_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    return out


def _save_tokenizer(tokenizer, out: Path, say_no_unk_token: bool = False) -> None:
    tokenizer.save_pretrained(out)
    # transformers 5 records its own backend class name, which 4.x cannot resolve; the generic
    # fast-tokenizer class loads in both.
    tokenizer_config_path = out / "tokenizer_config.json"
    tokenizer_config = json.loads(tokenizer_config_path.read_text())
    tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    if say_no_unk_token and tokenizer.unk_token is None:
        # As the families' own files say it ("unk_token": null): transformers loads some model_types
        # with their own tokenizer class over this file's (qwen3_5_moe_text: Qwen3_5Tokenizer),
        # whose default unk token (<|endoftext|>) renderers' Qwen3.5 renderer then refuses as missing.
        tokenizer_config["unk_token"] = None
    tokenizer_config_path.write_text(json.dumps(tokenizer_config, indent=2) + "\n")


def _build_format(out: Path, seed: int, config: TinyModelConfig, renderer: str) -> str:
    """A non-qwen3 format's checkpoint (all but slime_harbor.json); returns the tokenizer's source."""
    import torch
    from transformers import GenerationConfig

    from slime_harbor.policy.format_tokenizers import build_format_tokenizer

    built = build_format_tokenizer(renderer, config.bpe_vocab_size, config.max_position_embeddings,
                                   trained=config.trained_vocab)
    tokenizer = built.tokenizer
    _save_tokenizer(tokenizer, out, say_no_unk_token=True)
    eos_ids = [tokenizer.convert_tokens_to_ids(t) for t in built.eos]
    arch = ARCHITECTURES[renderer]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = _model(arch, config, len(tokenizer), eos_ids[0], tokenizer.pad_token_id, tokenizer.bos_token_id)
    model.generation_config = GenerationConfig(
        eos_token_id=eos_ids, pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
    )
    model.save_pretrained(out)
    if arch.model_type == "nemotron_h":
        _name_layers_by_pattern(out / "config.json")
    return built.source


def _name_layers_by_pattern(config_json: Path) -> None:
    """Nemotron-H's layers in config.json as Nemotron 3's own config.json names them: a
    hybrid_override_pattern (M Mamba2, E MoE, * attention, - MLP) and num_hidden_layers. transformers
    5 writes layers_block_type in its own names (linear_attention, full_attention), which SGLang's
    and vLLM's NemotronHConfig refuse; it reads the pattern back as the same layers."""
    import transformers

    model_config = json.loads(config_json.read_text())
    layers = model_config.pop("layers_block_type")
    model_config.pop("mtp_layers_block_type")  # in the same names; there are no MTP layers (num_nextn_predict_layers 0)
    model_config["hybrid_override_pattern"] = transformers.NemotronHConfig._list_to_pattern(layers)
    model_config["num_hidden_layers"] = len(layers)
    # As transformers writes config.json (PreTrainedConfig.to_json_string).
    config_json.write_text(json.dumps(model_config, indent=2, sort_keys=True) + "\n")


def _build_qwen3(out: Path, seed: int, config: TinyModelConfig) -> None:
    """The qwen3 checkpoint, file for file as before formats existed (plus tiny_model.json)."""
    import torch
    from transformers import GenerationConfig

    tokenizer = build_tokenizer(config)
    _save_tokenizer(tokenizer, out)

    # Initialise under a private RNG state so building does not disturb the caller's seeds.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = _model(ARCHITECTURES["qwen3"], config, len(tokenizer), tokenizer.convert_tokens_to_ids(IM_END),
                       tokenizer.convert_tokens_to_ids(ENDOFTEXT), None)
    model.generation_config = GenerationConfig(
        eos_token_id=[tokenizer.convert_tokens_to_ids(t) for t in (IM_END, ENDOFTEXT)],
        pad_token_id=model.config.pad_token_id,
    )
    model.save_pretrained(out)
    (out / "tiny_model.json").write_text(
        json.dumps({"seed": seed, "recipe": recipe_hash(config), **asdict(config)}, indent=2) + "\n"
    )


def recipe_hash(config: TinyModelConfig | None = None) -> str:
    """Fingerprint of everything the qwen3 build depends on besides the seed (the shape, corpus,
    tokens, template, recipe version): a cached model with another fingerprint is stale."""
    import hashlib

    recipe = json.dumps(
        [RECIPE_VERSION, asdict(config or TinyModelConfig()), CORPUS, WORDS, SPECIAL_TOKENS, FORMAT_TOKENS, CHAT_TEMPLATE]
    )
    return hashlib.sha256(recipe.encode()).hexdigest()[:16]


def format_recipe_hash(renderer: str, config: TinyModelConfig | None = None) -> str:
    """The fingerprint of a non-qwen3 format's build (its tokenizer's inputs, architecture, shapes)."""
    import hashlib

    from slime_harbor.policy.format_tokenizers import tokenizer_fingerprint

    recipe = json.dumps([
        FORMAT_RECIPE_VERSION, renderer, asdict(config or TinyModelConfig()), asdict(ARCHITECTURES[renderer]), MOE,
        MLA, SLIDING_WINDOW, INDEXER, FULL_ATTENTION_INTERVAL, GATED_DELTA_NET, NEMOTRON_H_PATTERN, MAMBA2,
        GPT_OSS_YARN, DEEPSEEK_YARN, REAL_CONFIG_KEYS, CORPUS, WORDS, tokenizer_fingerprint(renderer),
    ])
    return hashlib.sha256(recipe.encode()).hexdigest()[:16]


def ensure_tiny_model(seed: int = 0, renderer: str = "qwen3") -> Path:
    """The offline tiny model of chat format `renderer`, built once per seed, format and recipe and
    reused.

    The directory is named for the recipe, so a model cached by an older recipe (another vocab or
    chat template) is never picked up; the recorded recipe is checked too (qwen3: tiny_model.json,
    as always; every format: slime_harbor.json, written last), and a half-written build is built
    again.
    """
    from slime_harbor.policy.chat_formats import CHECKPOINT_RECORD

    if renderer == "qwen3":
        recipe = recipe_hash()
        out = cache_dir() / f"tiny-model-seed{seed}-{recipe}"
    else:
        if renderer not in ARCHITECTURES:
            raise ValueError(f"no tiny model for chat format {renderer!r}; one of: {', '.join(ARCHITECTURES)}")
        recipe = format_recipe_hash(renderer)
        out = cache_dir() / f"tiny-model-{renderer}-seed{seed}-{recipe}"
    built = []
    for stamp in ("tiny_model.json", CHECKPOINT_RECORD) if renderer == "qwen3" else (CHECKPOINT_RECORD,):
        try:
            built.append(json.loads((out / stamp).read_text()).get("recipe"))
        except (OSError, ValueError, AttributeError):
            built.append(None)
    if any(b != recipe for b in built):
        print(f"building the tiny offline {renderer} policy model in {out}", file=sys.stderr)
        build_tiny_model(out, seed=seed, renderer=renderer)
    return out
