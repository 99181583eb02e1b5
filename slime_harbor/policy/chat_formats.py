"""The chat formats slime-harbor trains, as data: one row per `renderers` renderer, and the one
place a checkpoint's format is chosen.

A format is how a model family turns messages into tokens and its replies back into messages
(PyPI `renderers` does both, one renderer per family). Everything that renders or parses a turn
(the gateway, the native agent, agent SFT, the demo) asks `choose_renderer` for the checkpoint's
format and `policy/renderer.py` for the renderer; nothing else branches on the family.

The choice, first that applies:
  1. the user's `--renderer NAME` (YAML `harbor_renderer`);
  2. the name `make-model` recorded in the checkpoint (slime_harbor.json);
  3. the checkpoint's Hugging Face name (config.json `_name_or_path`, else the dir's last two path
     parts) through renderers' MODEL_RENDERER_MAP;
  4. config.json's model_type, where exactly one format is carried by it (MODEL_TYPE_FORMATS).
A model_type that carries several formats, or none we know, stops before any trial with one line
that lists the choices.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from slime_harbor.exits import ConfigError

CHECKPOINT_RECORD = "slime_harbor.json"
"""The file `make-model` writes into a checkpoint: its renderer (and how it was built), so runs on it
need no --renderer."""


NAME_IT = "--renderer NAME (YAML harbor_renderer)"


@dataclass(frozen=True)
class ChatFormat:
    """One chat format: a `renderers` renderer and what is known of it."""

    renderer: str
    """The `renderers` name (`--renderer`)."""
    model_types: tuple[str, ...]
    """config.json model_type values of checkpoints that carry this format."""
    tool_calls: str
    """How the family writes a tool call in a reply."""
    reasoning: str
    """How the family writes reasoning (a bridge keeps every sampled reasoning token: policy/renderer.py)."""
    end_of_turn: str
    """The token a turn of text ends with (the renderer stops on all of its get_stop_token_ids)."""
    text_turn: str
    """A whole turn of text `{content}` with an empty thought, as the family writes it: the native
    agent's SFT replies. What the generation prompt already holds of it is not sampled."""
    bash_call: str
    """A whole turn calling the agent's `bash` tool with an empty thought, as the family writes it
    (`{command}` raw, `{command_json}` as a JSON string): what agent SFT's scripted policy answers.
    What the generation prompt already holds of it is not sampled (sampled_part)."""
    system_first: bool = False
    """The family's renderer takes one system message, first: it refuses any other (Qwen3.5, Qwen3.6,
    Nemotron 3; Llama 3 a second one before the first user turn when tools are given) or drops it
    (MiniMax-M2). The gateway folds the others into a user message (gateway/session.fold_system_messages)."""


QWEN_XML_BASH = "<tool_call>\n<function=bash>\n<parameter=command>\n{command}\n</parameter>\n</function>\n</tool_call>"
DEEPSEEK_BASH = ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>bash\n```json\n"
                 '{"command": {command_json}}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>')

FORMATS: dict[str, ChatFormat] = {f.renderer: f for f in (
    ChatFormat("qwen3", ("qwen2", "qwen3", "qwen3_moe"),
               "<tool_call> JSON {name, arguments} </tool_call>", "<think>...</think>", "<|im_end|>",
               "{content}<|im_end|>",
               '<tool_call>\n{"name": "bash", "arguments": {"command": {command_json}}}\n</tool_call><|im_end|>'),
    ChatFormat("qwen3.5", ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_next"),
               "<tool_call><function=NAME><parameter=K>V</parameter></function></tool_call> (qwen3_coder XML)",
               "<think>...</think>, opened by the generation prompt", "<|im_end|>",
               "<think>\n\n</think>\n\n{content}<|im_end|>",
               "<think>\n\n</think>\n\n" + QWEN_XML_BASH + "<|im_end|>", system_first=True),
    ChatFormat("qwen3.6", ("qwen3_5_moe", "qwen3_5_moe_text"),
               "<tool_call><function=NAME><parameter=K>V</parameter></function></tool_call> (qwen3_coder XML)",
               "<think>...</think>, opened by the generation prompt", "<|im_end|>",
               "<think>\n\n</think>\n\n{content}<|im_end|>",
               "<think>\n\n</think>\n\n" + QWEN_XML_BASH + "<|im_end|>", system_first=True),
    ChatFormat("glm-4.5", ("glm4_moe",),
               "<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>\\n</tool_call>",
               "<think>...</think>", "<|user|>",
               "<think></think>\n{content}<|user|>",
               "<think></think>\n<tool_call>bash\n<arg_key>command</arg_key>\n<arg_value>{command}</arg_value>\n"
               "</tool_call><|observation|>"),
    ChatFormat("glm-5", ("glm4_moe", "glm4_moe_lite", "glm_moe_dsa"),
               "<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>",
               "<think>...</think>, opened by the generation prompt", "<|user|>",
               "<think></think>{content}<|user|>",
               "<think></think><tool_call>bash<arg_key>command</arg_key><arg_value>{command}</arg_value></tool_call>"
               "<|observation|>"),
    ChatFormat("deepseek-v3", ("deepseek_v3",),
               "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME ```json ...``` <｜tool▁call▁end｜>",
               "none", "<｜end▁of▁sentence｜>",
               "{content}<｜end▁of▁sentence｜>", DEEPSEEK_BASH),
    ChatFormat("deepseek-r1", ("deepseek_v3",),
               "as deepseek-v3, after the think block",
               "<think>...</think>, opened by the generation prompt and after tool outputs", "<｜end▁of▁sentence｜>",
               "<think>\n\n</think>\n\n{content}<｜end▁of▁sentence｜>",
               "<think>\n\n</think>\n\n" + DEEPSEEK_BASH),
    ChatFormat("deepseek-v4", ("deepseek_v4",),
               "DSML: <｜DSML｜tool_calls><｜DSML｜invoke name=NAME><｜DSML｜parameter name=K string=...>",
               "off by the template's default (the generation prompt closes </think>)", "<｜end▁of▁sentence｜>",
               "{content}<｜end▁of▁sentence｜>",
               '\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="bash">\n<｜DSML｜parameter name="command" string="true">'
               "{command}</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>"),
    ChatFormat("kimi-k2", ("kimi_k2",),
               "<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>JSON"
               "<|tool_call_end|>", "none (K2-Instruct)", "<|im_end|>",
               "{content}<|im_end|>",
               "<|tool_calls_section_begin|><|tool_call_begin|>functions.bash:0<|tool_call_argument_begin|>"
               '{"command": {command_json}}<|tool_call_end|><|tool_calls_section_end|><|im_end|>'),
    ChatFormat("gpt-oss", ("gpt_oss",),
               "harmony: a commentary message to=functions.NAME, JSON, ended by <|call|>",
               "harmony's analysis channel (the generation prompt opens it)", "<|return|>",
               "<|channel|>analysis<|message|>Answer.<|end|><|start|>assistant<|channel|>final<|message|>{content}<|return|>",
               "<|channel|>analysis<|message|>Run it.<|end|><|start|>assistant<|channel|>commentary to=functions.bash "
               '<|constrain|>json<|message|>{"command": {command_json}}<|call|>'),
    ChatFormat("llama-3", ("llama",),
               "the reply is one JSON object {name, parameters}", "none", "<|eot_id|>",
               "{content}<|eot_id|>",
               '{"name": "bash", "parameters": {"command": {command_json}}}<|eot_id|>', system_first=True),
    ChatFormat("minimax-m2", ("minimax_m2",),
               "<minimax:tool_call><invoke name=NAME><parameter name=K>V</parameter></invoke></minimax:tool_call>",
               "<think>...</think>, opened by the generation prompt", "[e~[",
               "<think>\n\n</think>\n\n{content}[e~[",
               '<think>\n\n</think>\n\n<minimax:tool_call>\n<invoke name="bash">\n<parameter name="command">{command}'
               "</parameter>\n</invoke>\n</minimax:tool_call>[e~[", system_first=True),
    ChatFormat("nemotron-3", ("nemotron_h",),
               "<tool_call><function=NAME><parameter=K>V</parameter></function></tool_call>",
               "<think>...</think>, opened by the generation prompt", "<|im_end|>",
               "<think>\n\n</think>\n{content}\n<|im_end|>",
               "<think>\n\n</think>\n" + QWEN_XML_BASH + "\n<|im_end|>", system_first=True),
)}


def text_turn_text(renderer: str, content: str) -> str:
    """The whole turn of format `renderer` that says `content` (ChatFormat.text_turn)."""
    return FORMATS[renderer].text_turn.replace("{content}", content)


def bash_call_text(renderer: str, command: str) -> str:
    """The whole turn of format `renderer` that calls bash with `command` (ChatFormat.bash_call)."""
    return FORMATS[renderer].bash_call.replace("{command_json}", json.dumps(command)).replace("{command}", command)


def sampled_part(turn: str, prompt_text: str) -> str:
    """The part of a whole turn the policy samples: without the longest start of it that the
    generation prompt (decoded) already ends with (Qwen3.5's `<think>\n`, gpt-oss's
    `<|channel|>analysis<|message|>`)."""
    for n in range(len(turn), 0, -1):
        if prompt_text.endswith(turn[:n]):
            return turn[n:]
    return turn


OTHER_FORMATS_OF_TYPE = {"glm_moe_dsa": ("glm-5.1", "glm-5.3"), "nemotron_h": ("nemotron-3-ultra", "nemotron-3.5")}
"""Formats `renderers` has, beyond FORMATS' rows, that checkpoints of a model_type also carry (its
MODEL_RENDERER_MAP): a checkpoint of such a type must be named, never guessed."""


def model_type_formats() -> dict[str, list[str]]:
    """config.json model_type -> the formats checkpoints of that type carry (FORMATS' order, then
    OTHER_FORMATS_OF_TYPE's). A single format is still checked against the tokenizer: a checkpoint
    of the type in another format (a Llama 2 under `llama`) lacks the format's tokens and stops."""
    table: dict[str, list[str]] = {}
    for fmt in FORMATS.values():
        for model_type in fmt.model_types:
            table.setdefault(model_type, []).append(fmt.renderer)
    for model_type, others in OTHER_FORMATS_OF_TYPE.items():
        table.setdefault(model_type, []).extend(others)
    return table


def known_renderers() -> list[str]:
    """Every name `renderers` can build (ours in FORMATS are proven; the rest are its own)."""
    from renderers.configs import _CONFIG_BY_NAME

    return sorted(name for name in _CONFIG_BY_NAME if name not in ("auto", "custom"))


def check_renderer_name(name: str) -> str:
    """`name` if `renderers` has it, else a one-line ConfigError listing the names."""
    names = known_renderers()
    if name not in names:
        raise ConfigError(f"unknown chat format (--renderer / harbor_renderer) {name!r}; renderers has: {', '.join(names)}")
    return name


def read_model_config(model_dir: str | Path) -> dict:
    """The checkpoint's config.json, or a one-line ConfigError."""
    path = Path(model_dir) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ConfigError(f"cannot read the model's config.json at {path}: {error}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{path} is not a JSON object")
    return config


def recorded_renderer(model_dir: str | Path) -> str | None:
    """The renderer `make-model` recorded in the checkpoint, if it did."""
    try:
        return json.loads((Path(model_dir) / CHECKPOINT_RECORD).read_text()).get("renderer")
    except (OSError, ValueError, AttributeError):
        return None


def keep_record(source_dir: str | Path, out_dir: str | Path) -> None:
    """A checkpoint trained from `source_dir` speaks its format: copy make-model's record, if any."""
    record = Path(source_dir) / CHECKPOINT_RECORD
    if record.is_file() and Path(source_dir).resolve() != Path(out_dir).resolve():
        shutil.copyfile(record, Path(out_dir) / CHECKPOINT_RECORD)


def _hub_names(model_dir: Path, config: dict) -> list[str]:
    names = [config.get("_name_or_path") or ""]
    resolved = model_dir.resolve()
    names.append(f"{resolved.parent.name}/{resolved.name}")
    return [n for n in names if n]


def choose_renderer(model_dir: str | Path, explicit: str | None = None) -> str:
    """The checkpoint's chat format (a `renderers` name), chosen as the module docstring says, or a
    one-line ConfigError naming the choices."""
    if explicit:
        return check_renderer_name(explicit)
    model_dir = Path(model_dir)
    config = read_model_config(model_dir)
    recorded = recorded_renderer(model_dir)
    if recorded:
        return check_renderer_name(recorded)
    from renderers.base import MODEL_RENDERER_MAP

    for name in _hub_names(model_dir, config):
        if name in MODEL_RENDERER_MAP:
            return MODEL_RENDERER_MAP[name]
    model_type = config.get("model_type")
    if not model_type:
        raise ConfigError(f"{model_dir}/config.json has no model_type: name its chat format with {NAME_IT} "
                          f"(one of {', '.join(FORMATS)})")
    choices = model_type_formats().get(model_type, [])
    if len(choices) == 1:
        return choices[0]
    if choices:
        raise ConfigError(f"model_type {model_type!r} ({model_dir}) carries several chat formats: name one with "
                          f"{NAME_IT}: {' | '.join(choices)}")
    raise ConfigError(f"no chat format known for model_type {model_type!r} ({model_dir}): name one with {NAME_IT} "
                      f"(one of {', '.join(FORMATS)})")
