"""The training sample: what one trajectory (or one segment of it) becomes.

Fields and meanings are SLiME's `slime.utils.types.Sample`, so the SLiME hook converts with
`to_slime()` and the local trainer reads the same object. Kept as a plain dataclass here so the
chain runs where slime is not installed.

Layout of one sample (SLiME convention):
    tokens          = prompt_ids + response_ids
    response_length = len(response_ids)
    loss_mask       = one entry per response token: 1 = sampled by the policy, 0 = observation /
                      template tokens the policy did not generate
    rollout_log_probs = one entry per response token: the sampler's logprob, 0.0 where masked
    rollout_top_p_token_ids / rollout_top_p_token_offsets (top-p replay, None unless recorded):
                      response token i kept ids[offsets[i]:offsets[i + 1]]; len(offsets) =
                      response_length + 1; masked tokens keep nothing (the offset repeats)
    weight_versions = one entry per model call of the sample, in order: the server's weight
                      version that sampled it (a string, as SLiME stores meta_info's); empty when
                      the sampler reported none
"""

from __future__ import annotations

import math

import dataclasses
import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


def top_p_offsets_ok(ids, offsets, n_tokens: int) -> bool:
    """Whether top-p replay data is well formed for n_tokens tokens (SLiME's layout): one offset per
    token plus one, from 0 to len(ids), never decreasing; token i kept ids[offsets[i]:offsets[i+1]]."""
    return (
        len(offsets) == n_tokens + 1
        and offsets[0] == 0
        and offsets[-1] == len(ids)
        and all(a <= b for a, b in zip(offsets, offsets[1:]))
    )


class SampleStatus(str, Enum):
    """SLiME's `Sample.Status` values (pending is never written by us)."""

    COMPLETED = "completed"  # agent finished (submitted or stopped) and the verifier ran
    TRUNCATED = "truncated"  # step / token / time limit hit; the verifier still scored it
    ABORTED = "aborted"  # infrastructure failure or cancellation: never trained on
    FAILED = "failed"  # the agent or verifier raised; no trustworthy reward


SUCCESS_REWARD = 1.0
"""The reward of a solved task: Harbor's binary verifiers write 1 (0 for a failure), and pm1
reward mapping keeps 1 for a success (2r - 1)."""


def is_success(reward: float | None) -> bool:
    """Whether a trial's reward counts as solving its task (pass@k's and pass rates' success): a
    reward of at least SUCCESS_REWARD. None (not scored) is no success."""
    return reward is not None and reward >= SUCCESS_REWARD


def pass_at_k(n: int, c: int, k: int) -> float | None:
    """Unbiased pass@k from n episodes with c successes; None when n < k (not estimable)."""
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if n < k:
        return None
    if n - c < k:  # every draw of k contains a success
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@dataclass
class TrainingSample:
    tokens: list[int]
    response_length: int
    loss_mask: list[int]
    rollout_log_probs: list[float]
    reward: float | None
    status: SampleStatus
    prompt: str = ""
    response: str = ""
    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    remove_sample: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)
    rollout_top_p_token_ids: list[int] | None = None
    rollout_top_p_token_offsets: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)

    @property
    def prompt_ids(self) -> list[int]:
        return self.tokens[: len(self.tokens) - self.response_length]

    @property
    def response_ids(self) -> list[int]:
        return self.tokens[len(self.tokens) - self.response_length :]

    def check(self) -> None:
        """Raise ValueError if the SLiME layout invariants do not hold."""
        n = self.response_length
        if not (len(self.loss_mask) == n == len(self.rollout_log_probs)):
            raise ValueError(
                f"sample layout broken: response_length={n}, len(loss_mask)={len(self.loss_mask)}, "
                f"len(rollout_log_probs)={len(self.rollout_log_probs)}"
            )
        if n > len(self.tokens):
            raise ValueError(f"response_length {n} exceeds len(tokens) {len(self.tokens)}")
        if any(m == 0 and lp != 0.0 for m, lp in zip(self.loss_mask, self.rollout_log_probs)):
            raise ValueError("masked positions must carry logprob 0.0")
        self._check_top_p()

    def _check_top_p(self) -> None:
        ids, offsets = self.rollout_top_p_token_ids, self.rollout_top_p_token_offsets
        if ids is None and offsets is None:
            return
        if ids is None or offsets is None:
            raise ValueError("top-p replay needs both rollout_top_p_token_ids and rollout_top_p_token_offsets")
        if len(offsets) != self.response_length + 1 or offsets[0] != 0 or offsets[-1] != len(ids):
            raise ValueError(
                f"top-p layout broken: {len(offsets)} offsets for response_length {self.response_length} "
                f"(want response_length + 1, from 0 to len(ids) = {len(ids)})"
            )
        for i, (token, mask) in enumerate(zip(self.response_ids, self.loss_mask)):
            start, end = offsets[i], offsets[i + 1]
            if end < start:
                raise ValueError(f"top-p offsets decrease at response token {i}")
            if mask == 0 and end != start:
                raise ValueError(f"masked response token {i} has a non-empty top-p set")
            if mask == 1 and token not in ids[start:end]:
                raise ValueError(f"sampled response token {i} ({token}) is not in its top-p set")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["status"] = self.status.value
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainingSample":
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in names}
        kwargs["status"] = SampleStatus(kwargs["status"])
        return cls(**kwargs)

    def to_slime(self, sample=None, tokenizer=None):
        """Fill `sample` (SLiME's Sample, or any object shaped like it) with these fields; with no
        sample, create a `slime.utils.types.Sample` (needs slime).

        `tokenizer` decodes the response text when this sample carries none."""
        if sample is None:
            from slime.utils.types import Sample

            sample = Sample()
        s, Sample = sample, type(sample)
        s.tokens = list(self.tokens)
        s.response_length = self.response_length
        s.loss_mask = list(self.loss_mask)
        s.rollout_log_probs = list(self.rollout_log_probs)
        if self.rollout_top_p_token_offsets is not None:
            s.rollout_top_p_token_ids = list(self.rollout_top_p_token_ids)
            s.rollout_top_p_token_offsets = list(self.rollout_top_p_token_offsets)
        s.reward = self.reward if self.reward is not None else 0.0
        s.status = Sample.Status(self.status.value)
        s.response = self.response or (tokenizer.decode(self.response_ids) if tokenizer is not None else "")
        if self.prompt:
            s.prompt = self.prompt
        if self.group_index is not None:
            s.group_index = self.group_index
        if self.index is not None:
            s.index = self.index
        s.rollout_id = self.rollout_id
        s.weight_versions = list(self.weight_versions)
        s.remove_sample = self.remove_sample
        s.metadata = {**(s.metadata or {}), **self.metadata}
        return s


def episode_key(sample) -> tuple:
    """The episode a sample belongs to: (group_index, rollout_id, or index without one). The
    converter splits an episode whose tokens drifted into several samples sharing one rollout_id;
    they are one episode in a group's baseline, in a filter's count and in a staleness verdict.
    For where an episode is only samples (the learner's batch, SLiME's Samples in the hooks);
    what holds the Episodes reads them. Works on SLiME's Sample and on an episode.Episode too
    (same attribute names)."""
    return sample.group_index, sample.rollout_id if sample.rollout_id is not None else sample.index


def mask_older_tokens(sample: TrainingSample) -> int:
    """SLiME's --mask-offpolicy-in-partial-rollout for a model call a weight update interrupted:
    only the tokens sampled after its last interruption train (those of its last version; the
    earlier ones are masked, logprob 0.0, top-p set emptied). Reads metadata["version_spans"] (per
    call, over response positions); returns the sampled tokens masked now."""
    masked = 0
    for call in sample.metadata.get("version_spans") or []:
        for _, start, end in (call or [])[:-1]:
            for i in range(start, end):
                if sample.loss_mask[i]:
                    sample.loss_mask[i], sample.rollout_log_probs[i] = 0, 0.0
                    masked += 1
    ids, offsets = sample.rollout_top_p_token_ids, sample.rollout_top_p_token_offsets
    if masked and offsets is not None:
        kept_ids, kept_offsets = [], [0]
        for i, mask in enumerate(sample.loss_mask):
            kept_ids += ids[offsets[i]:offsets[i + 1]] if mask else []
            kept_offsets.append(len(kept_ids))
        sample.rollout_top_p_token_ids, sample.rollout_top_p_token_offsets = kept_ids, kept_offsets
    return masked


def write_jsonl(path, samples: list[TrainingSample]) -> None:
    with open(path, "w") as f:
        for s in samples:
            f.write(s.to_json() + "\n")


def read_jsonl(path) -> list[TrainingSample]:
    with open(path) as f:
        return [TrainingSample.from_dict(json.loads(line)) for line in f if line.strip()]
