"""Procedural task families: generated dirs are Harbor tasks, real trials on the bubblewrap sandbox
score the oracle 1 and doing nothing (or nearly the right thing) 0, splits never share an
instance, and the SFT oracle episode is the native agent's token format."""

from __future__ import annotations

import asyncio
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from harbor.models.task.task import Task

from slime_harbor.agents.native import (DEFAULT_PROMPTS, format_observation, initial_messages, initial_prompt_ids,
                                        next_prompt_ids, reply_commands)
from slime_harbor.policy.renderer import make_renderer
from slime_harbor.policy.sampling import SamplingParams
from slime_harbor.rollout import run_rollouts
from slime_harbor.tasks import families as tf
from slime_harbor.trainers.sft import oracle_episode
from slime_harbor.run_config import RolloutConfig

REPO = Path(__file__).resolve().parent.parent
ALLOWED_DOCKERFILE_INSTRUCTIONS = {"FROM", "WORKDIR", "COPY", "ENV", "RUN"}

def rollout(tasks_dir: Path, agent: str, out: Path) -> dict:
    cfg = RolloutConfig(tasks_dir=tasks_dir, agent=agent, n_samples=1, concurrency=4, out_dir=out, progress=False)
    return asyncio.run(run_rollouts(cfg))


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> list[Path]:
    """Two held-out instances per family."""
    return tf.generate(tmp_path_factory.mktemp("families"), n=2, seed=0, split="heldout")


def test_every_family_is_generated(tasks):
    assert sorted({tf.family_of(p.name) for p in tasks}) == sorted(tf.FAMILIES)
    assert len(tasks) == 2 * len(tf.FAMILIES)


def test_generated_tasks_load_with_harbor(tasks):
    for path in tasks:
        task = Task(path)
        assert task.instruction == instance_of(path).instruction  # what oracle_episode renders
        assert task.config.environment.workdir == tf.WORKDIR
        assert task.config.metadata["family"] == tf.family_of(path.name)
        env = path / "environment"
        for line in (env / "Dockerfile").read_text().splitlines():
            keyword, *args = shlex.split(line)
            assert keyword in ALLOWED_DOCKERFILE_INSTRUCTIONS, line
            if keyword == "COPY":
                assert (env / args[0]).is_file()
        assert "/logs/verifier/reward.txt" in (path / "tests" / "test.sh").read_text()


def test_oracle_arguments_are_copied_from_the_instruction():
    """The skill to learn is copying: every name in the oracle command appears in the instruction."""
    for family in tf.FAMILIES:
        for inst in tf.instances(family, 5, seed=3):
            assert all(k in inst.instruction for k in inst.key), inst
            assert all(k in inst.command for k in inst.key), inst
            assert len(inst.command) <= 40


@pytest.mark.slow
def test_oracle_scores_one_and_nop_zero_in_real_trials(tasks, tmp_path):
    tasks_dir = tasks[0].parent
    for agent, expected in (("oracle", 1.0), ("nop", 0.0)):
        summary = rollout(tasks_dir, agent, tmp_path / agent)
        assert summary["errors"] == {}, summary["errors"]
        assert summary["per_task_rewards"] == {p.name: [expected] for p in tasks}, agent
        # every trial is monitored: the gold solutions of every family raise no hack flag
        assert summary["hack_rate"] == 0.0, {k: v for k, v in summary.items() if k.startswith("hack")}


@pytest.mark.slow
def test_near_misses_score_zero_in_real_trials(tasks, tmp_path):
    """The oracle agent runs solution/solve.sh: swap in a wrong command, keep everything else."""
    tasks_dir = tmp_path / "near_miss_tasks"
    for path in tasks[::2]:  # one instance per family
        inst = instance_of(path)
        copy = shutil.copytree(path, tasks_dir / path.name)
        (copy / "solution" / "solve.sh").write_text(f"cd {tf.WORKDIR}\n{inst.near_miss}\n")
    summary = rollout(tasks_dir, "oracle", tmp_path / "trials")
    assert summary["errors"] == {}
    assert summary["per_task_rewards"] == {p.name: [0.0] for p in sorted(tasks_dir.iterdir())}


@pytest.mark.slow
def test_a_native_agent_trial_sees_the_prompt_of_the_oracle_episode(tasks, tiny_model_dir, policy_server, tmp_path):
    """SFT must train on the very prompt tokens the agent sends in a real trial."""
    from transformers import AutoTokenizer

    from slime_harbor.samples import read_jsonl

    path = tasks[0]
    cfg = RolloutConfig(tasks_dir=path.parent, task_names=[path.name], agent="native", n_samples=1,
                        policy_url=policy_server, model_dir=str(tiny_model_dir), step_limit=1,
                        sampling=SamplingParams(max_new_tokens=8),
                        out_dir=tmp_path, progress=False)
    asyncio.run(run_rollouts(cfg))
    [sample] = read_jsonl(tmp_path / "samples.jsonl")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids, mask = oracle_episode(make_renderer(tiny_model_dir, tokenizer), tokenizer, instance_of(path))
    prompt = sample.tokens[: len(sample.tokens) - sample.response_length]
    assert prompt == ids[: mask.index(1)]


def instance_of(path: Path) -> tf.Instance:
    """The held-out instance (seed 0) a generated task dir was written from."""
    for inst in tf.instances(tf.family_of(path.name), 2, seed=0, split="heldout"):
        if inst.name == path.name:
            return inst
    raise KeyError(path.name)


def test_oracle_commands_and_near_misses_are_silent_and_succeed(tmp_path):
    """oracle_episode assumes the command's observation is return code 0 and no output."""
    for family in tf.FAMILIES:
        inst = tf.instances(family, 1, seed=0)[0]
        for command in (inst.command, inst.near_miss):
            workdir = tmp_path / f"{family}-{command == inst.command}"
            workdir.mkdir()
            for name, content in inst.files.items():
                (workdir / name).write_text(content)
            done = subprocess.run(["bash", "-c", command], cwd=workdir, capture_output=True, text=True)
            assert (done.returncode, done.stdout, done.stderr) == (0, "", ""), command


def test_splits_are_disjoint_and_draws_reproducible():
    for family in tf.FAMILIES:
        train = tf.instances(family, 8, seed=0, split="train")
        heldout = tf.instances(family, 8, seed=0, split="heldout")
        assert {i.split for i in train} == {"train"} and {i.split for i in heldout} == {"heldout"}
        assert not {i.key for i in train} & {i.key for i in heldout}
        # Disjoint across seeds too: the split is a function of the instance, not of the draw.
        other_seed = tf.instances(family, 8, seed=1, split="heldout")
        assert not {i.key for i in train} & {i.key for i in other_seed}
        assert [i.key for i in other_seed] != [i.key for i in heldout]
        assert tf.instances(family, 8, seed=0, split="train") == train
        assert len({i.key for i in train}) == len({i.name for i in train}) == 8


def test_a_family_runs_out_of_instances():
    n = len(tf.WORDS) ** 2  # make-dirs has fewer: two distinct words, split between train and held-out
    with pytest.raises(ValueError, match="fewer than"):
        tf.instances("make-dirs", n, seed=0)
    assert 0 < len(tf.instances("make-dirs", n, seed=0, strict=False)) < n


def test_oracle_episode_is_the_native_agent_token_format(renderer, tokenizer):
    tok = tokenizer
    inst = tf.instances("rename-file", 1, seed=0)[0]
    ids, mask = oracle_episode(renderer, tok, inst)
    prompt = initial_prompt_ids(renderer, inst.instruction)
    first_reply = ids[len(prompt): mask.index(0, len(prompt))]
    # The observation as the agent bridges it on after its first reply.
    messages = initial_messages(inst.instruction) + [
        {"role": "assistant", "content": tok.decode(first_reply, skip_special_tokens=True)},
        {"role": "user", "content": format_observation(0, "")}]
    observation = next_prompt_ids(renderer, messages, prompt, first_reply)[len(prompt) + len(first_reply):]
    assert ids[: len(prompt)] == prompt and not any(mask[: len(prompt)])
    # prompt | reply 1 | observation | reply 2: replies (closed by <|im_end|>) trained on, the rest not
    first_reply_end = mask.index(0, len(prompt))
    assert ids[first_reply_end: first_reply_end + len(observation)] == observation
    replies = tok.decode(ids[len(prompt):first_reply_end]), tok.decode(ids[first_reply_end + len(observation):])
    assert all(r.endswith("<|im_end|>") for r in replies)
    assert [reply_commands(r)[0] for r in replies] == [inst.command, DEFAULT_PROMPTS.submit_command]
    assert mask == ([0] * len(prompt) + [1] * (first_reply_end - len(prompt)) + [0] * len(observation)
                    + [1] * (len(ids) - first_reply_end - len(observation)))


def test_command_line_writes_tasks(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "slime_harbor.tasks.families", "--out", str(tmp_path), "--n", "1", "--seed", "5",
         "--split", "heldout", "--families", "make-dirs", "copy-file"],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    written = sorted(p.name for p in tmp_path.iterdir())
    assert [tf.family_of(n) for n in written] == ["copy-file", "make-dirs"]
    assert all(tf.split_of(tf.family_of(n), inst.key) == "heldout"
               for n in written for inst in tf.instances(tf.family_of(n), 1, seed=5, split="heldout"))
