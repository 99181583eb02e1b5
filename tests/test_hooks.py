"""SLiME hooks: reward post-processing always; the generate hook and SLiME's own plugin contract
tests when slime is importable (it is not on PyPI: CI skips those with a reason)."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from collections import Counter

from slime_harbor import hooks
from slime_harbor import rollout as rollout_module
from slime_harbor.cli import prepare_data
from slime_harbor.policy.sampling import SamplingParams
from slime_harbor.retries import RetryBudget
from slime_harbor.run_config import DEFAULT_TASKS
from slime_harbor.hooks import HookConfigError, dynamic_sampling_filter, generate, reward_post_process
from helpers.samples import recompute_logprobs
from helpers.slime import SampleLike

HAVE_SLIME = importlib.util.find_spec("slime") is not None
needs_slime = pytest.mark.skipif(not HAVE_SLIME, reason="slime is not importable (PYTHONPATH=<a THUDM/slime checkout>)")


@pytest.fixture
def Sample():
    """SLiME's Sample where slime is importable, else the stand-in with its fields."""
    if HAVE_SLIME:
        from slime.utils.types import Sample

        return Sample
    return SampleLike


@pytest.fixture
def fresh_counters(monkeypatch):
    monkeypatch.setattr(hooks, "METRICS", Counter())
    monkeypatch.setattr(hooks, "RETRY_BUDGET", RetryBudget())


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


KNOWN_CONTRACT_FAILURE = (
    "tests/plugin_contracts/test_plugin_generate_contracts.py::test_custom_generate_function_path_supports_user_override"
)


@needs_slime
def test_slime_plugin_contracts_pass_with_our_hooks_but_the_bare_sample_assertion():
    """SLiME's own tests/plugin_contracts (all four files), pointed at our generate, reward
    post-process and dynamic filter."""
    import slime

    root = Path(slime.__file__).resolve().parent.parent
    contracts = root / "tests" / "plugin_contracts"
    if not contracts.is_dir():
        pytest.skip("slime is installed without its tests/ directory")
    env = {
        **os.environ,
        "SLIME_CONTRACT_CUSTOM_GENERATE_FUNCTION_PATH": "slime_harbor.hooks.generate",
        "SLIME_CONTRACT_CUSTOM_REWARD_POST_PROCESS_PATH": "slime_harbor.hooks.reward_post_process",
        "SLIME_CONTRACT_DYNAMIC_SAMPLING_FILTER_PATH": "slime_harbor.hooks.dynamic_sampling_filter",
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parent.parent), str(root)]),
    }
    # All four contract files; the callsite checks read SLiME's sources by relative path: cwd = root.
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider", "tests/plugin_contracts"],
        env=env, capture_output=True, text=True, timeout=300, cwd=root,
    )
    failed = sorted(line.split()[1] for line in proc.stdout.splitlines() if line.startswith("FAILED "))
    # The one known failure: this test asserts a bare Sample; our hook always returns a list
    # (SLiME's runtime needs one shape per batch; its own coding-agent example returns lists too).
    assert failed == [KNOWN_CONTRACT_FAILURE], proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "35 passed" in proc.stdout, proc.stdout[-1500:]


def test_generate_hook_runs_a_real_trial(tmp_path, policy_server, tiny_model_dir, Sample, fresh_counters):
    host, port = policy_server.removeprefix("http://").split(":")
    args = SimpleNamespace(sglang_router_ip=host, sglang_router_port=int(port), hf_checkpoint=str(tiny_model_dir),
                           harbor_step_limit=2, harbor_trials_dir=str(tmp_path / "trials"))
    task = DEFAULT_TASKS / "dedupe-lines"
    sample = Sample(group_index=3, index=7, prompt="p", label=task.name, metadata={"task_dir": str(task)})
    out = asyncio.run(generate(args, sample, {"temperature": 1.0, "max_new_tokens": 96}))
    assert isinstance(out, list) and out[0] is sample
    for s in out:
        assert isinstance(s, Sample) and s.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED)
        assert len(s.loss_mask) == s.response_length == len(s.rollout_log_probs) > 0
        assert s.reward == 0.0 and not s.remove_sample and s.rollout_id == 7 and s.group_index == 3
        assert s.response and s.metadata["harbor_retries"] == 0
    assert hooks.hook_metrics()["status/" + out[0].status.value] == 1

    # A label that names no task is an unusable rollout: removed, never a -1, and still a list.
    (missing,) = asyncio.run(generate(args, Sample(index=0, prompt="p", label="no-such-task"), {}))
    assert missing.remove_sample and missing.status == Sample.Status.FAILED and missing.reward == 0.0


def test_generate_hook_runs_terminus2_through_the_process_gateway(tmp_path, responsive_server, responsive_model_dir,
                                                                  hf_model, Sample, fresh_counters):
    """`harbor_agent: terminus-2`: one gateway per process and event loop in front of the "router",
    reused by every trial, closed by close_gateway (port free). Its samples train (logprobs equal a
    recomputation by the model), and SLiME's top-p replay, stop_token_ids and sampling_seed now
    apply to it: its samples carry top-p ids. The policy is test_rollout_e2e's SFT'd tiny model, so
    terminus-2's turns end (the untrained one hits max_tokens each turn and terminus-2 re-asks until
    its timeout)."""
    import torch

    from helpers.servers import port_is_free

    host, port = responsive_server.removeprefix("http://").split(":")
    args = SimpleNamespace(sglang_router_ip=host, sglang_router_port=int(port), hf_checkpoint=str(responsive_model_dir),
                           harbor_agent="terminus-2", harbor_step_limit=2, harbor_trials_dir=str(tmp_path / "trials"))
    task = DEFAULT_TASKS / "dedupe-lines"

    async def two_trials():
        plain = Sample(group_index=0, index=1, prompt="p", label=task.name, session_id="sess-1",
                       metadata={"task_dir": str(task)})
        first = await generate(args, plain, {"temperature": 1.0, "max_new_tokens": 96})
        (gateway,) = rollout_module._SHARED_GATEWAYS[asyncio.get_running_loop()].values()
        replay = Sample(group_index=0, index=2, prompt="p", label=task.name, session_id="sess-2",
                        metadata={"task_dir": str(task)})
        second = await generate(args, replay, {"temperature": 1.0, "top_p": 0.9, "max_new_tokens": 96,
                                                "stop_token_ids": [5], "sampling_seed": 3,
                                                "custom_params": {"return_top_p_token_ids": True}})
        assert list(rollout_module._SHARED_GATEWAYS[asyncio.get_running_loop()].values()) == [gateway]  # one per loop
        await hooks.close_gateway()
        return first, second, gateway.port, asyncio.get_running_loop()

    first, second, gateway_port, loop = asyncio.run(two_trials())
    # (Another loop's gateway may remain: a SLiME round run earlier in this process keeps its own.)
    assert port_is_free(gateway_port) and loop not in rollout_module._SHARED_GATEWAYS
    for s in first:
        assert s.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED) and not s.remove_sample
        n = s.response_length
        lp = recompute_logprobs(hf_model, s.tokens, 1.0)[-n:]
        mask = torch.tensor(s.loss_mask, dtype=torch.bool)
        assert (lp[mask] - torch.tensor(s.rollout_log_probs)[mask]).abs().mean().item() < 1e-4
    for s in second:
        assert not s.remove_sample and s.rollout_top_p_token_ids is not None
        assert len(s.rollout_top_p_token_offsets) == s.response_length + 1


def test_a_slime_abort_stops_the_trial_and_tears_the_sandbox_down(tmp_path, policy_server, tiny_model_dir):
    """SLiME's abort can land while the agent runs a command (no request to abort on the server):
    the watched flag must cancel the trial, and its sandbox must be gone when the call returns."""
    import time

    from slime_harbor.hooks import run_unless_aborted
    from slime_harbor.rollout import run_episode
    from slime_harbor.run_config import RolloutConfig
    from helpers.rollout import leftovers

    cfg = RolloutConfig(agent="native", policy_url=policy_server, model_dir=str(tiny_model_dir),
                        step_limit=400, sampling=SamplingParams(max_new_tokens=48), progress=False)
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
    assert episode is None  # 400 turns of the random model take far longer than 4 s
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
        (out,) = asyncio.run(generate(args, sample, {}))
        assert out.status == Sample.Status.ABORTED and out.remove_sample and out.reward == 0.0
        assert not (tmp_path / "trials").exists()  # no trial was started
    finally:
        SingletonMeta._instances.pop(GenerateState, None)


# ---- CI-side: every path of generate, the filter and the post-process without slime ---------------

def plain(group, rollout_id, reward, removed=False, index=None):
    """A SampleLike as the hook leaves it in a SLiME group."""
    return SampleLike(group_index=group, index=rollout_id if index is None else index, rollout_id=rollout_id,
                      reward=reward, remove_sample=removed)


def test_dynamic_filter_counts_episodes_once_and_ignores_removed():
    args = SimpleNamespace()
    # Rewards vary between episodes: keep. Items are the hook's lists (one per prompt copy).
    assert dynamic_sampling_filter(args, [[plain(0, 0, 1.0)], [plain(0, 1, 0.0)]]).keep
    # All kept episodes equal; the removed sample's 0.0 is no reward: drop.
    out = dynamic_sampling_filter(args, [[plain(0, 0, 1.0)], [plain(0, 1, 1.0)], [plain(0, 2, 0.0, removed=True)]])
    assert not out.keep and out.reason == "zero_std_1.0"
    # One episode fanned out into two samples + one removed: a single scored episode, no signal.
    out = dynamic_sampling_filter(args, [[plain(0, 0, 1.0), plain(0, 0, 1.0)], [plain(0, 1, 0.0, removed=True)]])
    assert not out.keep and out.reason.startswith("fewer_than_2")
    # Bare samples (SLiME's default shape, rollout_id unset) are episodes of their own.
    bare = [SampleLike(index=0, reward=0.0), SampleLike(index=1, reward=1.0)]
    assert dynamic_sampling_filter(args, bare).keep
    # reward_key selects from dict rewards, as SLiME's get_reward_value does.
    keyed = [[SampleLike(index=0, rollout_id=0, reward={"acc": 1.0})], [SampleLike(index=1, rollout_id=1, reward={"acc": 0.0})]]
    assert dynamic_sampling_filter(SimpleNamespace(reward_key="acc"), keyed).keep


def test_reward_post_process_with_args_without_reward_key():
    """SLiME's runtime-hook contract passes `type("Args", (), {})()`: no reward_key, no anything.
    Before, the hook called Sample.get_reward_value(args), which reads args.reward_key."""
    args = type("Args", (), {})()
    samples = [SampleLike(index=0, rollout_id=0, group_index=0, reward=0.5), SampleLike(index=1, rollout_id=1, group_index=0, reward=1.5)]
    raw, rewards = reward_post_process(args, samples)
    assert raw == [0.5, 1.5] and rewards == pytest.approx([-0.5, 0.5])
    keyed = [SampleLike(index=0, rollout_id=0, group_index=0, reward={"r": 1.0}),
             SampleLike(index=1, rollout_id=1, group_index=0, reward={"r": 0.0})]
    assert reward_post_process(SimpleNamespace(reward_key="r"), keyed)[0] == [1.0, 0.0]


def drifted_episode(group_index, index, **grading):
    """An Episode whose tokens drifted at turn 1 (two samples), converted by the real converter
    (`grading`: its GradingReport and the hack_action, for the reward's one decision)."""
    from helpers.trial_results import linear_detail, make_result, OBS0, P0

    from slime_harbor.converter import trial_to_episode

    detail = linear_detail()
    detail["prompt_token_ids"][1] = P0 + [77] + OBS0
    return trial_to_episode(make_result(detail, {"reward": 1.0}), group_index=group_index, index=index, **grading)


def test_generate_returns_a_list_sharing_rollout_id_on_every_path(tmp_path, monkeypatch, Sample, fresh_counters):
    """Before: a bare Sample normally and on failures, a list on drift; SLiME's flatten
    (`while isinstance(data[0], list)`) crashed on a batch mixing the two."""
    args = SimpleNamespace(sglang_router_ip="127.0.0.1", sglang_router_port=9, harbor_trials_dir=str(tmp_path / "t"))
    task = DEFAULT_TASKS / "dedupe-lines"
    top_p = {"top_p": 0.9, "custom_params": {"return_top_p_token_ids": True}}

    def call(sample, params=None):
        out = asyncio.run(generate(args, sample, params or {}))
        assert isinstance(out, list) and out and all(isinstance(s, Sample) for s in out)
        assert {s.rollout_id for s in out} == {sample.index}
        for s in out:
            assert len(s.loss_mask) == s.response_length == len(s.rollout_log_probs)
        return out

    # 1. No task: FAILED placeholder; with top-p replay on it carries empty, well-formed top-p data.
    (s,) = call(Sample(index=4, label="no-such-task"), top_p)
    assert s.status == Sample.Status.FAILED and s.remove_sample
    assert list(s.rollout_top_p_token_ids) == [] and list(s.rollout_top_p_token_offsets) == [0, 0]
    assert len(s.rollout_top_p_token_offsets) == s.response_length + 1

    # 2. Tokens drifted: two samples, one rollout_id.
    monkeypatch.setattr(hooks, "run_episode", lambda task_dir, cfg, **kw: _coro(drifted_episode(kw["group_index"], kw["index"])))
    out = call(Sample(index=5, group_index=1, label=task.name))
    assert len(out) == 2 and all(s.status == Sample.Status.COMPLETED and s.reward == 1.0 for s in out)

    # 3. SLiME aborted the round before the trial started: ABORTED placeholder.
    class Singleton(type):
        _instances: dict = {}

    class GenerateState(metaclass=Singleton):
        aborted = True

    Singleton._instances[GenerateState] = GenerateState()
    module = type(sys)("slime.rollout.sglang_rollout")
    module.GenerateState = GenerateState
    monkeypatch.setitem(sys.modules, "slime.rollout.sglang_rollout", module)
    (s,) = call(Sample(index=6, label=task.name))
    assert s.status == Sample.Status.ABORTED and s.remove_sample and s.rollout_top_p_token_ids is None
    assert hooks.hook_metrics() == {"episodes": 3, "status/failed": 1, "status/completed": 1, "status/aborted": 1}


async def _coro(value):
    return value


def test_trajectory_filters_and_eval_trials_dir_from_the_yaml(tmp_path, monkeypatch, Sample, fresh_counters):
    """harbor_mask_step_limit masks a training episode that used every turn (all its samples, the
    episode counted once) as train-local's --mask-step-limit does; SLiME's evaluation trials are
    never masked and go to their own trials dir; a setting that is not true/false is one error."""
    task = DEFAULT_TASKS / "dedupe-lines"
    seen_dirs = []

    def at_step_limit(task_dir, cfg, **kw):
        seen_dirs.append(kw["trials_dir"])
        episode = drifted_episode(kw["group_index"], kw["index"])  # two samples of one episode
        episode.end = dataclasses.replace(episode.end, exit_status="step_limit")
        return _coro(episode)

    monkeypatch.setattr(hooks, "run_episode", at_step_limit)

    def call(evaluation=False, **settings):
        args = SimpleNamespace(sglang_router_ip="127.0.0.1", sglang_router_port=9,
                               harbor_trials_dir=str(tmp_path / "trials"), **settings)
        return asyncio.run(generate(args, Sample(index=1, group_index=0, label=task.name), {}, evaluation=evaluation))

    assert [s.remove_sample for s in call()] == [False, False]  # off by default: scored as it is
    masked = call(harbor_mask_step_limit=True, harbor_mask_timeouts=True)
    assert [(s.remove_sample, s.metadata["masked_by"]) for s in masked] == [(True, "step_limit")] * 2
    assert hooks.hook_metrics()["masked/step_limit"] == 1
    evaluated = call(evaluation=True, harbor_mask_step_limit=True)
    assert [s.remove_sample for s in evaluated] == [False, False] and "masked_by" not in evaluated[0].metadata
    call(evaluation=True, harbor_eval_trials_dir=str(tmp_path / "evals"))
    assert seen_dirs == [tmp_path / "trials", tmp_path / "trials", tmp_path / "trials" / "eval", tmp_path / "evals"]
    with pytest.raises(HookConfigError, match="harbor_mask_length_limit must be true or false, got 'yes'"):
        call(harbor_mask_length_limit="yes")


def test_a_screened_episode_is_counted_masked_hack(tmp_path, monkeypatch, Sample, fresh_counters):
    """harbor_hack_action screen: run_episode hands back an episode the hack monitor screened (its
    action, decided once by the real converter, two samples); generate returns it removed,
    masked_by hack, counted once as masked/hack, as a filter's mask is. Evaluation counts none."""
    from slime_harbor.grading.grade import GradingReport
    from slime_harbor.grading.hack_monitor import HackFlag

    def screened(task_dir, cfg, **kw):
        report = GradingReport(flags=(HackFlag("always_equal", "slug.py:5 __eq__ ignores other"),))
        return _coro(drifted_episode(kw["group_index"], kw["index"], grading=report, hack_action="screen"))

    monkeypatch.setattr(hooks, "run_episode", screened)
    args = SimpleNamespace(sglang_router_ip="127.0.0.1", sglang_router_port=9,
                           harbor_trials_dir=str(tmp_path / "trials"))
    label = (DEFAULT_TASKS / "dedupe-lines").name
    out = asyncio.run(generate(args, Sample(index=1, group_index=0, label=label), {}))
    assert [(s.remove_sample, s.metadata["masked_by"]) for s in out] == [(True, "hack")] * 2
    assert hooks.hook_metrics()["masked/hack"] == 1
    asyncio.run(generate(args, Sample(index=2, group_index=0, label=label), {}, evaluation=True))
    assert hooks.hook_metrics()["masked/hack"] == 1


def test_one_zero_variance_rule_for_train_local_and_slime(Sample, fresh_counters):
    """Groups of episodes from the real converter: train-local's dynamic sampling
    (filters.drop_zero_std_groups, on the Episodes) and SLiME's filter
    (dynamic_sampling_filter, on the Samples generate returns for them) decide alike. Rewards
    1e-9 apart are equal for both (no GRPO signal); 0.5 apart vary. A drifted episode (two
    samples, one rollout_id) counts once in both: alone in its group, neither sees two episodes."""
    from helpers.trial_results import linear_detail, make_result

    from slime_harbor.converter import trial_to_episode
    from slime_harbor.filters import drop_zero_std_groups

    def episode(reward, index):
        if reward == "drifted":  # reward 1.0, two samples
            return drifted_episode(0, index)
        return trial_to_episode(make_result(linear_detail(), {"reward": reward}), group_index=0, index=index)

    for rewards, signal in (([0.5, 0.5 + 1e-9], False), (["drifted", 1.0 - 1e-9], False), ([0.5, 1.0], True),
                            (["drifted"], False)):
        train_local = [episode(r, k) for k, r in enumerate(rewards)]
        drop_zero_std_groups(train_local)
        slime = [hooks.to_slime_samples(Sample(index=k, group_index=0), episode(r, k)) for k, r in enumerate(rewards)]
        assert (not any(e.removed for e in train_local), dynamic_sampling_filter(SimpleNamespace(), slime).keep) \
            == (signal, signal), rewards


# ---- evaluation: SLiME's eval loop flattens what generate returns; log_eval_rollout counts trials --

def evaluate_batch(tmp_path, monkeypatch, Sample, kinds) -> list:
    """generate(..., evaluation=True) for each trial of `kinds` (its index), the episodes built by
    the real converter in place of the trials; the lists it returned, in index order."""
    from helpers.trial_results import episodes_by_index

    monkeypatch.setattr(hooks, "run_episode", episodes_by_index(kinds))
    args = SimpleNamespace(sglang_router_ip="127.0.0.1", sglang_router_port=9, harbor_trials_dir=str(tmp_path / "t"))
    task = DEFAULT_TASKS / "dedupe-lines"
    return [asyncio.run(generate(args, Sample(index=i, label=task.name), {}, evaluation=True)) for i in range(len(kinds))]


def test_evaluation_samples_carry_their_trials_reward_and_why_it_went_unscored(tmp_path, monkeypatch, Sample,
                                                                            fresh_counters):
    """Every trial comes back as a non-empty list whose samples all carry a reward; those of an
    unscored trial say why in metadata["unscored"]. A scored trial whose agent sampled nothing (an
    oracle) keeps its verifier's reward (before: 0.0, a failure in SLiME's eval mean)."""
    kinds = ["solved", "drifted", "solved_without_tokens", "environment_start_failed", "broken_verifier"]
    out = evaluate_batch(tmp_path, monkeypatch, Sample, kinds)
    assert [len(trial) for trial in out] == [1, 2, 1, 1, 1]
    assert all(s.reward is not None for trial in out for s in trial)
    assert [[s.reward for s in trial] for trial in out] == [[1.0], [0.0, 0.0], [1.0], [0.0], [0.0]]
    assert [{s.metadata.get("unscored") for s in trial} for trial in out] == [
        {None}, {None}, {None}, {"environment_start_failed"}, {"RewardFileNotFoundError"}]
    (no_task,) = asyncio.run(generate(SimpleNamespace(harbor_trials_dir=str(tmp_path / "t")),
                                      Sample(index=9, label="no-such-task"), {}, evaluation=True))
    assert no_task.reward == 0.0 and no_task.metadata["unscored"] == "no_task"


def test_eval_metrics_count_each_scored_trial_once(tmp_path, monkeypatch, Sample, fresh_counters):
    """The eight trials as SLiME's eval loop lists them (flat, by index): nine samples. Its default
    mean over them is 1/9; over the six scored trials, each once, it is 1/6. pass@k per prompt row
    over its scored trials, averaged over the rows with k of them (the unscored row is left out)."""
    from helpers.trial_results import EVAL_BATCH

    flat = sorted((s for trial in evaluate_batch(tmp_path, monkeypatch, Sample, EVAL_BATCH) for s in trial),
                  key=lambda s: s.index)
    rewards = [s.reward for s in flat]
    assert len(flat) == 9 and sum(rewards) / len(rewards) == pytest.approx(1 / 9)  # SLiME's default mean
    metrics = hooks.eval_dataset_metrics("heldout", flat, rewards, group_size=2, passrate=True)
    assert metrics == pytest.approx({
        "eval/heldout": 1 / 6, "eval/heldout-scored": 6, "eval/heldout-truncated_ratio": 1 / 6,
        "eval/heldout-unscored": 2, "eval/heldout-unscored/environment_start_failed": 1,
        "eval/heldout-unscored/RewardFileNotFoundError": 1,
        # rows: (1, 0) -> pass@1 0.5, pass@2 1; (0, 0) and (0, 0) -> 0; the unscored row left out
        "eval/heldout-pass@1": 0.5 / 3, "eval/heldout-pass@1/groups_left_out": 1,
        "eval/heldout-pass@2": 1 / 3, "eval/heldout-pass@2/groups_left_out": 1,
    })
    # One row of eight trials: SLiME's k values 1, 2, 4, 8 (none for one trial a row); six scored,
    # one success: pass@k = 1 - C(5, k) / C(6, k); eight scored trials are missing for pass@8.
    metrics = hooks.eval_dataset_metrics("heldout", flat, rewards, group_size=8, passrate=True)
    assert {k: v for k, v in metrics.items() if "pass@" in k} == pytest.approx({
        "eval/heldout-pass@1": 1 / 6, "eval/heldout-pass@2": 1 / 3, "eval/heldout-pass@4": 2 / 3,
        "eval/heldout-pass@1/groups_left_out": 0, "eval/heldout-pass@2/groups_left_out": 0,
        "eval/heldout-pass@4/groups_left_out": 0, "eval/heldout-pass@8/groups_left_out": 1})
    assert "eval/heldout-pass@1" not in hooks.eval_dataset_metrics("heldout", flat, rewards, 1, passrate=True)
    assert "eval/heldout-pass@1" not in hooks.eval_dataset_metrics("heldout", flat, rewards, 2, passrate=False)


@pytest.mark.parametrize("overrides, params, match", [
    (dict(use_rollout_routing_replay=True), {}, "routed experts"),
    (dict(harbor_keep_interrupted="yes"), {}, "harbor_keep_interrupted must be true or false"),
    (dict(use_rollout_routing_replay=True, harbor_agent="terminus-2"), {"sampling_seed": 3}, "routed experts"),
    (dict(harbor_hack_action="punish"), {}, "harbor_hack_action must be one of flag, penalty, screen"),
    (dict(harbor_hack_detectors=["no_such_module:f"]), {}, "no_such_module"),
    # an agent refused or placed nowhere never reaches Harbor's own install in the sandbox
    (dict(harbor_agent="terminus-1"), {}, "harbor_agent: agent 'terminus-1' cannot train here"),
    (dict(harbor_agent="no-such-agent"), {}, "harbor_agent: unknown agent 'no-such-agent'"),
])
def test_settings_that_cannot_apply_raise_on_the_first_call(overrides, params, match, Sample):
    args = SimpleNamespace(**overrides)
    with pytest.raises(HookConfigError, match=match):
        asyncio.run(generate(args, Sample(index=0, label="dedupe-lines"), params))


@pytest.mark.parametrize("agent", ["native", "terminus-2", "mini-swe-agent", "chat_tools_agent:ChatToolsAgent"])
def test_slime_sampling_params_apply_to_every_agent(agent, Sample):
    """The gateway calls /generate itself, so top-p replay ids, stop_token_ids and sampling_seed
    reach every agent's sampling (the native agent's kwargs, else its gateway session), while a
    setting no agent can honour is still refused."""
    from slime_harbor.agents.native import NativeAgentOptions
    from slime_harbor.hooks import rollout_config
    from slime_harbor.agents.placement import agent_config, uses_gateway

    args = SimpleNamespace(harbor_agent=agent)
    params = {"stop_token_ids": [7], "sampling_seed": 11, "custom_params": {"return_top_p_token_ids": True}}
    hooks.check_supported(args)
    cfg = rollout_config(args, params, Sample(index=0))
    sampling = cfg.sampling  # a gateway agent's session's sampling
    if not uses_gateway(cfg.agent):  # the native agent's option
        sampling = NativeAgentOptions.model_validate(agent_config(cfg).kwargs).sampling
    assert sampling.stop_token_ids == [7] and sampling.return_top_p_token_ids and sampling.sampling_seed == 11
    with pytest.raises(HookConfigError, match="routed experts"):
        hooks.check_supported(SimpleNamespace(harbor_agent=agent, use_rollout_routing_replay=True))


def test_a_prompt_rows_refused_agent_is_a_failed_sample_without_a_trial(tmp_path, Sample):
    """A prompt row may name its own harbor_agent: a refused one ends that sample, FAILED with the
    refusal as its reason (removed, never trained), before any sandbox starts."""
    args = SimpleNamespace(sglang_router_ip="127.0.0.1", sglang_router_port=9, harbor_trials_dir=str(tmp_path / "trials"))
    task = DEFAULT_TASKS / "dedupe-lines"
    sample = Sample(index=0, prompt="p", label=task.name, metadata={"task_dir": str(task), "harbor_agent": "computer-1"})
    (out,) = asyncio.run(generate(args, sample, {}))
    assert out.status == Sample.Status.FAILED and out.remove_sample
    assert "agent 'computer-1' cannot train here" in out.metadata["status_reason"]
    assert not (tmp_path / "trials").exists()


def test_sampling_params_reach_the_agent_config(Sample):
    """SLiME's per-request options become the agents' own kwargs (AgentConfig.kwargs)."""
    from slime_harbor.agents.native import NativeAgentOptions
    from slime_harbor.hooks import rollout_config
    from slime_harbor.agents.placement import agent_config

    sample = Sample(index=0, session_id="sess-1")
    params = {"temperature": 0.7, "top_p": 0.9, "max_new_tokens": 33, "stop": ["</x>"], "stop_token_ids": [7],
              "skip_special_tokens": False, "no_stop_trim": True, "sampling_seed": 11,
              "custom_params": {"return_top_p_token_ids": True}}
    native = agent_config(rollout_config(SimpleNamespace(rollout_max_context_len=900), params, sample)).kwargs
    options = NativeAgentOptions.model_validate(native)
    assert (options.sampling.temperature, options.sampling.top_p, options.sampling.max_new_tokens) == (0.7, 0.9, 33)
    assert options.sampling.stop == ["</x>"] and options.sampling.stop_token_ids == [7]
    assert options.sampling.sampling_seed == 11 and options.sampling.return_top_p_token_ids is True
    assert options.routing_key == "sess-1" and options.max_context_len == 900
    # A gateway agent: the run's sampling is its gateway session's, the routing key the session's too.
    cfg = rollout_config(SimpleNamespace(harbor_agent="terminus-2", rollout_max_context_len=900), params, sample)
    sampling = cfg.sampling
    assert (sampling.temperature, sampling.top_p, sampling.max_new_tokens) == (0.7, 0.9, 33)
    assert sampling.stop == ["</x>"] and sampling.stop_token_ids == [7] and sampling.return_top_p_token_ids
    assert sampling.sampling_seed == 11 and cfg.routing_key == "sess-1" and cfg.max_context_len == 900
    term = agent_config(cfg).kwargs
    assert term["llm_call_kwargs"] == {"max_tokens": 33}  # stop strings and routing live in the gateway
    assert term["model_info"]["max_input_tokens"] == 900 and term["model_info"]["output_cost_per_token"] == 0.0


def test_transient_failures_are_retried_within_the_task_budget(tmp_path, tiny_model_dir, Sample, fresh_counters):
    """A dead policy server is transient (ABORTED): the task runs again while its budget lasts; once
    spent, the failure is FAILED (never retried, never scored) and counted."""
    args = SimpleNamespace(sglang_router_ip="127.0.0.1", sglang_router_port=9, hf_checkpoint=str(tiny_model_dir),
                           harbor_trials_dir=str(tmp_path / "trials"), harbor_max_retries_per_task=1,
                           harbor_retry_backoff_sec=0.0, harbor_step_limit=1)
    task = DEFAULT_TASKS / "dedupe-lines"
    (s,) = asyncio.run(generate(args, Sample(index=0, label=task.name), {"max_new_tokens": 8}))
    assert s.status == Sample.Status.FAILED and s.remove_sample and s.reward == 0.0
    assert s.metadata["harbor_retries"] == 1 and "retry budget of 1" in s.metadata["status_reason"]
    assert "unreachable" in s.metadata["status_reason"] and s.metadata["retry_budget_spent"]
    assert len(list((tmp_path / "trials").iterdir())) == 2  # the first run and one rerun
    m = hooks.hook_metrics()
    assert m["retries"] == 1 and m["retry_budget_exhausted"] == 1 and m["retries/dedupe-lines"] == 1


def test_a_tasks_retry_budget_recovers_as_its_window_slides():
    """Reruns are budgeted per task per sliding window: spent, the task is not rerun; once its
    oldest rerun leaves the window, it may be rerun again. Another task has its own budget."""
    now = [0.0]
    budget = RetryBudget(clock=lambda: now[0])
    assert budget.try_spend("a", 2, 100.0) and budget.try_spend("a", 2, 100.0)
    assert not budget.try_spend("a", 2, 100.0) and budget.try_spend("b", 2, 100.0)
    assert budget.metrics() == {"retries/a": 2, "retries/b": 1}
    now[0] = 99.0
    assert not budget.try_spend("a", 2, 100.0)
    now[0] = 100.5  # both of a's reruns (at 0) left the window
    assert budget.metrics() == {"retries/a": 0, "retries/b": 0}
    assert budget.try_spend("a", 2, 100.0)


def test_a_tasks_reruns_leave_its_window_one_at_a_time():
    """Reruns spent at different times leave the window each at its own time, oldest first: not
    all at once when the newest does, nor all at once when the oldest does."""
    now = [0.0]
    budget = RetryBudget(clock=lambda: now[0])
    assert budget.try_spend("a", 2, 100.0)
    now[0] = 50.0
    assert budget.try_spend("a", 2, 100.0) and not budget.try_spend("a", 2, 100.0)
    now[0] = 100.5  # the rerun at 0 left the window; the one at 50 is still in it
    assert budget.metrics() == {"retries/a": 1}
    assert budget.try_spend("a", 2, 100.0) and not budget.try_spend("a", 2, 100.0)
    now[0] = 150.5  # the one at 50 left too; the one at 100.5 has not
    assert budget.metrics() == {"retries/a": 1}
    assert budget.try_spend("a", 2, 100.0) and not budget.try_spend("a", 2, 100.0)


class FlakyEnvironment:
    """The bubblewrap sandbox, failing its first FAILS starts (a transient start failure) or raising
    a build failure (permanent). Harbor loads it by import path like any environment."""

    FAILS = 0
    PERMANENT = False
    starts = 0


def _flaky_environment_class():
    from harbor.environments.base import SandboxBuildFailedError

    from slime_harbor.environments.bubblewrap import BubblewrapEnvironment

    class Flaky(BubblewrapEnvironment):
        async def start(self, force_build: bool) -> None:
            FlakyEnvironment.starts += 1
            if FlakyEnvironment.PERMANENT:
                raise SandboxBuildFailedError("injected: the image does not build")
            if FlakyEnvironment.starts <= FlakyEnvironment.FAILS:
                raise RuntimeError("injected: the sandbox did not start")
            await super().start(force_build)

    return Flaky


FlakySandbox = None  # set on first use (harbor imports "test_hooks:FlakySandbox")


@pytest.mark.parametrize("fails, permanent, status, attempts", [
    (1, False, "completed", 2),   # one failed start, retried, the oracle then solves the task
    (5, False, "aborted", 3),     # every start fails: 1 + env_start_retries attempts, then aborted
    (0, True, "failed", 1),       # the image does not build: permanent, not retried
])
def test_environment_start_failures_are_retried_with_backoff(tmp_path, monkeypatch, fails, permanent, status, attempts):
    global FlakySandbox
    FlakySandbox = FlakySandbox or _flaky_environment_class()
    monkeypatch.setattr(FlakyEnvironment, "FAILS", fails)
    monkeypatch.setattr(FlakyEnvironment, "PERMANENT", permanent)
    monkeypatch.setattr(FlakyEnvironment, "starts", 0)
    from slime_harbor.rollout import run_episode
    from slime_harbor.run_config import RolloutConfig

    cfg = RolloutConfig(agent="oracle", env="test_hooks:FlakySandbox", env_start_retries=2, env_start_backoff_sec=0.05,
                        progress=False)
    episode = asyncio.run(run_episode(DEFAULT_TASKS / "dedupe-lines", cfg, group_index=0, index=0, trials_dir=tmp_path))
    first = episode.samples[0]
    assert episode.status.value == status and first.metadata["env_start_attempts"] == attempts == FlakyEnvironment.starts
    if status == "completed":
        assert episode.reward == 1.0
    else:
        assert first.remove_sample and first.reward is None and episode.reward is None


@needs_slime
def test_slimes_own_filter_fails_on_our_groups_and_ours_does_not():
    """Why the hook ships its own filter: SLiME's check_reward_nonzero_std calls get_reward_value
    on each group item (our lists have none) and counts a removed sample's 0.0 as a reward."""
    from slime.rollout.filter_hub.dynamic_sampling_filters import check_reward_nonzero_std
    from slime.utils.types import Sample

    args = SimpleNamespace(reward_key=None)
    listed = [[Sample(index=0, rollout_id=0, reward=1.0)], [Sample(index=1, rollout_id=1, reward=0.0)]]
    with pytest.raises(AttributeError):
        check_reward_nonzero_std(args, listed)
    assert dynamic_sampling_filter(args, listed).keep
    removed = [Sample(index=0, reward=1.0), Sample(index=1, reward=1.0), Sample(index=2, reward=0.0, remove_sample=True)]
    assert check_reward_nonzero_std(args, removed).keep  # kept: a group without signal
    assert not dynamic_sampling_filter(args, removed).keep
