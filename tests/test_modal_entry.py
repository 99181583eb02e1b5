"""examples/harbor/harbor_grpo_modal.py without a Modal account: the App and its image are built
offline, and a --test run executes the Modal functions in-process (`.local()`) and writes what the
local trainer writes. Modal's server URL points at a closed loopback port, so any contact fails."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("modal")

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "examples" / "harbor" / "harbor_grpo_modal.py"
NO_MODAL = {"MODAL_SERVER_URL": "http://127.0.0.1:9", "MODAL_TOKEN_ID": "", "MODAL_TOKEN_SECRET": ""}


def test_app_and_its_remote_learner_are_defined_offline(monkeypatch, tmp_path):
    for k, v in NO_MODAL.items():
        monkeypatch.setenv(k, v)
    spec = importlib.util.spec_from_file_location("harbor_grpo_modal", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    import modal

    assert module.app.name == "slime-harbor-grpo"
    assert isinstance(module.PolicyTrainer, modal.Cls) and isinstance(module.image, modal.Image)

    # train()'s learner side goes to the Modal class: steps, the served weight version, checkpoints
    # saved by name on the volume. Modal's .local / .remote callables stand in for the class here.
    saved = []

    class Method:
        def __init__(self, fn):
            self.local = fn

    class Trainer:
        info = Method(lambda: {"url": "http://gpu:1", "weight_version": 3})
        train_step = Method(lambda samples, step: {"loss": 0.5, "n": len(samples), "weight_version": step})
        save = Method(lambda name, step=None, metrics=None: saved.append((name, step, metrics)))
        close = Method(lambda: saved.append("closed"))

    learner = module.RemoteLearner(Trainer(), local=True)
    assert (learner.url, learner.weight_version) == ("http://gpu:1", 3)
    assert learner.train_step(iter(["a", "b"]), 4) == {"loss": 0.5, "n": 2} and learner.weight_version == 4
    learner.save_checkpoint(tmp_path / "run" / "checkpoint_4", 4, [{"step": 4}])
    learner.save_final(tmp_path / "run" / "final")
    learner.close()
    assert saved == [("checkpoint_4", 4, [{"step": 4}]), ("final", None, None), "closed"]


@pytest.mark.slow
def test_test_run_writes_the_local_trainers_outputs(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, **NO_MODAL, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--test", "--tasks", str(REPO / "tests" / "fixtures" / "tasks"),
         "--output-dir", str(out), "--lr", "0.001", "--n-samples", "4"],
        env=env, capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    metrics = json.loads((out / "metrics.json").read_text())
    assert summary["steps"] == 2 and [m["step"] for m in metrics] == [1, 2]
    # The GPU side served what it trained: a step that updated the weights moved the version.
    first = metrics[0]
    assert list(metrics[1]["sampled_weight_versions"]) == ["0" if first["skipped"] else "1"], first["skipped"]
    for name in ("checkpoint_1", "checkpoint_2"):
        assert (out / name / "trainer_state.json").is_file() and (out / name / "adapter_model.safetensors").is_file()
    assert (out / "final" / "adapter_model.safetensors").is_file()
    assert (out / "rollouts" / "step_2" / "samples.jsonl").is_file()
