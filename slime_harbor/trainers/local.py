"""GRPO on one machine: Harbor rollouts from the current policy, then a clipped policy-gradient step.

The local counterpart of the SLiME trainer, for CPUs, one GPU and tests. It shares the rollout
core (rollout.run_rollouts: Harbor Trials, agent, sandbox, verifier, converter) and the maths
(grpo.py); what is its own is how the policy is served and how its weights are updated:

    one torch module (LoRA adapters on the base model by default)
      |-- served by a SamplingEngine behind an EmbeddedPolicyServer on loopback: the agents
      |   sample from it, and the engine reports each token's logprob log_softmax(logits / T)
      `-- trained in place by AdamW: after each step the engine is told (update_model), so the
          next rollout samples from the updated weights

One step N (trainers/loop.py runs them, synchronously unless --max-staleness K >= 1):
    1. rollout: n_samples Harbor trials per task (a group; one per task, or rollout_batch_size of
       them, from the shuffled task stream) -> output_dir/rollouts/step_N/samples.jsonl, the
       trials under rollouts/trials/; the trajectory filters (filters.py) mask episodes that hit
       an enabled limit; with dynamic sampling, groups whose kept rewards do not vary are masked
       and more tasks are sampled to fill the step
    2. advantages: reward minus the mean reward of the task's episodes (grpo.episode_advantages);
       removed samples (infra failures: counted as aborted or failed; masked, by a filter or the
       hack monitor's screen: counted per reason) are dropped
    3. update: recompute the logprobs of the sampled tokens (log_softmax(logits / T), exactly as
       the engine does), old logprobs = the rollout's own (so the PPO ratio is pi / pi_sampler;
       with --use-tis the learner's own recomputation before the update, and each token's loss is
       weighted by SLiME's truncated importance ratio clamp(exp(old - rollout))),
       reference logprobs = the base model (adapters disabled, or a frozen copy with --no-lora),
       loss = grpo.grpo_loss, gradients accumulated over micro-batches, one AdamW step per
       minibatch (updates_per_rollout minibatches per rollout)
    4. held-out evaluation (eval_tasks; also before step 1): pass@1 / pass@k (trainers/evaluate.py)
    5. metrics.json (one record per step; step 0 holds only the evaluation before training),
       wandb (tracking.py), checkpoint_N/ every save_every steps; final/ and reward_curve.png at the end

External server (--policy-url / --vllm-url): the agents sample from an SGLang or vLLM-compatible
server instead of the embedded engine, and after each optimizer step the Learner pushes the new
weights the way SGLang takes them (policy/weights.py: LoRA adapters via /load_lora_adapter and
/unload_lora_adapter, full weights via /update_weights_from_disk). A server that takes no weights
(--weight-sync none) keeps sampling its own: the old logprobs are then recomputed from the trained
policy, and every step logs server_logprob_gap, how far the server's logprobs are from ours.

Asynchronous (--max-staleness K >= 1): the rollouts never stop; each update trains on the first
groups to complete, in a thread while trials go on, masks episodes with a call more than K
versions behind (masked_by stale) and publishes the next version, which the server takes between
calls. Weight version N = the weights after N updates = checkpoint_N.

SIGINT / SIGTERM (from the command line): trials in flight are cancelled (sandboxes torn down, not
trained); an update in flight finishes with its metrics and scheduled checkpoint.
Then summary.json is written with "interrupted": true, no final/, and the process exits 130 / 143;
`--resume` continues from the last checkpoint.

Where each part lives: local_config.py (LocalTrainConfig, its checks), learner.py (the policy, the
update step, checkpoints, weight sync: Learner), training_run.py (what a run records: step figures,
the task stream, its lines and summary), loop.py (the loop, K = 0 or more), this file (the
run around it, the CLI).

Run: `slime-harbor train-local --test` (or examples/harbor/harbor_grpo_local.py).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from slime_harbor.agents.placement import samples_policy
from slime_harbor.config_docs import add_field_flags
from slime_harbor.exits import ConfigError, Interrupted, OneLineArgumentParser, SignalGuard
from slime_harbor.policy.chat_formats import choose_renderer
from slime_harbor.policy.weight_check import CHECK_MODES, WeightMismatch
from slime_harbor.tasks.manifest import apply_manifest
from slime_harbor.tasks.task_dir import discover_tasks
from slime_harbor.trainers.loop import train_loop
from slime_harbor.trainers.training_run import TaskStream, TrainingRun, run_summary
from slime_harbor.run_config import run_setting_choices
from slime_harbor.trainers.local_config import (
    check_train_config, find_checkpoint, LocalTrainConfig, OBJECTIVES, resolve_device, TEST_PRESET, TRAINER_STATE, with_tasks_selected,
)
from slime_harbor.trainers.learner import Learner, restore_rng


# --------------------------------------------------------------------------------------------
# The run.


def _tracker(cfg: LocalTrainConfig, out: Path, base_model: str, device: str):
    if not cfg.wandb_project:
        return None
    try:
        import wandb  # noqa: F401
    except ModuleNotFoundError:
        raise ConfigError("--wandb-project needs the wandb package (pip install wandb)") from None
    from slime_harbor.trainers.tracking import WandbRun

    config = jsonable({**dataclasses.asdict(cfg), "base_model": base_model, "device": device})
    return WandbRun(cfg.wandb_project, cfg.wandb_run_name, out, config)


def _plot(out: Path, metrics: list[dict]) -> str | None:
    """OUTPUT_DIR/reward_curve.png: training reward per step and held-out pass@1 (None without matplotlib)."""
    try:
        import matplotlib  # noqa: F401
    except ModuleNotFoundError:
        return None
    from slime_harbor.trainers.tracking import plot_reward_curve

    steps = [m for m in metrics if "reward_mean" in m]
    heldout = [(m["step"], m["eval"]["pass@1"]) for m in metrics if m.get("eval", {}).get("pass@1") is not None]
    plot_reward_curve(out / "reward_curve.png", [m["step"] for m in steps], [m["reward_mean"] for m in steps],
                      heldout, "Local GRPO", heldout_label="held-out pass@1 (step 0: before training)")
    return str(out / "reward_curve.png")


def train(cfg: LocalTrainConfig, guard: SignalGuard | None = None, learner_factory=Learner) -> dict[str, Any]:
    """Run GRPO steps until step num_rollouts; returns the run summary (also in summary.json).
    With an entered SignalGuard (the command line's), a signal stops the run in order (see the
    module doc) and Interrupted is raised after summary.json is written.
    `learner_factory(cfg, base_model, device, checkpoint, out, start)` builds the policy side."""
    cfg = with_tasks_selected(cfg)
    check_train_config(cfg)
    guard = guard or SignalGuard()  # not entered: signals keep their usual effect
    task_paths, skipped_tasks = apply_manifest(discover_tasks(cfg.tasks_dir, cfg.task_names), cfg.task_manifest)
    tasks = [p.name for p in task_paths]
    if not tasks:
        raise ConfigError(f"every task in {cfg.tasks_dir} is marked broken or flaky in {cfg.task_manifest}")
    checkpoint = find_checkpoint(cfg.resume) if cfg.resume else None
    state = json.loads((checkpoint / TRAINER_STATE).read_text()) if checkpoint else None
    if state and state["lora"] != cfg.lora:
        raise ConfigError(f"{checkpoint} was trained with lora={state['lora']}; pass the same --no-lora setting")
    base_model = state["base_model"] if state else str(resolve_model(cfg.model))
    if samples_policy(cfg.agent):  # the run's chat format, named in config.json and summary.json
        cfg = dataclasses.replace(cfg, renderer=choose_renderer(base_model, cfg.renderer))
    out = Path(cfg.output_dir or (checkpoint.parent if checkpoint else "runs/grpo-local"))
    out.mkdir(parents=True, exist_ok=True)
    device = resolve_device(cfg.device)

    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    start = state["step"] if state else 0
    metrics: list[dict] = list(state["metrics"]) if state else []
    learner = learner_factory(cfg, base_model, device, checkpoint, out, start)
    if figures := getattr(learner, "check_figures", None):  # a Learner's weight check before any rollout
        print(f"weight check before the first rollout: the server's logprobs are {figures['weight_sync/probe_gap']:.1e} "
              f"from the trainer's (version {start})", file=sys.stderr)
    if checkpoint:
        restore_rng(checkpoint)
        print(f"resumed from {checkpoint} at step {start}", file=sys.stderr)
    (out / "config.json").write_text(json.dumps(jsonable({**dataclasses.asdict(cfg), "base_model": base_model,
                                                            "device": device}), indent=1))
    run = TrainingRun(cfg, out, learner, base_model, start, metrics,
                      last_checkpoint=str(checkpoint) if checkpoint else None)
    started = time.monotonic()
    stream = TaskStream(tasks, cfg.seed, position=metrics[-1].get("task_stream_position", 0) if metrics else 0)
    interrupted: Interrupted | None = None
    try:
        run.tracker = _tracker(cfg, out, base_model, device)
        with asyncio.Runner() as runner:
            guard.run(train_loop(run, {p.name: p for p in task_paths}, stream), runner)
    except Interrupted as exc:
        interrupted = exc
    except BaseException:  # any end but a signal's: the learner's servers and wandb close, then it is raised again
        learner.close()
        if run.tracker is not None:
            run.tracker.finish()
        raise

    try:
        if interrupted is None:
            learner.save_final(out / "final")
    finally:
        learner.close()
    summary = run_summary(metrics, cfg, base_model, out, run.last_checkpoint, time.monotonic() - started)
    summary["skipped_tasks"] = skipped_tasks  # broken or flaky in --task-manifest: never trained on
    summary.update(run.twins)  # twin_tasks, and per task what its impossible twin changed or why it has none
    summary["interrupted"] = interrupted is not None
    summary["reward_curve"] = _plot(out, metrics)
    if run.tracker is not None:
        if summary["reward_curve"]:
            run.tracker.log_image("rollout/reward_curve", Path(summary["reward_curve"]))
        summary["wandb_dir"] = str(run.tracker.dir)
        run.tracker.finish()
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    if interrupted is not None:
        print(f"interrupted after step {summary['last_step']}: metrics in {out}/metrics.json, "
              f"last checkpoint {run.last_checkpoint or 'none'}", file=sys.stderr)
        raise interrupted
    return summary


def resolve_model(model: str | None) -> Path:
    if model is None:
        from slime_harbor.policy.tiny_model import ensure_tiny_model

        return ensure_tiny_model()
    # An absolute dir, so the adapter config of final/ points at the base from anywhere.
    return Path(model).resolve() if Path(model).exists() else Path(model)


def jsonable(d: dict) -> dict:
    return {k: str(v) if isinstance(v, Path) else v for k, v in d.items()}


# --------------------------------------------------------------------------------------------
# Command line: one flag per field, help from the field's docstring.


FLAG_NAMES = {"tasks_dir": "--tasks", "lora": "--no-lora", "verifier_timeout_sec": "--eval-timeout"}
# Names users already type (other GRPO scripts), accepted as well.
FLAG_ALIASES = {"policy_url": ["--vllm-url"], "step_limit": ["--agent-step-limit"]}
# Fields whose values are a fixed set (argparse refuses the others in one line).
FLAG_CHOICES = {"objective": OBJECTIVES, "weight_check": CHECK_MODES, "keep_interrupted": ("on", "off")}
# Harbor's own task filters (`harbor run -i NAME -x NAME`), one name per flag, repeatable.
HARBOR_FILTER_FLAGS = {"task_names": ["-i", "--include-task-name"], "exclude_task_names": ["-x", "--exclude-task-name"]}


def build_parser() -> argparse.ArgumentParser:
    p = OneLineArgumentParser(
        prog="slime-harbor train-local", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter, argument_default=argparse.SUPPRESS,
    )
    p.add_argument("--test", action="store_true",
                   help=f"quick run: {', '.join(f'{k}={v}' for k, v in TEST_PRESET.items())}; other flags override")
    add_field_flags(p, LocalTrainConfig, LocalTrainConfig(), flags={
        f.name: FLAG_NAMES.get(f.name, "--" + f.name.replace("_", "-")) for f in dataclasses.fields(LocalTrainConfig)},
        aliases=FLAG_ALIASES, choices=run_setting_choices() | FLAG_CHOICES, given_only=True)
    for name, extra in HARBOR_FILTER_FLAGS.items():
        p.add_argument(*extra, dest=name, action="append",
                       help=f"one name of --{name.replace('_', '-')}, repeatable (as harbor run)")
    return p


def config_from_args(argv: Sequence[str] | None = None) -> LocalTrainConfig:
    """Defaults, then the --test preset, then the flags given explicitly."""
    given = vars(build_parser().parse_args(argv))
    preset = TEST_PRESET if given.pop("test", False) else {}
    return LocalTrainConfig(**{**preset, **given})


def main(argv: Sequence[str] | None = None, guard: SignalGuard | None = None) -> dict[str, Any]:
    """`slime-harbor train-local`: bad flags are one line (exit 2); SIGINT / SIGTERM stop in
    order (exit 130 / 143). `guard` is the command line's, already entered; run directly
    (examples/harbor/harbor_grpo_local.py, python -m), main installs its own."""
    if guard is None:
        with SignalGuard() as own:
            return _exit_cleanly(lambda: main(argv, own))
    cfg = with_tasks_selected(config_from_args(argv))
    check_train_config(cfg)
    summary = train(cfg, guard)
    print(json.dumps(summary, indent=1))
    return summary


def _exit_cleanly(run):
    try:
        return run()
    except Interrupted as exc:
        raise SystemExit(exc.exit_code) from None
    except ConfigError as exc:
        print(f"slime-harbor train-local: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except WeightMismatch as exc:
        print(f"slime-harbor train-local: error: weight check: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
