"""The policy being trained, as the rollout sees it.

    client.py       SGLang /generate client (the agent's only way to sample)
    server.py       embedded SGLang-compatible server (SGLang router in production)
    engine.py       continuous-batching sampler behind the embedded server
    renderer.py     the model family's chat renderer (PyPI `renderers`), the gateway's and agent SFT's
    tiny_model.py   the tiny Qwen3-architecture model and tokenizer, built offline
"""
