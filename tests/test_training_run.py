"""A short local GRPO run with everything of a real training run on: held-out evaluation (pass@1 and
pass@k checked against a hand computation from the evaluation's own trials), dynamic sampling
(a group without reward variance dropped and a new one sampled), offline wandb (every metric of
metrics.json read back from wandb's own run file), the reward-curve PNG; and `slime-harbor demo`
at toy size. Real Harbor trials on the bubblewrap sandbox, the tiny model served by the engine.

Tasks (copies of tests/fixtures/tasks/vowel-share with another verifier):
    vowel-share   reward = vowel share of the agent's text: varies within a group (GRPO signal)
    zero          reward 0 always: its group never varies (dynamic sampling drops it)
    coin-*        reward 1 when the agent's text has an odd length, else 0: held-out successes
                  that come and go, so pass@1 and pass@k are not trivially 0 or 1
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from helpers.training import wandb_rows

from slime_harbor.samples import read_jsonl
from slime_harbor.trainers.local import train
from slime_harbor.trainers.local_config import LocalTrainConfig
from slime_harbor.trainers.tracking import flatten, read_offline_history, wandb_key

REPO = Path(__file__).resolve().parent.parent
VOWEL_SHARE = REPO / "tests" / "fixtures" / "tasks" / "vowel-share"

VERIFIER = """#!/bin/bash
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
python3 - <<'PY'
import json
steps = json.load(open("/logs/agent/trajectory.json"))["steps"]
text = "".join(s.get("message") or "" for s in steps if s.get("source") == "agent")
open("/logs/verifier/reward.txt", "w").write("%s\\n" % ({expr}))
PY
"""


def task(dest: Path, reward_expr: str | None = None) -> Path:
    shutil.copytree(VOWEL_SHARE, dest)
    if reward_expr is not None:
        (dest / "tests" / "test.sh").write_text(VERIFIER.format(expr=reward_expr))
    return dest


@pytest.fixture(scope="module")
def run(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("training_run")
    task(root / "train" / "vowel-share")
    task(root / "train" / "zero", "0")
    for name in ("coin-a", "coin-b"):
        task(root / "heldout" / name, "int(len(text) % 2 == 1)")
    cfg = LocalTrainConfig(
        tasks_dir=root / "train", model=str(tiny_model_dir), n_samples=3, num_rollouts=2, lr=1e-2,
        step_limit=1, max_new_tokens=12, save_every=0, output_dir=root / "out", device="cpu", concurrency=4,
        rollout_batch_size=1, dynamic_sampling=True, dynamic_sampling_max_rounds=1,
        eval_tasks=root / "heldout", eval_every=1, eval_n_samples=4, eval_temperature=1.0,
        wandb_project="test-project", wandb_run_name="toy",
    )
    summary = train(cfg)
    return root / "out", summary


@pytest.mark.slow
def test_heldout_evaluation_pass_at_k_matches_its_trials(run):
    out, summary = run
    metrics = json.loads((out / "metrics.json").read_text())
    assert [m["step"] for m in metrics] == [0, 1, 2]
    assert set(metrics[0]) == {"step", "eval", "timings"}  # step 0: the evaluation before training
    for m in metrics:
        e, step_dir = m["eval"], out / "eval" / f"step_{m['step']}"
        # Hand computation from the evaluation's own trials.
        rewards = defaultdict(dict)
        for s in read_jsonl(step_dir / "samples.jsonl"):
            rewards[s.metadata["task_name"]][s.index] = s.reward
        assert sorted(rewards) == ["coin-a", "coin-b"] and all(len(r) == 4 for r in rewards.values())
        by_hand = {}
        for name, r in rewards.items():
            c = sum(v == 1.0 for v in r.values())
            by_hand[name] = (c / 4, 1.0 if c > 0 else 0.0)  # pass@4 of 4 episodes: any success
            assert e["per_task"][name]["pass@1"] == pytest.approx(c / 4)
            assert e["per_task"][name]["pass@4"] == pytest.approx(1 - math.comb(4 - c, 4) / math.comb(4, 4))
            assert e["per_task"][name]["pass@4"] == by_hand[name][1]
        assert e["pass@1"] == pytest.approx(sum(v[0] for v in by_hand.values()) / 2)
        assert e["pass@4"] == pytest.approx(sum(v[1] for v in by_hand.values()) / 2)
        assert e["k"] == 4 and e["n_trials"] == 8
        assert len([p for p in (step_dir / "trials").iterdir() if p.is_dir()]) == 8  # its own trials dir
    assert [e["step"] for e in summary["evals"]] == [0, 1, 2]
    # Never trained on: no held-out task in any training rollout.
    for step in (1, 2):
        names = {s.metadata["task_name"] for s in read_jsonl(out / "rollouts" / f"step_{step}" / "samples.jsonl")}
        assert names <= {"vowel-share", "zero"}


@pytest.mark.slow
def test_dynamic_sampling_drops_the_constant_group_and_samples_another(run):
    out, summary = run
    steps = [m for m in json.loads((out / "metrics.json").read_text()) if m["step"] > 0]
    # One task per step from a shuffled epoch of {vowel-share, zero}: the step that drew zero
    # dropped its group (rewards all 0) and sampled the stream's next task in a refill.
    refilled = [m for m in steps if m["filters"]["zero_std"] >= 1]
    assert refilled, [m["filters"] for m in steps]
    for m in refilled:
        assert m["n_groups_sampled"] == 2
        samples = read_jsonl(out / "rollouts" / f"step_{m['step']}" / "samples.jsonl")  # the refill's too
        zero = [s for s in samples if s.metadata["task_name"] == "zero"]
        assert zero and all(s.reward == 0.0 for s in zero)
        # Masked samples are counted as filtered, not aborted, and never reach the loss.
        assert m["aborted"] == 0
        assert m["n_trained_samples"] == sum(s.metadata["task_name"] == "vowel-share" for s in samples)
    assert summary["masked_episodes"]["zero_std"] == sum(m["filters"]["zero_std"] for m in steps)
    # The converter records each turn's finish reason (the length filter reads it).
    s = read_jsonl(out / "rollouts" / "step_1" / "samples.jsonl")[0]
    assert s.metadata["finish_reasons"] and set(s.metadata["finish_reasons"]) <= {"stop", "length"}


def test_a_resumed_run_logs_into_the_same_wandb_run(tmp_path, monkeypatch):
    """The second WandbRun of one output dir (a --resume) continues the first's wandb run: same
    id, its steps in a second offline-run dir of that id that `wandb sync` joins; another output
    dir is another run."""
    from slime_harbor.trainers.tracking import RUN_ID_FILE, WandbRun

    monkeypatch.setenv("WANDB_MODE", "offline")
    ids = []
    for out, step in ((tmp_path / "a", 1), (tmp_path / "a", 2), (tmp_path / "b", 1)):
        tracker = WandbRun("test-project", "toy", out, {"seed": 0})
        tracker.log({"step": step, "reward_mean": 0.5})
        ids.append(tracker.run.id)
        tracker.finish()
    assert ids[0] == ids[1] != ids[2] and (tmp_path / "a" / RUN_ID_FILE).read_text().strip() == ids[0]
    run_dirs = sorted((tmp_path / "a" / "wandb").glob("offline-run-*"))
    # wandb names a run dir offline-run-<time>-<id>, and adds -1 when one of that id and second exists.
    assert len(run_dirs) == 2 and all(re.search(rf"-{ids[0]}(-\d+)?$", d.name) for d in run_dirs), run_dirs
    steps = [r["rollout/step"] for d in run_dirs for r in wandb_rows(d, lambda r: "rollout/step" in r, 1)]
    assert steps == [1, 2]


@pytest.mark.slow
def test_offline_wandb_run_holds_every_metric_of_every_step(run):
    out, summary = run
    run_dirs = list((out / "wandb").glob("offline-run-*"))
    assert len(run_dirs) == 1 and summary["wandb_dir"] == str(run_dirs[0])
    metrics = json.loads((out / "metrics.json").read_text())
    wandb_rows(run_dirs[0], lambda r: any(k.startswith("rollout/reward_curve") for k in r), 1)  # logged last
    rows = read_offline_history(run_dirs[0])
    logged = [r for r in rows if "rollout/step" in r and "rollout/reward_curve" not in "".join(r)]
    assert [r["rollout/step"] for r in logged] == [m["step"] for m in metrics]
    for record, row in zip(metrics, logged):
        expected = {wandb_key(p): v for p, v in flatten(record).items() if p != "step"}
        assert expected.keys() <= row.keys(), sorted(expected.keys() - row.keys())
        for key, value in expected.items():
            assert row[key] == pytest.approx(value), key
    # SLiME's names for the headline quantities, and the reward curve as an image.
    assert {"rollout/raw_reward", "passrate/pass@1", "train/pg_loss", "train/kl_loss", "train/pg_clipfrac",
            "perf/rollout_time", "eval/heldout-pass@1", "eval/heldout-pass@4"} <= set().union(*logged)
    assert any(k.startswith("rollout/reward_curve") for r in rows for k in r)
    assert (out / "reward_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_demo_at_toy_size(tmp_path):
    out = tmp_path / "demo"
    flags = {
        "--out": out, "--families": "write-word delete-files", "--train-instances": 1, "--heldout-instances": 1,
        "--eval-samples": 2, "--sft-instances": 4, "--sft-max-steps": 2, "--sft-check-every": 1,
        "--sft-target": 1.0, "--grpo-steps": 2, "--n-samples": 2, "--concurrency": 4,
    }
    argv = [a for k, v in flags.items() for a in (k, *str(v).split())]
    proc = subprocess.run([sys.executable, "-m", "slime_harbor.cli", "demo", *argv], cwd=REPO,
                          capture_output=True, text=True, timeout=900, env={**__import__("os").environ, "WANDB_MODE": "offline"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("held-out success: ") and "(after SFT) -> " in last and "(after GRPO)" in last
    results = json.loads((out / "results.json").read_text())
    assert [step for step, _ in results["heldout_curve"]] == [0, 2]
    assert results["heldout_trials_per_eval"] == 4  # 2 families x 1 instance x 2 episodes
    assert results["sft"]["steps"] == 2 and len(results["grpo_train_reward"]) == 2
    outputs = results["outputs"]
    assert Path(outputs["reward_curve"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "offline-run-" in outputs["wandb_run"] and Path(outputs["wandb_run"]).is_dir()
    for key in ("reward_curve", "wandb_run", "metrics", "final_model"):
        assert outputs[key] in proc.stdout  # the summary says where each output is
