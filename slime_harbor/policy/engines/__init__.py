"""Each engine kind, one class: what it is, how it is recognised at a URL, what it can do
(abilities), and for the kinds we start, how. Found by name (ENGINE_TYPES, the `--engine` names)
or from a server's answers (policy/probe.py asks ENGINE_KINDS in order).

    base.py             Engine, ServerAnswers (what a URL answers), Unrecognised
    abilities.py        what an engine can do beyond sampling: StartsFromVenv, ReportsVersion,
                        ReportsDtype, UpdatesFromDisk, LoadsLoRA, ScoresPrompts
    generate_server.py  those abilities on a /generate server's native endpoints (SGLang's, ours)
    embedded.py         ours, in this process (policy/server.py)
    sglang.py           SGLang (SLiME's sampler), from its own venv, and its router
    vllm.py             vLLM (Prime-RL's and the external-server trainer's), from its own venv
    openai_server.py    any other OpenAI-compatible server, reached only by URL

Adding an engine: one module here with its class, its set-up script, and its line in ENGINE_KINDS.
"""

from __future__ import annotations

from slime_harbor.policy.engines.abilities import StartsFromVenv
from slime_harbor.policy.engines.base import Engine
from slime_harbor.policy.engines.embedded import Embedded
from slime_harbor.policy.engines.openai_server import OpenAIServer
from slime_harbor.policy.engines.sglang import SGLang, SGLangRouter
from slime_harbor.policy.engines.vllm import VLLM

ENGINE_KINDS: list[type[Engine]] = [VLLM, Embedded, SGLang, SGLangRouter, OpenAIServer]
"""Every kind, in the order a server's answers are matched: a kind that says more of itself first
(vLLM in dev mode has a /server_info too; ours is told from SGLang by its name), the bare OpenAI one last."""

ENGINE_TYPES: dict[str, type[StartsFromVenv]] = {
    kind.name: kind for kind in sorted(ENGINE_KINDS, key=lambda kind: kind.name) if issubclass(kind, StartsFromVenv)}
"""The kinds `slime-harbor serve --engine NAME` and EngineProcess start from their venvs, by name."""
