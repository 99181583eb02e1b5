"""Which chat renderer speaks the policy's model family: its chat format (messages to token ids,
bridged to the next turn) and its reply parser, PyPI `renderers` chosen by config.json's
model_type. Read by the gateway (every dialect's turns) and by agent SFT (an agent's episodes
rendered as the gateway renders them), so both speak the same format.
"""

from __future__ import annotations

import json
from pathlib import Path

# config.json model_type -> the renderers config that speaks the family's chat format. Qwen2.5 and
# Qwen3 (dense and MoE) share ChatML with Hermes-style <tool_call> JSON; Qwen3's renderer also
# handles <think> blocks. thinking_retention="all": a bridge keeps every sampled reasoning token
# (the Jinja template would drop reasoning of earlier turns, which is a re-render, i.e. drift).
RENDERER_FAMILIES = {"qwen2": "qwen3", "qwen3": "qwen3", "qwen3_moe": "qwen3"}


class RendererError(ValueError):
    """No renderer speaks this model's chat format (one line, when the gateway or a run starts)."""


def make_renderer(model_dir: str | Path, tokenizer):
    """The renderer of the model's family, read from its config.json model_type."""
    from renderers import create_renderer
    from renderers.configs import Qwen3RendererConfig

    config_path = Path(model_dir) / "config.json"
    try:
        model_type = json.loads(config_path.read_text()).get("model_type")
    except (OSError, ValueError) as error:
        raise RendererError(f"cannot read the model's config.json at {config_path}: {error}") from error
    family = RENDERER_FAMILIES.get(model_type)
    if family is None:
        raise RendererError(
            f"the gateway has no chat renderer/parser for model family {model_type!r} ({model_dir}); "
            f"supported model_type values: {', '.join(sorted(RENDERER_FAMILIES))}"
        )
    try:
        return create_renderer(tokenizer, Qwen3RendererConfig(thinking_retention="all"))
    except AssertionError as error:  # renderers asserts the family's special tokens exist
        raise RendererError(f"{model_dir}: the tokenizer lacks the {family} chat format's tokens ({error})") from error
