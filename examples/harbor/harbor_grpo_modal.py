"""GRPO with the policy on a Modal GPU and the Harbor rollouts on this machine.

    modal run examples/harbor/harbor_grpo_modal.py --num-rollouts 50 --n-samples 4 --model-name Qwen/Qwen3-4B
    python examples/harbor/harbor_grpo_modal.py --test --output-dir runs/modal-test   # no Modal account

The Modal class PolicyTrainer (A100-80GB, HF token from the secret `hf-token-swe`) is the local
trainer's Learner: it serves the policy on the embedded SGLang-compatible server, reached from here
through a Modal tunnel, and runs each training step on the GPU; checkpoints and final/ go to the
Modal Volume `slime-harbor-runs` under the run's name. The loop itself is the local trainer's
train(): rollouts (Harbor + Docker or the local sandbox) run here against the served policy, and
metrics.json / summary.json / rollouts/ are written to --output-dir. With --test every Modal
function runs in this process (`.local()`; no volume, no secret, nothing contacts Modal), on the
tiny offline model and the local trainer's --test preset.
"""

import json
import os
import sys
from pathlib import Path

import modal

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

REPO = Path(__file__).resolve().parents[2]
RUNS = "/runs"  # the volume's mount point in the container

app = modal.App("slime-harbor-grpo")
image = (
    modal.Image.debian_slim(python_version="3.12")
    .pip_install("harbor==0.24.0", "torch", "transformers>=4.51", "tokenizers", "peft", "httpx", "fastapi", "uvicorn")
    .add_local_python_source("slime_harbor")
)
volume = modal.Volume.from_name("slime-harbor-runs", create_if_missing=True)


@app.cls(gpu="A100-80GB", image=image, volumes={RUNS: volume}, secrets=[modal.Secret.from_name("hf-token-swe")],
         timeout=24 * 3600, max_containers=1, scaledown_window=20 * 60)
class PolicyTrainer:
    config_json: str = modal.parameter()  # the LocalTrainConfig, as JSON
    run_dir: str = modal.parameter()  # checkpoints and final/ go here (a volume path on Modal)

    @modal.enter()
    def start(self) -> None:
        from slime_harbor.trainers.local import resolve_model
        from slime_harbor.trainers.learner import Learner
        from slime_harbor.trainers.local_config import LocalTrainConfig, resolve_device

        cfg = LocalTrainConfig(**json.loads(self.config_json))
        self.out = Path(self.run_dir)
        on_modal = not modal.is_local()
        base_model = str(resolve_model(cfg.model))
        self.learner = Learner(cfg, base_model, resolve_device(cfg.device), None, self.out, 0,
                               host="0.0.0.0" if on_modal else "127.0.0.1")
        self.url = self.learner.url
        if on_modal:  # the rollouts run elsewhere: reach the embedded server through a tunnel
            self._tunnel = modal.forward(int(self.url.rsplit(":", 1)[1]))
            self.url = self._tunnel.__enter__().url

    @modal.method()
    def info(self) -> dict:
        return {"url": self.url, "weight_version": self.learner.weight_version}

    @modal.method()
    def train_step(self, samples: list, step: int) -> dict:
        return {**self.learner.train_step(samples, step), "weight_version": self.learner.weight_version}

    @modal.method()
    def save(self, name: str, step: int | None = None, metrics: list | None = None) -> None:
        if step is None:
            self.learner.save_final(self.out / name)
        else:
            self.learner.save_checkpoint(self.out / name, step, metrics)
        if not modal.is_local():
            volume.commit()

    @modal.method()
    def close(self) -> None:
        self.learner.close()


class RemoteLearner:
    """train()'s policy side, forwarded to PolicyTrainer (.remote on Modal, .local with --test)."""

    def __init__(self, trainer: PolicyTrainer, local: bool):
        self._call = lambda name: getattr(getattr(trainer, name), "local" if local else "remote")
        info = self._call("info")()
        self.url, self.weight_version, self.lora_name = info["url"], info["weight_version"], None

    def train_step(self, samples, step: int) -> dict:
        result = self._call("train_step")(list(samples), step)
        self.weight_version = result.pop("weight_version")
        return result

    def save_checkpoint(self, path: Path, step: int, metrics: list) -> None:
        self._call("save")(Path(path).name, step, metrics)

    def save_final(self, path: Path) -> None:
        self._call("save")(Path(path).name)

    def close(self) -> None:
        self._call("close")()


# The entry point's flags; the trainer's own defaults, so only a flag given changes the --test preset.
FLAGS = {"num_rollouts": 50, "n_samples": 4, "agent": "native", "model_name": "", "lr": 1e-6, "kl_coef": 0.001,
         "output_dir": "runs/grpo-modal", "tasks": "", "env": "local"}


@app.local_entrypoint()
def main(test: bool = False, num_rollouts: int = 50, n_samples: int = 4, agent: str = "native",
         model_name: str = "", lr: float = 1e-6, kl_coef: float = 0.001, output_dir: str = "runs/grpo-modal",
         tasks: str = "", env: str = "local") -> dict:
    from slime_harbor.trainers.local import jsonable, train
    from slime_harbor.trainers.local_config import LocalTrainConfig, TEST_PRESET

    values = {k: v for k, v in locals().items() if k in FLAGS}
    given = {k: v for k, v in values.items() if v != FLAGS[k]}
    renamed = {"model_name": "model", "tasks": "tasks_dir"}
    given = {renamed.get(k, k): v for k, v in given.items()}
    if "tasks_dir" in given:
        given["task_names"] = None  # the preset's task names are the bundled tasks'
    cfg = LocalTrainConfig(**{**(TEST_PRESET if test else {}), **given, "output_dir": Path(output_dir)})
    run_dir = output_dir if test else f"{RUNS}/{Path(output_dir).name}"
    config = {k: v for k, v in jsonable(vars(cfg)).items() if k not in ("output_dir", "resume")}
    trainer = PolicyTrainer(config_json=json.dumps(config), run_dir=run_dir)
    summary = train(cfg, learner_factory=lambda *args: RemoteLearner(trainer, local=test))
    print(json.dumps(summary, indent=1))
    if not test:
        print(f"checkpoints and final/: Modal volume slime-harbor-runs, {run_dir}", file=sys.stderr)
    return summary


if __name__ == "__main__":  # `python harbor_grpo_modal.py --test ...`: the same entry point, without Modal's CLI
    import argparse
    import warnings

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--test", action="store_true")
    for name, default in FLAGS.items():
        parser.add_argument("--" + name.replace("_", "-"), type=type(default), default=default)
    args = vars(parser.parse_args())
    if not args["test"]:
        raise SystemExit("a real run goes through Modal's CLI: modal run examples/harbor/harbor_grpo_modal.py ...")
    warnings.filterwarnings("ignore", message=".*executing locally.*")  # --test has no volume, on purpose
    main(**args)
