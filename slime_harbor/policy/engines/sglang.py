"""SGLang, SLiME's sampler, from its own venv (scripts/setup-sglang.sh), and SGLang's router in front
of several of them. Its abilities are a /generate server's (engines/generate_server.py).

    recognised by   GET /server_info (an engine); GET /workers (the router, whose /server_info there is none)
    context limit   /v1/models' max_model_len, capped by the KV pool (max_total_num_tokens); the
                    router's: its workers' lowest
    LoRA            served when started with --enable-lora (/server_info's enable_lora)
"""

from __future__ import annotations

import os
from pathlib import Path

from slime_harbor.policy.engines.abilities import StartsFromVenv
from slime_harbor.policy.engines.base import INITIAL_WEIGHT_VERSION, Engine, ServerAnswers, get_json
from slime_harbor.policy.engines.generate_server import GenerateServer, pool_capped_context

SGLANG_VERSION = "0.5.23"
CPU_SHIMS = Path(__file__).resolve().parents[1] / "cpu_shims"
"""Holds the sgl_kernel stand-in that SGLang imports on a CPU (see its docstring)."""


class SGLang(GenerateServer, StartsFromVenv):
    name = "sglang"
    setup_script = "scripts/setup-sglang.sh"

    @classmethod
    def recognise(cls, answers: ServerAnswers) -> Engine | None:
        info = answers.get("/server_info")
        if info is None:
            return None
        return cls(answers.url, pool_capped_context(answers, info), answers.served_model, bool(info.get("enable_lora")))

    @classmethod
    def venv_name(cls, gpu: bool) -> str:
        return f"sglang-{SGLANG_VERSION}"

    @classmethod
    def command(cls, python: Path, model: str, host: str, port: int, gpu: bool, env: dict[str, str]) -> list[str]:
        argv = [str(Path(python).with_name("sglang")), "serve", "--model-path", str(model), "--host", host,
                "--port", str(port), "--weight-version", INITIAL_WEIGHT_VERSION]
        if not gpu:
            argv += ["--device", "cpu", "--attention-backend", "torch_native", "--sampling-backend", "pytorch",
                     "--disable-overlap-schedule", "--disable-cuda-graph", "--max-total-tokens", "32768",
                     "--max-running-requests", "8", "--chunked-prefill-size", "1024", "--skip-server-warmup",
                     "--dtype", "float32", "--sleep-on-idle"]
            env["SGLANG_USE_CPU_ENGINE"] = "1"
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(CPU_SHIMS), env.get("PYTHONPATH")]))
        return argv


class SGLangRouter(GenerateServer):
    """SGLang's router: it forwards /generate and the update endpoints to its workers, and says no
    version or dtype of its own (its workers' are read)."""

    name = "sglang-router"

    @classmethod
    def recognise(cls, answers: ServerAnswers) -> Engine | None:
        workers = answers.get("/workers")
        if workers is None:
            return None
        limits = [(SGLang.recognise(ServerAnswers(url)) or SGLang(url)).context_len for url in _worker_urls(workers)]
        context = min((n for n in limits if n), default=answers.context_len)
        return cls(answers.url, context, answers.served_model)

    def _workers(self) -> list[SGLang]:
        """Its workers now (each asked for what it serves, not recognised again)."""
        return [SGLang(url) for url in _worker_urls(get_json(self.url + "/workers", 30))]

    def weight_version(self) -> str | None:
        """The highest of its workers' (the update reaches them one after another)."""
        versions = [w.weight_version() for w in self._workers()]
        return max((v for v in versions if v is not None), key=_version_key, default=None)

    def dtype(self) -> str | None:
        workers = self._workers()
        return workers[0].dtype() if workers else None


def _worker_urls(workers: dict | None) -> list[str]:
    """The worker URLs in a router's /workers answer."""
    return [w["url"] for w in (workers or {}).get("workers") or [] if isinstance(w, dict) and w.get("url")]


def _version_key(version: str):
    return (0, int(version)) if version.isdigit() else (1, version)
