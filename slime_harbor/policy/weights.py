"""Push a trainer's weights to a running policy server, the way SGLang takes them.

    lora   the adapter is saved to weights_dir/step_N and loaded under a new name with
           POST /load_lora_adapter {"lora_name", "lora_path"}; the previous one is then unloaded
           (POST /unload_lora_adapter). vLLM: the same under /v1 (started with --enable-lora and
           VLLM_ALLOW_RUNTIME_LORA_UPDATING=True). Rollouts name the adapter they sample from
           (lora_name; vLLM's OpenAI "model").
    disk   the full weights (LoRA merged in) are saved to weights_dir/step_N and loaded, labelled
           with version "N", so the server labels every token it samples from them with N (as
           SLiME's updates do). Calls in flight are aborted first (the clients continue them from
           the tokens they had, under the new weights, or sample them again
           whole; PolicyClient's keep_interrupted) and new ones wait:
           SGLang (and ours): POST /pause_generation {"mode": "abort"} (or "retract": WeightSync.pause),
             /update_weights_from_disk {"model_path", "weight_version"}, /continue_generation;
           vLLM: POST /pause?mode=abort, /collective_rpc slime_harbor_reload_weights {"weights_path"}
             (our worker extension, policy/vllm_worker.py: vLLM's reload_weights, then a tied LM
             head re-tied; plain reload_weights on a server started without it),
             /reset_prefix_cache (no KV of the old weights serves the new version),
             /update_weight_version {"new_version"}, /resume.
    none   nothing is pushed: the server keeps the weights it has (a vLLM server without these
           endpoints); the trainer recomputes old logprobs instead.

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

import httpx

from slime_harbor.policy.engines.vllm import VLLM_WORKER_EXTENSION

MODES = ("auto", "lora", "disk", "none")
PAUSE_MODES = ("abort", "retract", "wait")
"""How a disk update pauses the calls in flight (WeightSync.pause): abort on SGLang and vLLM,
retract on SGLang, wait on vLLM. SGLang's in_place and vLLM's keep are left out on purpose: a
call paused so decodes on over the KV cache the old weights computed, under the new weights,
so its next tokens are sampled by neither version and no checkpoint gives their logprobs."""


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


class WeightSyncError(RuntimeError):
    """The server refused or failed a weight update: training on would sample stale weights."""


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
    _has_worker_extension: bool | None = field(default=None, init=False)
    """Whether the vLLM server was started with our worker extension (None: not asked yet)."""

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
        # auto: a LoRA policy goes over as its adapter where the server loads adapters (ours;
        # SGLang with --enable-lora), else merged, from disk.
        mode = self.mode if self.mode != "auto" else ("lora" if lora and self._serves_lora() else "disk")
        if mode == "none":
            return False
        if mode == "lora" and not lora:
            raise ValueError("weight sync lora needs a LoRA policy (drop --no-lora, or use disk)")
        out = self.weights_dir / f"step_{step}"
        if mode == "lora":
            model.save_pretrained(out)
            name = f"{self.lora_prefix}-step{step}"
            # SGLang's (and ours) at the root; vLLM's under /v1 (with VLLM_ALLOW_RUNTIME_LORA_UPDATING).
            prefix = "/v1" if self._engine().api == "openai" else ""
            self._post(f"{prefix}/unload_lora_adapter", {"lora_name": name}, check=False)  # left by an earlier run
            if not self._post(f"{prefix}/load_lora_adapter", {"lora_name": name, "lora_path": str(out)}):
                return False
            if self.lora_name and self.lora_name != name:
                self._post(f"{prefix}/unload_lora_adapter", {"lora_name": self.lora_name})
            self.lora_name = name
        else:
            full = copy.deepcopy(model).merge_and_unload() if lora else model
            full.save_pretrained(out)
            tokenizer.save_pretrained(out)
            if not self._load_from_disk(out, str(step)):
                return False
        if self._last_dir and self._last_dir != out:
            shutil.rmtree(self._last_dir, ignore_errors=True)
        self._last_dir = out
        self.version = step
        return True

    def _engine(self):
        """What serves base_url (policy/probe.py, asked once per URL)."""
        from slime_harbor.policy.probe import probe

        return probe(self.base_url)

    def _serves_lora(self) -> bool:
        return self._engine().serves_lora

    def _load_from_disk(self, path: Path, version: str) -> bool:
        """Pause (`pause`: the calls in flight aborted, retracted or waited for), load the weights
        at `path` labelled `version`, resume."""
        openai = self._engine().api == "openai"
        if self.pause in (("retract",) if openai else ("wait",)):
            raise WeightSyncError(f"{self.base_url} ({'vLLM' if openai else 'SGLang'}) has no {self.pause} pause; "
                                  f"use {'abort or wait' if openai else 'abort or retract'}")
        if openai:  # vLLM
            if not self._post(f"/pause?mode={self.pause}", {}):
                return False
            try:
                self._vllm_reload(path)
                self._post("/reset_prefix_cache", {})
                self._post("/update_weight_version", {"new_version": version})
            finally:
                self._post("/resume", {}, check=False)
            return True
        if not self._post("/pause_generation", {"mode": self.pause}):
            return False
        try:
            # SGLang flushes its prefix cache on this update (flush_cache defaults on): a retracted
            # call is prefilled again from the new weights, not served the old ones' KV.
            return self._post("/update_weights_from_disk", {"model_path": str(path), "weight_version": version})
        finally:
            self._post("/continue_generation", {}, check=False)

    def _vllm_reload(self, path: Path) -> None:
        """vLLM's in-place reload, through our worker extension where the server has it
        (policy/vllm_worker.py: the LM head of a model with tied embeddings follows the reloaded
        embeddings; vLLM's own reload_weights keeps the old head on a CPU)."""
        method = "slime_harbor_reload_weights"
        if self._has_worker_extension is not False:
            url = self.base_url + "/collective_rpc"
            try:
                reply = httpx.post(url, json={"method": method, "kwargs": {"weights_path": str(path)}},
                                   timeout=self.timeout_s)
            except httpx.HTTPError as error:
                raise WeightSyncError(f"{url} failed: {type(error).__name__}: {error}") from error
            if reply.status_code == 200:
                self._has_worker_extension = True
                return
            if f"has no attribute '{method}'" not in reply.text:  # the extension is there and failed
                raise WeightSyncError(f"{url} ({method}) answered HTTP {reply.status_code}: {reply.text[:300]}")
            self._has_worker_extension = False
            print(f"{self.base_url} runs vLLM without slime-harbor's worker extension: its reload_weights keeps the "
                  f"old LM head of a model with tied embeddings (start it with --worker-extension-cls "
                  f"{VLLM_WORKER_EXTENSION}; the weight check will tell)", file=sys.stderr)
        self._post("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(path)}})

    def _post(self, path: str, payload: dict, check: bool = True) -> bool:
        url = self.base_url + path
        try:
            response = httpx.post(url, json=payload, timeout=self.timeout_s)
        except httpx.HTTPError as error:
            raise WeightSyncError(f"{url} failed: {type(error).__name__}: {error}") from error
        if response.status_code in (404, 405) and self.mode == "auto" and check:
            print(f"{url} is not served (HTTP {response.status_code}): weights are not pushed; old logprobs "
                  "are recomputed by the trainer and the run logs how far the server's are", file=sys.stderr)
            self.mode = "none"
            return False
        ok = response.status_code == 200 and _json(response).get("success", True)
        if not ok and check:
            raise WeightSyncError(f"{url} answered HTTP {response.status_code}: {response.text[:300]}")
        return ok


def _json(response: httpx.Response) -> dict:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
