"""SGLang, SLiME's sampler, from its own venv (scripts/setup-sglang.sh)."""

from __future__ import annotations

import os
from pathlib import Path

from slime_harbor.policy.wire_api import GENERATE_API
from slime_harbor.policy.engines.base import INITIAL_WEIGHT_VERSION, Engine

SGLANG_VERSION = "0.5.23"
CPU_SHIMS = Path(__file__).resolve().parents[1] / "cpu_shims"
"""Holds the sgl_kernel stand-in that SGLang imports on a CPU (see its docstring)."""


class SGLang(Engine):
    name = "sglang"
    wire_api = GENERATE_API
    setup_script = "scripts/setup-sglang.sh"

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
