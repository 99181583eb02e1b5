"""How a client samples from a policy server: the wire API, a concept apart from which engine
serves it (SGLang's router and our embedded server speak SGLang's API; vLLM and any other
OpenAI-compatible server the OpenAI one). The values are the `policy_api` setting's.

    GENERATE_API      POST {root}/generate with token ids, SGLang's native API
    COMPLETIONS_API   POST {base}/completions with token ids (base: the OpenAI base, .../v1)
"""

from __future__ import annotations

GENERATE_API = "sglang"
COMPLETIONS_API = "openai"
WIRE_APIS = (GENERATE_API, COMPLETIONS_API)
