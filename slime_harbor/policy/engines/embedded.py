"""Ours: the embedded engine (policy/embedded_engine.py) behind the policy server (policy/server.py),
in this process (`slime-harbor serve`, and every runner without --policy-url, start it there). It
copies SGLang's native endpoints, so its abilities are a /generate server's
(engines/generate_server.py); it always loads LoRA adapters.

    recognised by   GET /server_info's "engine": SERVER_NAME
"""

from __future__ import annotations

from slime_harbor.policy.engines.base import Engine, ServerAnswers
from slime_harbor.policy.engines.generate_server import GenerateServer, pool_capped_context

SERVER_NAME = "slime-harbor-embedded"
"""What our server's /server_info names as its engine."""


class Embedded(GenerateServer):
    name = "embedded"

    @classmethod
    def recognise(cls, answers: ServerAnswers) -> Engine | None:
        info = answers.get("/server_info")
        if info is None or info.get("engine") != SERVER_NAME:
            return None
        return cls(answers.url, pool_capped_context(answers, info), answers.served_model, serves_lora=True)
