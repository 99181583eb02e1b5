"""Procedural Harbor task families: many small instances of one shell skill each.

A family is a parameterised task ("rename the file A to B") whose instances differ in their
file names, words and file contents. Training on some instances and testing on others checks
that a policy learned the skill rather than one answer. Every instance is a real Harbor task
dir that the bubblewrap sandbox runs:

    <name>/task.toml
    <name>/instruction.md            e.g. "Rename the file water.txt to house.txt."
    <name>/environment/Dockerfile    FROM / WORKDIR / COPY of the files below
    <name>/environment/<files>       the starting files (the target plus distractors)
    <name>/solution/solve.sh         the oracle: one short command, e.g. `mv water.txt house.txt`
    <name>/tests/test.sh             checks the end state; writes /logs/verifier/reward.txt
    <name>/tests/expected            the file content the check compares with (when it needs one)

The oracle command is short and its arguments appear in the instruction verbatim, with the same
tokenization (a space before names and words; backquotes where the command has no space, as in
sed's `s/old/new/g`), so a 2-layer model can learn to copy them. The verifier checks behaviour
(end state of the work dir, distractor files untouched), so doing nothing scores 0, and so
does each instance's near miss: a plausible wrong command (cp for mv, touch for mkdir, ...)
that tests run and that bench/learning.py's imperfect demonstrator uses.

Train and held-out instances are disjoint by construction: an instance's split is a hash of its
family and the parameters the instruction names, so no seed can put one instance in both.

    python -m slime_harbor.tasks.families --out DIR --n 4 --seed 0 [--split heldout]
"""

from __future__ import annotations

import argparse
import hashlib
import random
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# Nouns the tiny model's tokenizer holds as one token both with and without a leading space, so a
# name in the instruction and the same name in the command are the same token.
WORDS = """
water house paper light story school food land animal page earth hand year mother country father
night picture study eyes white days miles sun air home place name number sound head kind feet
side people man day part line value message answer sentence children form
""".split()

WORKDIR = "/app"
SPLITS = ("train", "heldout")
HELDOUT_SHARE = 4  # one instance key in HELDOUT_SHARE goes to the held-out split
EXHAUSTED_AFTER = 5000  # instances() gives up after this many draws in a row bring nothing new

TASK_TOML = """schema_version = "1.4"

[metadata]
difficulty = "easy"
category = "shell"
family = "{family}"

[verifier]
timeout_sec = 30.0

[agent]
timeout_sec = 120.0

[environment]
workdir = "{workdir}"
build_timeout_sec = 60.0
network_mode = "no-network"
cpus = 1
memory_mb = 512
"""

# Reward 0 is written first so that any failure of the check still leaves a reward; reward files
# the agent may have planted are removed first (Harbor reads reward.json before reward.txt).
TEST_SH = """#!/bin/bash
mkdir -p /logs/verifier
rm -f /logs/verifier/reward.json /logs/verifier/reward.txt
echo 0 > /logs/verifier/reward.txt
cd {workdir} || exit 0
if {check}; then
    echo 1 > /logs/verifier/reward.txt
fi
"""


@dataclass(frozen=True)
class Instance:
    """One task of a family: what the agent reads, what it starts with, and how it is checked."""

    family: str
    key: tuple[str, ...]
    """The parameters the instruction names; they decide the split and make the task's name."""
    instruction: str
    command: str
    """The oracle: one shell command run in the work dir."""
    near_miss: str
    """A plausible wrong command the verifier rejects (cp for mv, touch for mkdir, ...), silent
    like the oracle: for tests, and for demonstrations of an imperfect demonstrator."""
    thought: str
    """The THOUGHT an oracle-style reply gives before the command (one per family)."""
    files: dict[str, str]
    """Work-dir files at the start: name -> content."""
    check: str
    """Bash condition, run in the work dir after the agent, true iff the task is done."""
    expected: str | None = None
    """Content for tests/expected, which `check` may compare a file with."""

    @property
    def split(self) -> str:
        return split_of(self.family, self.key)

    @property
    def name(self) -> str:
        return f"{self.family}-{'-'.join(k.replace('.', '_') for k in self.key)}"


def family_of(task_name: str) -> str:
    """The family of a task dir written by `write_task`, from its name."""
    for family in FAMILIES:
        if task_name.startswith(family + "-"):
            return family
    raise ValueError(f"{task_name!r} is not the name of a task-family instance")


def split_of(family: str, key: tuple[str, ...]) -> str:
    digest = hashlib.sha256("\0".join((family, *key)).encode()).digest()
    return "heldout" if int.from_bytes(digest[:4], "big") % HELDOUT_SHARE == 0 else "train"


# --------------------------------------------------------------------------------------------
# The families. Each draws one instance from an RNG; file names are WORDS + ".txt".


def _file(rng: random.Random, avoid: set[str]) -> str:
    name = rng.choice([w for w in WORDS if w not in avoid])
    avoid.add(name)
    return name + ".txt"


def _text(rng: random.Random, n_lines: int, avoid: set[str] = frozenset()) -> str:
    """A few lines of WORDS (never those in `avoid`), newline-terminated."""
    pool = [w for w in WORDS if w not in avoid]
    return "".join(" ".join(rng.choices(pool, k=rng.randint(2, 5))) + "\n" for _ in range(n_lines))


def _distractors(rng: random.Random, used: set[str], n: int = 2) -> dict[str, str]:
    return {_file(rng, used): _text(rng, rng.randint(1, 3)) for _ in range(n)}


def write_word(rng: random.Random) -> Instance:
    used: set[str] = set()
    word = rng.choice(WORDS)
    target = _file(rng, used)
    return Instance(
        family="write-word", key=(word, target),
        instruction=f"Write the word {word} into the file {target}.",
        command=f"echo {word} > {target}", near_miss=f"touch {target}", thought="I will write the word into the file.",
        files=_distractors(rng, used),
        check=f'[ "$(cat {target} 2>/dev/null)" = {word} ]',
    )


def rename_file(rng: random.Random) -> Instance:
    used: set[str] = set()
    source, dest = _file(rng, used), _file(rng, used)
    content = _text(rng, rng.randint(1, 3))
    return Instance(
        family="rename-file", key=(source, dest),
        instruction=f"Rename the file {source} to {dest}.",
        command=f"mv {source} {dest}", near_miss=f"cp {source} {dest}", thought="I will rename the file.",
        files={source: content, **_distractors(rng, used)},
        check=f"[ ! -e {source} ] && cmp -s /tests/expected {dest}", expected=content,
    )


def copy_file(rng: random.Random) -> Instance:
    used: set[str] = set()
    source, dest = _file(rng, used), _file(rng, used)
    content = _text(rng, rng.randint(1, 3))
    return Instance(
        family="copy-file", key=(source, dest),
        instruction=f"Copy the file {source} to {dest}.",
        command=f"cp {source} {dest}", near_miss=f"mv {source} {dest}", thought="I will copy the file.",
        files={source: content, **_distractors(rng, used)},
        check=f"cmp -s /tests/expected {source} && cmp -s /tests/expected {dest}", expected=content,
    )


def replace_word(rng: random.Random) -> Instance:
    used: set[str] = set()
    target = _file(rng, used)
    old, new = rng.sample(WORDS, 2)
    # Other words never contain `old`, so the expected text is exactly what sed's s/old/new/g makes.
    filler = {w for w in WORDS if old in w or new in w}
    lines = _text(rng, rng.randint(2, 3), avoid=filler).splitlines(keepends=True)
    at = rng.randrange(len(lines))
    words = lines[at].split()
    for _ in range(2):  # twice on one line: sed without /g replaces only the first
        words.insert(rng.randint(0, len(words)), old)
    lines[at] = " ".join(words) + "\n"
    content = "".join(lines)
    return Instance(
        family="replace-word", key=(old, new, target),
        instruction=f"In the file {target}, replace every `{old}` with `{new}`.",
        command=f"sed -i 's/{old}/{new}/g' {target}", near_miss=f"sed -i 's/{old}/{new}/' {target}",
        thought="I will replace the word in the file.",
        files={target: content, **_distractors(rng, used)},
        check=f"cmp -s /tests/expected {target}", expected=content.replace(old, new),
    )


def make_dirs(rng: random.Random) -> Instance:
    used: set[str] = set()
    first, second = rng.sample(WORDS, 2)
    used.update((first, second))
    return Instance(
        family="make-dirs", key=(first, second),
        instruction=f"Create the directories {first} and {second}.",
        command=f"mkdir {first} {second}", near_miss=f"touch {first} {second}", thought="I will create the directories.",
        files=_distractors(rng, used), check=f"[ -d {first} ] && [ -d {second} ]",
    )


def delete_files(rng: random.Random) -> Instance:
    used: set[str] = set()
    first, second = _file(rng, used), _file(rng, used)
    others = _distractors(rng, used)
    return Instance(
        family="delete-files", key=(first, second),
        instruction=f"Delete the files {first} and {second}.",
        command=f"rm {first} {second}", near_miss=f"rm {first}", thought="I will delete the files.",
        files={first: _text(rng, 1), second: _text(rng, 1), **others},
        # The other files must survive: `rm *` is not the skill.
        check=" && ".join([f"[ ! -e {first} ] && [ ! -e {second} ]", *(f"[ -f {f} ]" for f in others)]),
    )


def count_lines(rng: random.Random) -> Instance:
    used: set[str] = set()
    source, dest = _file(rng, used), _file(rng, used)
    content = _text(rng, rng.randint(2, 9))
    n = content.count("\n")
    return Instance(
        family="count-lines", key=(source, dest),
        instruction=f"Write the number of lines in {source} into the file {dest}.",
        # `wc -l FILE` would also print the file's name: the number alone is asked for.
        command=f"wc -l < {source} > {dest}", near_miss=f"wc -l {source} > {dest}",
        thought="I will count the lines of the file.",
        files={source: content, **_distractors(rng, used)},
        check=f'[ "$(cat {dest} 2>/dev/null)" = {n} ]',
    )


FAMILIES: dict[str, Callable[[random.Random], Instance]] = {
    "write-word": write_word,
    "rename-file": rename_file,
    "copy-file": copy_file,
    "replace-word": replace_word,
    "make-dirs": make_dirs,
    "delete-files": delete_files,
    "count-lines": count_lines,
}


# --------------------------------------------------------------------------------------------
# Drawing instances and writing them as Harbor task dirs.


def instances(family: str, n: int, seed: int, split: str = "train", strict: bool = True) -> list[Instance]:
    """`n` distinct instances of `family` in `split`, the same ones for the same seed. A family
    with fewer distinct instances in the split raises, or gives them all with strict=False."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    draw = FAMILIES[family]
    rng = random.Random(f"{family}/{split}/{seed}")
    found: dict[tuple[str, ...], Instance] = {}
    misses = 0  # draws in a row that found nothing new: the family is (almost surely) exhausted
    while len(found) < n and misses < EXHAUSTED_AFTER:
        inst = draw(rng)
        if inst.split == split and inst.key not in found:
            found[inst.key] = inst
            misses = 0
        else:
            misses += 1
    if len(found) < n and strict:
        raise ValueError(f"{family} has fewer than {n} distinct {split} instances ({len(found)} found)")
    return list(found.values())


def write_task(inst: Instance, tasks_dir: Path) -> Path:
    """Write `inst` as a Harbor task dir under `tasks_dir`; returns its path."""
    root = Path(tasks_dir) / inst.name
    for sub in ("environment", "solution", "tests"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "task.toml").write_text(TASK_TOML.format(family=inst.family, workdir=WORKDIR))
    # Verbatim, no trailing newline: Harbor hands the file's text to the agent as is, and the SFT
    # episodes (oracle_episode) must render the very prompt tokens the agent will see.
    (root / "instruction.md").write_text(inst.instruction)
    dockerfile = ["FROM python:3.11-slim", f"WORKDIR {WORKDIR}"]
    for name, content in sorted(inst.files.items()):
        (root / "environment" / name).write_text(content)
        dockerfile.append(f"COPY {name} {WORKDIR}/{name}")
    (root / "environment" / "Dockerfile").write_text("\n".join(dockerfile) + "\n")
    (root / "solution" / "solve.sh").write_text(f"#!/bin/bash\ncd {shlex.quote(WORKDIR)}\n{inst.command}\n")
    (root / "tests" / "test.sh").write_text(TEST_SH.format(workdir=WORKDIR, check=inst.check))
    if inst.expected is not None:
        (root / "tests" / "expected").write_text(inst.expected)
    for script in (root / "solution" / "solve.sh", root / "tests" / "test.sh"):
        script.chmod(0o755)
    return root


def generate(out_dir: Path, n: int, seed: int, split: str = "train",
             families: list[str] | None = None) -> list[Path]:
    """`n` instances of each family (default: all) in `split`, written as task dirs in `out_dir`."""
    return [write_task(inst, out_dir)
            for family in (families or list(FAMILIES))
            for inst in instances(family, n, seed, split)]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="directory to write the task dirs into")
    p.add_argument("--n", type=int, default=4, help="instances per family")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--split", choices=SPLITS, default="train")
    p.add_argument("--families", nargs="+", choices=list(FAMILIES), default=None)
    a = p.parse_args(argv)
    paths = generate(a.out, a.n, a.seed, a.split, a.families)
    print(f"wrote {len(paths)} tasks to {a.out}")


if __name__ == "__main__":
    main()
