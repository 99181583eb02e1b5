"""Each chat format's assistant turns, written by hand from the family's own documentation (model
cards, chat templates, the tool-calling guides), never produced by the renderer that then parses
them: a turn that thinks (where the family does) and calls the agent's bash tool with
`ls -la`, and a final turn that answers in text. A test gives them to the gateway as the policy's
sampled tokens (the format's tokenizer encodes the text; special tokens are single tokens there)
and checks what each API dialect hands the agent.

Where the template already wrote the start of the turn into the generation prompt (Qwen3.5's and
DeepSeek-R1's `<think>\\n`, gpt-oss's `<|channel|>analysis<|message|>`), chat_formats.sampled_part
drops what the prompt holds: the policy samples only the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

COMMAND = "ls -la"
REASONING = "I should list the files first."


@dataclass(frozen=True)
class FormatTurns:
    tool_turn: str
    """The turn that calls bash(command="ls -la"), ending with the family's end of turn."""
    final_turn: str
    """A turn that answers "Done." in text."""
    reasons: bool
    """Whether tool_turn carries REASONING (the family reasons in its turns)."""


QWEN_XML_CALL = "<tool_call>\n<function=bash>\n<parameter=command>\nls -la\n</parameter>\n</function>\n</tool_call>"

TURNS: dict[str, FormatTurns] = {
    # Qwen3 model card ("Agentic Use", Hermes-style): <tool_call> JSON, <think> blocks, <|im_end|>.
    "qwen3": FormatTurns(
        f"<think>\n{REASONING}\n</think>\n\n<tool_call>\n" '{"name": "bash", "arguments": {"command": "ls -la"}}'
        "\n</tool_call><|im_end|>",
        "<think>\nThe files are listed.\n</think>\n\nDone.<|im_end|>", True),
    # Qwen3.5 / Qwen3.6 chat template and the qwen3_coder tool parser: XML function calls.
    "qwen3.5": FormatTurns(f"<think>\n{REASONING}\n</think>\n\n{QWEN_XML_CALL}<|im_end|>",
                           "<think>\nThe files are listed.\n</think>\n\nDone.<|im_end|>", True),
    "qwen3.6": FormatTurns(f"<think>\n{REASONING}\n</think>\n\n{QWEN_XML_CALL}<|im_end|>",
                           "<think>\nThe files are listed.\n</think>\n\nDone.<|im_end|>", True),
    # GLM-4.5 chat template: <think>..</think>, then <tool_call>NAME with arg_key / arg_value lines;
    # a turn that calls a tool ends where the observation begins (<|observation|>), a final one at <|user|>.
    "glm-4.5": FormatTurns(
        f"<think>{REASONING}</think>\n<tool_call>bash\n<arg_key>command</arg_key>\n<arg_value>ls -la</arg_value>\n"
        "</tool_call><|observation|>",
        "<think>The files are listed.</think>\nDone.<|user|>", True),
    # GLM-5 (and GLM-4.7) chat template: the same tags without the newlines.
    "glm-5": FormatTurns(
        f"<think>{REASONING}</think><tool_call>bash<arg_key>command</arg_key><arg_value>ls -la</arg_value>"
        "</tool_call><|observation|>",
        "<think>The files are listed.</think>Done.<|user|>", True),
    # DeepSeek-V3 model card / tokenizer_config chat template: tool calls between
    # <｜tool▁calls▁begin｜> and <｜tool▁calls▁end｜>, "function<｜tool▁sep｜>NAME" and a ```json fence.
    "deepseek-v3": FormatTurns(
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>bash\n```json\n"
        '{"command": "ls -la"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>',
        "Done.<｜end▁of▁sentence｜>", False),
    # DeepSeek-R1: the same calls after the <think> block the template opens.
    "deepseek-r1": FormatTurns(
        f"<think>\n{REASONING}\n</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>bash\n"
        '```json\n{"command": "ls -la"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>',
        "<think>\nThe files are listed.\n</think>\n\nDone.<｜end▁of▁sentence｜>", True),
    # DeepSeek-V4's encoding guide (DSML): <｜DSML｜tool_calls> blocks of invoke / parameter, string="true".
    # The chat template's default is non-thinking (its generation prompt closes </think>), so no reasoning.
    "deepseek-v4": FormatTurns(
        "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"bash\">\n"
        "<｜DSML｜parameter name=\"command\" string=\"true\">ls -la</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
        "</｜DSML｜tool_calls><｜end▁of▁sentence｜>",
        "Done.<｜end▁of▁sentence｜>", False),
    # Kimi K2 tool-calling guide: a section of calls, each "functions.NAME:IDX" then JSON arguments.
    "kimi-k2": FormatTurns(
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.bash:0<|tool_call_argument_begin|>"
        '{"command": "ls -la"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>',
        "Done.<|im_end|>", False),
    # OpenAI's harmony format guide: reasoning on the analysis channel, a function call on commentary
    # addressed to=functions.NAME with <|constrain|>json, ended by <|call|>; a final answer by <|return|>.
    "gpt-oss": FormatTurns(
        f"<|channel|>analysis<|message|>{REASONING}<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.bash <|constrain|>json<|message|>{"command":"ls -la"}<|call|>',
        "<|channel|>analysis<|message|>The files are listed.<|end|><|start|>assistant<|channel|>final"
        "<|message|>Done.<|return|>", True),
    # Llama 3.2 model card (JSON tool calling): the reply is one {"name", "parameters"} object.
    "llama-3": FormatTurns('{"name": "bash", "parameters": {"command": "ls -la"}}<|eot_id|>', "Done.<|eot_id|>",
                           False),
    # MiniMax-M2 tool-calling guide: <minimax:tool_call> with invoke / parameter elements, [e~[ ends a turn.
    "minimax-m2": FormatTurns(
        f"<think>\n{REASONING}\n</think>\n\n<minimax:tool_call>\n<invoke name=\"bash\">\n"
        "<parameter name=\"command\">ls -la</parameter>\n</invoke>\n</minimax:tool_call>[e~[",
        "<think>\nThe files are listed.\n</think>\n\nDone.[e~[", True),
    # Nemotron 3 Nano chat template: <think> block, then qwen3_coder-style XML calls, <|im_end|>.
    "nemotron-3": FormatTurns(f"<think>\n{REASONING}\n</think>\n{QWEN_XML_CALL}\n<|im_end|>",
                              "<think>\nThe files are listed.\n</think>\nDone.\n<|im_end|>", True),
}
