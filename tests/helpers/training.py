"""Local training in tests: a short train-local config on the fixture tasks, and the weights of a
run's checkpoints."""

from __future__ import annotations

from pathlib import Path

import torch

from helpers.tasks import FIXTURE_TASKS
from slime_harbor.trainers.local_config import LocalTrainConfig


def run_config(tiny_model_dir, out: Path, **overrides) -> LocalTrainConfig:
    base = dict(
        tasks_dir=FIXTURE_TASKS, model=str(tiny_model_dir), n_samples=4, num_rollouts=2, lr=1e-2,
        updates_per_rollout=2, step_limit=1, max_new_tokens=24, save_every=1, output_dir=out, device="cpu",
    )
    base.update(overrides)
    return LocalTrainConfig(**base)


def model_at(out: Path, version: int, tiny_model_dir):
    """The weights of `version`: the base model for 0, else checkpoint_<version> (LoRA adapters)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    if version:
        model = PeftModel.from_pretrained(model, out / f"checkpoint_{version}")
    return model.eval()


def wandb_rows(run_dir: Path, keep, count: int, within_sec: float = 60.0) -> list[dict]:
    """The history rows `keep` accepts of an offline wandb run dir, once `count` of them are on disk:
    wandb's service writes its transaction log on its own, and on a busy machine the last rows can
    land a moment after run.finish() returned. Whatever is there after `within_sec`, otherwise."""
    import time

    from slime_harbor.trainers.tracking import read_offline_history

    deadline = time.monotonic() + within_sec
    while True:
        rows = [r for r in read_offline_history(run_dir) if keep(r)]
        if len(rows) >= count or time.monotonic() > deadline:
            return rows
        time.sleep(0.5)
