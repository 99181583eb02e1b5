"""Supervised fine-tuning on token sequences with a loss mask: the warm start before GRPO.

Loss = mean negative log-likelihood of the masked-in tokens only (prompts and tool output are
context), the same masking the GRPO loss uses, so a warm-started policy and its RL updates agree
on what "the policy's tokens" are. Two shapes of example:

    (prompt ids, completion ids)   one turn; loss on the completion (`sft`, `sft_model_dir`)
    (ids, loss mask)               a whole multi-turn episode; loss where the mask is 1
                                   (`sft_sequences`, e.g. from `native_agent_episode`)

`native_agent_episode` renders an episode in the native agent's exact token format (its prompt,
its replies closed by the end-of-turn token, the observation tokens it bridges on between turns,
all by the agent's own functions), so SFT trains on the very token sequences the agent later
samples and the converter trains on.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from slime_harbor.agents.native import (DEFAULT_PROMPTS, format_observation, format_reply, initial_messages,
                                        initial_prompt_ids, next_prompt_ids)
from slime_harbor.policy.chat_formats import keep_record, sampled_part, text_turn_text
from slime_harbor.tasks.families import Instance
from slime_harbor.grpo import masked_mean

Pair = tuple[list[int], list[int]]  # (prompt ids, completion ids)
MaskedSequence = tuple[list[int], list[int]]  # (token ids, loss mask of the same length)


@dataclass
class SFTConfig:
    steps: int = 200
    """Optimizer steps (at most, when an `until` callback stops early)."""
    lr: float = 3e-3
    """AdamW learning rate (tiny models from scratch like a large one)."""
    batch_size: int = 8
    """Examples per step."""
    seed: int = 0


def pair_sequence(prompt: list[int], completion: list[int]) -> MaskedSequence:
    """A one-turn example as a masked sequence: loss on the completion only."""
    return list(prompt) + list(completion), [0] * len(prompt) + [1] * len(completion)


def native_agent_episode(renderer, tokenizer, instruction: str, replies: Sequence[str],
                         outputs: Sequence[tuple[int, str]]) -> MaskedSequence:
    """The ids of a native-agent episode and its loss mask (1 on the agent's own tokens).

    `replies[i]` is the agent's i-th reply text (a whole turn of the format around it, with an empty
    thought and the end of a turn of text: chat_formats.ChatFormat.text_turn, as a sampled turn ends); `outputs[i]` = (return code, output) of
    the command of reply i, rendered and bridged on by the agent's own functions. Give one output
    fewer than replies when the last reply submits.
    """
    if len(outputs) not in (len(replies), len(replies) - 1):
        raise ValueError("give one (returncode, output) per reply, or one fewer when the last reply submits")
    messages = initial_messages(instruction)
    ids = initial_prompt_ids(renderer, instruction)
    mask = [0] * len(ids)
    for i, reply in enumerate(replies):
        turn = sampled_part(text_turn_text(renderer.config.name, reply), tokenizer.decode(ids))
        sampled = tokenizer.encode(turn, add_special_tokens=False)
        if i < len(outputs):
            messages += [{"role": "assistant", "content": reply},
                         {"role": "user", "content": format_observation(*outputs[i])}]
            bridged = next_prompt_ids(renderer, messages, ids, sampled)
            if bridged[: len(ids) + len(sampled)] != ids + sampled:
                raise ValueError(f"reply {i} cannot be closed by the chat format: no SFT example of it")
            mask += [1] * len(sampled) + [0] * (len(bridged) - len(ids) - len(sampled))
            ids = bridged
        else:
            ids, mask = ids + sampled, mask + [1] * len(sampled)
    return ids, mask


def masked_token_logprobs(model, batch: Sequence[MaskedSequence], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(token | all before it) of a right-padded batch, and the loss mask aligned with it
    ([B, W-1] each: the first token has no prediction)."""
    width = max(len(ids) for ids, _ in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    target_mask = torch.zeros((len(batch), width), dtype=torch.bool)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    for i, (seq, mask) in enumerate(batch):
        if len(seq) != len(mask):
            raise ValueError(f"example {i}: {len(seq)} ids but {len(mask)} mask entries")
        ids[i, : len(seq)] = torch.tensor(seq)
        attention[i, : len(seq)] = 1
        target_mask[i, : len(seq)] = torch.tensor(mask, dtype=torch.bool)
    logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1].float()
    logprobs = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
    return logprobs, target_mask[:, 1:]


def sequence_nll(model, batch: Sequence[MaskedSequence], pad_id: int = 0) -> torch.Tensor:
    """Mean NLL of the masked-in tokens of the batch (the SFT loss)."""
    logprobs, mask = masked_token_logprobs(model, batch, pad_id)
    return -masked_mean(logprobs, mask)


def sequence_logprob(model, batch: Sequence[MaskedSequence], pad_id: int = 0) -> torch.Tensor:
    """[B] log-probability that sampling at temperature 1 reproduces each example's masked-in
    tokens exactly (given its masked-out tokens), e.g. an oracle episode's replies."""
    logprobs, mask = masked_token_logprobs(model, batch, pad_id)
    return (logprobs * mask).sum(-1)


def sft_sequences(model, sequences: Sequence[MaskedSequence], config: SFTConfig = SFTConfig(),
                  pad_id: int = 0, until: Callable[[int, Any], bool] | None = None) -> list[float]:
    """Train `model` in place on masked sequences; returns the loss per step. `until(step, model)`,
    called after each step (model in train mode, no grad tracking needed), stops early on True."""
    rng = random.Random(config.seed)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.lr)
    model.train()
    losses = []
    for _ in range(config.steps):
        batch = [sequences[rng.randrange(len(sequences))] for _ in range(config.batch_size)]
        loss = sequence_nll(model, batch, pad_id)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if until is not None and until(len(losses), model):
            break
    model.eval()
    return losses


def sft(model, pairs: Sequence[Pair], config: SFTConfig = SFTConfig(), pad_id: int = 0) -> list[float]:
    """Train `model` in place on (prompt, completion) pairs; returns the loss per step."""
    return sft_sequences(model, [pair_sequence(p, c) for p, c in pairs], config, pad_id)


def sft_model_dir(model_dir: str | Path, out_dir: str | Path, pairs: Sequence[Pair] = (),
                  config: SFTConfig = SFTConfig(), *, sequences: Sequence[MaskedSequence] = (),
                  until: Callable[[int, Any], bool] | None = None) -> list[float]:
    """Load an HF model, fine-tune it on `pairs` and/or masked `sequences` (see `sft_sequences`
    for `until`), save model + tokenizer to `out_dir`; returns the loss per step."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    examples = [pair_sequence(p, c) for p, c in pairs] + [(list(s), list(m)) for s, m in sequences]
    if not examples:
        raise ValueError("nothing to train on: give pairs or sequences")
    torch.manual_seed(config.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    losses = sft_sequences(model, examples, config, pad_id=tokenizer.pad_token_id or 0, until=until)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    keep_record(model_dir, out_dir)
    return losses


# --------------------------------------------------------------------------------------------
# Oracle-style episodes of the procedural task families (tasks/families.py), for the warm start.

DONE_THOUGHT = "The task is done."


def oracle_episode(renderer, tokenizer, inst: Instance, command: str | None = None) -> MaskedSequence:
    """The native agent's token sequence of an oracle-style episode of a family instance and its
    loss mask: the instance's command (or `command`, e.g. inst.near_miss), its observation, then
    `submit`. Every family's command and near miss is silent and succeeds, so the observation is
    return code 0 with empty output."""
    replies = [format_reply(inst.thought, command or inst.command), format_reply(DONE_THOUGHT, DEFAULT_PROMPTS.submit_command)]
    return native_agent_episode(renderer, tokenizer, inst.instruction, replies, [(0, "")])
