"""How one model call samples, and what it sampled.

SamplingParams: what is asked for, the one settings object from SLiME's sampling dict (the hook),
the rollout config and a gateway session, through the policy client's `/generate` request, to the
policy server and its engine. Its names, defaults and wire form are SGLang's `sampling_params`.

Generation: what came back, one sampled completion, as the engine produces it and as the policy
client reads it off the wire (SGLang's `meta_info`, which the policy server builds from it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


GENERATE_MAX_NEW_TOKENS = 128
"""SGLang's /generate default for a request that names no max_new_tokens (the wire's, which our
server follows); ours, below, is an agent turn's."""


@dataclass
class SamplingParams:
    """Per-call sampling settings (SGLang's names and defaults, but max_new_tokens: an agent turn's
    512). In an episode's settings (RolloutConfig.sampling, the native agent's option),
    sampling_seed is the episode's seed: turn t samples with turn_seed(seed, t)."""

    temperature: float = 1.0
    """Softmax temperature; 0 = greedy. 1.0 samples from the policy itself, which GRPO's importance
    ratio assumes."""
    top_p: float = 1.0
    """Nucleus mass kept; 1.0 disables it."""
    top_k: int = -1
    """Keep only the k most likely tokens; <= 0 disables it."""
    max_new_tokens: int = 512
    """Most tokens one call may generate: 512 leaves an agent's turn room for a thought and a
    command."""
    stop: list[str] = field(default_factory=list)
    """Stop when the output text contains one of these (the chat template's end-of-turn token always stops)."""
    stop_token_ids: list[int] = field(default_factory=list)
    """Extra stop token ids, besides the model's eos."""
    ignore_eos: bool = False
    """Stop neither on eos nor on stop_token_ids (benchmarks, fixed lengths)."""
    no_stop_trim: bool = False
    """Keep the stop token / stop string in the returned text."""
    skip_special_tokens: bool = True
    """Drop special tokens from the returned text."""
    spaces_between_special_tokens: bool = True
    """Passed to the tokenizer's decode (fast tokenizers ignore it)."""
    sampling_seed: int | None = None
    """Per-call seed (SLiME sends one under deterministic inference): same seed and prompt, same
    sample; None = random."""
    return_top_p_token_ids: bool = False
    """Report the ids the top-k / top-p filter kept per token (SLiME's top-p replay, on the wire as
    custom_params.return_top_p_token_ids); logprobs are then renormalised over them."""

    def __post_init__(self) -> None:
        # The one range check of these settings: the CLI, train-local, the hook and the agents all
        # build a SamplingParams (`not >=` also refuses nan).
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = [s for s in self.stop if s]

    @property
    def truncates(self) -> bool:
        """Whether sampling is truncated at all (else a server returns no kept ids)."""
        return self.temperature == 0 or self.top_k > 0 or self.top_p < 1

    def to_generate_params(self) -> dict[str, Any]:
        """SGLang's `sampling_params` dict (what /generate takes)."""
        params: dict[str, Any] = {
            "temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
            "max_new_tokens": self.max_new_tokens, "stop": list(self.stop), "stop_token_ids": list(self.stop_token_ids),
            "ignore_eos": self.ignore_eos, "no_stop_trim": self.no_stop_trim,
            "skip_special_tokens": self.skip_special_tokens,
            "spaces_between_special_tokens": self.spaces_between_special_tokens,
        }  # fmt: skip
        if self.sampling_seed is not None:
            params["sampling_seed"] = self.sampling_seed
        if self.return_top_p_token_ids:
            params["custom_params"] = {"return_top_p_token_ids": True}
        return params

    @classmethod
    def from_generate_params(cls, raw: dict[str, Any]) -> SamplingParams:
        """The inverse of to_generate_params; raises ValueError (one line) on a field it does not know."""
        raw = {k: v for k, v in raw.items() if v is not None}
        custom = raw.pop("custom_params", None) or {}
        if not isinstance(custom, dict):
            raise ValueError("custom_params must be an object")
        # SLiME's SGLang patch reads custom_params["return_top_p_token_ids"]; other custom params only
        # feed custom logit processors, which no server of ours runs.
        if custom.get("return_top_p_token_ids"):
            raw["return_top_p_token_ids"] = True
        unknown = sorted(set(raw) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"unsupported sampling params: {unknown}")
        return cls(**{"max_new_tokens": GENERATE_MAX_NEW_TOKENS, **raw})


@dataclass
class Generation:
    """One sampled completion, exactly as the sampler produced it (the engine's, or the policy
    client's reading of a server's reply)."""

    token_ids: list[int]
    """The sampled tokens (not the prompt); a matched stop token included, as SGLang does."""
    logprobs: list[float]
    """One per token: log_softmax(logits / T) before top-k / top-p (with top-p replay:
    renormalised over the kept ids)."""
    text: str
    """The decoded tokens (the server's; what it trims depends on the request)."""
    finish_reason: str
    """One of stop, length, abort (SGLang's meta_info finish_reason.type, OpenAI's finish_reason)."""
    rid: str
    """The request id it ran under (SGLang's rid)."""
    matched_stop: int | str | None = None
    """With finish_reason stop: the stop token id or stop string that ended it (SGLang's
    finish_reason.matched, vLLM's stop_reason); None otherwise or when not reported."""
    weight_version: str | None = None
    """The weights that sampled it (SGLang's meta_info.weight_version, a string on the wire and in
    the samples); of a call that spans an update, the oldest (what a staleness bound reads);
    None when not reported."""
    top_p_token_ids: list[int] | None = None
    """Top-p replay, flat as SLiME's samples carry it: token i kept
    top_p_token_ids[top_p_token_offsets[i]:top_p_token_offsets[i + 1]] (most likely first, the
    sampled token among them). None unless asked for and the sampling truncates."""
    top_p_token_offsets: list[int] | None = None
    """len(token_ids) + 1 offsets into top_p_token_ids, from 0."""
    prompt_ids: list[int] | None = None
    """The prompt it continues (the engine's; the client leaves it to the caller, who sent it)."""
    latency_s: float | None = None
    """The engine's time from submit to finish; None when not measured."""
    reissued: int = 0
    """How often the server aborted this call on its own (a weight update) and the client asked
    again: for the rest of it (keep_interrupted) or for all of it."""
    version_spans: list[tuple[str, int, int]] | None = None
    """Which weights sampled which tokens: (version, start, end) over token_ids, in order, covering
    them all (SGLang's meta_info.weight_versions; one span where a call ran under one version).
    None when the sampler reported no version."""
    discarded_tokens: int = 0
    """Tokens the server had sampled for this call when an update interrupted it and that the
    completion does not hold (sampled again whole, or of weights nobody can name)."""
    reprefill_tokens: int = 0
    """Tokens prefilled again because an update interrupted the call: each request that resumed
    it (its prompt, plus the kept tokens) less what the server found in its prefix cache, and
    for SGLang's retract the prompt plus the output it re-prefilled."""

    @property
    def interrupted(self) -> bool:
        """Whether a weight update interrupted it (asked again, or tokens of two versions)."""
        return self.reissued > 0 or len({v for v, _, _ in self.version_spans or []}) > 1

    @property
    def token_versions(self) -> list[str | None]:
        """The version of each token (None where unknown)."""
        versions: list[str | None] = [None] * len(self.token_ids)
        for version, start, end in self.version_spans or []:
            versions[start:end] = [version] * (end - start)
        return versions


def turn_seed(seed: int, turn: int) -> int:
    """The sampling_seed of turn `turn` of an episode seeded `seed`.

    Every turn differs (the same seed each turn would replay the same noise sequence on an engine
    that seeds per request), the episode is reproducible, and episodes with distinct seeds never
    share a turn seed while turns < 1,000,003 (SLiME gives group member i the seed rollout_seed + i).
    """
    return (seed * 1_000_003 + turn) % 2**63
