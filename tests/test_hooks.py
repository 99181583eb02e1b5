"""SLiME hooks: reward post-processing always; the generate hook and SLiME's own plugin contract
tests when slime is importable (it is not on PyPI: CI skips those with a reason)."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from slime_harbor.cli import prepare_data
from slime_harbor.rollout import DEFAULT_TASKS
from slime_harbor.hooks import reward_post_process

HAVE_SLIME = importlib.util.find_spec("slime") is not None
needs_slime = pytest.mark.skipif(not HAVE_SLIME, reason="slime is not installed (install it from source to run)")


def fake_samples(specs):
    """Objects with the Sample fields reward_post_process reads; specs = (group, rollout_id, reward, removed)."""
    return [
        SimpleNamespace(group_index=g, index=r, rollout_id=r, reward=x, remove_sample=rm,
                        get_reward_value=lambda args, x=x: x)
        for g, r, x, rm in specs
    ]


def test_reward_post_process_groups_by_index_and_ignores_removed():
    args = SimpleNamespace(grpo_std_normalization=False)
    samples = fake_samples([
        (0, 0, 1.0, False), (0, 1, 0.0, False), (0, 2, 0.0, True),   # removed: no say in the mean
        (1, 3, 1.0, False), (1, 3, 1.0, False),                        # one episode split in two samples
        (1, 4, 0.0, False),
    ])
    raw, rewards = reward_post_process(args, samples)
    assert raw == [1.0, 0.0, 0.0, 1.0, 1.0, 0.0]
    assert rewards == pytest.approx([0.5, -0.5, 0.0, 0.5, 0.5, -0.5])


def test_reward_post_process_std_normalisation_and_nested_groups():
    args = SimpleNamespace(grpo_std_normalization=True)
    samples = fake_samples([(0, 0, 1.0, False), (0, 1, 0.0, False), (0, 2, 0.0, False), (0, 3, 1.0, False)])
    _, flat = reward_post_process(args, samples)
    _, nested = reward_post_process(args, [samples[:2], samples[2:]])
    std = (4 * 0.25 / 3) ** 0.5  # Bessel-corrected, as torch.std
    assert flat == pytest.approx([0.5 / std, -0.5 / std, -0.5 / std, 0.5 / std], rel=1e-4)
    assert nested == flat


def test_prepare_data_rows(tmp_path):
    out = tmp_path / "prompts.jsonl"
    n = prepare_data(DEFAULT_TASKS, out)
    import json

    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert n == len(rows) >= 12
    for row in rows:
        task = Path(row["metadata"]["task_dir"])
        assert row["label"] == task.name and row["prompt"] == (task / "instruction.md").read_text()


@needs_slime
def test_slime_generate_contract_passes_with_our_hook():
    """SLiME's own tests/plugin_contracts generate contract, pointed at slime_harbor.hooks.generate."""
    import slime

    contracts = Path(slime.__file__).resolve().parent.parent / "tests" / "plugin_contracts"
    if not contracts.is_dir():
        pytest.skip("slime is installed without its tests/ directory")
    env = {**os.environ, "SLIME_CONTRACT_CUSTOM_GENERATE_FUNCTION_PATH": "slime_harbor.hooks.generate"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(contracts / "test_plugin_generate_contracts.py")],
        env=env, capture_output=True, text=True, timeout=300, cwd=contracts.parent,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@needs_slime
def test_generate_hook_runs_a_real_trial(tmp_path, policy_server, tiny_model_dir):
    from slime.utils.types import Sample

    from slime_harbor.hooks import generate

    host, port = policy_server.removeprefix("http://").split(":")
    args = SimpleNamespace(sglang_router_ip=host, sglang_router_port=int(port), hf_checkpoint=str(tiny_model_dir),
                           harbor_step_limit=2, harbor_trials_dir=str(tmp_path / "trials"))
    task = DEFAULT_TASKS / "dedupe-lines"
    sample = Sample(group_index=3, index=7, prompt="p", label=task.name, metadata={"task_dir": str(task)})
    out = asyncio.run(generate(args, sample, {"temperature": 1.0, "max_new_tokens": 24}))
    out = out if isinstance(out, list) else [out]
    for s in out:
        assert isinstance(s, Sample) and s.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED)
        assert len(s.loss_mask) == s.response_length == len(s.rollout_log_probs) > 0
        assert s.reward == 0.0 and not s.remove_sample and s.rollout_id == 7 and s.group_index == 3

    # A label that names no task is an unusable rollout: removed, never a -1.
    missing = asyncio.run(generate(args, Sample(index=0, prompt="p", label="no-such-task"), {}))
    assert missing.remove_sample and missing.status == Sample.Status.FAILED and missing.reward == 0.0


def test_a_slime_abort_stops_the_trial_and_tears_the_sandbox_down(tmp_path, policy_server, tiny_model_dir):
    """SLiME's abort can land while the agent runs a command (no request to abort on the server):
    the watched flag must cancel the trial, and its sandbox must be gone when the call returns."""
    import time

    from slime_harbor.hooks import run_unless_aborted
    from slime_harbor.rollout import RolloutConfig, run_episode
    from test_rollout_e2e import leftovers

    cfg = RolloutConfig(agent="native", policy_url=policy_server, model_dir=str(tiny_model_dir),
                        step_limit=30, max_new_tokens=48, progress=False)
    out = tmp_path / "out"
    started = time.monotonic()
    flag_at: list[float] = []

    def aborted() -> bool:
        if time.monotonic() - started > 4.0:
            flag_at.append(flag_at[0] if flag_at else time.monotonic())
            return True
        return False

    episode = asyncio.run(run_unless_aborted(
        run_episode(DEFAULT_TASKS / "dedupe-lines", cfg, group_index=0, index=0, trials_dir=out / "trials"),
        aborted, poll_seconds=0.2))
    assert episode is None  # 30 turns of the random model take far longer than 4 s
    assert time.monotonic() - flag_at[0] < 20  # cancelled, not run to the step limit
    procs, dirs = leftovers(out)
    assert procs == [] and dirs == []

    # The caller cancelled (SLiME's worker shutting down): the cancellation passes on, nothing is left.
    async def cancel_after(seconds):
        call = asyncio.ensure_future(run_unless_aborted(
            run_episode(DEFAULT_TASKS / "dedupe-lines", cfg, group_index=1, index=0, trials_dir=out / "trials"),
            lambda: False, poll_seconds=0.2))
        await asyncio.sleep(seconds)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        return leftovers(out)  # checked before asyncio.run would cancel what is left behind

    assert asyncio.run(cancel_after(4.0)) == ([], [])

    # Not aborted: the episode comes back as it is.
    short = RolloutConfig(**{**cfg.__dict__, "step_limit": 1})
    episode = asyncio.run(run_unless_aborted(
        run_episode(DEFAULT_TASKS / "dedupe-lines", short, group_index=0, index=1, trials_dir=out / "trials"),
        lambda: False, poll_seconds=0.2))
    assert episode is not None and episode.samples[0].response_length > 0


@needs_slime
def test_generate_returns_an_aborted_removed_sample_once_slime_aborted(tmp_path, monkeypatch):
    """The flag is read from SLiME's GenerateState singleton (its SingletonMeta registry). The real
    slime.rollout.sglang_rollout needs ray, so a module holding a GenerateState stands in for it."""
    import types

    from slime.utils.misc import SingletonMeta
    from slime.utils.types import Sample

    from slime_harbor.hooks import generate, slime_rollout_aborted

    class GenerateState(metaclass=SingletonMeta):
        def __init__(self):
            self.aborted = False

    module = types.ModuleType("slime.rollout.sglang_rollout")
    module.GenerateState = GenerateState
    monkeypatch.setitem(sys.modules, "slime.rollout.sglang_rollout", module)
    assert not slime_rollout_aborted()  # no state yet: not created by reading it
    assert GenerateState not in SingletonMeta._instances
    try:
        GenerateState().aborted = True
        assert slime_rollout_aborted()
        args = SimpleNamespace(sglang_router_ip="127.0.0.1", sglang_router_port=9, harbor_trials_dir=str(tmp_path / "trials"))
        task = DEFAULT_TASKS / "dedupe-lines"
        sample = Sample(index=0, prompt="p", label=task.name, metadata={"task_dir": str(task)})
        out = asyncio.run(generate(args, sample, {}))
        assert out.status == Sample.Status.ABORTED and out.remove_sample and out.reward == 0.0
        assert not (tmp_path / "trials").exists()  # no trial was started
    finally:
        SingletonMeta._instances.pop(GenerateState, None)
