"""What a policy server's URL serves, from the server's own answers, whoever started it (ours, the
real SGLang or vLLM, SGLang's router): its kind and context limit, the weight version it serves,
the dtype it computes in.

    probe(url)                 EngineInfo: sglang | sglang-router | vllm | embedded | openai, its limit
    weight_version(url)        the version it serves now;  set_weight_version(url, v) labels it
    server_dtype(url)          float32 | bfloat16 | ... (the weight check's bound depends on it)

What the rest of the chain needs from an engine is the protocol, not its name: SGLang's /generate
(our engine speaks it too) or vLLM's OpenAI /v1/completions with token ids. `probe` tells them
apart from the server's own answers, so `--policy-url` takes any of them with no extra flag.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path

import httpx

from slime_harbor.policy.wire_api import COMPLETIONS_API, GENERATE_API


@dataclass(frozen=True)
class EngineInfo:
    kind: str
    """sglang | sglang-router | vllm | embedded | openai (another OpenAI-compatible server)."""
    context_len: int | None
    """Prompt + completion tokens one request may hold on this server (None: it does not say)."""
    served_model: str | None = None
    """The first model name its /v1/models lists (the OpenAI API's model field)."""
    serves_lora: bool = False
    """Whether it loads LoRA adapters by name (ours always; SGLang started with --enable-lora)."""

    @property
    def api(self) -> str:
        """How clients sample from it: sglang (/generate) or openai (/v1/completions with token ids)."""
        return COMPLETIONS_API if self.kind in ("vllm", "openai") else GENERATE_API


@functools.lru_cache(maxsize=32)
def probe(url: str, timeout: float = 10.0) -> EngineInfo:
    """What ``url`` (a server's root) serves, from its own answers: vLLM's /version, SGLang's
    /server_info (a router has /workers), our engine's /server_info; its context limit from
    /v1/models (max_model_len) and, for SGLang, the KV pool (max_total_num_tokens)."""
    url = url.rstrip("/")
    with httpx.Client(timeout=timeout) as client:
        def get(path: str) -> dict | None:
            try:
                reply = client.get(url + path)
            except (httpx.HTTPError, httpx.InvalidURL):  # nothing there (yet): the callers' requests will say
                return None
            if reply.status_code != 200:
                return None
            try:
                body = reply.json()
            except ValueError:
                return None
            return body if isinstance(body, dict) else None

        models = get("/v1/models") or {}
        listed = [m for m in models.get("data") or [] if isinstance(m, dict)]
        context = min((int(m["max_model_len"]) for m in listed if m.get("max_model_len")), default=None)
        served = str(listed[0]["id"]) if listed and listed[0].get("id") else None
        if (get("/version") or {}).get("version"):  # vLLM (in dev mode it has a /server_info too)
            return EngineInfo("vllm", context, served)
        info = get("/server_info")
        if info is not None:
            kind = "embedded" if info.get("engine") == "slime-harbor-embedded" else "sglang"
            pool = info.get("max_total_num_tokens")
            if pool:
                context = min(context or int(pool), int(pool))
            return EngineInfo(kind, context, served, kind == "embedded" or bool(info.get("enable_lora")))
        workers = get("/workers")
        if workers is not None:  # SGLang's router: its workers' limit (its own /v1/models has none)
            limits = [probe(w["url"], timeout).context_len for w in workers.get("workers") or [] if w.get("url")]
            context = min((n for n in limits if n), default=context)
            return EngineInfo("sglang-router", context, served)
        return EngineInfo("openai" if models else "sglang", context, served)


def weight_version(url: str, kind: str | None = None) -> str | None:
    """The weight version ``url`` serves now: SGLang's /model_info (0.5.23 has no
    /get_weight_version), vLLM's /weight_info; under SGLang's router, the highest of its workers'."""
    kind = kind or probe(url).kind
    url = url.rstrip("/")
    with httpx.Client(timeout=30) as client:
        if kind == "sglang-router":
            workers = [w["url"] for w in client.get(f"{url}/workers").json()["workers"]]
            versions = [weight_version(w, "sglang") for w in workers]
            return max((v for v in versions if v is not None), key=_version_key, default=None)
        path = "/weight_info" if kind == "vllm" else "/model_info"
        reply = client.get(url + path)
        if reply.status_code != 200:
            return None
        version = reply.json().get("weight_version")
        return None if version is None else str(version)


def server_dtype(url: str, kind: str | None = None) -> str | None:
    """The dtype ``url`` computes in, where the server says: ours and SGLang in /server_info
    ("auto" there is the checkpoint's, and a float32 checkpoint runs in float16, as SGLang picks
    it), vLLM in its dev-mode /server_info; under SGLang's router, its first worker's."""
    kind = kind or probe(url).kind
    url = url.rstrip("/")
    try:
        with httpx.Client(timeout=30) as client:
            if kind == "sglang-router":
                workers = [w["url"] for w in client.get(f"{url}/workers").json()["workers"]]
                return server_dtype(workers[0], "sglang") if workers else None
            info = client.get(url + "/server_info").json()
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None
    if kind == "vllm":  # its config as one string: "model='...', ..., dtype=torch.float32, ..."
        found = re.search(r"\bdtype=torch\.(\w+)", str(info.get("vllm_config") or ""))
        return found.group(1) if found else None
    dtype = info.get("dtype")
    if dtype == "auto":
        config = Path(str(info.get("model_path") or "")) / "config.json"
        try:
            saved = json.loads(config.read_text())
        except (OSError, ValueError):
            return None
        saved_dtype = saved.get("torch_dtype") or saved.get("dtype")
        return "float16" if saved_dtype in (None, "float32") else str(saved_dtype)
    return DTYPE_ALIASES.get(str(dtype), str(dtype)) if dtype else None


DTYPE_ALIASES = {"half": "float16", "float": "float32", "fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}
"""SGLang's --dtype choices that name a torch dtype by another word."""


def _version_key(version: str):
    return (0, int(version)) if version.isdigit() else (1, version)


def set_weight_version(url: str, version: str) -> None:
    """Label the weights ``url`` serves (SGLang and vLLM: /update_weight_version)."""
    body = {"new_version": version}
    reply = httpx.post(url.rstrip("/") + "/update_weight_version", json=body, timeout=60)
    if reply.status_code != 200:
        raise RuntimeError(f"{url}/update_weight_version answered HTTP {reply.status_code}: {reply.text[:200]}")
