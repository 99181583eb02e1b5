"""The policy being trained, as the rollout sees it.

    sampling.py          SamplingParams (how a call samples) and Generation (what it sampled)
    client.py            SGLang /generate or vLLM /v1/completions client (the agents' only way to sample)
    server.py            the embedded SGLang-compatible server (SGLang's router in production)
    embedded_engine.py   the continuous-batching sampler behind it (decode.py: its batch's tensors)
    engines/             each engine we start, one class (SGLang, vLLM), by --engine name: ENGINE_TYPES
    engine_launcher.py   starts them from their own venvs (EngineProcess, serve_engine)
    parent_guard.py      leads a started engine's process group: it ends when its starter dies, even by SIGKILL
    wire_api.py          how clients sample: SGLang's /generate or OpenAI completions (the policy_api values)
    probe.py             what a server's URL serves: its kind, context limit, weight version, dtype
    weights.py           pushes a trainer's weights to a server;  weight_check.py: checks it serves them
    vllm_worker.py       runs inside vLLM: a reload after which a tied LM head follows the embeddings
    renderer.py          the model family's chat renderer (PyPI `renderers`), the gateway's, the agent's and SFT's
    tiny_model.py        the tiny Qwen3-architecture model and tokenizer, built offline
"""
