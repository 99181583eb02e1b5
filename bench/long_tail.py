"""What asynchronous training buys when trial times are heavy-tailed: train-local --max-staleness K
for K = 0 (synchronous), 1 and 2 on the same tasks, from the same start, at the same concurrency
and episodes per update.

Real agent trials have a long tail: most finish in seconds, a few wait for minutes (a long test
suite, a command that hangs until its timeout). Here the tasks are the learning benchmark's
procedural families (slime_harbor.tasks.families), warm-started by the same SFT
(trainers/demo.py), and each training task's verifier first waits, in about one trial in
ten chosen at random per trial, for 10-20x a fast trial's time (`sleep`: waiting inside the
sandbox, not CPU work), so any task can be slow. Held-out tasks have no tail (they only measure).

For each K the local trainer runs `updates` updates of rollout_batch_size tasks x n_samples
episodes at `concurrency` trials at once (bubblewrap sandbox, native agent, full weights), then
the final weights are measured on the held-out tasks. Every arm uses --use-tis (SLiME's truncated
importance sampling: the old policy is the learner's own recomputation, each token weighted by
clamp(exp(old - rollout), 0, 2)), which corrects for samples up to K versions old and is a no-op
on fresh ones. One line per arm:

    max_staleness=K updates=U trained_episodes=E wall_s=W episodes_per_min=R learner_idle=F heldout=H stale=D

  trained_episodes  episodes the updates trained on (not masked, not failed)
  wall_s            the training run's wall time (the held-out evaluation apart)
  episodes_per_min  trained_episodes / wall_s x 60
  learner_idle      share of wall_s the learner waited for data (K = 0: the rollouts; K >= 1:
                    its waits for complete groups)
  heldout           held-out success (verifier reward 1) of the final weights
  stale             episodes masked for staleness

and `initial heldout=H0` for the SFT model every arm starts from. Target: K = 1 at least 2.0x
the episodes per minute of K = 0, held-out success at most 0.05 below K = 0's, K = 0 above H0.

    .venv/bin/python bench/long_tail.py [--seed 0] [--updates 10] [--concurrency 32] [--arms 0 1 2] ...
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import time
from pathlib import Path

from slime_harbor.policy.tiny_model import build_tiny_model
from slime_harbor.samples import read_jsonl
from slime_harbor.tasks import families as task_families
from slime_harbor.trainers.demo import LearningConfig, sft_warm_start
from slime_harbor.trainers.local import train
from slime_harbor.trainers.local_config import LocalTrainConfig

# The learning benchmark's held-out success (bench/learning.py: run as a script, this file's folder is on
# the import path), so both benchmarks measure held-out tasks alike.
from learning import evaluate


@dataclasses.dataclass
class LongTailConfig:
    out: Path = Path("runs/long_tail")
    seed: int = 0
    arms: list[int] = dataclasses.field(default_factory=lambda: [0, 1, 2])
    updates: int = 10
    tasks_per_update: int = 8  # rollout_batch_size; x n_samples episodes per update
    n_samples: int = 4
    concurrency: int = 32  # sandboxes at once: a slow trial waits in one without starving the fast
    slow_share: float = 0.1  # trials whose verifier waits
    slow_wait_s: tuple[float, float] = (25.0, 50.0)  # 10-20x a fast trial (~2.5 s on 2 cores)
    heldout_instances: int = 16  # per family; x 2 episodes x 6 families = 192 held-out trials (SE <= 0.036)
    lr: float = 1e-3
    use_tis: bool = True  # every arm: SLiME's off-policy correction (with K = 0 its weights are 1)
    updates_per_rollout: int = 1  # one step per update keeps a sampler one version behind near the learner


def add_tail(task: Path, share: float, wait: tuple[float, float]) -> None:
    """Make `task`'s verifier wait first in a random `share` of its trials (bash's $RANDOM: a new
    draw per trial), for wait[0]..wait[1] seconds; its time limit grows to cover the wait."""
    lo, hi = int(wait[0]), int(wait[1])
    tail = (f"# long tail: in about {share:.0%} of trials, wait {lo}-{hi} s (not CPU work)\n"
            f"if [ $((RANDOM % 10000)) -lt {int(share * 10000)} ]; then sleep $(({lo} + RANDOM % {hi - lo + 1})); fi\n")
    test = task / "tests" / "test.sh"
    head, _, body = test.read_text().partition("\n")
    test.write_text(f"{head}\n{tail}{body}")
    toml = task / "task.toml"
    toml.write_text(re.sub(r"(\[verifier\]\ntimeout_sec = )[0-9.]+", rf"\g<1>{hi + 60}.0", toml.read_text()))


def setup(cfg: LongTailConfig, learning: LearningConfig) -> tuple[Path, Path, Path]:
    """The tiny model, the SFT start, the training tasks (with the tail) and the held-out tasks."""
    base = build_tiny_model(cfg.out / "models" / "base", seed=cfg.seed)
    per_family = max(1, cfg.updates * cfg.tasks_per_update // len(learning.families))
    train_dir, heldout_dir = cfg.out / "tasks" / "train", cfg.out / "tasks" / "heldout"
    instances = [inst for family in learning.families
                 for inst in task_families.instances(family, per_family, cfg.seed, "train", strict=False)]
    for inst in instances:
        add_tail(task_families.write_task(inst, train_dir), cfg.slow_share, cfg.slow_wait_s)
    task_families.generate(heldout_dir, cfg.heldout_instances, cfg.seed, "heldout", learning.families)
    sft_dir = cfg.out / "models" / "sft"
    sft_warm_start(learning, base, sft_dir, probe=instances[:: max(1, len(instances) // 6)][:6])
    return sft_dir, train_dir, heldout_dir


def run_arm(cfg: LongTailConfig, learning: LearningConfig, k: int, sft_dir: Path, train_dir: Path,
            heldout_dir: Path) -> dict:
    out = cfg.out / f"k{k}"
    summary = train(LocalTrainConfig(
        tasks_dir=train_dir, rollout_batch_size=cfg.tasks_per_update, model=str(sft_dir), agent="native", env="local",
        n_samples=cfg.n_samples, concurrency=cfg.concurrency, step_limit=learning.step_limit,
        max_new_tokens=learning.max_new_tokens, temperature=learning.temperature, lora=False, device="cpu",
        num_rollouts=cfg.updates, lr=cfg.lr, kl_coef=0.0, updates_per_rollout=cfg.updates_per_rollout,
        output_dir=out, save_every=0, seed=cfg.seed, max_staleness=k, use_tis=cfg.use_tis,
    ))
    metrics = [m for m in json.loads((out / "metrics.json").read_text()) if m["step"] > 0]
    trained = 0
    for m in metrics:
        kept = {(s.group_index, s.rollout_id) for s in read_jsonl(out / "rollouts" / f"step_{m['step']}" / "samples.jsonl")
                if not s.remove_sample and s.reward is not None and any(s.loss_mask)}
        trained += len(kept) if m["skipped"] is None else 0
    wall = summary["wall_seconds_this_run"]
    waited = sum(m["timings"]["learner_wait_s"] if k else m["timings"]["rollout_s"] for m in metrics)
    heldout = evaluate(learning, out / "final", heldout_dir, cfg.out / "eval" / f"k{k}")
    return {"max_staleness": k, "updates": len(metrics), "trained_episodes": trained, "wall_s": round(wall, 1),
            "episodes_per_min": round(trained / wall * 60, 2), "learner_idle": round(waited / wall, 3),
            "heldout": round(heldout["success"], 3), "stale": summary["masked_episodes"]["stale"],
            "heldout_trials": heldout["n_trials"]}


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = LongTailConfig()
    for f in dataclasses.fields(LongTailConfig):
        value = getattr(defaults, f.name)
        if isinstance(value, bool):
            p.add_argument("--" + f.name.replace("_", "-"), type=lambda v: v.lower() in ("1", "true", "yes"),
                           default=value)
        elif isinstance(value, (list, tuple)):
            p.add_argument("--" + f.name.replace("_", "-"), nargs="+", type=type(value[0]), default=value)
        else:
            p.add_argument("--" + f.name.replace("_", "-"), type=type(value), default=value)
    cfg = LongTailConfig(**vars(p.parse_args(argv)))
    learning = LearningConfig(out=cfg.out, seed=cfg.seed, eval_samples=2, concurrency=cfg.concurrency)
    started = time.monotonic()
    if cfg.out.exists():
        import shutil

        shutil.rmtree(cfg.out)
    cfg.out.mkdir(parents=True)
    sft_dir, train_dir, heldout_dir = setup(cfg, learning)
    initial = evaluate(learning, sft_dir, heldout_dir, cfg.out / "eval" / "initial")
    print(f"[{time.monotonic() - started:.0f}s] SFT start ready; held-out {initial['success']:.3f}", file=sys.stderr)
    arms = []
    for k in cfg.arms:
        arms.append(run_arm(cfg, learning, k, sft_dir, train_dir, heldout_dir))
        print(f"[{time.monotonic() - started:.0f}s] arm K={k} done: {arms[-1]}", file=sys.stderr)
    print(f"initial heldout={initial['success']:.3f}")
    for a in arms:
        print(" ".join(f"{k}={a[k]}" for k in ("max_staleness", "updates", "trained_episodes", "wall_s",
                                                "episodes_per_min", "learner_idle", "heldout", "stale")))
    (cfg.out / "results.json").write_text(json.dumps({"initial_heldout": initial["success"], "arms": arms,
                                                      "config": {k: str(v) for k, v in vars(cfg).items()},
                                                      "wall_s": round(time.monotonic() - started, 1)}, indent=1))
    print(f"total wall {time.monotonic() - started:.0f}s; results in {cfg.out / 'results.json'}")
    return arms


if __name__ == "__main__":
    main()
