"""SFT warm start, then GRPO, with held-out success before and after: the stages of bench/learning.py
(the learning benchmark: its docstring has the method and why) and of `slime-harbor demo`.

Benchmark: `run(LearningConfig())`, SFT -> held-out evals of the base and SFT models -> 40 GRPO
steps, one local-trainer call per step on that step's fresh training instances.
Demo (`run_demo`): the same tasks, SFT warm start and trainer, shorter: one local-trainer call
for every GRPO step (rollout_batch_size tasks a step from the training pool), its held-out
evaluation before the first and after the last step (eval_tasks), wandb offline, the reward curve.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import shutil
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch

from slime_harbor.tasks import families as task_families
from slime_harbor.policy.engine import EngineConfig
from slime_harbor.policy.renderer import make_renderer
from slime_harbor.trainers.local import train
from slime_harbor.trainers.local_config import check_train_config, LocalTrainConfig
from slime_harbor.policy.server import EmbeddedPolicyServer
from slime_harbor.rollout import run_rollouts
from slime_harbor.trial_setup import RolloutConfig
from slime_harbor.trainers.sft import SFTConfig, sequence_logprob, sft_model_dir
from slime_harbor.policy.tiny_model import build_tiny_model
from slime_harbor.trainers.tracking import plot_reward_curve


@dataclass
class LearningConfig:
    """Every knob of the benchmark; each is a flag (underscores -> dashes)."""

    out: Path = Path("runs/learning")
    """Output dir (emptied first): models, tasks, rollouts, results.json, reward_curve.png."""
    seed: int = 0
    """Seeds the tiny model, the task draws, SFT, sampling and GRPO."""

    # --- agent ---
    agent: str = "native"
    """native, or mini-swe-agent: Harbor's own mini-swe-agent (its default tool-calling config)
    through the recording gateway, warm-started on episodes in its own format (read off one real
    trial of it: trainers/agent_sft.py)."""
    env: str = "local"
    """Sandbox: local (bubblewrap) or docker."""

    # --- tasks ---
    families: list[str] = dataclasses.field(
        default_factory=lambda: [f for f in task_families.FAMILIES if f != "replace-word"])
    """Task families to train and test on. replace-word is left out by default: its command
    (`sed -i 's/X/Y/g' F`, three names to copy) stays at success 0 for the tiny model after 4x
    the SFT this benchmark does, so it would add trials without signal."""
    train_instances: int = 4
    """Training instances per family per GRPO step (new ones each step while a family has them)."""
    heldout_instances: int = 16
    """Held-out instances per family the success rates are measured on (16 x 6 families x 2
    episodes = 192 trials per evaluation: a success rate's standard error is then <= 0.036)."""
    eval_samples: int = 2
    """Episodes per held-out instance per evaluation."""

    # --- SFT warm start ---
    sft_instances: int = 150
    """Training instances per family whose episodes SFT sees: enough that copying names from
    the instruction is cheaper than memorising them (with 8, held-out success stayed at 0)."""
    demo_error_share: float = 0.5
    """Share of SFT demonstrations whose command is the family's near miss (cp for mv, touch for
    mkdir, ...) instead of the oracle's: an imperfect demonstrator. 0 = oracle only."""
    sft_target: float = 0.4
    """SFT stops once the policy would sample the oracle episode of GRPO's first training
    instances (unseen by SFT) with this mean probability (at most 1 - demo_error_share). Early,
    so that SFT alone leaves the policy well below success 1; a target rather than a step count
    because the copying skill appears abruptly, at a step that depends on the seed."""
    sft_check_every: int = 25
    """SFT steps between two checks of sft_target."""
    sft_max_steps: int = 1500
    """SFT steps at most (the target is normally met after ~500-700)."""
    sft_lr: float = 1e-2
    """AdamW learning rate of SFT (a model from scratch takes large steps)."""
    sft_batch_size: int = 8
    """Episodes per SFT step."""
    sft_native_steps: int = 0
    """For a third-party agent: SFT steps on the native agent's episodes of the same instances
    before SFT in the agent's own format. The native episodes are short (the names 6 tokens
    before the reply that copies them), so the tiny model learns to copy there within ~700 steps,
    and then in the agent's format within a few hundred more, where it alone stays near chance
    after 750 (bench/agent_sft.py --native-first)."""

    # --- episodes ---
    step_limit: int = 3
    """Agent turns per episode (the oracle needs 2: the command, then submit)."""
    max_new_tokens: int = 48
    """Tokens per turn (the longest oracle reply is ~40)."""
    temperature: float = 1.0
    """Sampling temperature of GRPO rollouts and of the evaluations."""
    concurrency: int = 16
    """Trials at once (the engine batches their generations)."""

    # --- GRPO (local_trainer) ---
    grpo_steps: int = 40
    """GRPO steps (one rollout of the step's training instances, n_samples each, then updates)."""
    n_samples: int = 4
    """GRPO group size."""
    lr: float = 1e-3
    """Production GRPO uses 1e-6 on a pretrained model; the tiny model trained from scratch
    moves only with a far larger step."""
    lora: bool = False
    """LoRA adapters (True) or every weight (False, the default here: the tiny model is small)."""
    kl_coef: float = 0.0
    """No KL towards the SFT model: the point is to move away from it."""
    updates_per_rollout: int = 2
    """Optimizer steps per rollout (minibatches of its episodes)."""
    eval_every: int = 10
    """Measure held-out success every this many GRPO steps too (for the curve); <= 0: only at the end."""
    rft_arm: bool = False
    """bench/learning.py (on by default there; not in the demo): also train an RFT arm (rejection fine-tuning: the likelihood of the successful episodes
    only) from the same SFT model, on the same schedule of training instances with the same group
    size, sampling and learning rate, and measure it on the same held-out tasks."""


# --------------------------------------------------------------------------------------------


def grpo_schedule(cfg: LearningConfig) -> list[list[task_families.Instance]]:
    """The training instances of each GRPO step: train_instances per family, fresh each step while
    the family has unused ones (then cycling), so GRPO has to learn the skill, not the answers."""
    pools = {family: task_families.instances(family, cfg.grpo_steps * cfg.train_instances, cfg.seed, "train",
                                             strict=False)
             for family in cfg.families}
    return [[pool[(step * cfg.train_instances + j) % len(pool)]
             for pool in pools.values() for j in range(cfg.train_instances)]
            for step in range(cfg.grpo_steps)]


def sft_episodes(cfg: LearningConfig, base: Path, tokenizer, probe: list[task_families.Instance], work: Path):
    """The SFT warm start's data in cfg.agent's format: (episodes of sft_instances training
    instances per family, a demo_error_share of them with the near miss for command; the oracle
    episodes of `probe`, which SFT does not see; how many episodes have the near miss). `work`:
    where a third-party agent's format is read off a trial of it."""
    unseen = {inst.name for inst in probe}
    demonstrator = random.Random(cfg.seed)
    demos = [(inst, demonstrator.random() < cfg.demo_error_share)
             for family in cfg.families
             for inst in task_families.instances(family, cfg.sft_instances, cfg.seed + 1, "train", strict=False)
             if inst.name not in unseen]
    if cfg.agent == "native":
        def episode(inst, command=None):
            return task_families.oracle_episode(tokenizer, inst, command)
    else:  # the agent's own format, read off one real trial of it in the run's sandbox
        from slime_harbor.trainers.agent_sft import capture_format, oracle_agent_episode

        fmt = capture_format(cfg.agent, cfg.env, probe[0], work, max_new_tokens=cfg.max_new_tokens, model_dir=base)
        renderer = make_renderer(base, tokenizer)

        def episode(inst, command=None):
            return oracle_agent_episode(fmt, renderer, tokenizer, inst, command)
    sequences = [episode(inst, inst.near_miss if wrong else None) for inst, wrong in demos]
    return sequences, [episode(inst) for inst in probe], sum(wrong for _, wrong in demos)


def sft_warm_start(cfg: LearningConfig, base: Path, out: Path, probe: list[task_families.Instance],
                   progress: bool = False) -> dict:
    """SFT on episodes of training instances (a demo_error_share of them with the near miss for
    command) until the policy samples the oracle episodes of `probe` (training instances SFT
    does not see) with mean probability sft_target."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base)
    sequences, probe_sequences, n_near_miss = sft_episodes(cfg, base, tokenizer, probe,
                                                           out.parent / f"{cfg.agent}-format")
    history: list[tuple[int, float]] = []
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=cfg.sft_max_steps, desc="SFT steps (stops at the target)", unit="step", dynamic_ncols=True)

    def until(step: int, model) -> bool:
        if bar is not None:
            bar.update(1)
        if step % cfg.sft_check_every:
            return False
        with torch.no_grad():
            p = sequence_logprob(model, probe_sequences, tokenizer.pad_token_id).exp().mean().item()
        history.append((step, p))
        if bar is not None:
            bar.set_postfix(p_oracle=f"{p:.3f}", target=cfg.sft_target)
        else:
            print(f"  SFT step {step}: P(oracle episode) {p:.3f}", file=sys.stderr)
        return p >= cfg.sft_target

    config = SFTConfig(steps=cfg.sft_max_steps, lr=cfg.sft_lr, batch_size=cfg.sft_batch_size, seed=cfg.seed)
    model_dir, native_steps = base, 0
    if cfg.agent != "native" and cfg.sft_native_steps > 0:
        # The copying skill first, where it is cheap to learn (see sft_native_steps).
        native, _, _ = sft_episodes(dataclasses.replace(cfg, agent="native"), base, tokenizer, probe, out.parent)
        model_dir = out.parent / "sft-native"
        t = time.monotonic()
        native_steps = len(sft_model_dir(base, model_dir, sequences=native,
                                         config=dataclasses.replace(config, steps=cfg.sft_native_steps)))
        print(f"  SFT on {len(native)} native-format episodes: {native_steps} steps in "
              f"{time.monotonic() - t:.0f}s; now in {cfg.agent}'s format", file=sys.stderr)
    try:
        losses = sft_model_dir(model_dir, out, config=config, sequences=sequences, until=until)
    finally:
        if bar is not None:
            bar.close()
    return {"steps": len(losses), "native_steps": native_steps, "n_episodes": len(sequences),
            "n_near_miss_episodes": n_near_miss, "loss_first": losses[0], "loss_last": losses[-1],
            "p_oracle_episode": history}


def evaluate(cfg: LearningConfig, model_dir: Path, tasks_dir: Path, out: Path) -> dict:
    """Held-out success: eval_samples real trials per task, cfg.agent sampling from model_dir."""
    engine_config = EngineConfig(seed=cfg.seed)
    with EmbeddedPolicyServer(model_dir, engine_config=engine_config, model_name="policy") as server:
        rollout = RolloutConfig(
            tasks_dir=tasks_dir, agent=cfg.agent, env=cfg.env, n_samples=cfg.eval_samples, policy_url=server.url,
            model_dir=str(model_dir), concurrency=cfg.concurrency, out_dir=out, temperature=cfg.temperature,
            step_limit=cfg.step_limit, max_new_tokens=cfg.max_new_tokens, progress=False,
        )
        summary = asyncio.run(run_rollouts(rollout))
    by_family: dict[str, list[float]] = defaultdict(list)
    unscored = 0
    for task, rewards in summary["per_task_rewards"].items():
        # An unscored trial (an infrastructure failure) says nothing of the policy: left out and
        # counted, as trainers/evaluate.py does.
        by_family[task_families.family_of(task)] += [float(r) for r in rewards if r is not None]
        unscored += sum(r is None for r in rewards)
    everything = [r for rs in by_family.values() for r in rs]
    return {
        "success": sum(r >= 1.0 for r in everything) / len(everything) if everything else None,
        "per_family": {f: sum(r >= 1.0 for r in rs) / len(rs) for f, rs in sorted(by_family.items()) if rs},
        "n_trials": len(everything),
        "n_unscored": unscored,
        "errors": len(summary["errors"]),
        "wall_s": summary["wall_seconds"],
    }


def _rate(x: float | None) -> str:
    return "n/a (no trial scored)" if x is None else f"{x:.3f}"


def _delta(after: float | None, before: float | None) -> float | None:
    return None if after is None or before is None else after - before


def grpo(cfg: LearningConfig, model_dir: Path, tasks_dir: Path, schedule: list[list[task_families.Instance]],
         out: Path, on_step, objective: str = "grpo") -> list[dict]:
    """GRPO with local_trainer.train, one call per step (each resuming the last one's checkpoint:
    weights, optimizer and RNG state) so each step trains on its own instances; `on_step(step,
    checkpoint)` runs after each. Returns the trainer's per-step metrics."""
    for step, step_instances in enumerate(schedule, start=1):
        config = LocalTrainConfig(
            tasks_dir=tasks_dir, task_names=[inst.name for inst in step_instances], model=str(model_dir),
            agent=cfg.agent, env=cfg.env, n_samples=cfg.n_samples, concurrency=cfg.concurrency, step_limit=cfg.step_limit,
            max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, lora=cfg.lora, device="cpu",
            num_rollouts=step, lr=cfg.lr, kl_coef=cfg.kl_coef, updates_per_rollout=cfg.updates_per_rollout,
            output_dir=out, save_every=1, seed=cfg.seed, resume=out / f"checkpoint_{step - 1}" if step > 1 else None,
            objective=objective,
        )
        train(config)
        if step > 1:  # keep only the latest checkpoint
            shutil.rmtree(out / f"checkpoint_{step - 1}")
        on_step(step, out / f"checkpoint_{step}")
    return json.loads((out / "metrics.json").read_text())


TITLE = "Tiny model on procedural Harbor task families (local GRPO)"


def plot(path: Path, metrics: list[dict], heldout_curve: list[tuple[int, float]]) -> None:
    """GRPO training reward per step and held-out success (step 0 = SFT only) on one chart."""
    plot_reward_curve(path, [m["step"] for m in metrics], [m["reward_mean"] for m in metrics], heldout_curve,
                      TITLE, heldout_label="held-out success (step 0: SFT only)")


def _fresh_start(cfg) -> None:
    """Seed torch, use both cores, and empty cfg.out: a run starts from nothing."""
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(2)
    if cfg.out.exists():
        shutil.rmtree(cfg.out)
    cfg.out.mkdir(parents=True)


def run(cfg: LearningConfig) -> dict:
    started = time.monotonic()
    _fresh_start(cfg)
    timings: dict[str, float] = {}

    def lap(name: str, t0: float) -> None:
        timings[name] = round(timings.get(name, 0.0) + time.monotonic() - t0, 1)
        print(f"[{time.monotonic() - started:6.1f}s] {name} done ({timings[name]}s so far)", file=sys.stderr)

    t = time.monotonic()
    base = build_tiny_model(cfg.out / "models" / "base", seed=cfg.seed)
    train_dir, heldout_dir, schedule = setup_tasks(cfg)
    lap("setup", t)

    t = time.monotonic()
    sft_dir = cfg.out / "models" / "sft"
    sft = sft_warm_start(cfg, base, sft_dir, probe=schedule[0])
    lap("sft", t)

    evals = {}
    for name, model in (("base", base), ("sft", sft_dir)):
        t = time.monotonic()
        evals[name] = evaluate(cfg, model, heldout_dir, cfg.out / "eval" / name)
        lap("eval", t)
    heldout_curve = [(0, evals["sft"]["success"])]

    def on_step(step: int, checkpoint: Path) -> None:
        if step == cfg.grpo_steps or (cfg.eval_every > 0 and step % cfg.eval_every == 0):
            t = time.monotonic()
            evals[f"grpo_step_{step}"] = evaluate(cfg, checkpoint, heldout_dir, cfg.out / "eval" / f"grpo_step_{step}")
            heldout_curve.append((step, evals[f"grpo_step_{step}"]["success"]))
            print(f"  held-out success after GRPO step {step}: {_rate(heldout_curve[-1][1])}", file=sys.stderr)
            lap("eval", t)

    t, eval_so_far = time.monotonic(), timings["eval"]
    metrics = grpo(cfg, sft_dir, train_dir, schedule, cfg.out / "grpo", on_step)
    timings["grpo"] = round(time.monotonic() - t - (timings["eval"] - eval_so_far), 1)  # without its evals
    evals["grpo"] = evals[f"grpo_step_{cfg.grpo_steps}"]

    rft_metrics = []
    if cfg.rft_arm:  # the same SFT start, instances, group size, sampling and lr; only the loss differs
        t = time.monotonic()

        def on_rft_step(step: int, checkpoint: Path) -> None:
            if step == cfg.grpo_steps:
                evals["rft"] = evaluate(cfg, checkpoint, heldout_dir, cfg.out / "eval" / "rft")

        rft_metrics = grpo(cfg, sft_dir, train_dir, schedule, cfg.out / "rft", on_rft_step, objective="rft")
        lap("rft", t)

    plot(cfg.out / "reward_curve.png", metrics, heldout_curve)
    before, after = evals["sft"]["success"], evals["grpo"]["success"]
    results = {
        "heldout_success": {"base": evals["base"]["success"], "sft_only": before, "sft_grpo": after,
                            "delta_grpo": _delta(after, before),
                            **({"sft_rft": evals["rft"]["success"], "delta_rft": _delta(evals["rft"]["success"], before)}
                               if cfg.rft_arm else {})},
        "rft_train_reward": [m["reward_mean"] for m in rft_metrics],
        "heldout_curve": heldout_curve,
        "evals": evals,
        "sft": sft,
        "grpo_train_reward": [m["reward_mean"] for m in metrics],
        "grpo_skipped_steps": [m["step"] for m in metrics if m["skipped"]],
        "timings_s": timings,
        "wall_s": round(time.monotonic() - started, 1),
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(cfg).items()},
    }
    (cfg.out / "results.json").write_text(json.dumps(results, indent=1))
    report(results, cfg)
    return results


def report(results: dict, cfg: LearningConfig) -> None:
    s, e = results["heldout_success"], results["evals"]
    print(f"held-out success, {e['sft']['n_trials']} real trials each ({cfg.eval_samples} episodes x "
          f"{cfg.heldout_instances} unseen instances x {len(cfg.families)} families, T={cfg.temperature}):")
    delta = s["delta_grpo"]
    print(f"  base (no SFT)  {_rate(s['base'])}")
    print(f"  SFT only       {_rate(s['sft_only'])}")
    print(f"  SFT + GRPO     {_rate(s['sft_grpo'])}   ({cfg.grpo_steps} GRPO steps)")
    print(f"  delta (GRPO)   {'n/a' if delta is None else format(delta, '+.3f')}   target >= +0.200: "
          f"{'MET' if delta is not None and delta >= 0.2 else 'NOT MET'}")
    if "sft_rft" in s:
        print(f"  SFT + RFT      {_rate(s['sft_rft'])}   ({cfg.grpo_steps} steps, the same rollouts per step; delta "
              f"{'n/a' if s['delta_rft'] is None else format(s['delta_rft'], '+.3f')})")
    print("  held-out curve " + "  ".join(f"step {k}: {_rate(v)}" for k, v in results["heldout_curve"]))
    families = list(e["sft"]["per_family"])
    print("  per family     " + " ".join(f"{f[:12]:>12s}" for f in families))
    for name in [n for n in ("base", "sft", "grpo", "rft") if n in e]:
        print(f"  {name:14s} " + " ".join(f"{e[name]['per_family'].get(f, float('nan')):12.2f}" for f in families))
    rewards = " ".join("n/a" if r is None else f"{r:.2f}" for r in results["grpo_train_reward"])
    print(f"GRPO training reward per step: {rewards}")
    sft = results["sft"]
    print(f"SFT: {sft['steps']} steps on {sft['n_episodes']} episodes ({sft['n_near_miss_episodes']} with the near miss), "
          f"loss {sft['loss_first']:.3f} -> "
          f"{sft['loss_last']:.3f}, P(oracle episode of unseen training instances) {sft['p_oracle_episode'][-1][1]:.3f}")
    print(f"wall {results['wall_s']:.0f}s, {results['timings_s']}")
    print(f"wrote {cfg.out / 'results.json'} and {cfg.out / 'reward_curve.png'}")


def add_flags(p: argparse.ArgumentParser, defaults: LearningConfig, skip: tuple[str, ...] = ()) -> None:
    """One flag per LearningConfig field but `skip` (underscores -> dashes), defaulting to
    `defaults`, its help the field's docstring."""
    from slime_harbor.trainers.local import field_docs

    docs = field_docs(LearningConfig)
    for f in dataclasses.fields(LearningConfig):
        if f.name in skip:
            continue
        default = getattr(defaults, f.name)
        flag = "--" + f.name.replace("_", "-")
        help_text = docs.get(f.name, "").replace("%", "%%")
        if isinstance(default, list):
            p.add_argument(flag, nargs="+", default=default, help=help_text)
        elif isinstance(default, bool):
            p.add_argument(flag, type=lambda v: v.lower() in ("1", "true", "yes"), default=default, help=help_text)
        else:
            p.add_argument(flag, type=type(default), default=default, help=help_text)


def config_from_args(argv: list[str] | None = None) -> LearningConfig:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_flags(p, LearningConfig(rft_arm=True))  # the bench measures GRPO against RFT by default
    return LearningConfig(**vars(p.parse_args(argv)))


# --------------------------------------------------------------------------------------------
# The demo: `slime-harbor demo`.

DEMO_DEFAULTS = LearningConfig(out=Path("runs/demo"), grpo_steps=12, eval_every=0)
"""The benchmark's tasks, SFT and hyperparameters, with fewer GRPO steps (see run_demo)."""
DEMO_AGENT_DEFAULTS = {
    "native": {},
    # Its replies are tool calls in JSON (the submit call is 61 tokens of the tiny model's).
    # Half the training tasks per step: each of its trials starts a Python with LiteLLM (~2.5 s of
    # CPU), where the native agent starts none.
    # SFT learns to copy the task's names in the native format first (sft_native_steps).
    "mini-swe-agent": {"agent": "mini-swe-agent", "max_new_tokens": 64, "train_instances": 2,
                       "sft_native_steps": 700},
}
"""What `demo --agent NAME` changes in DEMO_DEFAULTS (the agents the demo can warm-start)."""


def demo_defaults(agent: str = "native") -> LearningConfig:
    """The demo's defaults for `agent`: DEMO_DEFAULTS with the agent's own settings."""
    if agent not in DEMO_AGENT_DEFAULTS:
        raise ValueError(f"the demo runs {' or '.join(DEMO_AGENT_DEFAULTS)}, not agent {agent!r}")
    return dataclasses.replace(DEMO_DEFAULTS, **DEMO_AGENT_DEFAULTS[agent])
DEMO_WANDB_PROJECT = "slime-harbor-demo"


def setup_tasks(cfg: LearningConfig) -> tuple[Path, Path, list[list[task_families.Instance]]]:
    """Write the GRPO training instances and the held-out instances; returns (train dir, held-out dir, schedule)."""
    schedule = grpo_schedule(cfg)
    train_dir, heldout_dir = cfg.out / "tasks" / "train", cfg.out / "tasks" / "heldout"
    for inst in {inst.name: inst for step in schedule for inst in step}.values():
        task_families.write_task(inst, train_dir)
    task_families.generate(heldout_dir, cfg.heldout_instances, cfg.seed, "heldout", cfg.families)
    return train_dir, heldout_dir, schedule


def run_demo(cfg: LearningConfig, wandb_project: str | None = DEMO_WANDB_PROJECT, guard=None,
             reward_mapping: str = "raw", hack_action: str = "flag") -> dict:
    """SFT warm start, then cfg.grpo_steps GRPO steps in one local-trainer run whose own held-out
    evaluation (eval_samples episodes of each held-out instance, before the first step and after
    the last) gives the before/after figures. Writes OUT/results.json; prints where everything is.
    `guard`: the command line's SignalGuard (SIGINT / SIGTERM stop the GRPO run in order)."""
    started = time.monotonic()
    _fresh_start(cfg)
    timings: dict[str, float] = {}

    def stage(name: str, t0: float) -> None:
        timings[name] = round(time.monotonic() - t0, 1)
        print(f"[{time.monotonic() - started:6.1f}s] {name} done in {timings[name]}s", file=sys.stderr)

    t = time.monotonic()
    print("1/3 tiny model and procedural tasks (train / held-out splits)", file=sys.stderr)
    base = build_tiny_model(cfg.out / "models" / "base", seed=cfg.seed)
    train_dir, heldout_dir, schedule = setup_tasks(cfg)
    sft_dir, grpo_dir = cfg.out / "models" / "sft", cfg.out / "grpo"
    config = LocalTrainConfig(
        tasks_dir=train_dir, rollout_batch_size=cfg.train_instances * len(cfg.families), model=str(sft_dir),
        agent=cfg.agent, env=cfg.env, n_samples=cfg.n_samples, concurrency=cfg.concurrency, step_limit=cfg.step_limit,
        max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, lora=cfg.lora, device="cpu",
        num_rollouts=cfg.grpo_steps, lr=cfg.lr, kl_coef=cfg.kl_coef, updates_per_rollout=cfg.updates_per_rollout,
        output_dir=grpo_dir, save_every=0, seed=cfg.seed, progress=True, reward_mapping=reward_mapping,
        hack_action=hack_action, eval_tasks=heldout_dir, eval_n_samples=cfg.eval_samples, eval_every=cfg.eval_every,
        wandb_project=wandb_project or None, wandb_run_name=f"demo-seed{cfg.seed}",
    )
    check_train_config(dataclasses.replace(config, model=None))  # bad settings fail now, not after SFT
    stage("setup", t)

    t = time.monotonic()
    print(f"2/3 SFT warm start on {len(cfg.families)} task families (imperfect demonstrator)", file=sys.stderr)
    sft = sft_warm_start(cfg, base, sft_dir, probe=schedule[0], progress=True)
    stage("sft", t)

    t = time.monotonic()
    n_heldout = len(list(heldout_dir.iterdir()))
    print(f"3/3 GRPO: {cfg.grpo_steps} steps of {cfg.train_instances * len(cfg.families)} tasks x {cfg.n_samples} "
          f"real trials; held-out evaluation ({n_heldout} tasks x {cfg.eval_samples}) before and after", file=sys.stderr)
    summary = train(config, guard)
    stage("grpo (with its evaluations)", t)

    evals = summary["evals"]
    before, after = evals[0]["pass@1"], evals[-1]["pass@1"]
    results = {
        "heldout_success": {"sft_only": before, "sft_grpo": after,
                            "delta_grpo": None if None in (before, after) else after - before},
        "heldout_curve": [(e["step"], e["pass@1"]) for e in evals],
        "heldout_trials_per_eval": evals[0]["n_trials"],
        "sft": sft,
        "grpo_train_reward": [m["reward_mean"] for m in json.loads((grpo_dir / "metrics.json").read_text())
                              if "reward_mean" in m],
        "timings_s": timings,
        "wall_s": round(time.monotonic() - started, 1),
        # Wall time on a shared machine says little without the load it ran under.
        "load_average_1_5_15_min_at_end": [round(x, 2) for x in os.getloadavg()],
        "cpu_count": os.cpu_count(),
        "outputs": {
            "reward_curve": summary.get("reward_curve"),
            "wandb_run": summary.get("wandb_dir"),
            "metrics": str(grpo_dir / "metrics.json"),
            "heldout_trials": str(grpo_dir / "eval"),
            "training_trials": str(grpo_dir / "rollouts"),
            "final_model": summary["final"],
            "sft_model": str(sft_dir),
            "results": str(cfg.out / "results.json"),
        },
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(cfg).items()},
    }
    (cfg.out / "results.json").write_text(json.dumps(results, indent=1))
    demo_report(results)
    return results


def demo_report(results: dict) -> None:
    def f(x):
        return "n/a" if x is None else f"{x:.3f}"

    s, o = results["heldout_success"], results["outputs"]
    rewards = " ".join("n/a" if r is None else f"{r:.2f}" for r in results["grpo_train_reward"])
    print(f"GRPO training reward per step: {rewards}")
    load = results["load_average_1_5_15_min_at_end"]
    print(f"SFT: {results['sft']['steps']} steps; wall {results['wall_s']:.0f}s {results['timings_s']}; "
          f"load average {load[0]} / {load[1]} / {load[2]} (1 / 5 / 15 min) on {results['cpu_count']} CPUs")
    print("outputs:")
    print(f"  reward curve (PNG)        {o['reward_curve']}")
    wandb_note = " (offline: `wandb sync DIR` uploads it)" if o["wandb_run"] and "offline-run" in o["wandb_run"] else ""
    print(f"  wandb run                 {o['wandb_run']}{wandb_note}")
    print(f"  per-step metrics          {o['metrics']}")
    print(f"  held-out trials           {o['heldout_trials']}/step_N/trials")
    print(f"  training trials           {o['training_trials']}/step_N/trials")
    print(f"  models                    {o['sft_model']} (after SFT), {o['final_model']} (after GRPO)")
    print(f"  summary                   {o['results']}")
    print(f"held-out success: {f(s['sft_only'])} (after SFT) -> {f(s['sft_grpo'])} (after GRPO) "
          f"over {results['heldout_trials_per_eval']} held-out trials each")
