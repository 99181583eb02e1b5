"""The engines we start, one class each, found by their `--engine` name (ENGINE_TYPES).

    base.py      Engine: what an engine we start declares (its wire API, set-up script, venv,
                 command line, what it needs once healthy)
    sglang.py    SGLang (SLiME's sampler), from its own venv
    vllm.py      vLLM (Prime-RL's and the external-server trainer's), from its own venv

Adding an engine: one module here with its class, its set-up script, and its line in ENGINE_TYPES.
"""

from __future__ import annotations

from slime_harbor.policy.engines.base import Engine
from slime_harbor.policy.engines.sglang import SGLang
from slime_harbor.policy.engines.vllm import VLLM

ENGINE_TYPES: dict[str, type[Engine]] = {engine.name: engine for engine in (SGLang, VLLM)}
"""The engines `slime-harbor serve --engine NAME` and EngineProcess start, by name."""
