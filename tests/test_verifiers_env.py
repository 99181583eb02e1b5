"""The verifiers plugin (what prime-rl loads): verifiers' own eval entry point (`vf-eval`) runs it
against the embedded server, in real Harbor trials on bundled tasks, and the tokens its traces
carry pass the same invariants and logprob check as our own samples."""

from __future__ import annotations

from pathlib import Path

import pytest

vf = pytest.importorskip("verifiers.v1")

from slime_harbor.samples import SampleStatus, TrainingSample  # noqa: E402
from helpers.rollout import EASY_TASKS  # noqa: E402
from helpers.samples import check_sample_against_model  # noqa: E402
from helpers.verifiers import branch_sample, PLUGIN, run_vf_eval  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def test_plugin_loads_by_id_with_its_config_fields():
    from verifiers.v1.utils.loaders import load_environment, resolve_env_config

    cfg = resolve_env_config({"taskset": {"id": PLUGIN, "tasks_dir": str(REPO / "examples/harbor/tasks"),
                                          "environment_type": "docker", "agent": "terminus-2", "max_turns": 7,
                                          "n_parallel_envs": 3}})
    env = load_environment(cfg)
    ts = env.taskset.config
    assert (ts.environment_type, ts.agent, ts.max_turns, ts.n_parallel_envs) == ("docker", "terminus-2", 7, 3)
    names = [t.data.name for t in env.taskset]
    assert "dedupe-lines" in names and all(Path(t.data.task_dir).is_dir() for t in env.taskset)


def test_openai_token_in_path_of_the_client(policy_server, tokenizer, model):
    """PolicyClient(api="openai"): token ids to /v1/completions, token ids + logprobs back."""
    import asyncio

    import torch

    from slime_harbor.policy.client import PolicyClient
    from slime_harbor.policy.sampling import SamplingParams

    prompt = tokenizer.encode("hello there", add_special_tokens=False)

    async def go():
        client = PolicyClient(policy_server + "/v1", api="openai", model="policy")
        try:
            return await client.generate(prompt, SamplingParams(max_new_tokens=6, temperature=1.0))
        finally:
            await client.aclose()

    gen = asyncio.run(go())
    assert len(gen.token_ids) == len(gen.logprobs) > 0 and gen.finish_reason in ("stop", "length")
    with torch.no_grad():
        logits = model(torch.tensor([prompt + gen.token_ids])).logits[0, len(prompt) - 1:-1]
    want = torch.log_softmax(logits, -1).gather(-1, torch.tensor(gen.token_ids)[:, None])[:, 0]
    assert (want - torch.tensor(gen.logprobs)).abs().max().item() < 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("agent", ["native", "terminus-2"])
def test_vf_eval_runs_real_trials_with_exact_tokens(agent, responsive_server, responsive_model_dir, hf_model, tmp_path):
    """Against the tiny model after a few SFT steps (test_rollout_e2e's), so both agents' turns
    parse and their commands run. The served model is named "policy" (Harbor's hosted_vllm
    names allow no '/'); the tokenizer comes from the plugin's own field."""
    episodes = run_vf_eval(responsive_server + "/v1", responsive_model_dir, agent, tmp_path, rollouts=2,
                           max_new_tokens=96)
    assert len(episodes) == 4 and {e.task.data.name for e in episodes} == set(EASY_TASKS)
    diffs = []
    for episode in episodes:
        [trace] = episode.traces
        assert trace.ok and not trace.errors, trace.errors
        assert 0.0 <= trace.reward <= 1.0 and "reward" in trace.rewards  # the Harbor verifier's
        assert Path(trace.info["trial_dir"], "verifier").is_dir()  # a real Harbor trial ran
        if agent == "native":  # token in / token out: every turn lands in the one branch
            assert trace.num_turns == trace.info["turns"] >= 1 and len(trace.branches) == 1
        for branch in trace.branches:
            diffs.append(check_sample_against_model(branch_sample(branch), hf_model, 1.0))
    assert diffs and max(diffs) < 1e-4
