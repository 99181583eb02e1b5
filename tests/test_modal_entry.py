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


def test_app_and_image_are_defined_offline(monkeypatch):
    for k, v in NO_MODAL.items():
        monkeypatch.setenv(k, v)
    spec = importlib.util.spec_from_file_location("harbor_grpo_modal", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    import modal

    assert module.app.name == "slime-harbor-grpo"
    assert isinstance(module.PolicyTrainer, modal.Cls) and isinstance(module.image, modal.Image)
    assert callable(module.main)
    assert len(SCRIPT.read_text().splitlines()) < 150


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
    assert metrics[1]["sampled_weight_version"] == (0 if first["skipped"] else 1), first["skipped"]
    for name in ("checkpoint_1", "checkpoint_2"):
        assert (out / name / "trainer_state.json").is_file() and (out / name / "adapter_model.safetensors").is_file()
    assert (out / "final" / "adapter_model.safetensors").is_file()
    assert (out / "rollouts" / "step_2" / "samples.jsonl").is_file()
