"""A tiny Qwen3-architecture policy, built offline, for tests and CPU demos.

No weights can be downloaded here, so the policy the rest of slime-harbor trains and serves in
tests is made from scratch: a byte-level BPE tokenizer trained on the small corpus below (shell,
Python, task text and the agents' answer formats) plus a randomly initialised Qwen3ForCausalLM.
It is saved in Hugging Face format, so everything that loads a real Qwen3 checkpoint
(AutoTokenizer, AutoModelForCausalLM, the chat template) loads this one the same way.

The model knows nothing; what matters is that it is a real causal LM with a real tokenizer, so
token ids, logprobs, chat rendering and weight updates are exercised exactly as with Qwen3.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from slime_harbor.cache import cache_dir

# Qwen's special tokens. eos is <|im_end|> (the end of an assistant turn), pad is <|endoftext|>.
ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END]
# Qwen3's added (non-special) tokens of its tool-call and reasoning format, in Qwen3's vocab order
# (<tool_call> 151657 ... </think> 151668): single tokens, kept when decoding with
# skip_special_tokens, so renderers' Qwen3Renderer and tool-call parsers work on this tokenizer.
TOOL_CALL, TOOL_CALL_END = "<tool_call>", "</tool_call>"
TOOL_RESPONSE, TOOL_RESPONSE_END = "<tool_response>", "</tool_response>"
THINK, THINK_END = "<think>", "</think>"
FORMAT_TOKENS = [TOOL_CALL, TOOL_CALL_END, TOOL_RESPONSE, TOOL_RESPONSE_END, THINK, THINK_END]

# Qwen3's own chat template (as shipped in Qwen/Qwen3-* tokenizer_config.json): tools in the system
# turn, <tool_call> JSON in assistant turns, tool results as <tool_response> in a user turn, <think>
# blocks after the last user query, enable_thinking=False prefilling an empty think block.
CHAT_TEMPLATE = QWEN3_CHAT_TEMPLATE = r'''{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}'''

# Bump when the build changes in a way the fields of TinyModelConfig do not show (corpus, tokens,
# template, init): cached models built by an older recipe are then rebuilt (ensure_tiny_model).
RECIPE_VERSION = 2


@dataclass
class TinyModelConfig:
    """Shape of the tiny policy. Defaults build in about a second and run fast on 2 CPU cores."""

    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2  # grouped-query attention, as in Qwen3
    head_dim: int = 32
    bpe_vocab_size: int = 2048  # target size of the trained BPE vocab (the corpus may give fewer)
    max_position_embeddings: int = 32768  # context length the server enforces
    initializer_range: float = 0.3  # next-token entropy ~3.5 nats: varied samples, top-p that bites


# Training text for the tokenizer: the kinds of text a coding agent reads and writes.
CORPUS = r'''
You are a helpful assistant that can interact with a computer shell to solve programming tasks.
Your response must contain exactly ONE bash code block with ONE command (or commands connected with && or ||).
Include a THOUGHT section before your command where you explain your reasoning process.

THOUGHT: I need to look at the files in the repository first to understand its structure.

```bash
ls -la
```

THOUGHT: The task asks me to create a file called hello.txt that contains the text "Hello, world!".

```bash
echo "Hello, world!" > hello.txt && cat hello.txt
```

THOUGHT: Let me find where the function is defined before I change it.

```bash
grep -rn "def parse_args" --include=*.py .
```

THOUGHT: The tests fail because the function returns None for an empty list. I will fix it.

```bash
sed -i 's/return None/return []/' src/utils.py && python -m pytest -q tests/
```

THOUGHT: I have completed the task and verified the output. I will submit.

```bash
echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT
```

{
  "analysis": "The directory is empty. No files have been created yet.",
  "plan": "Create the script, make it executable and run it to check the output.",
  "commands": [
    {"keystrokes": "cat > run.sh << 'EOF'\n#!/bin/bash\necho done\nEOF\n", "duration": 0.1},
    {"keystrokes": "chmod +x run.sh && ./run.sh\n", "duration": 1.0}
  ],
  "task_complete": true
}

Task: Write a Python script at /app/solution.py that reads numbers from input.txt, one per line,
and prints their sum. The file may contain blank lines, which should be ignored.
Task: Fix the failing unit test in the repository. Do not modify the tests themselves.
Task: Count the number of lines in /app/data.csv that contain the word "error" and write the
count to /app/answer.txt.
Task: Create a directory named output and copy every .log file from /var/log/app into it.
The terminal shows the output of the previous command. Read it carefully before you act.

$ cd /app && ls
README.md  data.csv  main.py  requirements.txt  tests
$ cat main.py | head -n 20
$ wc -l data.csv
1024 data.csv
$ find . -name "*.py" -type f | xargs grep -l "import os"
$ mkdir -p output && cp /var/log/app/*.log output/
$ tar -czf backup.tar.gz output/ && rm -rf output
$ pip install -r requirements.txt
$ git status && git diff HEAD~1 -- src/
$ python3 -c "import sys; print(sys.version)"
$ export PATH=$HOME/.local/bin:$PATH
$ awk -F, '{ total += $3 } END { print total }' data.csv
$ sort -u names.txt | uniq -c | sort -rn | head -5
$ curl -s http://localhost:8000/health || echo "server down"
$ chmod 644 config.yaml; chown root:root config.yaml
$ echo $? ; printf "%s\n" "$HOME"
bash: command not found
Traceback (most recent call last):
  File "/app/main.py", line 12, in <module>
    main()
FileNotFoundError: [Errno 2] No such file or directory: 'input.txt'
AssertionError: expected 3, got 4
1 failed, 7 passed in 0.12s

import os
import sys
import json
from pathlib import Path


def read_numbers(path: str) -> list[int]:
    """Read one integer per line, skipping blank lines."""
    numbers = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            numbers.append(int(line))
    return numbers


class Counter:
    def __init__(self, start=0):
        self.value = start

    def increment(self, step=1):
        self.value += step
        return self.value


def main() -> None:
    total = sum(read_numbers(sys.argv[1]))
    print(f"total: {total}")
    result = {"status": "ok", "count": len(sys.argv), "items": [1, 2, 3]}
    print(json.dumps(result, indent=2))
    for i, name in enumerate(sorted(os.listdir("."))):
        if name.endswith(".txt") and i % 2 == 0:
            print(i, name)
        elif name.startswith("_"):
            raise ValueError("unexpected file: " + name)
    try:
        data = Path("config.json").read_text()
    except FileNotFoundError:
        data = "{}"
    return None


if __name__ == "__main__":
    main()

def test_sum():
    assert sum([1, 2, 3]) == 6
    assert Counter().increment() == 1

The quick brown fox jumps over the lazy dog. Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 3.14 -1.
ABCDEFGHIJKLMNOPQRSTUVWXYZ abcdefghijklmnopqrstuvwxyz !"#$%&'()*+,-./:;<=>?@[\]^_`{|}~
'''

# Words the corpus above is too short to teach. Each appears twice (min_frequency=2) after a space,
# capitalised after a space, and at the start of a line, so each form can become one token.
WORDS = """
the of and to in is it that for you was with on as have be at by this from or an are not but
what all were when we there can your which their if do will each about how up out them then she
many some so these would other into has more her two like him see time could no make than first
been its who now people my made over did down only way find use may water long little very after
called just where most know get through back much before go good new write our used me man too
any day same right look think also around another came come work three word must because does part
even place well such here take why things help put years different away again off went old number
great tell men say small every found still between name should home big give air line set own under
read last never us left end along while might next sound below saw something thought both few those
always looked show large often together asked house don world going want school important until form
food keep children feet land side without boy once animal life enough took sometimes four head above
kind began almost live page got earth need far hand high year mother light parts country father let
night following picture being study second eyes soon times story boys since white days ever paper hard
near sentence better best across during today others however sure means knew try told young miles sun
task file files directory command commands output input error errors test tests pass fail failed
passed check create created write wrote read run running script scripts function functions value
values return returns string strings list lists number integer float line lines path paths config
install installed package packages server client request response status code exit message repository
solution answer submit complete completed terminal shell environment variable variables permission
print import class def self none true false while break continue lambda yield async await raise
except finally with assert global pass elif else open close append extend strip split join format
len range enumerate zip sorted reversed dict set tuple int str bool bytes type isinstance super
main args kwargs result results data json yaml csv log logs tmp app src lib bin usr etc var home
ls cd pwd cat echo grep sed awk find xargs sort uniq head tail wc cut tr tee mkdir rmdir rm cp mv
touch chmod chown ln tar gzip gunzip zip unzip curl wget git pip python python3 pytest bash sh make
diff patch ps kill top df du free env export source which whoami date sleep true false test
user assistant system tool thought analysis plan keystrokes duration
"""


def build_tokenizer(config: TinyModelConfig | None = None):
    """Train the byte-level BPE tokenizer and wrap it as a PreTrainedTokenizerFast."""
    config = config or TinyModelConfig()
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    # Byte-level: every byte string has a token sequence, and decoding gives the bytes back.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=config.bpe_vocab_size,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    words = WORDS.split()
    lines = CORPUS.splitlines(keepends=True)
    lines += 2 * [" ".join(words) + "\n", " ".join(w.capitalize() for w in words) + "\n"]
    lines += 2 * [w + "\n" for w in words]
    tokenizer.train_from_iterator(lines, trainer=trainer)
    # Added after training so they sit at the end of the vocab, as in Qwen: the special tokens,
    # then the format tokens as plain added tokens (Qwen3 marks them special=False).
    tokenizer.add_special_tokens(SPECIAL_TOKENS)
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in FORMAT_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        chat_template=CHAT_TEMPLATE,
        model_max_length=config.max_position_embeddings,
        clean_up_tokenization_spaces=False,
    )


def build_tiny_model(out_dir: str | Path, seed: int = 0, config: TinyModelConfig | None = None) -> Path:
    """Write the tiny policy (weights, config, tokenizer, chat template) to `out_dir`.

    The same seed and config give byte-identical files. Returns `out_dir` as a Path.
    """
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    config = config or TinyModelConfig()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(config)
    tokenizer.save_pretrained(out)
    # transformers 5 records its own backend class name, which 4.x cannot resolve; the generic
    # fast-tokenizer class loads in both.
    tokenizer_config_path = out / "tokenizer_config.json"
    tokenizer_config = json.loads(tokenizer_config_path.read_text())
    tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    tokenizer_config_path.write_text(json.dumps(tokenizer_config, indent=2) + "\n")

    model_config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        max_position_embeddings=config.max_position_embeddings,
        initializer_range=config.initializer_range,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.convert_tokens_to_ids(ENDOFTEXT),
        torch_dtype="float32",
    )
    # Initialise under a private RNG state so building does not disturb the caller's seeds.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(model_config)
    model.generation_config = GenerationConfig(
        eos_token_id=[tokenizer.convert_tokens_to_ids(t) for t in (IM_END, ENDOFTEXT)],
        pad_token_id=model_config.pad_token_id,
    )
    model.save_pretrained(out)
    (out / "tiny_model.json").write_text(
        json.dumps({"seed": seed, "recipe": recipe_hash(config), **asdict(config)}, indent=2) + "\n"
    )
    return out


def recipe_hash(config: TinyModelConfig | None = None) -> str:
    """Fingerprint of everything a build depends on besides the seed (the shape, corpus, tokens,
    template, recipe version): a cached model with another fingerprint is stale."""
    import hashlib

    recipe = json.dumps(
        [RECIPE_VERSION, asdict(config or TinyModelConfig()), CORPUS, WORDS, SPECIAL_TOKENS, FORMAT_TOKENS, CHAT_TEMPLATE]
    )
    return hashlib.sha256(recipe.encode()).hexdigest()[:16]


def ensure_tiny_model(seed: int = 0) -> Path:
    """The offline tiny model, built once per seed and recipe and reused.

    The directory is named for the recipe, so a model cached by an older recipe (another vocab or
    chat template) is never picked up; tiny_model.json's recipe is checked too, and a half-written
    build (no tiny_model.json, written last) is built again.
    """
    recipe = recipe_hash()
    out = cache_dir() / f"tiny-model-seed{seed}-{recipe}"
    stamp = out / "tiny_model.json"
    try:
        built = json.loads(stamp.read_text()).get("recipe")
    except (OSError, ValueError):
        built = None
    if built != recipe:
        print(f"building the tiny offline policy model in {out}", file=sys.stderr)
        build_tiny_model(out, seed=seed)
    return out
