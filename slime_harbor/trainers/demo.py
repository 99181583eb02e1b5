"""`slime-harbor demo`: SFT warm start, then GRPO, with held-out success before and after.

The demo's config (LearningConfig, shared with the learning benchmark bench/learning.py, which
runs the same stages longer and adds its own evaluations and an RFT arm), its stages (the
procedural tasks and their GRPO schedule, the SFT warm start) and run_demo: one local-trainer run
of grpo_steps steps (rollout_batch_size tasks a step from the training pool) whose own held-out
evaluation (eval_tasks) runs before the first and after the last step, wandb offline, the reward
curve.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from slime_harbor.tasks import families as task_families
from slime_harbor.policy.renderer import make_renderer
from slime_harbor.policy.sampling import SamplingParams
from slime_harbor.config_docs import add_field_flags
from slime_harbor.trainers.local import train
from slime_harbor.trainers.local_config import check_train_config, LocalTrainConfig
from slime_harbor.trainers.sft import oracle_episode, SFTConfig, sequence_logprob, sft_model_dir
from slime_harbor.policy.format_tokenizers import TRAINED_ON_REQUEST
from slime_harbor.policy.tiny_model import TinyModelConfig, build_tiny_model


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
    temperature: float = SamplingParams.temperature
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
    renderer = make_renderer(base, tokenizer)
    if cfg.agent == "native":
        def episode(inst, command=None):
            return oracle_episode(renderer, tokenizer, inst, command)
    else:  # the agent's own format, read off one real trial of it in the run's sandbox
        from slime_harbor.trainers.agent_sft import capture_format, oracle_agent_episode

        fmt = capture_format(cfg.agent, cfg.env, probe[0], work, max_new_tokens=cfg.max_new_tokens, model_dir=base)

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


def fresh_start(cfg) -> None:
    """Seed torch, use both cores, and empty cfg.out: a run starts from nothing."""
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(2)
    if cfg.out.exists():
        shutil.rmtree(cfg.out)
    cfg.out.mkdir(parents=True)


def add_flags(p: argparse.ArgumentParser, defaults: LearningConfig, skip: tuple[str, ...] = ()) -> None:
    """One flag per LearningConfig field but `skip` (underscores -> dashes), defaulting to
    `defaults`, its help the field's docstring; a true / false field takes the word."""
    add_field_flags(p, LearningConfig, defaults, skip=skip, bools="value")


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


def run_demo(cfg: LearningConfig, wandb_project: str | None = DEMO_WANDB_PROJECT, guard=None, **run_settings) -> dict:
    """SFT warm start, then cfg.grpo_steps GRPO steps in one local-trainer run whose own held-out
    evaluation (eval_samples episodes of each held-out instance, before the first step and after
    the last) gives the before/after figures. Writes OUT/results.json; prints where everything is.
    `guard`: the command line's SignalGuard (SIGINT / SIGTERM stop the GRPO run in order);
    `run_settings`: RunSettings knobs for the GRPO run (reward_mapping, hack_action, ...)."""
    started = time.monotonic()
    fresh_start(cfg)
    timings: dict[str, float] = {}

    def stage(name: str, t0: float) -> None:
        timings[name] = round(time.monotonic() - t0, 1)
        print(f"[{time.monotonic() - started:6.1f}s] {name} done in {timings[name]}s", file=sys.stderr)

    t = time.monotonic()
    print("1/3 tiny model and procedural tasks (train / held-out splits)", file=sys.stderr)
    renderer = run_settings.get("renderer") or "qwen3"
    # A vocabulary trained here where the family's real one is huge (Qwen3.5/3.6: 248k ids, ~95% of
    # a CPU training step in the LM head); gpt-oss keeps o200k (harmony renders with its ids).
    shape = TinyModelConfig(trained_vocab=renderer in TRAINED_ON_REQUEST)
    base = build_tiny_model(cfg.out / "models" / "base", seed=cfg.seed, config=shape, renderer=renderer)
    train_dir, heldout_dir, schedule = setup_tasks(cfg)
    sft_dir, grpo_dir = cfg.out / "models" / "sft", cfg.out / "grpo"
    config = LocalTrainConfig(
        tasks_dir=train_dir, rollout_batch_size=cfg.train_instances * len(cfg.families), model=str(sft_dir),
        agent=cfg.agent, env=cfg.env, n_samples=cfg.n_samples, concurrency=cfg.concurrency, step_limit=cfg.step_limit,
        max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, lora=cfg.lora, device="cpu",
        num_rollouts=cfg.grpo_steps, lr=cfg.lr, kl_coef=cfg.kl_coef, updates_per_rollout=cfg.updates_per_rollout,
        output_dir=grpo_dir, save_every=0, seed=cfg.seed, progress=True, eval_tasks=heldout_dir,
        eval_n_samples=cfg.eval_samples, eval_every=cfg.eval_every, wandb_project=wandb_project or None,
        wandb_run_name=f"demo-seed{cfg.seed}", **run_settings,
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
            "training_trials": str(grpo_dir / "rollouts" / "trials"),
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
    print(f"  training trials           {o['training_trials']}")
    print(f"  models                    {o['sft_model']} (after SFT), {o['final_model']} (after GRPO)")
    print(f"  summary                   {o['results']}")
    print(f"held-out success: {f(s['sft_only'])} (after SFT) -> {f(s['sft_grpo'])} (after GRPO) "
          f"over {results['heldout_trials_per_eval']} held-out trials each")
