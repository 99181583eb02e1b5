"""Supervised fine-tuning on (prompt ids, completion ids) pairs: the warm start before GRPO.

Loss = mean negative log-likelihood of the completion tokens only (prompt tokens are context),
the same masking the GRPO loss uses, so a warm-started policy and its RL updates agree on what
"the policy's tokens" are.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass
class SFTConfig:
    steps: int = 200
    """Optimizer steps."""
    lr: float = 3e-3
    """AdamW learning rate (tiny models from scratch like a large one)."""
    batch_size: int = 8
    """Pairs per step."""
    seed: int = 0


def completion_nll(model, batch: list[tuple[list[int], list[int]]], pad_id: int = 0) -> torch.Tensor:
    """Mean NLL of completion tokens given their prompts, for a right-padded batch."""
    seqs = [p + c for p, c in batch]
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    target_mask = torch.zeros((len(seqs), width), dtype=torch.bool)
    attention = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, (p, c) in enumerate(batch):
        ids[i, : len(p) + len(c)] = torch.tensor(p + c)
        attention[i, : len(p) + len(c)] = 1
        target_mask[i, len(p) : len(p) + len(c)] = True
    logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1].float()
    logprobs = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
    mask = target_mask[:, 1:]
    return -(logprobs * mask).sum() / mask.sum().clamp(min=1)


def sft(model, pairs: list[tuple[list[int], list[int]]], config: SFTConfig = SFTConfig(), pad_id: int = 0) -> list[float]:
    """Train `model` in place; returns the loss per step."""
    rng = random.Random(config.seed)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.lr)
    model.train()
    losses = []
    for _ in range(config.steps):
        batch = [pairs[rng.randrange(len(pairs))] for _ in range(config.batch_size)]
        loss = completion_nll(model, batch, pad_id)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    model.eval()
    return losses


def sft_model_dir(model_dir: str | Path, out_dir: str | Path, pairs, config: SFTConfig = SFTConfig()) -> list[float]:
    """Load an HF model, fine-tune it on `pairs`, save model + tokenizer to `out_dir`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(config.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    losses = sft(model, pairs, config, pad_id=tokenizer.pad_token_id or 0)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return losses
