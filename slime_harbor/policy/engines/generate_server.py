"""The abilities of a server whose native API is /generate (SGLang's, which our embedded server
copies endpoint for endpoint): one implementation, which both kinds inherit.

    version    GET /model_info's weight_version (SGLang 0.5.23 has no /get_weight_version);
               POST /update_weight_version {"new_version"}
    dtype      GET /server_info's dtype ("auto" is the checkpoint's: a float32 checkpoint runs in
               float16, as SGLang picks it)
    update     POST /pause_generation {"mode": abort | retract}, /update_weights_from_disk
               {"model_path", "weight_version"}, /continue_generation
    LoRA       POST /load_lora_adapter {"lora_name", "lora_path"}, /unload_lora_adapter {"lora_name"}
"""

from __future__ import annotations

import json
from pathlib import Path

from slime_harbor.policy.engines.abilities import (
    LoadsLoRA, ReportsDtype, ReportsVersion, ScoresPrompts, UpdatesFromDisk, call,
)
from slime_harbor.policy.engines.base import Engine, ServerAnswers, get_json
from slime_harbor.policy.wire_api import GENERATE_API

DTYPE_ALIASES = {"half": "float16", "float": "float32", "fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}
"""--dtype choices that name a torch dtype by another word."""


class GenerateServer(Engine, ReportsVersion, ReportsDtype, UpdatesFromDisk, LoadsLoRA, ScoresPrompts):
    wire_api = GENERATE_API
    pause_modes = ("abort", "retract")

    def weight_version(self) -> str | None:
        version = (get_json(self.url + "/model_info", 30) or {}).get("weight_version")
        return None if version is None else str(version)

    def set_weight_version(self, version: str, timeout_s: float = 60.0) -> None:
        call(self.url + "/update_weight_version", {"new_version": version}, timeout_s)

    def dtype(self) -> str | None:
        info = get_json(self.url + "/server_info", 30) or {}
        dtype = info.get("dtype")
        if dtype == "auto":
            try:
                saved = json.loads((Path(str(info.get("model_path") or "")) / "config.json").read_text())
            except (OSError, ValueError):
                return None
            saved_dtype = saved.get("torch_dtype") or saved.get("dtype")
            return "float16" if saved_dtype in (None, "float32") else str(saved_dtype)
        return DTYPE_ALIASES.get(str(dtype), str(dtype)) if dtype else None

    def update_from_disk(self, path: Path, version: str, pause: str, timeout_s: float) -> None:
        call(self.url + "/pause_generation", {"mode": pause}, timeout_s)
        try:
            # It flushes its prefix cache on this update (flush_cache defaults on): a retracted call
            # is prefilled again from the new weights, not served the old ones' KV.
            call(self.url + "/update_weights_from_disk", {"model_path": str(path), "weight_version": version},
                 timeout_s)
        finally:
            call(self.url + "/continue_generation", {}, timeout_s, check=False)

    def load_lora(self, name: str, path: Path, timeout_s: float) -> None:
        call(self.url + "/unload_lora_adapter", {"lora_name": name}, timeout_s, check=False)  # an earlier run's
        call(self.url + "/load_lora_adapter", {"lora_name": name, "lora_path": str(path)}, timeout_s)

    def unload_lora(self, name: str, timeout_s: float) -> None:
        call(self.url + "/unload_lora_adapter", {"lora_name": name}, timeout_s)


def pool_capped_context(answers: ServerAnswers, info: dict) -> int | None:
    """Its context limit: /v1/models' max_model_len, capped by the KV pool /server_info states
    (max_total_num_tokens: no request holds more)."""
    context, pool = answers.context_len, info.get("max_total_num_tokens")
    return min(context or int(pool), int(pool)) if pool else context
