"""Which chat renderer speaks the policy's model family: its chat format (messages to token ids,
bridged to the next turn) and its reply parser, PyPI `renderers` chosen by config.json's
model_type. Read by the gateway (every dialect's turns), the native agent (its prompts and the
observations it bridges on) and agent SFT (an agent's episodes rendered as the gateway renders
them), so all of them speak one format.
"""

from __future__ import annotations

import functools
import json
import threading
from pathlib import Path

# config.json model_type -> the renderers config that speaks the family's chat format. Qwen2.5 and
# Qwen3 (dense and MoE) share ChatML with Hermes-style <tool_call> JSON; Qwen3's renderer also
# handles <think> blocks. thinking_retention="all": a bridge keeps every sampled reasoning token
# (the Jinja template would drop reasoning of earlier turns, which is a re-render, i.e. drift).
RENDERER_FAMILIES = {"qwen2": "qwen3", "qwen3": "qwen3", "qwen3_moe": "qwen3"}


_TOKENIZER_LOCK = threading.Lock()


def load_tokenizer(model_dir: str | Path | None):
    """The policy's tokenizer (Hugging Face's, from `model_dir`), loaded once per process and
    shared by everything that decodes or renders its tokens; None without a model dir."""
    if not model_dir:
        return None
    with _TOKENIZER_LOCK:  # transformers' lazy imports race when two threads load at once
        return _load_tokenizer(str(model_dir))


@functools.lru_cache(maxsize=8)
def _load_tokenizer(model_dir: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


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


def bridge_ids(renderer, prompt_ids: list[int], completion_ids: list[int], new_messages: list[dict],
               tools: list | None = None) -> list[int] | None:
    """prompt + completion + the template tokens of `new_messages` and the next generation prompt:
    the renderer's bridge to the next turn, or None where it does not extend prompt + completion
    (the caller renders the conversation anew, which starts a new sample).

    The bridge is given the prompt only back to its last end-of-turn token (where the assistant
    header starts), so its cost follows the new tokens, not the history; the history before that
    tail is put back in front unchanged. It may close a truncated turn (a synthesised end-of-turn,
    a </think>): those tokens follow the completion like any template token.
    """
    stops = set(renderer.get_stop_token_ids())
    cut = next((i for i in range(len(prompt_ids) - 1, -1, -1) if prompt_ids[i] in stops), 0)
    tail = prompt_ids[cut:]
    bridged = renderer.bridge_to_next_turn(tail, completion_ids, new_messages, tools=tools)
    so_far = len(tail) + len(completion_ids)
    if bridged is None or bridged.token_ids[: len(tail)] != tail or bridged.token_ids[len(tail):so_far] != completion_ids:
        return None
    return prompt_ids[:cut] + list(bridged.token_ids)
