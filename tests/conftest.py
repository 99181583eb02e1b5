"""Shared fixtures: the tiny policy model and a running policy server on loopback, the tiny model
SFT'd to answer in each agent's format (the responsive model) and the one taught the gateway's tool
conversation (the tool model). Helpers the test modules share live in tests/helpers/."""

import os

# LiteLLM fetches its model-cost map from the internet on import unless told to use its own copy.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import pytest

from helpers.samples import trainer_view


def served(model_dir):
    """Yields the base URL (http://127.0.0.1:PORT) of an embedded policy server on `model_dir`,
    stopped when the fixture ends: every server fixture below is one of these."""
    from slime_harbor.policy.server import EmbeddedPolicyServer

    with EmbeddedPolicyServer(model_dir) as server:
        yield server.url


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """The tiny Qwen3 policy (weights, tokenizer, chat template), built once per test session."""
    import torch

    from slime_harbor.policy.tiny_model import build_tiny_model

    torch.set_num_threads(2)  # tests share 2 cores with sandboxes and servers
    return build_tiny_model(tmp_path_factory.mktemp("tiny_model"), seed=0)


@pytest.fixture(scope="session")
def format_model():
    """The tiny checkpoint of a chat format, and its tokenizer: format_model("glm-5") -> (dir,
    tokenizer), built once per machine (make-model --renderer's cache) and loaded once per session."""
    import functools

    from transformers import AutoTokenizer

    from slime_harbor.policy.tiny_model import ensure_tiny_model

    @functools.cache
    def load(renderer: str):
        model_dir = ensure_tiny_model(renderer=renderer)
        return model_dir, AutoTokenizer.from_pretrained(model_dir)

    return load


@pytest.fixture
def policy_server(tiny_model_dir):
    """Base URL (http://127.0.0.1:PORT) of an embedded policy server on the tiny model."""
    yield from served(tiny_model_dir)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    """The tiny model's tokenizer."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def renderer(tiny_model_dir, tokenizer):
    """The tiny model's chat renderer (its family's, as the gateway and the native agent pick it)."""
    from slime_harbor.policy.renderer import make_renderer

    return make_renderer(tiny_model_dir, tokenizer)


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    """The tiny model, the trainer's view. One per module, and read-only (a module that trains a
    model overrides this with its own copy)."""
    return trainer_view(tiny_model_dir)


@pytest.fixture(scope="module")
def responsive_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model after a few SFT steps, so it answers in each agent's format and ends its turn:
    the native agent's commands really run in the sandbox, and terminus-2 gets parseable JSON."""
    from helpers.rollout import NATIVE_REPLY, TERMINUS_REPLY
    from transformers import AutoTokenizer

    from slime_harbor.agents.native import initial_prompt_ids
    from slime_harbor.policy.renderer import make_renderer
    from slime_harbor.trainers.sft import SFTConfig, sft_model_dir
    from slime_harbor.run_config import DEFAULT_TASKS

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    renderer = make_renderer(tiny_model_dir, tok)
    pairs = []
    for task in sorted(DEFAULT_TASKS.iterdir()):
        if not (task / "instruction.md").is_file():
            continue
        instruction = (task / "instruction.md").read_text()
        pairs.append((initial_prompt_ids(renderer, instruction), tok.encode(NATIVE_REPLY, add_special_tokens=False)))
        prompt = tok.apply_chat_template(
            [{"role": "user", "content": f"You are an AI assistant solving command-line tasks.\n{instruction}"}],
            add_generation_prompt=True, tokenize=True,
        )
        prompt = prompt if isinstance(prompt, list) else prompt["input_ids"]
        pairs.append((list(prompt), tok.encode(TERMINUS_REPLY, add_special_tokens=False)))
    out = tmp_path_factory.mktemp("responsive_model")
    losses = sft_model_dir(tiny_model_dir, out, pairs, SFTConfig(steps=50, batch_size=4))
    assert losses[-1] < 0.2 * losses[0]
    return out


@pytest.fixture(scope="module")
def responsive_server(responsive_model_dir):
    yield from served(responsive_model_dir)


@pytest.fixture(scope="module")
def hf_model(responsive_model_dir):
    return trainer_view(responsive_model_dir)


@pytest.fixture(scope="module")
def tool_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model after a few SFT steps on the gateway's own prompts of a TURNS-turn tool
    conversation, so it answers with a tool call (the format the gateway parses) at every turn."""
    from helpers.tool_gateway import SYSTEM, TASK, TOOL_REPLY, TOOLS, TURNS, observation
    from renderers import create_renderer
    from renderers.configs import Qwen3RendererConfig
    from transformers import AutoTokenizer

    from slime_harbor.trainers.sft import SFTConfig, sft_model_dir

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    renderer = create_renderer(tok, Qwen3RendererConfig(thinking_retention="all"))
    reply = tok.encode(TOOL_REPLY, add_special_tokens=False)
    prompt = renderer.render_ids([{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}],
                                 tools=TOOLS, add_generation_prompt=True)
    pairs = []
    for k in range(TURNS + 2):
        pairs.append((prompt, reply))
        prompt = renderer.bridge_to_next_turn(prompt, reply, [{"role": "tool", "content": observation(k)}],
                                              tools=TOOLS).token_ids
    out = tmp_path_factory.mktemp("tool_model")
    losses = sft_model_dir(tiny_model_dir, out, pairs, SFTConfig(steps=80, batch_size=4))
    assert losses[-1] < 0.05 * losses[0]
    return out


@pytest.fixture(scope="module")
def tool_server(tool_model_dir):
    yield from served(tool_model_dir)


@pytest.fixture(scope="module")
def tool_model(tool_model_dir):
    return trainer_view(tool_model_dir)


@pytest.fixture(scope="module")
def base_server(tiny_model_dir):
    """The untrained tiny model: it rarely ends a turn, so its replies run to max_tokens."""
    yield from served(tiny_model_dir)
