"""verifiers' side in tests: our plugin run by its own `vf-eval`, and its trace branches as samples.
Needs verifiers.v1: a test that imports this module skips without it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.rollout import EASY_TASKS
from slime_harbor.samples import SampleStatus, TrainingSample

vf = pytest.importorskip("verifiers.v1")

REPO = Path(__file__).resolve().parent.parent.parent
PLUGIN = "slime-harbor-verifiers"


def branch_sample(branch) -> TrainingSample:
    """A trace branch as one of our samples: the response starts at the first sampled token."""
    mask = branch.sampled_mask
    start = mask.index(True)
    return TrainingSample(tokens=branch.token_ids, response_length=len(mask) - start,
                          loss_mask=[int(m) for m in mask[start:]], rollout_log_probs=branch.logprobs[start:],
                          reward=0.0, status=SampleStatus.COMPLETED)


def run_vf_eval(base_url: str, tokenizer_dir, agent: str, tmp_path: Path, rollouts: int, max_new_tokens: int) -> list:
    """verifiers' own `vf-eval` on the plugin against the OpenAI base `base_url` serving "policy",
    on EASY_TASKS (two turns each): its episodes, read back from its traces.jsonl."""
    out = tmp_path / "vf"
    cmd = [str(Path(sys.executable).parent / "vf-eval"), PLUGIN, "-m", "policy", "--env.taskset.tokenizer",
           str(tokenizer_dir), "--client.base-url", base_url, "--client.api-key-var", "SLIME_HARBOR_NO_KEY",
           "-r", str(rollouts), "--env.taskset.agent", agent, "--env.taskset.max-turns", "2",
           "--env.taskset.max-new-tokens", str(max_new_tokens), "--env.taskset.trials-dir", str(tmp_path / "trials"),
           "--select.include.names", *EASY_TASKS, "--no-push", "--rich", "None", "-o", str(out)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [traces_file] = out.glob("*/traces.jsonl")
    return [vf.WireEpisode.model_validate(json.loads(line)) for line in traces_file.read_text().splitlines()]
