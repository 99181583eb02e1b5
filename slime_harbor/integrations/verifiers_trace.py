"""Our episode of one Harbor trial -> a verifiers v1 Trace, the form prime-rl trains on.

prime-rl turns each `trace.branches[i]` (a root-to-leaf path of message nodes) into one training
sample: the nodes' token_ids concatenated, their masks (True = sampled by the policy) and the
logprobs of the sampled tokens. One of our samples (converter.py) is already such a sequence, so
it becomes one chain: the prompt node, then alternating runs of sampled tokens (an assistant node
with its logprobs, recorded as a model call) and observation tokens (a user node, mask False).
"""

from __future__ import annotations

from itertools import groupby

import verifiers.v1 as vf

from slime_harbor.episode import Episode
from slime_harbor.reward import reward_under
from slime_harbor.samples import SampleStatus, TrainingSample


def fill_trace(trace: vf.Trace, episode: Episode, tokenizer, reward_key: str = "reward", model: str | None = None) -> None:
    """One trial's episode -> the trace's message graph, reward, metrics and errors."""
    meta = episode.metadata
    trace.info.update({k: v for k, v in episode.ended_metadata().items()
                       if k in ("trial_dir", "exit_status", "turns", "hack_flags", "hack_details", "twin")})
    if episode.masked_by == "hack":  # the hack monitor's screen: out of training
        trace.errors.append(vf.Error(type="HackScreened", message="; ".join(meta.get("hack_details") or [])))
        trace.is_completed, trace.ok = True, False
        return
    if not episode.scored:
        reason = episode.end.why or meta.get("exception_type") or episode.status.value
        trace.errors.append(vf.Error(type=meta.get("exception_type") or "HarborTrialFailed", message=str(reason)))
        trace.is_completed, trace.ok = True, False
        return
    for sample in episode.samples:
        if not sample.remove_sample and any(sample.loss_mask):
            add_chain(trace, sample, tokenizer, model)
    raw = meta.get("raw_rewards") or {}
    trace.record_reward(reward_key, reward_under(episode, reward_key))
    trace.record_metrics({k: float(v) for k, v in raw.items() if k != reward_key and isinstance(v, (int, float))}
                         if isinstance(raw, dict) else {})
    if episode.status is SampleStatus.TRUNCATED:
        trace.stop(episode.end.exit_status or "truncated")
    trace.is_completed, trace.ok = True, True


def add_chain(trace: vf.Trace, sample: TrainingSample, tokenizer, model: str | None = None) -> None:
    """One sample as one root-to-leaf chain: the prompt, then alternating runs of sampled tokens
    (an assistant turn: mask True, its logprobs; recorded as a model call) and observation tokens
    (mask False)."""
    prompt = sample.tokens[: len(sample.tokens) - sample.response_length]
    spans = [(False, prompt, [])]
    position = len(prompt)
    for sampled, run in groupby(range(sample.response_length), key=lambda i: bool(sample.loss_mask[i])):
        run = list(run)
        ids = sample.tokens[position: position + len(run)]
        spans.append((sampled, ids, [sample.rollout_log_probs[i] for i in run] if sampled else []))
        position += len(run)
    parent, seen = None, 0
    for sampled, ids, logprobs in spans:
        text = tokenizer.decode(ids, skip_special_tokens=True) if tokenizer is not None else ""
        message = vf.AssistantMessage(content=text) if sampled else vf.UserMessage(content=text)
        trace.nodes.append(vf.MessageNode(parent=parent, message=message, sampled=sampled, token_ids=list(ids),
                                          mask=[sampled] * len(ids), logprobs=logprobs))
        parent = len(trace.nodes) - 1
        if sampled:  # the turn's prompt is everything before it on the chain
            usage = vf.Usage(prompt_tokens=seen, completion_tokens=len(ids))
            trace.calls.append(vf.ModelCall(node=parent, model=model, usage=usage))
        seen += len(ids)
