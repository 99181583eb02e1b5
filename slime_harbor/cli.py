"""`slime-harbor` command line: make-model, serve, rollout, demo, train-local, prepare-data.

Every rollout flag maps to a documented `RolloutConfig` field; with no --policy-url the command
builds the tiny offline model (cached) and serves it on an embedded server, so it runs anywhere.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from slime_harbor.policy.tiny_model import build_tiny_model, ensure_tiny_model
from slime_harbor.rollout import DEFAULT_TASKS, RolloutConfig

def add_rollout_args(p: argparse.ArgumentParser, defaults: RolloutConfig) -> None:
    p.add_argument("--tasks", type=Path, default=DEFAULT_TASKS, help="Harbor task dirs (default: bundled tasks)")
    p.add_argument("--task-names", nargs="*", default=None, help="only these task dir names")
    p.add_argument("--agent", default=defaults.agent, help="native | terminus-2 | oracle | nop | module:Class")
    p.add_argument("--n-samples", type=int, default=defaults.n_samples, help="episodes per task (GRPO group size)")
    p.add_argument("--policy-url", default=None, help="SGLang router / policy server URL (default: embedded)")
    p.add_argument("--model", default=None, help="policy HF dir (default: the tiny offline model)")
    p.add_argument("--env", default=defaults.env, help="local | docker | <harbor env type> | module:Class")
    p.add_argument("--concurrency", type=int, default=defaults.concurrency, help="trials at once")
    p.add_argument("--out", type=Path, default=defaults.out_dir, help="output dir")
    p.add_argument("--temperature", type=float, default=defaults.temperature)
    p.add_argument("--top-p", type=float, default=defaults.top_p)
    p.add_argument("--top-k", type=int, default=defaults.top_k)
    p.add_argument("--step-limit", type=int, default=defaults.step_limit, help="agent turns per episode")
    p.add_argument("--max-new-tokens", type=int, default=defaults.max_new_tokens, help="tokens per turn")
    p.add_argument("--timeout-multiplier", type=float, default=defaults.timeout_multiplier)
    p.add_argument("--reward-mapping", choices=["raw", "pm1"], default=defaults.reward_mapping)
    p.add_argument("--no-progress", action="store_true")


def rollout_config(a: argparse.Namespace) -> RolloutConfig:
    return RolloutConfig(
        tasks_dir=a.tasks, task_names=a.task_names, agent=a.agent, n_samples=a.n_samples,
        policy_url=a.policy_url, model_dir=a.model, env=a.env, concurrency=a.concurrency, out_dir=a.out,
        temperature=a.temperature, top_p=a.top_p, top_k=a.top_k, step_limit=a.step_limit,
        max_new_tokens=a.max_new_tokens, timeout_multiplier=a.timeout_multiplier,
        reward_mapping=a.reward_mapping, progress=not a.no_progress,
    )


def run_rollout_command(cfg: RolloutConfig) -> dict:
    from slime_harbor.policy.server import policy_endpoint
    from slime_harbor.rollout import run_rollouts

    with policy_endpoint(cfg) as cfg:
        try:
            summary = asyncio.run(run_rollouts(cfg))
        except KeyboardInterrupt:
            print(f"\ninterrupted: finished trials are in {cfg.out_dir}/samples.jsonl", file=sys.stderr)
            raise SystemExit(130)
    print_summary(summary, cfg.out_dir)
    return summary


def print_summary(summary: dict, out: Path) -> None:
    counts = ", ".join(f"{k} {v}" for k, v in summary["status_counts"].items())
    mean = summary["mean_reward"]
    print(f"trials: {summary['n_trials']} ({counts})")
    print(f"mean reward: {'n/a' if mean is None else f'{mean:.3f}'}   pass rate: {summary['pass_rate']}")
    print(f"samples: {summary['n_samples']} written, {summary['n_trainable_samples']} trainable, "
          f"token drift points: {summary['drift_count']}")
    print(f"wall time: {summary['wall_seconds']}s   output: {out}/samples.jsonl, {out}/summary.json, {out}/trials/")


def prepare_data(tasks_dir: Path, out: Path) -> int:
    """Rows for SLiME's --prompt-data: {"prompt", "label", "metadata"} per Harbor task."""
    from slime_harbor.rollout import discover_tasks

    tasks = discover_tasks(tasks_dir)
    with open(out, "w") as f:
        for task in tasks:
            row = {
                "prompt": (task / "instruction.md").read_text(),
                "label": task.name,
                "metadata": {"task_name": task.name, "task_dir": str(task.resolve())},
            }
            f.write(json.dumps(row) + "\n")
    return len(tasks)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["train-local"]:  # its flags are LocalTrainConfig's fields: local_trainer parses them
        from slime_harbor.trainers.local import main as train_local

        train_local(argv[1:])
        return
    parser = argparse.ArgumentParser(prog="slime-harbor", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("make-model", help="write the tiny offline Qwen3-architecture policy")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seed", type=int, default=0)

    p = sub.add_parser("serve", help="serve a model over SGLang's /generate and OpenAI chat endpoints")
    p.add_argument("--model", default=None, help="HF model dir (default: the tiny offline model)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)

    p = sub.add_parser("rollout", help="run Harbor trials as GRPO groups and write samples")
    add_rollout_args(p, RolloutConfig())

    p = sub.add_parser("demo", help="the main job on embedded defaults: SFT warm start, then a short GRPO run on "
                       "procedural tasks with real trials; held-out success before and after",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    from slime_harbor.trainers.learning import DEMO_DEFAULTS, DEMO_WANDB_PROJECT, add_flags

    add_flags(p, DEMO_DEFAULTS)
    p.add_argument("--wandb-project", default=DEMO_WANDB_PROJECT,
                   help="wandb project (offline unless a W&B login is configured); '' = no wandb")

    sub.add_parser("train-local", help="GRPO on this machine: rollouts from the current policy, LoRA updates "
                   "(see train-local --help)")

    p = sub.add_parser("prepare-data", help="write SLiME --prompt-data rows, one per Harbor task")
    p.add_argument("--tasks", type=Path, default=DEFAULT_TASKS)
    p.add_argument("--out", type=Path, required=True)

    a = parser.parse_args(argv)
    if a.command == "make-model":
        print(build_tiny_model(a.out, seed=a.seed))
    elif a.command == "serve":
        from slime_harbor.policy.server import serve

        serve(a.model or str(ensure_tiny_model()), host=a.host, port=a.port)
    elif a.command == "rollout":
        run_rollout_command(rollout_config(a))
    elif a.command == "demo":
        from slime_harbor.trainers.learning import LearningConfig, run_demo

        project = vars(a).pop("wandb_project")
        fields = {k: v for k, v in vars(a).items() if k != "command"}
        run_demo(LearningConfig(**fields), wandb_project=project)
    elif a.command == "prepare-data":
        n = prepare_data(a.tasks, a.out)
        print(f"wrote {n} prompts to {a.out}")


if __name__ == "__main__":
    main()
