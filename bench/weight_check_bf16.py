"""How far a bf16 engine's logprobs sit from the trainer's float32 ones, and how large a stale LM
head's gap is beside that: what a bf16 bound for the weight check (policy/weight_check.py) would
have to tolerate, and what it would have to catch.

The engine here is a stand-in: Hugging Face's own forward pass with the same weights cast to
bf16 (SDPA attention, log-softmax in float32), on the device given; SGLang's and vLLM's bf16
kernels differ from it. Models: the tiny Qwen3 (built offline) and a randomly initialised model of
Qwen3-0.6B's shape (28 layers, hidden 1024, tied embeddings, vocab 151936); no trained weights can
be downloaded here. The fault: every weight moved as `steps` Adam updates at lr 1e-6 move it
(each by lr per step, a random sign), the LM head left as it was (vLLM's reload on a CPU kept it).

    python bench/weight_check_bf16.py [--device cuda] [--models tiny,qwen3-0.6b] [--steps 1,10,100]

Prints one JSON line per model and a table: the probe's mean (max) |gap| over 255 tokens.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from slime_harbor.policy.weight_check import BUILTIN_PROBE, PROBE_TOKENS, trainer_logprobs  # noqa: E402

LR = 1e-6


def build(name: str, device: str):
    """(float32 model on device, probe token ids)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    from slime_harbor.policy.tiny_model import build_tiny_model

    tiny = build_tiny_model(Path(tempfile.mkdtemp()) / "tiny", seed=0)
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    text = (BUILTIN_PROBE + "\n$ python -m pytest -q tests/test_slugify.py\n..F.\nE   assert slugify('Hello, World!') == "
            "'hello-world'\n") * 8
    probe = tokenizer.encode(text)[:PROBE_TOKENS]
    if name == "tiny":
        return AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).to(device).eval(), probe
    config = Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                         num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
                         max_position_embeddings=40960, rope_theta=1_000_000.0)
    torch.manual_seed(0)
    return Qwen3ForCausalLM(config).to(device=device, dtype=torch.float32).eval(), probe


def moved(model, steps: int, seed: int = 0):
    """A copy with every weight moved by steps x LR (a random sign each), as Adam's first steps move them."""
    out = copy.deepcopy(model)
    generator = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            signs = torch.randint(0, 2, p.shape, generator=generator).to(p.device, p.dtype) * 2 - 1
            p.add_(signs * LR * steps)
    return out


def stale_head(model_moved, model_before):
    """model_moved with its LM head untied and left at model_before's weights."""
    out = copy.deepcopy(model_moved)
    out.config.tie_word_embeddings = False
    out.lm_head.weight = torch.nn.Parameter(model_before.get_input_embeddings().weight.detach().clone())
    return out


def gap(a: list[float], b: list[float]) -> tuple[float, float]:
    d = (torch.tensor(a) - torch.tensor(b)).abs()
    return d.mean().item(), d.max().item()


def served_bf16(model, probe) -> list[float]:
    """The stand-in engine: the same weights in bf16, log-softmax in float32."""
    return trainer_logprobs(copy.deepcopy(model).to(torch.bfloat16), probe)


def measure(name: str, device: str, steps: list[int]) -> dict:
    model, probe = build(name, device)
    trained = trainer_logprobs(model, probe)
    out = {"model": name, "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
           "params": sum(p.numel() for p in model.parameters()), "probe_tokens": len(probe) - 1,
           "bf16_noise": gap(trained, served_bf16(model, probe)), "faults": {}}
    for k in steps:
        after = moved(model, k)
        want = trainer_logprobs(after, probe)
        head = stale_head(after, model)
        out["faults"][k] = {"fp32_stale_head": gap(want, trainer_logprobs(head, probe)),
                            "bf16_right": gap(want, served_bf16(after, probe)),
                            "bf16_stale_head": gap(want, served_bf16(head, probe))}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--models", default="tiny,qwen3-0.6b")
    parser.add_argument("--steps", default="1,10,100", help="update counts at lr 1e-6 (comma-separated)")
    args = parser.parse_args()
    steps = [int(s) for s in args.steps.split(",")]
    rows = []
    for name in args.models.split(","):
        result = measure(name, args.device, steps)
        print(json.dumps(result), flush=True)
        rows.append(result)
    print("\n| model | device | bf16 noise (same weights) | updates at lr 1e-6 | stale head, fp32 | right weights, bf16 | stale head, bf16 |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        noise = "%.1e (%.1e)" % r["bf16_noise"]
        for k, f in r["faults"].items():
            print(f"| {r['model']} | {r['device']} | {noise} | {k} | " + " | ".join(
                "%.1e (%.1e)" % f[key] for key in ("fp32_stale_head", "bf16_right", "bf16_stale_head")) + " |")


if __name__ == "__main__":
    main()
