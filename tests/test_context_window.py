"""A prompt over the context window ends the episode the same way for every agent: truncated, scored
by the verifier (on the workdir as the agent left it), exit status and reason `context_exceeded`,
and nothing empty trained. Real trials (bubblewrap sandbox, the embedded policy server) of the
native agent, Harbor's terminus-2 and a host-side agent speaking chat completions through the
gateway, on a task whose instruction alone is over a small-window copy of the tiny model; the same
reason when the prompt grows over the window after some turns; and the rollout command's one line
when every trial ended that way."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
from helpers.cli import run_cli
from helpers.rollout import config, leftovers

from slime_harbor.episode import CONTEXT_EXCEEDED
from slime_harbor.hooks import to_slime_samples
from slime_harbor.rollout import run_episode, run_rollouts
from slime_harbor.samples import read_jsonl, SampleStatus
from slime_harbor.run_config import DEFAULT_TASKS

CHAT_TOOLS_AGENT = "chat_tools_agent:ChatToolsAgent"  # tests/chat_tools_agent.py, importable from tests/
WINDOW = 512
"""The small-window model's context length (config.json's max_position_embeddings)."""
TASK = "dedupe-lines"


@pytest.fixture(scope="module")
def small_window_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model with a context window of WINDOW tokens: the gateway, the native agent,
    terminus-2's model_info and the engine all read it from config.json."""
    out = Path(shutil.copytree(tiny_model_dir, tmp_path_factory.mktemp("small_window") / "model"))
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "max_position_embeddings": WINDOW}))
    return out


@pytest.fixture(scope="module")
def small_window_server(small_window_model_dir):
    from slime_harbor.policy.server import EmbeddedPolicyServer

    with EmbeddedPolicyServer(small_window_model_dir) as server:
        yield server.url


def over_window_task(tasks_dir: Path, tokenizer) -> Path:
    """A copy of the bundled task whose instruction alone is over the window."""
    task = Path(shutil.copytree(DEFAULT_TASKS / TASK, tasks_dir / "over-window"))
    instruction = (task / "instruction.md").read_text()
    notes = "\n".join(f"Note {k}: the script must also keep line {k} exactly as it is written." for k in range(120))
    (task / "instruction.md").write_text(f"{instruction}\n{notes}\n")
    assert len(tokenizer.encode((task / "instruction.md").read_text())) > 2 * WINDOW
    return task


def only_trial(out_dir: Path) -> Path:
    (trial,) = [p for p in (out_dir / "trials").iterdir() if (p / "result.json").is_file()]
    return trial


def episode_of(trial: Path):
    from harbor.models.trial.result import TrialResult

    from slime_harbor.converter import trial_to_episode

    return trial_to_episode(TrialResult.model_validate_json((trial / "result.json").read_text()), index=0)


def slime_sample():
    """SLiME's own Sample where slime is importable, else the tests' stand-in of its fields."""
    try:
        from slime.utils.types import Sample
    except ImportError:
        from helpers.slime import SampleLike as Sample
    return Sample(index=0, group_index=0)


def untouched_reward() -> float:
    """The task's verifier on a workdir nobody touched: dedupe.sh is missing."""
    return 0.0


@pytest.mark.slow
def test_an_instruction_over_the_window_ends_every_agent_truncated_with_context_exceeded(
    tmp_path, small_window_model_dir, small_window_server, tokenizer
):
    task = over_window_task(tmp_path / "tasks", tokenizer)
    agents = {"native": {}, "terminus-2": {}, CHAT_TOOLS_AGENT: {"agent_kwargs": {"max_turns": 3}}}

    async def rollouts():
        cfgs = [config(tmp_path / name.replace(":", "_"), small_window_server, small_window_model_dir,
                       tasks_dir=task.parent, task_names=[task.name], agent=name, n_samples=1, **extra)
                for name, extra in agents.items()]
        return cfgs, await asyncio.gather(*(run_rollouts(cfg) for cfg in cfgs))

    cfgs, summaries = asyncio.run(rollouts())
    samples = {name: read_jsonl(cfg.out_dir / "samples.jsonl") for name, cfg in zip(agents, cfgs)}
    ends = {name: [(s.status, s.metadata["exit_status"], s.metadata["status_reason"]) for s in one]
            for name, one in samples.items()}
    assert all(end == [(SampleStatus.TRUNCATED, CONTEXT_EXCEEDED, CONTEXT_EXCEEDED)] for end in ends.values()), ends
    for name, cfg, summary in zip(agents, cfgs, summaries):
        (sample,) = samples[name]
        # Scored on the untouched workdir; nothing was sampled, so nothing is trained.
        assert sample.reward == untouched_reward(), (name, summary["errors"])
        assert sample.tokens == [] and sample.remove_sample and sample.metadata["no_tokens"], name
        assert summary["n_scored"] == 1 and summary["n_trainable_samples"] == 0, (name, summary)
        assert summary["exit_status_counts"] == {CONTEXT_EXCEEDED: 1}, (name, summary)
        assert leftovers(cfg.out_dir) == ([], []), name
    # In SLiME, the native episode (rebuilt from Harbor's result.json) is the hook's removed
    # placeholder: no loss, no say in its group's baseline.
    native_episode = episode_of(only_trial(cfgs[0].out_dir))
    (placeholder,) = to_slime_samples(slime_sample(), native_episode)
    assert placeholder.remove_sample and not any(placeholder.loss_mask)
    assert placeholder.status.value == "truncated" and placeholder.metadata["status_reason"] == CONTEXT_EXCEEDED
    # The gateway agents' exception (terminus-2's ContextLengthExceededError, the SDK's 400) is
    # what the agent did with the refusal, kept beside the end, not the end.
    for name in ("terminus-2", CHAT_TOOLS_AGENT):
        trial = only_trial(cfgs[list(agents).index(name)].out_dir)
        session = json.loads((trial / "agent" / "gateway" / "session.json").read_text())
        assert session["exit_reason"] == CONTEXT_EXCEEDED and session["stats"]["trained"] == 0
        result = json.loads((trial / "result.json").read_text())
        assert result["exception_info"] is None and result["agent_result"]["metadata"]["agent_error"], name


@pytest.mark.slow
def test_a_prompt_grown_over_the_window_mid_episode_ends_with_the_same_reason(
    tmp_path, small_window_model_dir, small_window_server, tokenizer
):
    """The first prompt fits and its reply fills the window: the native agent stops there, the
    chat agent's next call is refused by the gateway. Both truncated, scored, `context_exceeded`,
    and the reply they sampled is trained."""
    agents = {"native": {}, CHAT_TOOLS_AGENT: {"agent_kwargs": {"max_turns": 8}}}

    async def episodes():
        cfgs = [config(tmp_path / name.replace(":", "_"), small_window_server, small_window_model_dir, agent=name,
                       n_samples=1, step_limit=8, max_new_tokens=WINDOW, **extra) for name, extra in agents.items()]
        return cfgs, await asyncio.gather(*(
            run_episode(DEFAULT_TASKS / TASK, cfg, group_index=0, index=0, trials_dir=cfg.out_dir / "trials")
            for cfg in cfgs))

    cfgs, ended = asyncio.run(episodes())
    for name, episode in zip(agents, ended):
        assert (episode.status, episode.end.exit_status, episode.end.why) == (
            SampleStatus.TRUNCATED, CONTEXT_EXCEEDED, CONTEXT_EXCEEDED), (name, episode.end)
        assert episode.reward is not None and not episode.removed, name
        (sample,) = episode.samples
        assert sample.response_length > 0 and any(sample.loss_mask) and len(sample.tokens) <= WINDOW, name


@pytest.mark.slow
def test_a_rollout_whose_every_trial_is_over_the_window_says_so_in_one_line(
    tmp_path, small_window_model_dir, tokenizer
):
    task = over_window_task(tmp_path / "tasks", tokenizer)
    out = tmp_path / "out"
    proc = run_cli("rollout", "--agent", "terminus-2", "--env", "local", "--model", str(small_window_model_dir),
                   "--tasks", str(task.parent), "--n-samples", "2", "--out", str(out), "--no-progress", timeout=300)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if "context_exceeded" in line]
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr[-3000:]
    assert "all 2 trials" in lines[0] and f"{WINDOW} tokens" in lines[0] and str(out / "summary.json") in lines[0]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status_counts"]["truncated"] == 2 and summary["n_trainable_samples"] == 0
    assert leftovers(out) == ([], [])
