"""What a local GRPO run is told: LocalTrainConfig (every field is a `train-local` flag: see
trainers/local.py's build_parser, which reads the fields' comments as help), the --test preset,
and the checks that refuse a bad config in one line before anything starts (a --resume path
with no checkpoint, a device that is not there).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from slime_harbor.exits import ConfigError
from slime_harbor.filters import TrajectoryFilters
from slime_harbor.grpo import GRPOConfig
from slime_harbor.policy.sampling import SamplingParams
from slime_harbor.agents.settings import EpisodeLimits
from slime_harbor.agents.placement import samples_policy
from slime_harbor.run_config import check_config, RolloutConfig, RunSettings
from slime_harbor.trial_setup import check_environment_runs


# --test: five of the easy bundled tasks, short episodes, two steps, a checkpoint after each.
TEST_TASKS = ["dedupe-lines", "fix-sort-key", "count-errors", "fizzbuzz-params", "top-words"]
TEST_PRESET: dict[str, Any] = {
    "task_names": TEST_TASKS, "num_rollouts": 2, "step_limit": 3, "max_new_tokens": 48, "save_every": 1,
}
OBJECTIVES = ("grpo", "rft")
TRAINER_STATE = "trainer_state.json"  # marks a checkpoint dir: step, base model, metrics so far



# TrajectoryFilters named first: a dataclass takes its bases' fields from the last base on, so the
# --mask-* flags come after the shared knobs in --help, before this class's own.
@dataclass
class LocalTrainConfig(TrajectoryFilters, RunSettings, EpisodeLimits):
    """Every knob of a local GRPO run. Each field is a command-line flag (underscores -> dashes).
    The knobs every runner shares (tasks, agent, env, group size, hack monitor, ...) are
    RunSettings', the episode limits EpisodeLimits' and the mask switches TrajectoryFilters':
    declared there once, as a rollout and the filters take them. Where a SamplingParams field is
    the same knob, its default is that field's; sampling() and rollout() turn these into what a
    rollout takes, the checks are theirs."""

    # --- what to train on ---
    exclude_task_names: list[str] | None = None
    """Not these tasks (also -x / --exclude-task-name, repeatable; for a dataset, glob patterns)."""
    registry_path: Path | None = None
    """With a dataset name: the registry JSON file it is found in; None = Harbor's registry."""
    registry_url: str | None = None
    """With a dataset name: the URL of the registry JSON it is found in; None = Harbor's registry."""
    max_new_tokens: int = SamplingParams.max_new_tokens
    """Most tokens sampled per agent turn."""
    temperature: float = SamplingParams.temperature
    """Sampling temperature; the trainer scales logits by the same 1/T, so logprobs agree."""
    canary_tasks: Path | None = None
    """Impossible variants of tasks (`slime-harbor impossible-tasks`), mixed into each step's rollouts
    and never trained on; canary_pass_rate in metrics.json is the share that passed (any pass is a
    hack nothing caught: summary.json names its trial)."""
    canary_share: float = 0.25
    """With --canary-tasks: canary groups per training group each step (at least one)."""

    # --- where the policy is served ---
    policy_url: str | None = None
    """Sample from this SGLang / vLLM-compatible server (alias --vllm-url) instead of an embedded
    one; it must serve --model. After each optimizer step the weights are written under
    OUTPUT_DIR/weights and the server is told to load them (see --weight-sync): the server reads
    that path itself, so it must run on this host or see it on a shared filesystem."""
    weight_sync: str = "auto"
    """With --policy-url: lora (/load_lora_adapter + /unload_lora_adapter) | disk (the full, merged
    weights: SGLang's /update_weights_from_disk, vLLM's reload_weights) | none (the server keeps its
    weights; old logprobs are recomputed by the trainer) | auto (lora with LoRA on a server that
    loads adapters, else disk; none when the server has no such endpoint)."""
    weight_check: str = "error"
    """After every weight update, and before the first rollout, score a fixed probe (the run's first
    trained sample, 256 tokens at most) on the server and with the trainer's weights and compare
    (policy/weight_check.py): error (a float32 server more than 1e-3 away stops the run, one line
    naming the engine, the version, the gap and the likely cause) | warn (say so, go on) | off.
    A bf16 / fp16 server's bound is 0.5 (ten times bf16's rounding: policy/weight_check.py)."""

    max_staleness: int = 0
    """0: synchronous (each step's rollout, then its update). K >= 1: asynchronous: rollouts never
    stop (trials for later updates run while the learner updates; a trial spanning an update goes
    on, its later calls sampled by the new weights), each update trains on the first GRPO groups
    to complete, and an episode with a call sampled more than K versions before the weights being
    updated is masked (masked_by stale). See docs/other-trainers.md, "Asynchronous training"."""
    keep_interrupted: str = "on"
    """K >= 1 with --policy-url: on: a model call a weight update interrupts goes on from the
    tokens it had, under the new weights (each token keeps the logprob and version that sampled
    it, and trains with it) | off: it is sampled again whole (its tokens are discarded, counted as
    weight_sync/discarded_tokens)."""
    update_pause: str = "abort"
    """K >= 1 with --policy-url and full weights: how the server pauses the calls in flight for an
    update: abort (SGLang's and vLLM's: they end with what they had, and the client continues
    them) | retract (SGLang's: it frees them and prefills prompt + output again under the new
    weights itself) | wait (vLLM's: the update waits for them to finish on the old weights).
    SGLang's in_place and vLLM's keep are refused: they decode on from the old weights' KV cache,
    tokens of neither version."""
    rollout_batch_size: int | None = None
    """Tasks per step (SLiME's --rollout-batch-size), drawn in turn from a seeded shuffle of the
    tasks, epoch after epoch; None = every task every step."""

    # --- held-out evaluation (its episodes are never trained on) ---
    eval_tasks: Path | None = None
    """Directory of held-out Harbor task dirs: evaluated before the first step, every eval_every
    steps and after the last; their trials go to output_dir/eval/step_N/. None = no evaluation."""
    eval_every: int = 0
    """Evaluate every this many steps too (SLiME's --eval-interval); <= 0: before and after only."""
    eval_n_samples: int = 1
    """Episodes per held-out task (SLiME's --n-samples-per-eval-prompt): the k of pass@k."""
    eval_temperature: float | None = None
    """Sampling temperature of evaluation episodes (SLiME's --eval-temperature); None = temperature."""
    eval_top_p: float | None = None
    """Top-p of evaluation episodes (SLiME's --eval-top-p); None = 1.0, as training samples."""
    eval_top_k: int | None = None
    """Top-k of evaluation episodes (SLiME's --eval-top-k); None = -1 (off), as training samples."""
    eval_max_new_tokens: int | None = None
    """Tokens per turn of evaluation episodes (SLiME's --eval-max-response-len); None = max_new_tokens."""

    # --- trajectory filters (mask_*: TrajectoryFilters', in slime_harbor/filters.py) ---
    dynamic_sampling: bool = False
    """Drop groups whose kept rewards do not vary (SLiME's check_reward_nonzero_std) and sample
    more groups, up to dynamic_sampling_max_rounds extra rollouts, to fill the step's batch."""
    dynamic_sampling_max_rounds: int = 2
    """Extra rollouts per step at most when dynamic sampling refills the batch."""

    # --- the policy ---
    model: str | None = None
    """Base policy, a Hugging Face model dir; None = the tiny offline model (built once)."""
    lora: bool = True
    """Train LoRA adapters (peft) on a frozen base; False (--no-lora) trains every weight."""
    lora_r: int = 8
    """LoRA rank."""
    lora_alpha: int = 16
    """LoRA scaling numerator (the update is scaled by alpha / r)."""
    lora_target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    """Linear layers that get adapters (Qwen / Llama attention projections)."""
    device: str = "auto"
    """cpu | cuda | auto (cuda when available). Sampling and training share the device."""

    # --- optimisation ---
    num_rollouts: int = 50
    """Training steps; each is one rollout followed by updates_per_rollout optimizer steps."""
    lr: float = 1e-6
    """AdamW learning rate (SLiME's GRPO recipe)."""
    weight_decay: float = 0.0
    """AdamW weight decay (0: no pull towards zero, for adapters or full weights)."""
    max_grad_norm: float = 1.0
    """Clip the gradient's global norm to this (SLiME's --clip-grad); <= 0 disables."""
    kl_coef: float = 0.001
    """Weight of the low-variance KL penalty towards the base model; 0 disables it."""
    objective: str = "grpo"
    """grpo (the clipped policy gradient) or rft (rejection fine-tuning: the likelihood of the
    successful episodes only, reward >= 1, with the same tokens and loss masks; the baseline GRPO
    is measured against in bench/learning.py)."""
    eps_clip: float = 0.2
    """PPO ratio clipped below at 1 - eps_clip."""
    eps_clip_high: float = 0.28
    """PPO ratio clipped above at 1 + eps_clip_high (clip-higher)."""
    use_tis: bool = False
    """Truncated importance sampling (SLiME's --use-tis): the old logprobs become the learner's own
    recomputation before the update, and each token's loss is weighted by clamp(exp(old - rollout),
    tis_clip_low, tis_clip), correcting for the sampler not being the learner."""
    tis_clip: float = 2.0
    """Upper bound of the TIS weight (SLiME's --tis-clip)."""
    tis_clip_low: float = 0.0
    """Lower bound of the TIS weight (SLiME's --tis-clip-low)."""
    updates_per_rollout: int = 1
    """Optimizer steps per rollout (SLiME's --num-steps-per-rollout): the samples are split into
    this many minibatches. With 1 the update is on-policy (ratio ~ 1); later minibatches see the
    ratio move, which is what the clip bounds."""
    micro_batch_size: int = 4
    """Samples per forward/backward pass; gradients accumulate over them (bounds memory)."""

    # --- bookkeeping ---
    output_dir: Path | None = None
    """Where metrics, rollouts, checkpoints and final/ go; None = runs/grpo-local, or the
    checkpoint's own run dir when resuming."""
    save_every: int = 10
    """Write checkpoint_N/ every this many steps (and after the last step); <= 0: only the last."""
    resume: Path | None = None
    """A checkpoint_N dir, or a run dir (its latest checkpoint): continue from that step with its
    weights, optimizer state and RNG state."""
    seed: int = 0
    """Seeds torch, Python's random and the sampling engine."""
    progress: bool = False
    """Show the per-trial progress bar of each rollout."""
    wandb_project: str | None = None
    """Log every metric to this wandb project (offline unless a W&B login is configured or
    WANDB_MODE says otherwise); None = no wandb."""
    wandb_run_name: str | None = None
    """wandb run name; None = wandb's own."""

    def grpo(self) -> GRPOConfig:
        return GRPOConfig(eps_clip=self.eps_clip, eps_clip_high=self.eps_clip_high, kl_coef=self.kl_coef,
                          use_kl_loss=self.kl_coef > 0, use_tis=self.use_tis, tis_clip=self.tis_clip,
                          tis_clip_low=self.tis_clip_low)

    def rollout(self, policy_url: str, model_dir: str, out_dir: Path, task_names: list[str] | None = None,
                lora_name: str | None = None) -> RolloutConfig:
        shared = {f.name: getattr(self, f.name) for f in dataclasses.fields(RunSettings) + dataclasses.fields(EpisodeLimits)}
        return RolloutConfig(**shared | {"task_names": task_names if task_names is not None else self.task_names},
                             policy_url=policy_url, model_dir=model_dir, out_dir=out_dir, progress=self.progress,
                             sampling=self.sampling(), lora_name=lora_name,
                             keep_interrupted_calls=self.keep_interrupted == "on")

    def eval_rollout(self, policy_url: str, model_dir: str, out_dir: Path, lora_name: str | None = None) -> RolloutConfig:
        """The evaluation's episodes: held-out tasks, eval_n_samples each, the eval sampling settings."""
        given = {"temperature": self.eval_temperature, "top_p": self.eval_top_p, "top_k": self.eval_top_k,
                 "max_new_tokens": self.eval_max_new_tokens}  # None: the training episodes' (top-p, top-k off)
        sampling = dataclasses.replace(self.sampling(), **{k: v for k, v in given.items() if v is not None})
        return dataclasses.replace(
            self.rollout(policy_url, model_dir, out_dir, lora_name=lora_name), tasks_dir=self.eval_tasks, task_names=None,
            n_samples=self.eval_n_samples, sampling=sampling,
        )

    def sampling(self) -> SamplingParams:
        """The training episodes' sampling (ValueError in one line for a value SamplingParams refuses)."""
        return SamplingParams(temperature=self.temperature, max_new_tokens=self.max_new_tokens)

    def filters(self) -> TrajectoryFilters:
        return TrajectoryFilters(**{f.name: getattr(self, f.name) for f in dataclasses.fields(TrajectoryFilters)})


def find_checkpoint(path: Path) -> Path:
    """`path` itself if it is a checkpoint, else its checkpoint_N with the largest N."""
    path = Path(path)
    if (path / TRAINER_STATE).is_file():
        return path
    found = sorted((p for p in path.glob("checkpoint_*") if (p / TRAINER_STATE).is_file()),
                   key=lambda p: int(p.name.split("_")[-1]))
    if not found:
        raise FileNotFoundError(f"no checkpoint_N (with {TRAINER_STATE}) in {path}")
    return found[-1]


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"device must be cpu, cuda or auto, got {device!r}")
    return device


def check_canaries(cfg: LocalTrainConfig) -> None:
    from slime_harbor.tasks.task_dir import is_canary
    from slime_harbor.tasks.task_dir import discover_tasks

    if not 0 < cfg.canary_share <= 1:
        raise ConfigError(f"canary_share must be in (0, 1], got {cfg.canary_share}")
    try:
        names = [p.name for p in discover_tasks(cfg.canary_tasks)]
    except FileNotFoundError as exc:
        raise ConfigError(f"--canary-tasks: {exc}") from None
    if plain := [n for n in names if not is_canary(n)]:
        raise ConfigError(f"--canary-tasks {cfg.canary_tasks}: {plain[0]} is not an impossible variant "
                          "(write them with slime-harbor impossible-tasks)")


def with_tasks_selected(cfg: LocalTrainConfig) -> LocalTrainConfig:
    """`cfg` with tasks_dir a directory and task_names the tasks to train on: a dataset named
    with --tasks is downloaded now, exclusions applied (ConfigError in one line if it cannot be)."""
    from slime_harbor.tasks.datasets import select_tasks

    tasks_dir, task_names = select_tasks(cfg.tasks_dir, cfg.task_names, cfg.exclude_task_names,
                                         cfg.registry_path, cfg.registry_url)
    return dataclasses.replace(cfg, tasks_dir=tasks_dir, task_names=task_names, exclude_task_names=None,
                               registry_path=None, registry_url=None)


def check_train_config(cfg: LocalTrainConfig) -> None:
    """Refuse, before a model is loaded, a setting that cannot work (ConfigError, one line)."""
    at_least_1 = ["num_rollouts", "n_samples", "concurrency", "step_limit", "updates_per_rollout",
                  "micro_batch_size", "lora_r", "lora_alpha"]
    for name in at_least_1:
        if getattr(cfg, name) < 1:
            raise ConfigError(f"{name} must be at least 1, got {getattr(cfg, name)}")
    for name in ("lr", "weight_decay", "kl_coef", "eps_clip", "eps_clip_high", "tis_clip", "tis_clip_low"):
        if not getattr(cfg, name) >= 0:  # also refuses nan
            raise ConfigError(f"{name} must be >= 0, got {getattr(cfg, name)}")
    try:  # the sampling settings' own checks (max_new_tokens >= 1: check_config's, below)
        cfg.sampling()
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if not cfg.lr > 0:
        raise ConfigError(f"lr must be > 0, got {cfg.lr}")
    if cfg.canary_tasks is not None:
        check_canaries(cfg)
    if cfg.tis_clip_low > cfg.tis_clip:
        raise ConfigError(f"tis_clip_low ({cfg.tis_clip_low}) must not exceed tis_clip ({cfg.tis_clip})")
    if cfg.objective not in OBJECTIVES:
        raise ConfigError(f"objective must be one of {', '.join(OBJECTIVES)}, got {cfg.objective!r}")
    if not samples_policy(cfg.agent):
        raise ConfigError(f"agent {cfg.agent!r} does not sample from the policy; use native, terminus-2, "
                          "mini-swe-agent, another Harbor agent or module:Class")
    resolve_device(cfg.device)
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device cuda was asked for, but torch sees no CUDA device")
    if cfg.resume is not None:
        if not Path(cfg.resume).exists():
            raise ConfigError(f"resume: {cfg.resume} does not exist")
        try:
            find_checkpoint(cfg.resume)
        except FileNotFoundError as exc:
            raise ConfigError(f"resume: {exc}") from None
    looks_like_hub_id = cfg.model is not None and cfg.model.count("/") == 1 and not cfg.model.startswith((".", "/"))
    if cfg.model is not None and not Path(cfg.model).exists() and not looks_like_hub_id:
        raise ConfigError(f"model: {cfg.model} does not exist (and is not a hub id org/name)")
    from slime_harbor.policy.weight_check import CHECK_MODES
    from slime_harbor.policy.weights import MODES, PAUSE_MODES

    if cfg.weight_check not in CHECK_MODES:
        raise ConfigError(f"weight_check must be one of {', '.join(CHECK_MODES)}, got {cfg.weight_check!r}")

    if cfg.weight_sync not in MODES:
        raise ConfigError(f"weight_sync must be one of {', '.join(MODES)}, got {cfg.weight_sync!r}")
    if cfg.weight_sync == "lora" and not cfg.lora:
        raise ConfigError("weight_sync lora needs LoRA training (drop --no-lora, or use disk)")
    # Tasks, agent and environment, as a rollout checks them (the policy server is ours).
    n_tasks = len(check_config(cfg.rollout("http://embedded", cfg.model or "embedded", Path("unused"))))
    if cfg.rollout_batch_size is not None and not 1 <= cfg.rollout_batch_size <= n_tasks:
        raise ConfigError(f"rollout_batch_size must be 1..{n_tasks} (the number of tasks), got {cfg.rollout_batch_size}")
    if cfg.keep_interrupted not in ("on", "off"):
        raise ConfigError(f"keep_interrupted must be on or off, got {cfg.keep_interrupted!r}")
    if cfg.update_pause not in PAUSE_MODES:
        raise ConfigError(f"update_pause must be one of {', '.join(PAUSE_MODES)}, got {cfg.update_pause!r}"
                          + (" (it decodes on from the old weights' KV cache: tokens of neither version)"
                             if cfg.update_pause in ("in_place", "keep") else ""))
    if cfg.max_staleness < 0:
        raise ConfigError(f"max_staleness must be >= 0, got {cfg.max_staleness}")
    if cfg.max_staleness and cfg.policy_url and cfg.weight_sync in ("lora", "none"):
        raise ConfigError(f"max_staleness {cfg.max_staleness} with --policy-url needs --weight-sync disk or auto: "
                          + ("the server would keep its own weights" if cfg.weight_sync == "none" else
                             "a pushed adapter gets a new name, which calls already in flight do not use"))
    if cfg.dynamic_sampling_max_rounds < 0:
        raise ConfigError(f"dynamic_sampling_max_rounds must be >= 0, got {cfg.dynamic_sampling_max_rounds}")
    if cfg.eval_tasks is not None:
        if cfg.eval_n_samples < 1:
            raise ConfigError(f"eval_n_samples must be >= 1, got {cfg.eval_n_samples}")
        try:  # --eval-temperature, --eval-top-p, ...: SamplingParams' own checks
            evaluation = cfg.eval_rollout("http://embedded", cfg.model or "embedded", Path("unused"))
        except ValueError as exc:
            raise ConfigError(f"evaluation sampling: {exc}") from None
        check_config(evaluation)
    check_environment_runs(cfg.env)
