"""Trajectory -> training samples.

Input: a Harbor `TrialResult`. Its `agent_result.rollout_details[0]` (Harbor's `RolloutDetail`)
holds, per model turn t, the full prompt token ids, the sampled completion ids and their
logprobs. Both our native agent and Harbor's terminus-2 (`collect_rollout_details=True`) fill it.

One episode becomes one sample when every turn's prompt extends the previous turn's prompt +
completion token for token:

    tokens    = prompt_0 | c_0 | obs_0 | c_1 | obs_1 | ... | c_T
    loss_mask =  (prompt)  1..1  0..0   1..1  0..0         1..1
    logprobs  =            lp_0  0..0   lp_1  0..0         lp_T

`obs_t` is whatever turn t+1's prompt adds after prompt_t + c_t (tool output, chat-template
tokens): the policy did not sample it, so it is masked. Where turn t+1's prompt does NOT extend
what came before (an agent that re-renders text and re-tokenizes it differently, a summarised
history), training on the concatenation would pair logprobs with tokens the policy never saw.
We then start a new sample at that turn (its own prompt is the re-rendered history), give all
pieces the same rollout_id, and count the drift.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from slime_harbor.samples import SampleStatus, TrainingSample

# Exceptions that mean the infrastructure failed, not the policy: the sample is aborted.
INFRA_EXCEPTIONS = frozenset(
    {
        "CancelledError",
        "PolicyServerError",
        "EnvironmentStartTimeoutError",
        "SandboxBuildFailedError",
        "SandboxError",
        "HealthcheckError",
        "AgentSetupTimeoutError",
        "ConnectError",
        "DockerError",
    }
)
TRUNCATING_EXITS = frozenset({"step_limit", "context_limit"})


@dataclass
class Segment:
    """One token-aligned stretch of an episode: a prompt and the response that follows it."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: list[int] = field(default_factory=list)

    def extend(self, ids: list[int], mask: int, logprobs: list[float] | None = None) -> None:
        self.response_ids += ids
        self.loss_mask += [mask] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)


def split_into_segments(detail: dict[str, Any]) -> tuple[list[Segment], int]:
    """Align the turns of one RolloutDetail. Returns (segments, number of drift points)."""
    prompts = detail.get("prompt_token_ids") or []
    completions = detail.get("completion_token_ids") or []
    logprobs = detail.get("logprobs") or []
    if not (len(prompts) == len(completions) == len(logprobs)):
        raise ValueError(
            f"rollout detail has {len(prompts)} prompts, {len(completions)} completions, "
            f"{len(logprobs)} logprob lists; they must match one per turn"
        )
    segments: list[Segment] = []
    drift = 0
    current: Segment | None = None
    for turn, (prompt, completion, lps) in enumerate(zip(prompts, completions, logprobs)):
        if len(lps) != len(completion):
            raise ValueError(f"turn {turn}: {len(completion)} completion tokens but {len(lps)} logprobs")
        if current is not None:
            so_far = current.prompt_ids + current.response_ids
            if prompt[: len(so_far)] == so_far:
                current.extend(list(prompt[len(so_far) :]), mask=0)
            else:
                drift += 1
                segments.append(current)
                current = None
        if current is None:
            current = Segment(prompt_ids=list(prompt))
        current.extend(list(completion), mask=1, logprobs=[float(x) for x in lps])
        current.turns.append(turn)
    if current is not None:
        segments.append(current)
    return segments, drift


def scalar_reward(rewards: dict[str, float] | None) -> float | None:
    """Harbor verifiers write a flat dict; `reward` is the convention, else a single key, else the mean."""
    if not rewards:
        return None
    if "reward" in rewards:
        return float(rewards["reward"])
    values = [float(v) for v in rewards.values()]
    return values[0] if len(values) == 1 else sum(values) / len(values)


def classify(result) -> tuple[SampleStatus, float | None, str]:
    """(status, reward, why) of a finished trial. Only verifier-scored episodes keep a reward."""
    rewards = result.verifier_result.rewards if result.verifier_result else None
    reward = scalar_reward(rewards)
    exc = result.exception_info
    exc_type = exc.exception_type if exc else None
    meta = (result.agent_result.metadata if result.agent_result else None) or {}
    exit_status = meta.get("exit_status")
    if exc_type in INFRA_EXCEPTIONS or exit_status == "aborted":
        return SampleStatus.ABORTED, None, f"{exc_type or 'policy abort'}: {exc.exception_message if exc else exit_status}"
    if reward is None:
        why = f"{exc_type}: {exc.exception_message}" if exc else "verifier produced no reward"
        return SampleStatus.FAILED, None, why
    if exc_type == "AgentTimeoutError" or exit_status in TRUNCATING_EXITS:
        return SampleStatus.TRUNCATED, reward, exc_type or exit_status
    if exc_type is not None:
        return SampleStatus.FAILED, None, f"{exc_type}: {exc.exception_message}"
    return SampleStatus.COMPLETED, reward, exit_status or "completed"


def trial_to_samples(
    result,
    *,
    group_index: int | None = None,
    index: int | None = None,
    rollout_id: int | None = None,
    tokenizer=None,
    reward_mapping: str = "raw",
) -> list[TrainingSample]:
    """Convert one Harbor TrialResult to training samples (several if the tokens drifted).

    reward_mapping: "raw" keeps the verifier's reward; "pm1" maps reward r in [0, 1] to 2r - 1.
    Infra failures carry remove_sample=True and reward None; they are never trained.
    """
    status, reward, why = classify(result)
    agent_result = result.agent_result
    details = (agent_result.rollout_details if agent_result else None) or []
    segments, drift = split_into_segments(details[0]) if details else ([], 0)
    if reward is not None and reward_mapping == "pm1":
        reward = 2.0 * reward - 1.0
    elif reward_mapping not in ("raw", "pm1"):
        raise ValueError(f"unknown reward_mapping {reward_mapping!r} (use 'raw' or 'pm1')")
    removed = status not in (SampleStatus.COMPLETED, SampleStatus.TRUNCATED) or not segments
    metadata = {
        "task_name": result.task_name,
        "trial_name": result.trial_name,
        "trial_dir": _trial_dir(result),
        "raw_rewards": result.verifier_result.rewards if result.verifier_result else None,
        "agent": result.agent_info.name if result.agent_info else None,
        "turns": (agent_result.metadata or {}).get("turns") if agent_result else None,
        "exit_status": (agent_result.metadata or {}).get("exit_status") if agent_result else None,
        "exception_type": result.exception_info.exception_type if result.exception_info else None,
        # Per turn: "stop", or "length" where the turn hit the max-new-token limit (filters.py).
        "finish_reasons": ((details[0].get("extra") or {}).get("finish_reason") if details else None),
        "status_reason": why,
        "drift_count": drift,
        "n_segments": len(segments),
    }
    if not segments:
        # Agents that record no tokens (oracle, nop, a crash before the first turn) still report
        # their reward and status; there is nothing to train on.
        return [
            TrainingSample(
                tokens=[], response_length=0, loss_mask=[], rollout_log_probs=[],
                reward=reward, status=status, group_index=group_index, index=index,
                rollout_id=rollout_id if rollout_id is not None else index, remove_sample=True,
                metadata={**metadata, "segment": 0, "no_tokens": True},
            )
        ]
    samples = []
    for k, seg in enumerate(segments):
        samples.append(
            TrainingSample(
                tokens=seg.prompt_ids + seg.response_ids,
                response_length=len(seg.response_ids),
                loss_mask=seg.loss_mask,
                rollout_log_probs=seg.logprobs,
                reward=reward,
                status=status,
                prompt=tokenizer.decode(seg.prompt_ids) if tokenizer else "",
                response=tokenizer.decode(seg.response_ids) if tokenizer else "",
                group_index=group_index,
                index=index,
                rollout_id=rollout_id if rollout_id is not None else index,
                remove_sample=removed,
                metadata={**metadata, "segment": k, "turn_indices": seg.turns},
            )
        )
    return samples


def _trial_dir(result) -> str | None:
    uri = result.trial_uri or ""
    return uri.removeprefix("file://") if uri else None
