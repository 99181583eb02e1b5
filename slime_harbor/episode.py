"""The episode: what one Harbor trial produced, the one owner of its outcome.

An `Episode` holds how the trial ended (`EpisodeEnd`, decided once by `episode_end` from the
trial's result and the gateway's session), the reward it trains on, its segments' tokens
(`Segment`) and what is known about it. Whether it was `scored`, and whether it is out of
training (`removed`: not scored, nothing sampled, or masked), are its own; the training samples
(samples.py) are built from it once, where it leaves (`Episode.samples`).

The words an episode ends with (STEP_LIMIT, CONTEXT_EXCEEDED: the agents' and the gateway's) are
here too: they are what its status means. Which exceptions make it ABORTED (retried), FAILED or
scored is error_kinds.ERRORS' second column, read here by the recorded exception's class name.
The converter (converter.py) builds an Episode from a trial's tokens; the filters (filters.py)
mask it; the hack monitor scores or screens it.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any

from slime_harbor.error_kinds import FAILED, RETRIED, SCORED, named_base_of_name, outcome_of_name
from slime_harbor.verifier_reward import scalar_reward
from slime_harbor.samples import SampleStatus, TrainingSample

CANCELLED = "CancelledError"
"""The trial was cancelled (its hard timeout, SLiME ending the round): retried by the table, but
never a start that failed, whenever it came."""
TIME_LIMIT = "AgentTimeoutError"
"""Harbor's agent timeout: the agent ran out of its time, a limit; scored (the table) as TRUNCATED."""
AGENT_INSTALL = "agents.installed.installs:AgentInstallError"
"""The installed agents' install failure (and its timeout, a subclass), raised before the
environment starts (trial_setup.install_agents_first): part of a start that failed."""
STEP_LIMIT = "step_limit"
"""The episode used its turns (the agent's own limit, or the gateway's max_calls)."""
CONTEXT_EXCEEDED = "context_exceeded"
"""The episode's prompt is over the context window (the run's max_context_len, else the model's):
the instruction alone, or the conversation grown over it after some turns, or a reply that filled
it. Every agent ends such an episode with this word: the native agent itself, the gateway for the
agents that sample through it (its session's exit_reason, whatever the agent did with the 400 it
got: terminus-2 raises ContextLengthExceededError, an SDK raises its BadRequestError, an installed
agent exits non-zero), the installed agents' recipes where the agent says so itself."""
TRUNCATING_EXITS = frozenset({STEP_LIMIT, CONTEXT_EXCEEDED})
"""Exits at a limit: verified and scored as TRUNCATED, the limit as the reason (see episode_end).
Agents report them in agent_result.metadata["exit_status"] (the native agent, the installed
agents' recipes); terminus-2's is read by agents/host.report_exit_status; a limit the gateway enforced
is its session's exit_reason (see episode_end)."""


SCORED_STATUSES = frozenset({SampleStatus.COMPLETED, SampleStatus.TRUNCATED})
"""The verifier scored the finished trajectory: the only episodes whose reward is trained or
counted. The others (aborted, failed) carry no reward and remove_sample=True."""


def is_scored(sample) -> bool:
    """Whether the episode was scored by the verifier: an Episode, or any sample of one
    (ours read back from JSONL, SLiME's Sample: same values)."""
    return SampleStatus(getattr(sample.status, "value", sample.status)) in SCORED_STATUSES and sample.reward is not None


@dataclass
class Segment:
    """One token-aligned stretch of an episode: a prompt and the response that follows it.

    With top-p replay recorded, `top_p_ids` / `top_p_offsets` span the whole response the way
    SLiME's Sample holds them: sampled token i keeps top_p_ids[offsets[i]:offsets[i + 1]], and
    tokens the policy did not sample get empty sets (the offset repeats), as SLiME's
    `_pad_rollout_top_p_offsets` pads non-trainable tokens.
    """

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: list[int] = field(default_factory=list)
    top_p_ids: list[int] | None = None
    top_p_offsets: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    """One entry per model call, as SLiME's Sample.weight_versions (strings): the oldest version
    that sampled a token of the call; empty where unknown."""
    version_spans: list[list[tuple[str, int, int]] | None] = field(default_factory=list)
    """Per model call (as `turns`), which version sampled which of its tokens: (version, start,
    end) over the segment's response positions; None where the sampler named none."""
    prompt: str = ""
    response: str = ""
    """The decoded text, where a tokenizer was at hand."""

    def extend(
        self,
        ids: list[int],
        mask: int,
        logprobs: list[float] | None = None,
        top_p: tuple[list[int], list[int]] | None = None,
    ) -> None:
        self.response_ids += ids
        self.loss_mask += [mask] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)
        if self.top_p_offsets is None:
            return
        base = self.top_p_offsets[-1]
        if top_p is None:  # not sampled here: empty kept sets
            self.top_p_offsets += [base] * len(ids)
        else:
            kept, offsets = top_p
            self.top_p_ids += kept
            self.top_p_offsets += [base + o for o in offsets[1:]]


def environment_start_failed(result) -> bool:
    """The trial raised while its environment was starting (or failing its healthcheck, or while
    the agent's install that comes first was built): the agent was never set up. An error the table
    fails (a build failure: the same again next time) and a cancellation are excluded."""
    exc = result.exception_info
    return (
        exc is not None
        and outcome_of_name(exc.exception_type) != FAILED
        and exc.exception_type != CANCELLED
        and (result.environment_setup is not None or named_base_of_name(exc.exception_type) == AGENT_INSTALL)
        and result.agent_setup is None
    )


def agent_exit_status(result) -> str | None:
    """How the agent says its episode ended (agent_result.metadata["exit_status"]; a host agent
    that says nothing has it filled in by agents/host.report_exit_status)."""
    meta = (result.agent_result.metadata if result.agent_result else None) or {}
    return meta.get("exit_status")


@dataclass(frozen=True)
class EpisodeEnd:
    """How an episode ended, decided once (:func:`episode_end`), held by its :class:`Episode` and
    read from there by everything after: the episode's samples, the filters (its exit_status),
    the rollout's environment-start retry, the SLiME hook's retries and the summaries."""

    status: SampleStatus
    reward: float | None
    """The verifier's scalar reward; None unless the episode is scored (completed or truncated)."""
    exit_status: str | None
    """submitted | step_limit | context_exceeded | aborted | ...: the agent's own word, else the
    gateway's (the step or context limit it enforced); None where neither says."""
    why: str
    """One line: the status' reason."""
    environment_start_failed: bool = False
    """The environment never started (the agent was never set up): worth another start."""


def episode_end(result, gateway_exit: str | None = None) -> EpisodeEnd:
    """How the trial's episode ended, from everything that knows: the agent's result, the model
    gateway's session (`gateway_exit`: its exit_reason, "policy_unavailable" aborts the episode,
    a limit it enforced truncates it, whatever the agent did with the 400 it got), the
    environment and the verifier. Only verifier-scored episodes keep a reward.

    An exception Harbor recorded decides by its row in error_kinds.ERRORS (its second column):
    failed is FAILED first of all; scored keeps the verifier's reward (VerifierRefused's 0 as
    COMPLETED, AgentTimeoutError as TRUNCATED); retried is ABORTED (the retry budget runs it again).
    A class of no row is FAILED (error_kinds.UNNAMED_OUTCOME), unless the environment was starting
    (ABORTED, a start that failed) or the episode ended at a limit (TRUNCATED, scored).

    An episode at a limit (TRUNCATING_EXITS) is TRUNCATED and scored, with the limit as its reason
    whatever exception the agent ended on (rollout.end_run_at_gateway_limits lets the verifier run
    after an agent raised on the gateway's refusal). That includes a first prompt already over the
    context window (CONTEXT_EXCEEDED, nothing sampled), for every agent alike: it is scored on the
    workdir as the agent left it, untouched, and has no tokens, so Episode.removed keeps it out of
    training and out of its group's baseline (the SLiME hook sends a removed placeholder) while the
    run's counts still show it. Masking it instead would hide a window too small for the task
    behind an infrastructure-like status; truncated is what the native agent always reported.
    """
    rewards = result.verifier_result.rewards if result.verifier_result else None
    reward = scalar_reward(rewards)
    exc = result.exception_info
    exc_type = exc.exception_type if exc else None
    outcome = outcome_of_name(exc_type) if exc else None  # error_kinds.ERRORS' second column; None: no row
    agent_exit = agent_exit_status(result)
    exit_status = agent_exit
    if gateway_exit in TRUNCATING_EXITS and agent_exit not in (*TRUNCATING_EXITS, "aborted"):
        exit_status = gateway_exit  # the gateway ended it at a limit the agent does not report
    start_failed = environment_start_failed(result)

    def end(status: SampleStatus, why: str, scored: bool = False) -> EpisodeEnd:
        return EpisodeEnd(status, reward if scored else None, exit_status, why, start_failed)

    if outcome == FAILED:  # the table's failed: the same again next time, whatever else happened
        return end(SampleStatus.FAILED, f"{exc_type}: {exc.exception_message}")
    if outcome == SCORED and exc_type != TIME_LIMIT and reward is not None:  # the policy tampered: scored 0 (isolation.py)
        return end(SampleStatus.COMPLETED, exc.exception_message, scored=True)
    if gateway_exit == "policy_unavailable":
        return end(SampleStatus.ABORTED, "policy unavailable (the gateway answered 503)")
    if outcome == RETRIED or exit_status == "aborted" or start_failed:
        why = f"{exc_type}: {exc.exception_message}" if exc else f"policy abort: {exit_status}"
        return end(SampleStatus.ABORTED, f"environment start failed: {why}" if start_failed else why)
    if reward is None:
        return end(SampleStatus.FAILED, f"{exc_type}: {exc.exception_message}" if exc else "verifier produced no reward")
    if exit_status in TRUNCATING_EXITS:
        return end(SampleStatus.TRUNCATED, exit_status, scored=True)
    if exc_type == TIME_LIMIT:
        return end(SampleStatus.TRUNCATED, exc_type, scored=True)
    if exc_type is not None:  # a class of no row (error_kinds.UNNAMED_OUTCOME): the trial's own failure
        return end(SampleStatus.FAILED, f"{exc_type}: {exc.exception_message}")
    return end(SampleStatus.COMPLETED, exit_status or "completed", scored=True)


@dataclass
class Episode:
    """What one trial produced, the one owner of its outcome: how it ended (`end`), the reward it
    trains on, its segments' tokens, what is known about it (`metadata`, written once) and whether
    a filter took it out of training (`masked_by`). The training samples (`samples`) are built from
    it once, where it leaves (for SLiME, JSONL, the update's batch); until then the retry policy,
    the hack monitor and the filters change the episode, never a sample."""

    task_name: str
    group_index: int
    index: int
    end: EpisodeEnd
    reward: float | None
    """The reward trained on, as reward.py's rules decided it (reward_mapping applied, a hack
    penalty too); None unless scored."""
    segments: list[Segment] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    """Everything else known about the episode (trial_dir, agent, turns, raw_rewards, tampering,
    gateway stats, drift, hack flags, env_start_attempts, ...): every sample carries it, with how
    the episode ended (exit_status, status_reason)."""
    rollout_id: int | None = None
    seconds: float = 0.0
    masked_by: str | None = None
    """Which filter took the scored episode out of training and out of its group's baseline (one of
    filters.MASK_REASONS, written by filters.mask, or by the reward's one decision where the run
    screens a hack: converter.trial_to_episode); None while it is not masked. Its samples
    carry it as metadata["masked_by"]."""
    reward_case: Any = None
    """What `reward` was decided from (reward.RewardCase: the trial's result and its grading's
    flags), kept so that its reward can be read under another key (reward.reward_under); None for an
    episode built without one."""

    @property
    def status(self) -> SampleStatus:
        return self.end.status

    @property
    def scored(self) -> bool:
        """The verifier scored the episode: its reward is trained and counted."""
        return is_scored(self)

    @property
    def error(self) -> str | None:
        """Why the episode was not scored; None when it was."""
        return None if self.scored else self.end.why

    @property
    def unscored_reason(self) -> str | None:
        """Why the verifier did not score the episode, as a short key to count episodes by (its
        samples carry it as metadata["unscored"]); None when it was scored. `error` has the
        one-line detail. The environment never started; else the exception Harbor recorded (the
        image did not build, the verifier wrote no reward file, ...); else the policy server
        went away (policy_unavailable, policy_aborted); else no_reward (the verifier ran and
        wrote none)."""
        if self.scored:
            return None
        if self.end.environment_start_failed:
            return "environment_start_failed"
        if exception := self.metadata.get("exception_type"):
            return exception
        if (self.metadata.get("gateway") or {}).get("exit_reason") == "policy_unavailable":
            return "policy_unavailable"
        if self.end.exit_status == "aborted":
            return "policy_aborted"
        return "no_reward"

    @property
    def trial_dir(self) -> str | None:
        return self.metadata.get("trial_dir")

    @property
    def removed(self) -> bool:
        """Out of training: not scored, nothing sampled, or masked (`masked_by`)."""
        return not self.scored or not self.segments or self.masked_by is not None

    @property
    def weight_versions(self) -> list[str]:
        """The weight version of each of its model calls, segment by segment (its samples'
        weight_versions, in order); empty where the sampler reported none."""
        return [v for seg in self.segments for v in seg.weight_versions]

    def retries_spent(self, why: str) -> None:
        """An aborted episode that will not run again (its task's retry budget is spent): FAILED,
        which nothing retries, with `why` before the abort's own reason. Its end stays what
        episode_end decided otherwise: only the retry policy, which the episode cannot know,
        changes."""
        assert self.end.status == SampleStatus.ABORTED, self.end.status
        assert "samples" not in self.__dict__, "the episode's samples were built already; change the episode first"
        self.end = dataclasses.replace(self.end, status=SampleStatus.FAILED, why=f"{why}; last: {self.end.why}")
        self.metadata["retry_budget_spent"] = True

    def ended_metadata(self) -> dict[str, Any]:
        """The metadata every sample of the episode carries: `metadata`, how it ended and, masked,
        by what."""
        metadata = {**self.metadata, "exit_status": self.end.exit_status, "status_reason": self.end.why}
        if self.masked_by is not None:
            metadata["masked_by"] = self.masked_by
        if self.end.environment_start_failed:
            metadata["environment_start_failed"] = True
        if (reason := self.unscored_reason) is not None:
            metadata["unscored"] = reason
        return metadata

    @functools.cached_property
    def samples(self) -> list[TrainingSample]:
        """The episode as training samples, one per segment (one without tokens where it has
        none), all with its rollout_id, reward, status and metadata. Built once, on first use."""
        common = dict(reward=self.reward, status=self.status, group_index=self.group_index, index=self.index,
                      rollout_id=self.rollout_id if self.rollout_id is not None else self.index,
                      remove_sample=self.removed)
        metadata = self.ended_metadata()
        if not self.segments:
            # Agents that record no tokens (oracle, nop, a crash before the first turn) still report
            # their reward and status; there is nothing to train on.
            return [TrainingSample(tokens=[], response_length=0, loss_mask=[], rollout_log_probs=[], **common,
                                   metadata={**metadata, "segment": 0, "no_tokens": True})]
        return [
            TrainingSample(
                tokens=seg.prompt_ids + seg.response_ids,
                response_length=len(seg.response_ids),
                loss_mask=seg.loss_mask,
                rollout_log_probs=seg.logprobs,
                prompt=seg.prompt,
                response=seg.response,
                **common,
                metadata={**metadata, "segment": k, "turn_indices": seg.turns,
                          **({"version_spans": seg.version_spans} if any(seg.version_spans) else {})},
                weight_versions=seg.weight_versions,
                rollout_top_p_token_ids=seg.top_p_ids,
                rollout_top_p_token_offsets=seg.top_p_offsets,
            )
            for k, seg in enumerate(self.segments)
        ]
