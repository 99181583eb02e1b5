"""Is the engine serving the weights the trainer holds? Asked before the first rollout and after
every weight update, on the engine that serves the rollouts.

A weight update can fail without an error: vLLM's in-place reload of a model with tied embeddings
kept its old LM head while every other layer moved, and answered 200 with the right version
label; the run then trains on samples of a model that never existed. Nothing but the served
numbers tells. So the check scores a fixed probe twice and compares:

    the trainer     log p(token i | tokens before it) with the weights it just published, float32
    the engine      the same, from one prefill, through its wire API (an engine that ScoresPrompts,
                    policy/engines/abilities.py; the requests: policy/wire_api.py)

The probe is fixed for the run: a built-in prompt until the first update, then the run's first
trained sample cut to PROBE_TOKENS tokens. The gap is the mean |difference| over its tokens. The
bound depends on the dtype the engine computes in (GAP_BOUNDS): float32 agrees with the trainer to
~1e-6, so 1e-3 is far from noise and far below a wrong layer (2e-2 for the stale LM head). bf16 and
fp16 round every layer: on an H200, the same weights in bf16 sat 8e-3 (Qwen3-0.6B's shape) to 5e-2
(the tiny model) from the float32 trainer (bench/weight_check_bf16.py), so their bound, 0.5, is ten
times that and catches a gross fault (another model: 3.8) but not a stale LM head early, which stays
inside bf16's rounding for hundreds of updates; the gap per update in metrics.json shows its drift.
A dtype the engine does not name has no bound: its gap is warned about, never an error. An engine
that cannot score a prompt (a bare OpenAI-compatible server) cannot be checked: said once, no figures.

    WeightCheck(url, mode)          mode: error (stop the run) | warn (say it, go on) | off
    .check(model, version)          -> {"weight_sync/probe_gap", "weight_sync/probe_gap_max",
                                        "weight_sync/probe_ms"}; raises WeightMismatch (one line)
    .fix_probe(tokens)              the first trained sample's tokens (only the first call counts)
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

import httpx

from slime_harbor.policy.engines.abilities import ReportsDtype, ScoresPrompts
from slime_harbor.policy.wire_api import UnscoredPrompt

CHECK_MODES = ("error", "warn", "off")
PROBE_TOKENS = 256
"""Most tokens the probe scores (a prefill of this many is milliseconds on any engine)."""
HALF_PRECISION_BOUND = 0.5
"""bf16's and fp16's bound: ten times the bf16 rounding measured on an H200 (mean gap 8e-3 to 5e-2,
bench/weight_check_bf16.py, Hugging Face's forward standing in for an engine's kernels)."""
GAP_BOUNDS = {"float32": 1e-3, "bfloat16": HALF_PRECISION_BOUND, "float16": HALF_PRECISION_BOUND}
"""Mean |engine - trainer| logprob gap allowed per dtype the engine computes in. A dtype missing
here (one the engine does not name) has no bound: its gap is warned about, never an error."""
BUILTIN_PROBE = ("You are a coding agent in a Linux sandbox. Fix the failing test in /app, run it, "
                 "and reply with the command you ran and its output.")
"""What the probe scores before the run has trained a sample (the check before the first rollout)."""


class WeightMismatch(RuntimeError):
    """The engine serves other weights than the trainer holds (one line: engine, version, gap, cause)."""


@dataclass
class WeightCheck:
    url: str
    """The engine's root (SGLang, its router, vLLM, or ours)."""
    mode: str = "error"
    """error | warn | off."""
    lora_name: str | None = None
    """The adapter the rollouts sample (None: the engine's own weights)."""
    probe: list[int] = field(default_factory=list)
    """The token ids scored (set by fix_probe, or the built-in prompt on the first check)."""
    fixed: bool = False
    """Whether the probe is the run's first trained sample (it is kept from then on)."""
    unscorable: bool = field(default=False, init=False)
    """Whether the engine was found unable to score a prompt (said once)."""

    def __post_init__(self) -> None:
        if self.mode not in CHECK_MODES:
            raise ValueError(f"weight check must be one of {', '.join(CHECK_MODES)}, got {self.mode!r}")
        self.url = self.url.rstrip("/")

    def fix_probe(self, tokens: list[int]) -> None:
        """The run's first trained sample becomes the probe (cut to PROBE_TOKENS); later calls keep it."""
        if not self.fixed and len(tokens) >= 2:
            self.probe, self.fixed = list(tokens[:PROBE_TOKENS]), True

    def check(self, model, tokenizer, version: int | str, cause: str = "") -> dict[str, float]:
        """Score the probe with `model` (the trainer's weights of `version`) and on the engine;
        their gap in metrics.json's keys. Over the engine's dtype bound: WeightMismatch (mode
        error) or a warning (warn); `cause` is the likely one, for that line."""
        if self.mode == "off":
            return {}
        if not self.probe:
            self.probe = tokenizer.encode(BUILTIN_PROBE)[:PROBE_TOKENS]
        from slime_harbor.policy.probe import probe as engine_at

        engine = engine_at(self.url)
        if not isinstance(engine, ScoresPrompts):
            if not self.unscorable:
                print(f"weight check: {engine.kind} at {self.url} cannot score a prompt, so what it serves is "
                      "not checked", file=sys.stderr)
            self.unscorable = True
            return {}
        started = time.perf_counter()
        ours = trainer_logprobs(model, self.probe)
        try:
            served = engine.score(self.probe, self.lora_name)
        except UnscoredPrompt as exc:
            raise WeightMismatch(f"{exc} for the weight check") from None
        except httpx.HTTPError as exc:
            raise WeightMismatch(f"{self.url} failed during the weight check: {type(exc).__name__}: {exc}") from None
        gaps = [abs(a - b) for a, b in zip(ours, served, strict=True)]
        figures = {"weight_sync/probe_gap": sum(gaps) / len(gaps), "weight_sync/probe_gap_max": max(gaps),
                   "weight_sync/probe_ms": round((time.perf_counter() - started) * 1000, 1)}
        dtype = (engine.dtype() if isinstance(engine, ReportsDtype) else None) or "unknown"
        bound = GAP_BOUNDS.get(dtype)
        gap = figures["weight_sync/probe_gap"]
        if bound is not None and gap <= bound:
            return figures
        line = (f"{engine.kind} at {self.url} serves other weights than the trainer's version {version}: mean |logprob "
                f"gap| {gap:.2e} over {len(gaps)} probe tokens")
        if bound is None:
            # No bound for this dtype yet: say the gap, once per check, and go on.
            print(f"weight check: {line} (the engine computes in {dtype}, which has no bound: "
                  "not an error)", file=sys.stderr)
            return figures
        line += f" (bound {bound:.0e} for {dtype})" + (f"; likely cause: {cause}" if cause else "")
        if self.mode == "error":
            raise WeightMismatch(line)
        print(f"weight check: {line}", file=sys.stderr)
        return figures


def trainer_logprobs(model, tokens: list[int]) -> list[float]:
    """log p(token i | tokens before it), i >= 1, from `model` in float32 at temperature 1."""
    import torch

    device = next(model.parameters()).device
    ids = torch.tensor([tokens], dtype=torch.long, device=device)
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits[0, :-1].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, ids[0, 1:, None])[:, 0].cpu().tolist()


