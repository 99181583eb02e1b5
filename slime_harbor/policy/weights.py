"""Push a trainer's weights to a running policy server, through what its engine can do
(policy/engines/abilities.py): the server's kind comes from policy/probe.py, and each kind's class
holds its endpoints.

    lora   the adapter is saved to weights_dir/step_N and loaded under a new name (LoadsLoRA); the
           previous one is then unloaded. Rollouts name the adapter they sample from (lora_name;
           the OpenAI API's "model").
    disk   the full weights (LoRA merged in) are saved to weights_dir/step_N and loaded, labelled
           with version "N", so the server labels every token it samples from them with N (as
           SLiME's updates do) (UpdatesFromDisk). Calls in flight are aborted first (the clients
           continue them from the tokens they had, under the new weights, or sample them again
           whole; PolicyClient's keep_interrupted) and new ones wait; `pause` picks how.
    none   nothing is pushed: the server keeps the weights it has (a kind without these abilities,
           or a server that turns out not to serve the endpoints); the trainer recomputes old
           logprobs instead.

The server reads the path itself, so weights_dir must be on its filesystem (same host, or a
shared mount at the same path). SGLang serves LoRA only when started with --enable-lora (and
--max-lora-rank / --lora-target-modules that fit the adapters); our embedded server always does.
"""

from __future__ import annotations

import contextlib
import copy
import shutil
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from slime_harbor.policy.engines.abilities import EndpointMissing, LoadsLoRA, UpdatesFromDisk, WeightSyncError

MODES = ("auto", "lora", "disk", "none")
PAUSE_MODES = ("abort", "retract", "wait")
"""How a disk update pauses the calls in flight (WeightSync.pause; each kind's pause_modes says
which it has): abort on SGLang and vLLM, retract on SGLang, wait on vLLM. SGLang's in_place and
vLLM's keep are left out on purpose: a call paused so decodes on over the KV cache the old weights
computed, under the new weights, so its next tokens are sampled by neither version and no
checkpoint gives their logprobs."""


@contextlib.contextmanager
def peft_quietly():
    """Around a peft call that wraps a model in LoRA adapters (get_peft_model, PeftModel's
    from_pretrained / load_adapter): peft's PeftModel reads transformers' deprecated
    ``is_gradient_checkpointing``, which prints a FutureWarning into the CLI's output once per
    process (peft 0.18 with transformers 5.x). Only that warning, only there, is silenced: the
    code is peft's, and it reads the same value as the new name."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        yield


@dataclass
class WeightSync:
    base_url: str
    """The policy server (SGLang, or `slime-harbor serve`)."""
    mode: str
    """auto (lora for a LoRA policy on a server that loads adapters, else disk; none when the server has
    no such endpoint) | lora | disk | none."""
    weights_dir: Path
    """Where pushed weights are written (step_N/); only the latest push is kept."""
    lora_prefix: str = "policy"
    """Adapters are named <prefix>-step<N>."""
    timeout_s: float = 600.0
    pause: str = "abort"
    """PAUSE_MODES: abort (the calls in flight end with what they had; clients continue them or
    sample them again) | retract (SGLang: it prefills each call's prompt + output again under the
    new weights and decodes on; the client sees one completion) | wait (vLLM: the update waits
    until the calls in flight finish on the old weights)."""
    lora_name: str | None = field(default=None, init=False)
    """The adapter rollouts sample from now (None: the server's own weights)."""
    version: int = field(default=0, init=False)
    """The weight version the server holds: the step of the last push that succeeded (0: its own)."""
    _last_dir: Path | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"weight sync must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.pause not in PAUSE_MODES:
            raise ValueError(f"the update's pause must be one of {', '.join(PAUSE_MODES)}, got {self.pause!r}")
        self.base_url = self.base_url.rstrip("/")
        self.weights_dir = Path(self.weights_dir).resolve()  # the server resolves it, not our cwd

    def push(self, model, tokenizer, step: int) -> bool:
        """Hand `model` (a peft model or a plain HF model), the weights after `step` updates, to the
        server; False when nothing is pushed."""
        from peft import PeftModel

        lora = isinstance(model, PeftModel)
        engine = self.engine()
        # auto: a LoRA policy goes over as its adapter where the server loads adapters (ours;
        # SGLang with --enable-lora), else merged, from disk; none where its kind takes neither.
        mode = self.mode
        if mode == "auto":
            mode = ("lora" if lora and isinstance(engine, LoadsLoRA) and engine.serves_lora else
                    "disk" if isinstance(engine, UpdatesFromDisk) else "none")
            if mode == "none":
                self._take_none(f"{engine.url} ({engine.kind}) takes no weight updates")
        if mode == "none":
            return False
        if mode == "lora" and not lora:
            raise ValueError("weight sync lora needs a LoRA policy (drop --no-lora, or use disk)")
        ability = LoadsLoRA if mode == "lora" else UpdatesFromDisk
        if not isinstance(engine, ability):
            raise WeightSyncError(f"{engine.url} ({engine.kind}) cannot take a weight update by {mode}")
        if mode == "disk" and self.pause not in engine.pause_modes:
            raise WeightSyncError(f"{engine.url} ({engine.kind}) has no {self.pause} pause; "
                                  f"use {' or '.join(engine.pause_modes)}")
        out = self.weights_dir / f"step_{step}"
        try:
            if mode == "lora":
                model.save_pretrained(out)
                name = f"{self.lora_prefix}-step{step}"
                engine.load_lora(name, out, self.timeout_s)
                if self.lora_name and self.lora_name != name:
                    engine.unload_lora(self.lora_name, self.timeout_s)
                self.lora_name = name
            else:
                full = copy.deepcopy(model).merge_and_unload() if lora else model
                full.save_pretrained(out)
                tokenizer.save_pretrained(out)
                engine.update_from_disk(out, str(step), self.pause, self.timeout_s)
        except EndpointMissing as missing:
            if self.mode != "auto":
                raise
            self._take_none(str(missing))
            return False
        if self._last_dir and self._last_dir != out:
            shutil.rmtree(self._last_dir, ignore_errors=True)
        self._last_dir = out
        self.version = step
        return True

    def engine(self):
        """What serves base_url (policy/probe.py, asked once per URL)."""
        from slime_harbor.policy.probe import probe

        return probe(self.base_url)

    def _take_none(self, why: str) -> None:
        print(f"{why}: weights are not pushed; old logprobs are recomputed by the trainer and the run logs how "
              "far the server's are", file=sys.stderr)
        self.mode = "none"
