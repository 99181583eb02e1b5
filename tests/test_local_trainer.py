"""The local GRPO trainer, end to end and piece by piece: real Harbor trials on the bubblewrap sandbox,
the tiny model served by the engine that trains it, LoRA via peft, checkpoints and resume.

The tiny random policy scores 0 on every real task (no GRPO signal), so the end-to-end runs use
tests/fixtures/tasks/vowel-share, whose real verifier scores the vowel share of the agent's text.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest
import torch

from slime_harbor.trainers.local import config_from_args, train
from slime_harbor.trainers.learner import make_batch, OPTIMIZER_STATE, Policy, token_logprobs, train_on_samples
from slime_harbor.trainers.local_config import find_checkpoint, LocalTrainConfig
from slime_harbor.samples import SampleStatus, TrainingSample, read_jsonl
from helpers.training import run_config

REPO = Path(__file__).resolve().parent.parent


def base_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def rollout_logprob_gap(model, samples: list[TrainingSample], temperature: float = 1.0) -> float:
    """Largest |recomputed - rollout| logprob over the sampled tokens of `samples`."""
    batch = make_batch(samples, [0.0] * len(samples))
    with torch.no_grad():
        lp = token_logprobs(model, batch, temperature)
    mask = batch.loss_mask.bool()
    return (lp[mask] - batch.old_logprobs[mask]).abs().max().item()


@pytest.fixture(scope="module")
def trained_run(tiny_model_dir, tmp_path_factory):
    """Two GRPO steps (2 optimizer steps each) with a checkpoint after each step."""
    out = tmp_path_factory.mktemp("grpo_run")
    summary = train(run_config(tiny_model_dir, out))
    return out, summary


def test_loading_lora_adapters_prints_no_third_party_warning(trained_run, tiny_model_dir):
    """peft reads transformers' deprecated is_gradient_checkpointing when it wraps a model, which
    printed a FutureWarning into train-local's and the demo's output; fresh adapters, a checkpoint's
    and the engine's loaded adapter each load without one."""
    import warnings

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from slime_harbor.policy.embedded_engine import SamplingEngine

    out, _ = trained_run
    cfg = run_config(tiny_model_dir, out)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Policy.load(cfg, str(tiny_model_dir), "cpu")
        Policy.load(cfg, str(tiny_model_dir), "cpu", checkpoint=out / "checkpoint_2")
        base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        with SamplingEngine(base, AutoTokenizer.from_pretrained(tiny_model_dir)) as engine:
            engine.load_lora_adapter("step_2", str(out / "checkpoint_2"))
    assert [str(w.message) for w in caught if issubclass(w.category, (FutureWarning, DeprecationWarning))] == []


@pytest.mark.slow
def test_run_writes_metrics_checkpoints_and_final(trained_run):
    out, summary = trained_run
    metrics = json.loads((out / "metrics.json").read_text())
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert m["skipped"] is None, m["skipped"]
        assert m["n_samples"] == 4 and m["aborted"] == 0 and m["n_trained_samples"] == 4
        assert m["n_tokens"] > 0 and len(m["updates"]) == 2
        assert m["reward_mean"] is not None and m["reward_std"] > 0  # the group had a signal
        for key in ("loss", "pg_loss", "kl", "clipfrac", "ppo_kl", "abs_ppo_kl", "ratio_mean"):
            assert key in m
        assert set(m["timings"]) == {"rollout_s", "train_s", "learner_wait_s"}
        assert (out / "rollouts" / f"step_{m['step']}" / "samples.jsonl").is_file()
    # The engine was handed the updated module after step 1 (version 0 = as loaded), and every
    # sample says so per model call (SLiME's Sample.weight_versions: one string per call).
    assert [m["sampled_weight_versions"] for m in metrics] == [{"0": 4}, {"1": 4}]
    for step, version in ((1, "0"), (2, "1")):
        for s in read_jsonl(out / "rollouts" / f"step_{step}" / "samples.jsonl"):
            assert s.weight_versions == [version] * len(s.metadata["turn_indices"]), s.weight_versions
    for n in (1, 2):
        ckpt = out / f"checkpoint_{n}"
        assert (ckpt / "adapter_model.safetensors").is_file() and (ckpt / OPTIMIZER_STATE).is_file()
    assert find_checkpoint(out) == out / "checkpoint_2"
    assert summary["last_step"] == 2 and summary["skipped_steps"] == []
    assert json.loads((out / "summary.json").read_text()) == summary
    # the run's chat format, chosen from the checkpoint, named in its config and summary
    assert summary["renderer"] == json.loads((out / "config.json").read_text())["renderer"] == "qwen3"
    assert json.loads((ckpt / "slime_harbor.json").read_text())["renderer"] == "qwen3"  # kept with the checkpoint

    from transformers import AutoModelForCausalLM

    final = AutoModelForCausalLM.from_pretrained(out / "final")  # peft adapter dir, base found by path
    samples = read_jsonl(out / "rollouts" / "step_2" / "samples.jsonl")
    assert rollout_logprob_gap(final.eval(), samples) > 1e-3  # final moved on from step 2's sampler


@pytest.mark.slow
def test_ppo_ratio_is_real_and_rollouts_sample_the_current_policy(trained_run, tiny_model_dir):
    out, _ = trained_run
    metrics = json.loads((out / "metrics.json").read_text())
    for m in metrics:
        first, second = m["updates"]
        # The first minibatch is trained by the weights that sampled it: ratio 1 up to float noise.
        assert first["abs_ppo_kl"] < 1e-4 and abs(first["ratio_mean"] - 1) < 1e-4
        # The second comes after an optimizer step (lr 1e-2): old logprobs are the rollout's, not a
        # detached copy of the current ones, so the ratio has moved.
        assert second["abs_ppo_kl"] > 1e-3
    # After step 1 the policy differs from the base: KL to the reference is not 0 at step 2's start.
    assert metrics[1]["updates"][0]["kl"] > 1e-4

    # Step 2's rollout was sampled by the weights of checkpoint_1 (the engine served the updated
    # module), not by the base model.
    samples = read_jsonl(out / "rollouts" / "step_2" / "samples.jsonl")
    cfg = run_config(tiny_model_dir, out)
    after_step_1 = Policy.load(cfg, str(tiny_model_dir), "cpu", checkpoint=out / "checkpoint_1")
    assert rollout_logprob_gap(after_step_1.model, samples) < 1e-3
    assert rollout_logprob_gap(base_model(tiny_model_dir), samples) > 1e-2


@pytest.mark.slow
def test_lora_keeps_base_weights_and_reference_is_the_base(trained_run, tiny_model_dir):
    out, _ = trained_run
    cfg = run_config(tiny_model_dir, out)
    policy = Policy.load(cfg, str(tiny_model_dir), "cpu", checkpoint=out / "checkpoint_2")
    base = base_model(tiny_model_dir)
    trained = policy.model.get_base_model().state_dict()
    lora_b = [v for k, v in trained.items() if "lora_B" in k]
    assert lora_b and any(v.abs().max() > 0 for v in lora_b)  # the adapters were trained
    for name, value in base.state_dict().items():
        key = name if name in trained else name.replace(".weight", ".base_layer.weight")
        assert torch.equal(trained[key], value), name

    samples = read_jsonl(out / "rollouts" / "step_2" / "samples.jsonl")
    batch = make_batch(samples, [0.0] * len(samples))
    with torch.no_grad():
        expected = token_logprobs(base, batch, 1.0)
        current = token_logprobs(policy.model, batch, 1.0)
    reference = policy.reference_logprobs(batch, 1.0)
    mask = batch.loss_mask.bool()
    assert torch.allclose(reference[mask], expected[mask], atol=1e-5)
    assert (current[mask] - expected[mask]).abs().max() > 1e-3  # and the adapters are back on after


@pytest.mark.slow
def test_resume_continues_the_step_counter_with_the_optimizer_state(trained_run, tiny_model_dir, tmp_path):
    out, _ = trained_run
    cfg = run_config(tiny_model_dir, out)
    saved = torch.load(out / "checkpoint_1" / OPTIMIZER_STATE, weights_only=True)
    restored = Policy.load(cfg, str(tiny_model_dir), "cpu", checkpoint=out / "checkpoint_1").optimizer.state_dict()
    assert saved["state"].keys() == restored["state"].keys() and saved["state"]
    for k, state in saved["state"].items():
        assert torch.equal(state["exp_avg"], restored["state"][k]["exp_avg"])
        assert torch.equal(state["step"], restored["state"][k]["step"])

    new_lr = run_config(tiny_model_dir, out, lr=5e-3)
    groups = Policy.load(new_lr, str(tiny_model_dir), "cpu", checkpoint=out / "checkpoint_1").optimizer.param_groups
    assert all(g["lr"] == 5e-3 for g in groups)  # the state carries on; the flags given now set the rate

    resumed = tmp_path / "resumed"
    summary = train(run_config(tiny_model_dir, resumed, resume=out / "checkpoint_1"))
    metrics = json.loads((resumed / "metrics.json").read_text())
    original = json.loads((out / "metrics.json").read_text())
    assert [m["step"] for m in metrics] == [1, 2] and metrics[0] == original[0]
    assert not (resumed / "rollouts" / "step_1").exists()  # step 1 was not run again
    assert summary["last_step"] == 2 and (resumed / "checkpoint_2" / OPTIMIZER_STATE).is_file()
    # 2 optimizer steps per rollout: AdamW's step count is 4 only if step 1's state was restored.
    state = torch.load(resumed / "checkpoint_2" / OPTIMIZER_STATE, weights_only=True)["state"]
    assert all(int(s["step"]) == 4 for s in state.values())


def sample(tokenizer, model, prompt: str, response: str, reward, group=0, index=0, removed=False):
    """A sample whose rollout logprobs are the model's own (as the engine would report)."""
    p = tokenizer.encode(prompt, add_special_tokens=False)
    r = tokenizer.encode(response, add_special_tokens=False)
    s = TrainingSample(tokens=p + r, response_length=len(r), loss_mask=[1] * len(r), rollout_log_probs=[0.0] * len(r),
                       reward=reward, status=SampleStatus.COMPLETED, group_index=group, index=index, rollout_id=index,
                       remove_sample=removed)
    with torch.no_grad():
        s.rollout_log_probs = token_logprobs(model, make_batch([s], [0.0]), 1.0)[0].tolist()
    return s


def fresh_policy(tiny_model_dir, **overrides) -> Policy:
    torch.manual_seed(0)
    cfg = LocalTrainConfig(model=str(tiny_model_dir), lr=1e-2, device="cpu", **overrides)
    return Policy.load(cfg, str(tiny_model_dir), "cpu")


def trainable_state(policy: Policy) -> list[torch.Tensor]:
    return [p.detach().clone() for p in policy.params]


def test_removed_samples_are_not_trained(tiny_model_dir):
    runs = []
    for with_removed in (False, True):
        policy = fresh_policy(tiny_model_dir)
        tok, model = policy.tokenizer, policy.model
        samples = [
            sample(tok, model, "say hi", "hello there", 1.0, index=0),
            sample(tok, model, "say hi", "ls -la", 0.0, index=1),
        ]
        if with_removed:
            bad = sample(tok, model, "say hi", "echo aborted", 1.0, index=2, removed=True)
            bad.tokens = [10**9] * len(bad.tokens)  # would crash the embedding if it were ever trained on
            bad.status = SampleStatus.ABORTED
            samples.insert(1, bad)
        result = train_on_samples(policy, samples, policy.cfg, "cpu")
        runs.append((result, trainable_state(policy)))
    (clean, clean_weights), (mixed, mixed_weights) = runs
    assert mixed["aborted"] == 1 and clean["aborted"] == 0
    assert mixed["n_trained_samples"] == clean["n_trained_samples"] == 2
    assert mixed["n_tokens"] == clean["n_tokens"]
    assert all(torch.equal(a, b) for a, b in zip(clean_weights, mixed_weights))
    assert any(not torch.equal(a, b) for a, b in zip(clean_weights, trainable_state(fresh_policy(tiny_model_dir))))


def test_a_step_counts_screened_failed_and_aborted_episodes_each_under_its_own_name(tiny_model_dir, tmp_path, capsys):
    """One step's episodes, built by the real converter: a screened one (the hack monitor's own
    --hack-action screen), a failed one (its verifier wrote no reward: permanent), an aborted one
    (its sandbox never started) and scored ones. metrics.json's record, the step line and both
    summary.json files (train-local's, rollout's) count the screened episode under filters hack,
    the failed one as failed, not aborted, and the aborted one as aborted."""
    import dataclasses

    from helpers.trial_results import converted_episode
    from slime_harbor.grading.grade import GradingReport
    from slime_harbor.grading.hack_monitor import HackFlag
    from slime_harbor.rollout import summarize
    from slime_harbor.trainers.training_run import TrainingRun, run_summary, step_record, step_sampling
    from slime_harbor.run_config import RolloutConfig

    kinds = ["solved", "failed", "solved", "broken_verifier", "environment_start_failed", "failed"]
    screen = dict(grading=GradingReport(flags=(HackFlag("always_equal", "slug.py:5 __eq__ ignores other"),)),
                  hack_action="screen")  # the third episode's grading flagged it, and the run screens
    episodes = [converted_episode(kind, group_index=i // 3, index=i, **(screen if i == 2 else {}))
                for i, kind in enumerate(kinds)]
    assert [e.status for e in episodes[3:5]] == [SampleStatus.FAILED, SampleStatus.ABORTED]
    policy = fresh_policy(tiny_model_dir)
    sampling = step_sampling(episodes, errors=sum(e.error is not None for e in episodes), n_groups=2,
                             dynamic_sampling=False)
    samples = [s for e in episodes for s in e.samples]
    update = train_on_samples(policy, samples, policy.cfg, "cpu")
    run = TrainingRun(dataclasses.replace(policy.cfg, num_rollouts=5, save_every=0), tmp_path, learner=None,
                      base_model="tiny", start=0, metrics=[])
    run.finish_step(step_record(1, episodes, update, sampling, {}, {}, {"rollout_s": 1.0, "train_s": 1.0}))
    (m,) = json.loads((tmp_path / "metrics.json").read_text())
    assert m["filters"] == {"timeout": 0, "step_limit": 0, "length_limit": 0, "zero_std": 0, "stale": 0, "hack": 1}
    assert (m["n_samples"], m["aborted"], m["failed"], m["errors"], m["n_trained_samples"]) == (6, 1, 1, 2, 3)
    assert "aborted 1/6 failed 1 masked hack 1 |" in capsys.readouterr().err
    summary = run_summary(run.metrics, run.cfg, "tiny", tmp_path, None, 1.0)
    assert (summary["aborted_samples"], summary["failed_samples"], summary["masked_episodes"]["hack"]) == (1, 1, 1)
    rollout = summarize(episodes, RolloutConfig(agent="oracle"), 1.0)
    assert rollout["masked_episodes"]["hack"] == 1 and sum(rollout["masked_episodes"].values()) == 1


@pytest.mark.parametrize("rewards, removed, reason", [
    ([0.0, 0.0], [False, False], "every advantage is 0"),
    ([1.0, 0.0], [True, True], "no trainable sample"),
])
def test_no_signal_skips_the_step_cleanly(tiny_model_dir, rewards, removed, reason):
    policy = fresh_policy(tiny_model_dir)
    before = trainable_state(policy)
    samples = [sample(policy.tokenizer, policy.model, "q", text, r, index=i, removed=x)
               for i, (text, r, x) in enumerate(zip(["a b", "c d"], rewards, removed))]
    result = train_on_samples(policy, samples, policy.cfg, "cpu")
    assert result["skipped"].startswith(reason) and result["updates"] == [] and result["n_tokens"] == 0
    assert all(torch.equal(a, b) for a, b in zip(before, trainable_state(policy)))
    assert policy.optimizer.state_dict()["state"] == {}


def test_rft_trains_only_the_successful_episodes_tokens(tiny_model_dir):
    """objective rft: the successful episode's NLL is the whole loss (a failed one, in the same
    group, changes nothing: the weights equal a step on the success alone), GRPO's advantages
    are not used, and a step with no success is skipped."""
    runs = []
    for with_failure in (False, True):
        policy = fresh_policy(tiny_model_dir, objective="rft", kl_coef=0.0)
        tok, model = policy.tokenizer, policy.model
        samples = [sample(tok, model, "say hi", "hello there", 1.0, index=0)]
        if with_failure:
            samples.append(sample(tok, model, "say hi", "ls -la", 0.0, index=1))
        with torch.no_grad():
            nll = -token_logprobs(model, make_batch(samples[:1], [0.0]), 1.0)[0].mean().item()
        result = train_on_samples(policy, samples, policy.cfg, "cpu")
        runs.append((result, trainable_state(policy), nll))
    (alone, alone_weights, nll), (mixed, mixed_weights, _) = runs
    assert alone["n_trained_samples"] == mixed["n_trained_samples"] == 1
    assert mixed["nll"] == pytest.approx(nll, rel=1e-5) and "pg_loss" not in mixed
    assert all(torch.equal(a, b) for a, b in zip(alone_weights, mixed_weights))
    assert any(not torch.equal(a, b) for a, b in zip(alone_weights, trainable_state(fresh_policy(tiny_model_dir))))
    policy = fresh_policy(tiny_model_dir, objective="rft")
    failed = [sample(policy.tokenizer, policy.model, "q", "a b", 0.0, index=0)]
    assert train_on_samples(policy, failed, policy.cfg, "cpu")["skipped"] == "no successful episode to fine-tune on"


def test_full_model_training_keeps_a_frozen_reference(tiny_model_dir, tmp_path):
    policy = fresh_policy(tiny_model_dir, lora=False)
    base = base_model(tiny_model_dir)
    samples = [sample(policy.tokenizer, policy.model, "q", "hello", 1.0, index=0),
               sample(policy.tokenizer, policy.model, "q", "ls", 0.0, index=1)]
    train_on_samples(policy, samples, policy.cfg, "cpu")
    assert len(policy.params) == len(list(base.parameters()))  # every weight is trained
    ref = policy.reference.state_dict()
    assert all(torch.equal(ref[k], v) for k, v in base.state_dict().items())
    assert any(not torch.equal(p, base.state_dict()[k]) for k, p in policy.model.state_dict().items())

    from slime_harbor.trainers.learner import save_checkpoint

    save_checkpoint(policy, tmp_path / "checkpoint_1", 1, [])
    again = Policy.load(policy.cfg, str(tiny_model_dir), "cpu", checkpoint=tmp_path / "checkpoint_1")
    loaded = again.model.state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in policy.model.state_dict().items())
    assert all(torch.equal(again.reference.state_dict()[k], v) for k, v in base.state_dict().items())


def test_lora_targets_the_model_lacks_are_one_line(tiny_model_dir):
    """A model without the named linear layers (a Mamba- or linear-attention-only one, or a typo)
    stops before any trial in one line that names the setting and the way out; hybrids, whose
    attention layers have them, train (test_model_formats)."""
    from slime_harbor.exits import ConfigError

    cfg = LocalTrainConfig(model=str(tiny_model_dir), device="cpu", lora_target_modules=["in_proj", "out_proj"])
    with pytest.raises(ConfigError) as error:
        Policy.load(cfg, str(tiny_model_dir), "cpu")
    line = str(error.value)
    assert "\n" not in line and "--lora-target-modules in_proj out_proj" in line and "qwen3" in line and "--no-lora" in line


def test_flags_test_preset_and_overrides():
    cfg = config_from_args(["--test", "--n-samples", "2", "--no-lora", "--task-names", "dedupe-lines"])
    assert cfg.num_rollouts == 2 and cfg.save_every == 1 and cfg.max_new_tokens == 48  # from the preset
    assert cfg.n_samples == 2 and cfg.lora is False and cfg.task_names == ["dedupe-lines"]  # given
    assert cfg.lr == 1e-6 and cfg.kl_coef == 0.001 and cfg.eps_clip_high == 0.28  # defaults
    plain = config_from_args([])
    assert plain == LocalTrainConfig()
    assert config_from_args(["--resume", "runs/x"]).resume == Path("runs/x")


@pytest.mark.slow
def test_integration_script():
    """scripts/test_integration.sh: the whole local run on the shipped entry points."""
    env = {**os.environ, "PYTHON": str(REPO / ".venv" / "bin" / "python")}
    proc = subprocess.run(["bash", str(REPO / "scripts" / "test_integration.sh")], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "integration OK" in proc.stdout


@pytest.mark.slow
def test_a_gateway_agent_trains_locally(tiny_model_dir, tmp_path):
    """train-local with a `module:Class` agent (tests/chat_tools_agent.py): its episodes go through
    the gateway in front of the trainer's embedded server; the gateway writes the ATIF trajectory
    the agent does not write when the agent ends, before the verifier reads it (vowel-share scores
    the agent's text from it), so the group has a signal and the step trains."""
    out = tmp_path / "run"
    train(run_config(tiny_model_dir, out, agent="chat_tools_agent:ChatToolsAgent", num_rollouts=1,
                     updates_per_rollout=1))
    (m,) = json.loads((out / "metrics.json").read_text())
    assert m["skipped"] is None and m["aborted"] == 0 and m["n_trained_samples"] == 4, m
    samples = read_jsonl(out / "rollouts" / "step_1" / "samples.jsonl")
    assert len({s.metadata["raw_rewards"]["reward"] for s in samples}) > 1
    for s in samples:
        trial = Path(s.metadata["trial_dir"])
        assert (trial / "agent" / "trajectory.json").is_file() and (trial / "agent" / "gateway" / "calls.jsonl").is_file()
    assert rollout_logprob_gap(base_model(tiny_model_dir), samples) < 1e-4  # step 1 samples the base policy


def test_use_tis_takes_the_learners_recomputation_as_old_and_weights_by_the_sampler_gap(tiny_model_dir):
    """--use-tis: the samples' rollout logprobs are off by a known amount (a sampler that is not the
    learner). The PPO ratio is then 1 on the first update (old = the learner's recomputation, not
    the sampler's), and tis = exp(old - rollout) shows the gap; without it the ratio carries the gap
    and there is no tis metric."""
    results = {}
    for use_tis in (False, True):
        policy = fresh_policy(tiny_model_dir, use_tis=use_tis, kl_coef=0.0)
        samples = [sample(policy.tokenizer, policy.model, "say hi", text, r, index=i)
                   for i, (text, r) in enumerate([("hello there", 1.0), ("ls -la", 0.0)])]
        for s in samples:
            s.rollout_log_probs = [lp - 0.3 for lp in s.rollout_log_probs]  # the sampler found each token less likely
        results[use_tis] = train_on_samples(policy, samples, policy.cfg, "cpu")
    plain, tis = results[False], results[True]
    assert plain["ratio_mean"] == pytest.approx(math.exp(0.3), rel=1e-3) and "tis" not in plain
    assert tis["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert tis["tis"] == pytest.approx(math.exp(0.3), rel=1e-3) and tis["tis_clipfrac"] == 0.0
    assert tis["abs_ppo_kl"] == pytest.approx(0.3, rel=1e-3)  # still measured against the sampler


@pytest.mark.slow
def test_mask_step_limit_masks_episodes_the_gateway_ended_at_the_step_limit(tiny_model_dir, tmp_path):
    """A user's `module:Class` agent that declares GATEWAY_STEP_LIMIT (no limit or exit status of
    its own): --step-limit reaches it through the gateway, which refuses the call after the limit;
    the episode's exit_status is the gateway's step_limit, so --mask-step-limit masks it and
    metrics.json's filters count it."""
    out = tmp_path / "run"
    train(run_config(tiny_model_dir, out, agent="chat_tools_agent:GatewayLimitedAgent", num_rollouts=1,
                     updates_per_rollout=1, step_limit=2, n_samples=2, mask_step_limit=True))
    (m,) = json.loads((out / "metrics.json").read_text())
    samples = read_jsonl(out / "rollouts" / "step_1" / "samples.jsonl")
    assert samples and all(s.metadata["gateway"]["delivered"] == 2 for s in samples)  # limited to 2 calls
    assert all(s.status == SampleStatus.TRUNCATED and s.metadata["exit_status"] == "step_limit" for s in samples)
    assert all(s.remove_sample and s.metadata["masked_by"] == "step_limit" for s in samples)
    assert m["filters"]["step_limit"] == len({s.index for s in samples}) > 0, m


def test_train_locals_own_server_takes_no_weight_update_over_http(tiny_model_dir, tmp_path):
    """Its engine is updated in this process, so its update routes take a key no one holds: a sandbox
    or a node that reaches its port cannot swap the weights rollouts sample."""
    import httpx

    from slime_harbor.policy.server import UPDATE_ROUTES
    from slime_harbor.trainers.learner import Learner
    from slime_harbor.trainers.local_config import LocalTrainConfig

    cfg = LocalTrainConfig(model=str(tiny_model_dir), output_dir=tmp_path / "out", weight_check="off")
    learner = Learner(cfg, str(tiny_model_dir), "cpu", None, tmp_path / "out", 0)
    try:
        for path in UPDATE_ROUTES:
            assert httpx.post(learner.url + path, json={}).status_code == 401, path
        assert httpx.post(learner.url + "/update_weights_from_disk", json={"model_path": str(tiny_model_dir)},
                          headers={"Authorization": "Bearer guess"}).status_code == 403
    finally:
        learner.close()
