"""SFT on the tiny model: the loss falls, only masked-in tokens count, multi-turn episodes are
in the native agent's token format, and early stopping stops."""

from __future__ import annotations

import pytest
import torch

from slime_harbor.agents.native import DEFAULT_PROMPTS, format_observation, format_reply, initial_prompt_ids, reply_commands
from slime_harbor.trainers.sft import (
    SFTConfig, masked_token_logprobs, pair_sequence, native_agent_episode, sequence_logprob,
    sequence_nll, sft, sft_model_dir, sft_sequences,
)

INSTRUCTION = "Rename the file water.txt to house.txt."
REPLIES = [format_reply("I will rename the file.", "mv water.txt house.txt"), format_reply("The task is done.", "submit")]


@pytest.fixture
def model(tiny_model_dir):
    """A fresh copy per test (conftest's is shared by a module): these tests train it in place."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def episode(renderer, tokenizer):
    return native_agent_episode(renderer, tokenizer, INSTRUCTION, REPLIES, [(0, "")])


def test_agent_reply_parses_as_one_command():
    assert [reply_commands(r) for r in REPLIES] == [["mv water.txt house.txt"], ["submit"]]


def test_episode_is_prompt_replies_and_observation_with_mask_on_replies(renderer, tokenizer, episode):
    ids, mask = episode
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    # What the chat template renders for the same conversation: the episode is its tokens.
    messages = [{"role": "system", "content": DEFAULT_PROMPTS.system_template}, {"role": "user", "content": INSTRUCTION},
                {"role": "assistant", "content": REPLIES[0]}, {"role": "user", "content": format_observation(0, "")}]
    prompt = tokenizer.apply_chat_template(messages[:2], add_generation_prompt=True, tokenize=True)["input_ids"]
    so_far = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"]
    reply_1 = tokenizer.encode(REPLIES[0], add_special_tokens=False) + [im_end]
    observation = so_far[len(prompt) + len(reply_1):]
    assert so_far[: len(prompt) + len(reply_1)] == prompt + reply_1
    reply_2 = tokenizer.encode(REPLIES[1], add_special_tokens=False) + [im_end]
    assert initial_prompt_ids(renderer, INSTRUCTION) == prompt
    assert ids == prompt + reply_1 + observation + reply_2
    assert mask == [0] * len(prompt) + [1] * len(reply_1) + [0] * len(observation) + [1] * len(reply_2)
    with pytest.raises(ValueError):
        native_agent_episode(renderer, tokenizer, INSTRUCTION, REPLIES, [])


def test_loss_counts_masked_in_tokens_only(model, episode):
    """Without gradients: the loss is the mean NLL over the mask's 1s and nothing else."""
    ids, mask = episode
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1]
        nll = -torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
        trained = torch.tensor(mask[1:], dtype=torch.bool)
        assert sequence_nll(model, [episode]).item() == pytest.approx(nll[trained].mean().item(), rel=1e-5)
        assert sequence_logprob(model, [episode]).item() == pytest.approx(-nll[trained].sum().item(), rel=1e-5)
        # Observation tokens carry real NLL, so counting them would change the loss...
        everything = (ids, [1] * len(ids))
        assert abs(sequence_nll(model, [everything]).item() - sequence_nll(model, [episode]).item()) > 1e-3
        # ...and masked-out tokens after the last trained one change nothing, whatever they are.
        padded = (ids + ids[:40], mask + [0] * 40)
        assert sequence_nll(model, [padded]).item() == pytest.approx(sequence_nll(model, [episode]).item(), rel=1e-6)
        # Right padding in a batch does not move a row's figures.
        short = (ids[:100], mask[:100])
        batched = sequence_logprob(model, [episode, short])
        alone = sequence_logprob(model, [short])
        assert batched[1].item() == pytest.approx(alone.item(), rel=1e-5)


def test_observation_tokens_get_no_gradient_of_their_own(model, episode):
    """A masked-out target receives no gradient: the logprob tensor's grad is zero there."""
    ids, mask = episode
    logprobs, target_mask = masked_token_logprobs(model, [episode])
    logprobs.retain_grad()
    (-(logprobs * target_mask).sum() / target_mask.sum()).backward()
    grad = logprobs.grad[0]
    assert torch.all(grad[~target_mask[0]] == 0) and torch.all(grad[target_mask[0]] != 0)
    assert target_mask[0].tolist() == [bool(m) for m in mask[1:]]


def test_sft_on_episodes_lowers_their_nll(model, episode):
    with torch.no_grad():
        before = sequence_nll(model, [episode]).item()
    losses = sft_sequences(model, [episode], SFTConfig(steps=30, batch_size=2, lr=3e-3))
    with torch.no_grad():
        after = sequence_nll(model, [episode]).item()
    assert after < 0.2 * before and losses[-1] < losses[0]


def test_sft_on_pairs_lowers_the_completions_nll(model, renderer, tokenizer):
    prompt = initial_prompt_ids(renderer, INSTRUCTION)
    pairs = [(prompt, tokenizer.encode(REPLIES[0], add_special_tokens=False))]
    with torch.no_grad():
        before = sequence_nll(model, [pair_sequence(p, c) for p, c in pairs]).item()
    sft(model, pairs, SFTConfig(steps=20, batch_size=2))
    with torch.no_grad():
        assert sequence_nll(model, [pair_sequence(p, c) for p, c in pairs]).item() < 0.3 * before


def test_until_stops_early_and_model_dir_round_trips(tiny_model_dir, episode, tmp_path):
    from transformers import AutoModelForCausalLM

    seen = []
    losses = sft_model_dir(tiny_model_dir, tmp_path, config=SFTConfig(steps=50, batch_size=2), sequences=[episode],
                           until=lambda step, model: seen.append(step) or step == 7)
    assert len(losses) == 7 and seen == list(range(1, 8))
    saved = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    with torch.no_grad():
        assert sequence_nll(saved, [episode]).item() < losses[0]  # the trained weights were saved
    with pytest.raises(ValueError):
        sft_model_dir(tiny_model_dir, tmp_path / "nothing")
