"""An engine reached only by URL: any other server that speaks OpenAI completions with token ids
(`--policy-url`; Prime-RL's or verifiers' inference server, a hosted endpoint). It declares no
ability: it takes no weight pushes (the trainer recomputes old logprobs), its calls are labelled
only where it answers /weight_info (policy/client.py), and no weight check can score on it.

    recognised by   an OpenAI /v1/models list (asked after every kind that says more of itself)
"""

from __future__ import annotations

from slime_harbor.policy.engines.base import Engine, ServerAnswers
from slime_harbor.policy.wire_api import COMPLETIONS_API


class OpenAIServer(Engine):
    name = "openai"
    wire_api = COMPLETIONS_API

    @classmethod
    def recognise(cls, answers: ServerAnswers) -> Engine | None:
        if not answers.get("/v1/models"):
            return None
        return cls(answers.url, answers.context_len, answers.served_model)
