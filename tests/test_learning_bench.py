"""bench/learning.py end to end at toy size: every stage runs (model, tasks, SFT, real-trial
evaluations, GRPO steps through the local trainer) and its outputs are written. The learning
figure itself is the benchmark's job (minutes of CPU), not a test's."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_learning_bench_runs_every_stage_and_writes_results(tmp_path):
    out = tmp_path / "learning"
    flags = {
        "--out": out, "--families": "write-word delete-files", "--train-instances": 1,
        "--heldout-instances": 1, "--eval-samples": 1, "--sft-instances": 4, "--sft-max-steps": 2,
        "--sft-check-every": 1, "--sft-target": 1.0, "--grpo-steps": 2, "--eval-every": 1,
        "--n-samples": 2, "--concurrency": 4,
    }
    argv = [a for k, v in flags.items() for a in (k, *str(v).split())]
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "learning.py"), *argv],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "held-out success" in proc.stdout and "target >= +0.200" in proc.stdout

    results = json.loads((out / "results.json").read_text())
    assert set(results["heldout_success"]) == {"base", "sft_only", "sft_grpo", "delta_grpo", "sft_rft", "delta_rft"}
    assert "SFT + RFT" in proc.stdout and results["evals"]["rft"]["n_trials"] == 2
    # base, SFT and one evaluation after each GRPO step; 2 families x 1 instance x 1 episode each.
    assert [step for step, _ in results["heldout_curve"]] == [0, 1, 2]
    for name in ("base", "sft", "grpo_step_1", "grpo_step_2"):
        assert results["evals"][name]["n_trials"] == 2
        assert set(results["evals"][name]["per_family"]) == {"write-word", "delete-files"}
    assert results["sft"]["steps"] == 2
    assert len(results["grpo_train_reward"]) == 2
    assert results["config"]["grpo_steps"] == 2
    assert (out / "reward_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The trainer kept only its latest checkpoint and wrote its metrics.
    assert sorted(p.name for p in (out / "grpo").glob("checkpoint_*")) == ["checkpoint_2"]
    assert len(json.loads((out / "grpo" / "metrics.json").read_text())) == 2
    # The RFT arm: the same SFT start and, step by step, the same training instances and group size.
    configs = {arm: json.loads((out / arm / "config.json").read_text()) for arm in ("grpo", "rft")}
    assert [Path(c["model"]) for c in configs.values()] == [out / "models" / "sft"] * 2
    assert [c["objective"] for c in configs.values()] == ["grpo", "rft"]
    differ = {k for k in configs["grpo"] if configs["grpo"][k] != configs["rft"][k]} - {"output_dir", "resume"}
    assert differ == {"objective"}, differ
    for step in (1, 2):
        tasks = [sorted({json.loads(line)["metadata"]["task_name"]
                         for line in (out / arm / "rollouts" / f"step_{step}" / "samples.jsonl").read_text().splitlines()})
                 for arm in ("grpo", "rft")]
        assert tasks[0] == tasks[1] and tasks[0]
    assert len(results["rft_train_reward"]) == 2
