"""The renderer of the policy's chat format: messages to token ids, bridged to the next turn, and its
reply parser, PyPI `renderers`. Which format a checkpoint speaks is chat_formats.py's choice (the
user's --renderer, the checkpoint's record or name, its model_type). Read by the gateway (every
dialect's turns), the native agent (its prompts and the observations it bridges on) and agent SFT
(an agent's episodes rendered as the gateway renders them), so all of them speak one format.
"""

from __future__ import annotations

import functools
import threading
from pathlib import Path

from slime_harbor.exits import ConfigError
from slime_harbor.policy.chat_formats import choose_renderer

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


class RendererError(ConfigError):
    """The chosen format cannot be rendered with this tokenizer (one line, before any trial starts)."""


def make_renderer(model_dir: str | Path, tokenizer, renderer: str | None = None):
    """The renderer of the checkpoint's chat format (`renderer`, else chat_formats.choose_renderer's).

    thinking_retention="all": a bridge keeps every sampled reasoning token (a chat template drops
    the reasoning of earlier turns, which is a re-render, i.e. drift)."""
    from renderers import create_renderer
    from renderers.configs import _config_class_for

    from slime_harbor.policy.format_tokenizers import harmony_offline

    name = choose_renderer(model_dir, renderer)
    harmony_offline()  # gpt-oss renders through openai-harmony, which would download o200k_base otherwise
    try:
        made = create_renderer(tokenizer, _config_class_for(name)(thinking_retention="all"))
    except (AssertionError, KeyError, ValueError, RuntimeError) as error:  # renderers asserts the format's tokens exist; harmony's errors are RuntimeErrors
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise RendererError(f"{model_dir}: the tokenizer lacks the {name} chat format's tokens ({first})") from None
    if name in PARSER_FIXES:
        PARSER_FIXES[name](made, tokenizer)
    return made


def _r1_reasoning_after_tool_outputs(renderer, tokenizer) -> None:
    """DeepSeek-R1's template opens `<think>\n` right after the tool outputs, with no
    `<｜Assistant｜>` before it (renderers' bridge does the same), but renderers 0.1.12's parser
    looks for an opened think block only after `<｜Assistant｜>`: the reply to a tool result would
    reach the agent with its reasoning as content. Its parser is shown the header there."""
    parse = renderer.parse_response
    header = tokenizer.convert_tokens_to_ids(["<｜Assistant｜>"])
    outputs_end = tokenizer.convert_tokens_to_ids("<｜tool▁outputs▁end｜>")

    def parse_response(token_ids, *, tools=None, prompt_ids=None):
        if prompt_ids and outputs_end in prompt_ids[-4:]:
            cut = len(prompt_ids) - prompt_ids[::-1].index(outputs_end)
            prompt_ids = prompt_ids[:cut] + header + prompt_ids[cut:]
        return parse(token_ids, tools=tools, prompt_ids=prompt_ids)

    renderer.parse_response = parse_response


PARSER_FIXES = {"deepseek-r1": _r1_reasoning_after_tool_outputs}
"""What a format's renderer (renderers 0.1.12) parses wrongly, mended on the renderer made for it;
each proven by tests/test_format_tool_calls.py with a turn written from the family's docs."""


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
