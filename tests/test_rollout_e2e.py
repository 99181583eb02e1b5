"""End to end: real Harbor Trials, real bubblewrap sandbox, real tiny model behind the embedded
SGLang-compatible server, our native agent and Harbor's terminus-2, samples checked token by token."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import pytest
import torch
from harbor.models.trajectories import Trajectory

from slime_harbor.rollout import run_episode, run_rollout_episodes, run_rollouts
from slime_harbor.run_config import DEFAULT_TASKS
from slime_harbor.samples import SampleStatus, read_jsonl
from helpers.rollout import config, EASY_TASKS, leftovers, trial_names
from helpers.samples import check_sample_against_model, masked_spans


def test_native_agent_samples_are_token_exact(tmp_path, responsive_server, responsive_model_dir, hf_model, tokenizer):
    cfg = config(tmp_path, responsive_server, responsive_model_dir, task_names=EASY_TASKS, n_samples=2)
    rollouts = asyncio.run(run_rollout_episodes(cfg))
    summary, samples = rollouts.summary, read_jsonl(cfg.out_dir / "samples.jsonl")
    assert summary["n_trials"] == 4 and len({s.rollout_id for s in samples}) == 4
    # The episodes it returns are those samples.jsonl holds (an evaluation reads them, not the file).
    assert json.loads((cfg.out_dir / "summary.json").read_text())["n_trials"] == 4
    assert sorted(s.to_json() for e in rollouts.episodes for s in e.samples) == sorted(s.to_json() for s in samples)
    assert summary["status_counts"]["aborted"] == 0 and summary["status_counts"]["failed"] == 0, summary["errors"]
    assert summary["drift_count"] == 0 and summary["split_episodes"] == 0  # token in, token out: no retokenization
    diffs = []
    for s in samples:
        assert s.status in (SampleStatus.COMPLETED, SampleStatus.TRUNCATED)
        assert s.reward is not None and not s.remove_sample
        assert s.metadata["task_name"] in EASY_TASKS and Path(s.metadata["trial_dir"]).is_dir()
        assert s.group_index == EASY_TASKS.index(s.metadata["task_name"])
        diffs.append(check_sample_against_model(s, hf_model, cfg.sampling.temperature))
        # Every masked span is chat-template tokens wrapped around exactly the observation the
        # agent recorded in its ATIF trajectory.
        trajectory = json.loads((Path(s.metadata["trial_dir"]) / "agent" / "trajectory.json").read_text())
        Trajectory.model_validate(trajectory)  # Harbor's own ATIF model accepts it
        observations = [st["observation"]["results"][0]["content"] for st in trajectory["steps"] if st.get("observation")]
        spans = [tokenizer.decode(span) for span in masked_spans(s)]
        # The last turn's observation has no next turn, so it is in no prompt and no sample.
        assert len(spans) == s.metadata["turns"] - 1 and len(observations) >= len(spans)
        for text, obs in zip(spans, observations):
            assert text.removeprefix("<|im_end|>") == f"\n<|im_start|>user\n{obs}<|im_end|>\n<|im_start|>assistant\n"
    assert sum(diffs) / len(diffs) < 1e-4, diffs
    # The SFT'd policy mostly answers `ls`: real commands ran in the sandbox and came back.
    assert any("<returncode>0</returncode>" in tokenizer.decode(s.response_ids) for s in samples)
    assert (cfg.out_dir / "summary.json").is_file() and len(trial_names(cfg.out_dir)) == 4


def test_terminus2_samples_hold_invariants(tmp_path, responsive_server, responsive_model_dir, hf_model):
    cfg = config(tmp_path, responsive_server, responsive_model_dir, agent="terminus-2", n_samples=1, step_limit=2,
                 max_new_tokens=96)
    summary = asyncio.run(run_rollouts(cfg))
    samples = read_jsonl(cfg.out_dir / "samples.jsonl")
    assert summary["status_counts"]["aborted"] == 0, summary["errors"]
    trained = [s for s in samples if not s.remove_sample]
    assert trained, f"terminus-2 produced no trainable sample: {summary['errors']}"
    for s in trained:
        assert check_sample_against_model(s, hf_model, cfg.sampling.temperature) < 1e-4
    # Every turn's tokens land in exactly one sample: the drift count explains any split.
    assert len(trained) == 1 + trained[0].metadata["drift_count"]


def test_eight_concurrent_trials_complete(tmp_path, policy_server, tiny_model_dir):
    """Eight trials at concurrency 8 all complete, and they ran at once: Harbor's own timings of
    the trials overlap (one by one, no two would)."""
    from datetime import datetime

    cfg = config(tmp_path, policy_server, tiny_model_dir, n_samples=8, concurrency=8, step_limit=2)
    summary = asyncio.run(run_rollouts(cfg))
    assert summary["n_trials"] == 8
    assert summary["status_counts"]["completed"] + summary["status_counts"]["truncated"] == 8, summary["errors"]
    spans = []
    for path in (cfg.out_dir / "trials").glob("*/result.json"):
        result = json.loads(path.read_text())
        spans.append((datetime.fromisoformat(result["started_at"]), datetime.fromisoformat(result["finished_at"])))
    assert len(spans) == 8
    most_at_once = max(sum(start <= t < end for start, end in spans) for t, _ in spans)
    assert most_at_once >= 4, spans


def test_dead_policy_server_is_not_penalised(tmp_path, tiny_model_dir):
    """A transient failure is never scored; with no reruns allowed it is FAILED at once."""
    cfg = config(tmp_path, "http://127.0.0.1:9", tiny_model_dir, n_samples=1, max_retries_per_task=0)
    summary = asyncio.run(run_rollouts(cfg))
    (s,) = read_jsonl(cfg.out_dir / "samples.jsonl")
    assert s.status == SampleStatus.FAILED and s.remove_sample and s.reward is None
    assert "unreachable" in s.metadata["status_reason"] and "retry budget of 0" in s.metadata["status_reason"]
    assert summary["status_counts"]["failed"] == 1 and summary["mean_reward"] is None and summary["retries"] == 0


def test_an_aborted_episode_runs_again_within_its_tasks_retry_budget(tmp_path, tiny_model_dir):
    """The rollout reruns a transient failure as the SLiME hook does: a dead policy server aborts
    the episode, it runs again while the task's budget lasts, then it is FAILED (never scored)."""
    cfg = config(tmp_path, "http://127.0.0.1:9", tiny_model_dir, n_samples=1, max_retries_per_task=1,
                 retry_backoff_sec=0.0)
    summary = asyncio.run(run_rollouts(cfg))
    (s,) = read_jsonl(cfg.out_dir / "samples.jsonl")
    assert s.status == SampleStatus.FAILED and s.remove_sample and s.reward is None
    assert "retry budget of 1" in s.metadata["status_reason"] and "unreachable" in s.metadata["status_reason"]
    assert s.metadata["retries"] == 1 and s.metadata["retry_budget_spent"]
    assert len(trial_names(cfg.out_dir)) == 2  # the first run and one rerun
    assert summary["retries"] == 1 and summary["status_counts"]["failed"] == 1 and summary["n_trials"] == 1


def test_cancelled_rollout_leaves_nothing_and_keeps_finished_samples(tmp_path, policy_server, tiny_model_dir):
    cfg = config(tmp_path, policy_server, tiny_model_dir, agent="oracle", task_names=EASY_TASKS, n_samples=3,
                 concurrency=2)

    async def run_then_cancel():
        task = asyncio.create_task(run_rollouts(cfg))
        sink = cfg.out_dir / "samples.jsonl"
        # Let some trials finish and others be mid-flight, then cancel (what Ctrl-C does).
        for _ in range(600):
            await asyncio.sleep(0.1)
            if sink.exists() and sink.read_text().count("\n") >= 2:
                break
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run_then_cancel())
    finished = read_jsonl(cfg.out_dir / "samples.jsonl")
    assert 2 <= len(finished) < 6
    assert all(s.reward == 1.0 for s in finished)  # what finished is kept intact
    summary = json.loads((cfg.out_dir / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["n_trials"] == len(finished)
    assert len(trial_names(cfg.out_dir)) > len(finished)  # some trials were cut off mid-flight
    assert leftovers(cfg.out_dir) == ([], [])


def test_timed_out_trial_leaves_no_process_or_sandbox(tmp_path, policy_server, tiny_model_dir):
    # A task whose agent budget is far too small for the agent: Harbor's timeout fires mid-episode.
    task = tmp_path / "tasks" / "slow"
    src = DEFAULT_TASKS / EASY_TASKS[0]
    task.parent.mkdir()
    subprocess.run(["cp", "-r", str(src), str(task)], check=True)
    toml = (task / "task.toml").read_text()
    import re

    toml = re.sub(r"(\[agent\][^\[]*?timeout_sec\s*=\s*)[0-9.]+", r"\g<1>1.0", toml, flags=re.S)
    (task / "task.toml").write_text(toml)
    (task / "solution" / "solve.sh").write_text("#!/bin/bash\nsleep 300\n")
    cfg = config(tmp_path, policy_server, tiny_model_dir, agent="oracle", tasks_dir=task.parent, task_names=None,
                 n_samples=1)
    summary = asyncio.run(run_rollouts(cfg))
    (s,) = read_jsonl(cfg.out_dir / "samples.jsonl")
    assert s.metadata["exception_type"] == "AgentTimeoutError"
    assert s.status == SampleStatus.TRUNCATED and s.reward == 0.0
    assert summary["n_trials"] == 1
    assert leftovers(cfg.out_dir) == ([], [])


def test_server_abort_mid_generation_ends_the_episode_aborted_and_untrained(tmp_path, policy_server, tiny_model_dir):
    """SLiME ends a rollout round with POST /abort_request {"abort_all": true} while requests run:
    the agent must stop on the aborted turn, and the episode must come back aborted and removed
    (never scored), with its sandbox gone."""
    import httpx

    cfg = config(tmp_path, policy_server, tiny_model_dir, step_limit=30, max_new_tokens=4000)

    async def run_and_abort():
        episode = asyncio.create_task(run_episode(DEFAULT_TASKS / EASY_TASKS[0], cfg, group_index=0, index=0,
                                                  trials_dir=cfg.out_dir / "trials"))
        async with httpx.AsyncClient() as client:
            while not episode.done():  # wait for a generation in flight, then abort everything
                if (await client.get(policy_server + "/v1/loads")).json()["num_running_reqs"] > 0:
                    aborted = (await client.post(policy_server + "/abort_request", json={"abort_all": True})).json()
                    if aborted["aborted"]:
                        break
                await asyncio.sleep(0.05)
        return await episode

    episode = asyncio.run(run_and_abort())
    assert episode.status == SampleStatus.ABORTED and episode.reward is None
    assert all(s.remove_sample and s.reward is None for s in episode.samples)
    assert "abort" in episode.error
    assert leftovers(cfg.out_dir) == ([], [])


def test_native_agent_top_p_replay_is_well_formed_and_slime_accepts_it(
    tmp_path, responsive_server, responsive_model_dir, hf_model, tokenizer
):
    """top_p < 1 with return_top_p_token_ids, real trials: every sample carries top-p data over its
    whole response (kept sets for sampled tokens, empty for observations), each sampled token's
    logprob is renormalised over its kept set, and SLiME's Sample takes the layout."""
    cfg = config(tmp_path, responsive_server, responsive_model_dir, top_p=0.7, return_top_p_token_ids=True,
                 routing_key="episode-key")
    summary = asyncio.run(run_rollouts(cfg))
    samples = read_jsonl(cfg.out_dir / "samples.jsonl")
    assert summary["status_counts"]["aborted"] == 0 and summary["status_counts"]["failed"] == 0, summary["errors"]
    assert len(samples) == 2
    vocab = len(tokenizer)
    for s in samples:
        s.check()  # includes: masked tokens keep nothing, every sampled token is in its kept set
        ids, offsets = s.rollout_top_p_token_ids, s.rollout_top_p_token_offsets
        assert len(offsets) == s.response_length + 1 and offsets[-1] == len(ids)
        kept = [ids[a:b] for a, b in zip(offsets, offsets[1:])]
        assert all((len(k) > 0) == bool(m) for k, m in zip(kept, s.loss_mask))
        assert all(len(k) < vocab for k in kept)
        # Renormalised logprobs, recomputed by one forward pass under the replayed keep-mask.
        n = s.response_length
        with torch.no_grad():
            logits = hf_model(torch.tensor([s.tokens])).logits[0, -n - 1 : -1].float()
        full = torch.log_softmax(logits / cfg.sampling.temperature, dim=-1)
        sampled = [i for i, m in enumerate(s.loss_mask) if m]
        expected = torch.tensor([float(full[i, s.response_ids[i]] - full[i, kept[i]].logsumexp(-1)) for i in sampled])
        assert (expected - torch.tensor([s.rollout_log_probs[i] for i in sampled])).abs().mean() < 1e-4
        assert s.response == tokenizer.decode(s.response_ids)
    types = pytest.importorskip("slime.utils.types", reason="slime is not importable (PYTHONPATH=/work/slime)")
    for s in samples:
        out = s.to_slime(types.Sample())
        out._validate_response_metadata_lengths()  # SLiME's own check of the layout
        # What SLiME's _convert_samples_to_train_data asserts with --rollout-top-p != 1.
        assert len(out.rollout_top_p_token_offsets) == out.response_length + 1
        assert int(out.rollout_top_p_token_offsets[-1]) == len(out.rollout_top_p_token_ids)


def test_native_agent_seeded_episodes_replay_and_stop_at_the_context_window(
    tmp_path, responsive_server, responsive_model_dir, renderer
):
    from slime_harbor.agents.native import initial_prompt_ids
    from slime_harbor.policy.sampling import turn_seed

    task = DEFAULT_TASKS / EASY_TASKS[0]

    def episode(name, index, **overrides):
        cfg = config(tmp_path / name, responsive_server, responsive_model_dir, **overrides)
        return run_episode(task, cfg, group_index=0, index=index, trials_dir=cfg.out_dir / "trials")

    async def seeded():  # run together: the seeded episodes share the engine's batches
        # Temperature 1.5: the SFT'd model is near-certain of its taught reply at 1.0, so two seeds
        # would often draw the same tokens; the seed's effect is what is checked here.
        return await asyncio.gather(episode("a", 0, sampling_seed=7, temperature=1.5),
                                    episode("b", 1, sampling_seed=7, temperature=1.5),
                                    episode("c", 2, sampling_seed=8, temperature=1.5))

    a, b, c = asyncio.run(seeded())
    assert a.status == b.status and a.samples[0].tokens == b.samples[0].tokens  # an episode replays exactly
    assert a.samples[0].rollout_log_probs == pytest.approx(b.samples[0].rollout_log_probs, abs=1e-4)
    assert a.samples[0].tokens != c.samples[0].tokens
    assert len({turn_seed(7, t) for t in range(30)} | {turn_seed(8, t) for t in range(30)}) == 60

    # A context just big enough for the first prompt and 12 tokens: the episode stops there,
    # truncated but still verified.
    prompt = initial_prompt_ids(renderer, (task / "instruction.md").read_text())
    limited = asyncio.run(episode("limited", 3, max_context_len=len(prompt) + 12, step_limit=5))
    (s,) = limited.samples
    assert s.metadata["exit_status"] == "context_exceeded" and s.metadata["turns"] == 1
    assert s.status == SampleStatus.TRUNCATED and s.reward is not None and not s.remove_sample
    assert len(s.tokens) <= len(prompt) + 12


def test_native_agent_sampling_option_keeps_the_episode_defaults_it_does_not_name():
    """Harbor's --agent-kwarg 'sampling={"temperature": 0.7}' changes that field only (512 tokens a
    turn stay), and a value SamplingParams refuses is refused as the option."""
    from pydantic import ValidationError

    from slime_harbor.agents.native import NativeAgentOptions
    from slime_harbor.policy.sampling import SamplingParams

    options = NativeAgentOptions.model_validate({"sampling": {"temperature": 0.7}})
    assert options.sampling == SamplingParams(temperature=0.7) and options.sampling.max_new_tokens == 512
    assert NativeAgentOptions().sampling == SamplingParams()
    with pytest.raises(ValidationError, match="temperature must be >= 0"):
        NativeAgentOptions.model_validate({"sampling": {"temperature": -1}})


def test_the_run_settings_reach_the_native_agent_as_options_declared_once():
    """Each agent setting is RolloutConfig's field, and the native agent's option of the same name
    is that declaration: its default, its docs, its check. A config's values reach the agent
    through its AgentConfig; a value the config's check refuses is refused as an option, with the
    same message; an old launch script's lora_path still names the adapter."""
    from pydantic import ValidationError

    from slime_harbor.agents.native import NativeAgentOptions
    from slime_harbor.config_docs import field_docs
    from slime_harbor.exits import ConfigError
    from slime_harbor.agents.settings import AGENT_SETTINGS
    from slime_harbor.agents.placement import agent_config
    from slime_harbor.run_config import check_config, RolloutConfig

    docs, defaults = field_docs(RolloutConfig), RolloutConfig()
    for name in AGENT_SETTINGS:
        option = NativeAgentOptions.model_fields[name]
        assert (option.default, option.description) == (getattr(defaults, name), docs[name])
    given = dict(step_limit=7, max_context_len=900, routing_key="sess-1", policy_api="openai",
                 reissue_aborted_calls=True, keep_interrupted_calls=False, lora_name="policy-step3")
    options = NativeAgentOptions.model_validate(agent_config(RolloutConfig(**given)).kwargs)
    assert {name: getattr(options, name) for name in AGENT_SETTINGS} == given
    for bad, message in [({"step_limit": 0}, "step_limit must be at least 1, got 0"),
                         ({"policy_api": "grpc"}, "policy_api must be one of sglang, openai, got 'grpc'"),
                         ({"max_context_len": 0}, "max_context_len must be at least 1")]:
        with pytest.raises(ValidationError, match=message):
            NativeAgentOptions.model_validate(bad)
        with pytest.raises(ConfigError, match=message):
            check_config(RolloutConfig(**bad))
    assert NativeAgentOptions.model_validate({"lora_path": "policy-step3"}).lora_name == "policy-step3"
