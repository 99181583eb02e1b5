"""Trajectory -> Episode (episode.py), its tokens aligned into segments.

Input: a Harbor `TrialResult` and, for an agent that sampled through the model gateway, its
session's recording. The episode's tokens come from one owner (`trial_to_episode`): the gateway's
branches (one Harbor `RolloutDetail` each) where the agent's calls went through it, else the
agent's own `agent_result.rollout_details[0]` (our native agent; an agent that samples the policy
itself). A RolloutDetail holds, per model turn t, the full prompt token ids, the sampled
completion ids and their logprobs.

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
segments the same rollout_id, and count the drift.
"""

from __future__ import annotations

from typing import Any

from slime_harbor.episode import Episode, episode_end, Segment
from slime_harbor.policy.renderer import load_tokenizer
from slime_harbor.samples import top_p_offsets_ok
from slime_harbor.reward import RewardCase, decide_reward, verifier_passed


def turn_top_p(detail: dict[str, Any]) -> list[tuple[list[int], list[int]]] | None:
    """Per turn (kept ids, offsets) from RolloutDetail.extra, or None unless every turn has them.

    The native agent records them with `return_top_p_token_ids`; a turn without them (nothing was
    truncated, another agent) leaves the episode without top-p data. Malformed data raises.
    """
    extra = detail.get("extra") or {}
    all_ids, all_offsets = extra.get("top_p_token_ids"), extra.get("top_p_token_offsets")
    completions = detail.get("completion_token_ids") or []
    if all_ids is None or all_offsets is None or len(all_ids) != len(completions) or len(all_offsets) != len(completions):
        return None
    turns = []
    for turn, (completion, ids, offsets) in enumerate(zip(completions, all_ids, all_offsets)):
        if ids is None or offsets is None:
            if completion:
                return None
            ids, offsets = [], [0]  # an empty turn (aborted at once) keeps nothing
        if not top_p_offsets_ok(ids, offsets, len(completion)):
            raise ValueError(
                f"turn {turn}: top-p offsets malformed ({len(offsets)} offsets for {len(completion)} tokens, "
                f"{len(ids)} ids)"
            )
        turns.append(([int(i) for i in ids], [int(o) for o in offsets]))
    return turns


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
    top_p = turn_top_p(detail)
    spans = (detail.get("extra") or {}).get("version_spans") or [None] * len(completions)
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
        if current is None:  # every segment carries its own top-p data, from offset 0
            current = Segment(prompt_ids=list(prompt))
            if top_p is not None:
                current.top_p_ids, current.top_p_offsets = [], [0]
        start = len(current.response_ids)
        current.extend(
            list(completion), mask=1, logprobs=[float(x) for x in lps], top_p=top_p[turn] if top_p else None
        )
        current.turns.append(turn)
        current.version_spans.append(None if spans[turn] is None else
                                     [(str(v), start + a, start + b) for v, a, b in spans[turn]])
    if current is not None:
        segments.append(current)
    return segments, drift



def trial_to_episode(
    result,
    *,
    group_index: int | None = None,
    index: int | None = None,
    rollout_id: int | None = None,
    tokenizer=None,
    reward_mapping: str = "raw",
    recorded=None,
    grading=None,
    hack_action: str | None = None,
) -> Episode:
    """Convert one Harbor TrialResult to an Episode (several segments if the tokens drifted).

    reward_mapping: "raw" keeps the verifier's reward; "pm1" maps reward r in [0, 1] to 2r - 1
    (reward.py decides the reward). Infra failures carry reward None; they are never trained.
    recorded: the model gateway's session of the trial (anything with rollout_details(),
    exit_reason and stats, e.g. a GatewaySession): its branches replace the agent's own
    rollout_details, one segment (or more) per branch, all with the episode's rollout_id.
    grading: the trial's GradingReport (grading/grade.py): its findings in the metadata, its hack
    flags acted on by `hack_action` (the run's); None: a trial our grading stages did not grade.
    Scored-or-not (episode.episode_end) and the reward (reward.REWARD_RULES) are decided here, once.
    """
    ended = episode_end(result, gateway_exit=recorded.exit_reason if recorded is not None else None)
    case = RewardCase(rewards=result.verifier_result.rewards if result.verifier_result else None,
                      scored=ended.reward is not None, mapping=reward_mapping,
                      hack_flags=tuple(grading.flags) if grading is not None else None, hack_action=hack_action)
    decided = decide_reward(case)  # the one decision: the verifier's value, tampering, mapping, hack flags
    tokenizer = tokenizer if tokenizer is not None else agent_tokenizer(result)
    agent_result = result.agent_result
    # One owner of the episode's tokens: the gateway's recording where the agent's calls went
    # through it, else the agent's own record (one RolloutDetail: the native agent, an agent
    # that samples the policy itself and fills Harbor's rollout_details), else none.
    details = recorded.rollout_details() if recorded is not None else []
    if not details and not (recorded is not None and recorded.stats.get("calls")):
        details = ((agent_result.rollout_details if agent_result else None) or [])[:1]
    segments, drift = [], 0
    for detail in details:
        branch_segments, branch_drift = split_into_segments(detail)
        versions = (detail.get("extra") or {}).get("weight_version")
        for seg in branch_segments:
            if versions:  # one entry per model call of the segment, as SLiME's Sample.weight_versions
                seg.weight_versions = [str(versions[t]) for t in seg.turns if versions[t] is not None]
            if tokenizer:
                seg.prompt, seg.response = tokenizer.decode(seg.prompt_ids), tokenizer.decode(seg.response_ids)
        segments += branch_segments
        drift += branch_drift
    metadata = {
        "task_name": result.task_name,
        "trial_name": result.trial_name,
        "trial_dir": _trial_dir(result),
        "raw_rewards": result.verifier_result.rewards if result.verifier_result else None,
        "agent": result.agent_info.name if result.agent_info else None,
        "turns": (agent_result.metadata or {}).get("turns") if agent_result else None,
        "exception_type": result.exception_info.exception_type if result.exception_info else None,
        # Per turn: "stop", or "length" where the turn hit the max-new-token limit (filters.py).
        "finish_reasons": ([r for d in details for r in (d.get("extra") or {}).get("finish_reason") or []]
                           if details else None),
        **(grading.metadata() if grading is not None else {}),  # the watch's and the twin's outcomes
        **decided.metadata,  # tampering, hack flags
        "drift_count": drift,
        "n_segments": len(segments),
    }
    metadata["weight_sync"] = weight_sync_counts(recorded, details)
    if recorded is not None:
        metadata["n_branches"] = len(details)
        metadata["gateway"] = {**recorded.stats, "exit_reason": recorded.exit_reason}
        if metadata["turns"] is None:
            metadata["turns"] = sum(len(d["completion_token_ids"]) for d in details)
    # A screened episode (the hack_action rule's mask reason) is masked as filters.mask would: only
    # one still in training (scored, with tokens sampled).
    masked_by = decided.masked_by if decided.reward is not None and segments else None
    return Episode(task_name=result.task_name, group_index=group_index, index=index, end=ended,
                   reward=decided.reward, segments=segments, metadata=metadata, rollout_id=rollout_id,
                   reward_case=case, masked_by=masked_by)


def trial_passed(result, recorded=None) -> bool:
    """Whether the finished trial's verifier scored it a success, before any hack flag (grading's
    twin stage asks: only a passing trial is graded again on its impossible twin)."""
    ended = episode_end(result, gateway_exit=recorded.exit_reason if recorded is not None else None)
    return verifier_passed(RewardCase(rewards=result.verifier_result.rewards if result.verifier_result else None,
                                      scored=ended.reward is not None))


WEIGHT_SYNC_COUNTS = ("interrupted_calls", "discarded_tokens", "reprefill_tokens")
"""What weight updates did to an episode's model calls (Generation's figures, summed)."""


def weight_sync_counts(recorded, details: list[dict]) -> dict[str, int]:
    """The episode's WEIGHT_SYNC_COUNTS: from the gateway's session (every call, trained or not),
    else from the agent's own record (the native agent's per-turn lists)."""
    if recorded is not None:
        counts = getattr(recorded, "weight_sync", None) or {}
        return {k: int(counts.get(k, 0)) for k in WEIGHT_SYNC_COUNTS}
    extra = [(d.get("extra") or {}) for d in details]
    return {"interrupted_calls": sum(map(bool, (x for e in extra for x in e.get("interrupted") or []))),
            "discarded_tokens": sum(x for e in extra for x in e.get("discarded_tokens") or []),
            "reprefill_tokens": sum(x for e in extra for x in e.get("reprefill_tokens") or [])}


def agent_tokenizer(result):
    """The tokenizer the trial's agent used (the native agent's tokenizer_path kwarg), or None.

    Lets callers that pass no tokenizer still get the prompt / response text."""
    config = getattr(result, "config", None)
    agent = getattr(config, "agent", None)
    path = (getattr(agent, "kwargs", None) or {}).get("tokenizer_path")
    try:
        return load_tokenizer(path)
    except (OSError, ValueError):  # a result read later whose model dir moved: its text is optional, its tokens are not
        return None


def _trial_dir(result) -> str | None:
    uri = result.trial_uri or ""
    return uri.removeprefix("file://") if uri else None
