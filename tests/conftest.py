"""Shared fixtures: the tiny policy model and a running policy server on loopback."""

import os

# LiteLLM fetches its model-cost map from the internet on import unless told to use its own copy.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """The tiny Qwen3 policy (weights, tokenizer, chat template), built once per test session."""
    import torch

    from slime_harbor.policy.tiny_model import build_tiny_model

    torch.set_num_threads(2)  # tests share 2 cores with sandboxes and servers
    return build_tiny_model(tmp_path_factory.mktemp("tiny_model"), seed=0)


@pytest.fixture
def policy_server(tiny_model_dir):
    """Base URL (http://127.0.0.1:PORT) of an embedded policy server on the tiny model."""
    from slime_harbor.policy.server import EmbeddedPolicyServer

    server = EmbeddedPolicyServer(tiny_model_dir)
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    """The tiny model's tokenizer."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    """The tiny model in fp32, eval mode: the trainer's view, for recomputing logprobs. One per
    module, and read-only (a module that trains a model overrides this with its own copy)."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
