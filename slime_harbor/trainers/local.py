"""GRPO on one machine: Harbor rollouts from the current policy, then a clipped policy-gradient step.

The local counterpart of the SLiME trainer, for CPUs, one GPU and tests. It shares the rollout
core (rollout.run_rollouts: Harbor Trials, agent, sandbox, verifier, converter) and the maths
(grpo.py); what is its own is how the policy is served and how its weights are updated:

    one torch module (LoRA adapters on the base model by default)
      |-- served by a SamplingEngine behind an EmbeddedPolicyServer on loopback: the agents
      |   sample from it, and the engine reports each token's logprob log_softmax(logits / T)
      `-- trained in place by AdamW: after each step the engine is told (update_model), so the
          next rollout samples from the updated weights

One step N:
    1. rollout: n_samples Harbor trials per task (every task, or rollout_batch_size of them) ->
       output_dir/rollouts/step_N/samples.jsonl; the trajectory filters (filters.py) mask
       episodes that hit an enabled limit; with dynamic sampling, groups whose kept rewards do
       not vary are masked and more tasks are sampled (step_N/refill_R/) to fill the step
    2. advantages: reward minus the mean reward of the task's episodes (grpo.episode_advantages);
       removed samples (infra failures: counted as aborted; masked: counted per filter) are dropped
    3. update: recompute the logprobs of the sampled tokens (log_softmax(logits / T), exactly as
       the engine does), old logprobs = the rollout's own (so the PPO ratio is pi / pi_sampler),
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

SIGINT / SIGTERM (from the command line): a rollout in flight is cancelled (sandboxes torn down,
the step is not counted); an update in flight finishes with its metrics and scheduled checkpoint.
Then summary.json is written with "interrupted": true, no final/, and the process exits 130 / 143;
`--resume` continues from the last checkpoint.

Run: `slime-harbor train-local --test` (or examples/harbor/harbor_grpo_local.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import dataclasses
import json
import math
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from slime_harbor.exits import ConfigError, Interrupted, OneLineArgumentParser, SignalGuard
from slime_harbor.filters import apply_limit_filters, drop_zero_std_groups, varying_groups
from slime_harbor.grpo import episode_advantages, grpo_loss, masked_mean
from slime_harbor.tasks.manifest import apply_manifest
from slime_harbor.rollout import discover_tasks, run_rollouts
from slime_harbor.trainers.evaluate import eval_metrics
from slime_harbor.samples import TrainingSample, read_jsonl
# The run's config lives in local_config.py; its names stay importable from here.
from slime_harbor.trainers.local_config import (  # noqa: F401
    TEST_TASKS, TEST_PRESET, TRAINER_STATE, LocalTrainConfig, resolve_device, find_checkpoint,
    check_train_config,
)

OPTIMIZER_STATE = "optimizer.pt"
RNG_STATE = "rng.pt"


# --------------------------------------------------------------------------------------------
# Samples -> tensors -> logprobs.


@dataclass
class Batch:
    """Samples left-padded to one width, with per-response-token tensors right-aligned to R."""

    input_ids: torch.Tensor  # [B, W]
    attention_mask: torch.Tensor  # [B, W]
    position_ids: torch.Tensor  # [B, W]
    targets: torch.Tensor  # [B, R] the last R tokens of each row
    loss_mask: torch.Tensor  # [B, R] 1 = sampled by the policy; 0 = observation, prompt, padding
    old_logprobs: torch.Tensor  # [B, R] the sampler's logprobs
    advantages: torch.Tensor  # [B, 1]


def make_batch(samples: Sequence[TrainingSample], advantages: Sequence[float], device="cpu") -> Batch:
    """Left padding puts every response at the end of its row, so one `logits_to_keep` covers all."""
    width = max(len(s.tokens) for s in samples)
    resp = max(s.response_length for s in samples)
    b = len(samples)
    input_ids = torch.zeros((b, width), dtype=torch.long)
    attention = torch.zeros((b, width), dtype=torch.long)
    loss_mask = torch.zeros((b, resp), dtype=torch.float32)
    old = torch.zeros((b, resp), dtype=torch.float32)
    for i, s in enumerate(samples):
        n = s.response_length
        input_ids[i, width - len(s.tokens):] = torch.tensor(s.tokens)
        attention[i, width - len(s.tokens):] = 1
        loss_mask[i, resp - n:] = torch.tensor(s.loss_mask, dtype=torch.float32)
        old[i, resp - n:] = torch.tensor(s.rollout_log_probs, dtype=torch.float32)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)  # as the engine's prefill: pads do not shift positions
    return Batch(
        input_ids.to(device), attention.to(device), positions.to(device), input_ids[:, width - resp:].to(device),
        loss_mask.to(device), old.to(device), torch.tensor(list(advantages), dtype=torch.float32)[:, None].to(device),
    )


def token_logprobs(model, batch: Batch, temperature: float) -> torch.Tensor:
    """[B, R] log pi(token | prefix) of the last R tokens of each row, as the engine computes them:
    log_softmax(logits / T) over the whole vocabulary, in fp32 (T = 0 means greedy: raw logits)."""
    resp = batch.targets.shape[1]
    logits = model(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids,
        logits_to_keep=resp + 1, use_cache=False,
    ).logits[:, :-1].float()  # position j predicts token j + 1: the last R+1 logits predict the last R tokens
    if temperature > 0:
        logits = logits / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, batch.targets[..., None])[..., 0]


def trainable(samples: Sequence[TrainingSample]) -> list[TrainingSample]:
    """Samples the loss may see: not removed (infra failures), with a reward and a sampled token."""
    return [s for s in samples if not s.remove_sample and s.reward is not None and any(s.loss_mask)]


# --------------------------------------------------------------------------------------------
# The policy: the module being trained, its reference, and its optimizer.


class Policy:
    """The trained module (a PeftModel with LoRA, or the full model), its frozen reference, and AdamW."""

    def __init__(self, model, reference, tokenizer, base_model: str, cfg: LocalTrainConfig):
        self.model = model  # also what the engine serves: one module, updated in place
        self.reference = reference  # None with LoRA: the base is the model with adapters disabled
        self.tokenizer = tokenizer
        self.base_model = base_model
        self.cfg = cfg
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, weight_decay=cfg.weight_decay)

    @classmethod
    def load(cls, cfg: LocalTrainConfig, base_model: str, device: str, checkpoint: Path | None = None) -> Policy:
        """The base model with fresh adapters (or a copy as reference), or a checkpoint's weights."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(checkpoint or base_model)
        base = AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32).to(device)
        if cfg.lora:
            from peft import LoraConfig, PeftModel, get_peft_model

            if checkpoint is not None:
                model = PeftModel.from_pretrained(base, checkpoint, is_trainable=True)
            else:
                # lora_dropout 0: the trained forward pass must be the one the engine sampled with.
                lora = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
                                  target_modules=list(cfg.lora_target_modules), task_type="CAUSAL_LM")
                model = get_peft_model(base, lora)
            reference = None
        else:
            model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).to(device) if checkpoint else base
            reference = base if checkpoint else copy.deepcopy(base)
            reference.requires_grad_(False)
        model.eval()  # no dropout anywhere: training and sampling run the same function
        policy = cls(model, reference, tokenizer, base_model, cfg)
        if checkpoint is not None:
            state = torch.load(Path(checkpoint) / OPTIMIZER_STATE, map_location=device, weights_only=True)
            policy.optimizer.load_state_dict(state)
            for group in policy.optimizer.param_groups:  # the state carries on; this run's flags set the rates
                group["lr"], group["weight_decay"] = cfg.lr, cfg.weight_decay
        return policy

    def reference_logprobs(self, batch: Batch, temperature: float) -> torch.Tensor:
        with torch.no_grad():
            if self.reference is not None:
                return token_logprobs(self.reference, batch, temperature)
            with self.model.disable_adapter():
                return token_logprobs(self.model, batch, temperature)

    def save(self, out: Path, *, with_optimizer: bool) -> None:
        """HF / peft format (loadable with AutoModelForCausalLM.from_pretrained) plus the tokenizer."""
        out.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(out)
        self.tokenizer.save_pretrained(out)
        if with_optimizer:
            torch.save(self.optimizer.state_dict(), out / OPTIMIZER_STATE)


def update(policy: Policy, samples: Sequence[TrainingSample], advantages: Sequence[float],
           cfg: LocalTrainConfig, device: str) -> dict[str, float]:
    """One optimizer step on `samples`: grpo_loss over all of them, accumulated micro-batch by
    micro-batch with weights that make the sum equal the loss of the whole minibatch."""
    grpo = cfg.grpo()
    total_tokens = sum(sum(s.loss_mask) for s in samples)
    policy.optimizer.zero_grad(set_to_none=True)
    sums: dict[str, float] = {}
    for start in range(0, len(samples), cfg.micro_batch_size):
        micro = samples[start:start + cfg.micro_batch_size]
        batch = make_batch(micro, advantages[start:start + cfg.micro_batch_size], device)
        # token-level reduction: the micro-batch's mean weighs by its share of the tokens;
        # sequence-level: by its share of the samples.
        share = (batch.loss_mask.sum().item() / total_tokens if grpo.loss_level == "token"
                 else len(micro) / len(samples))
        ref = policy.reference_logprobs(batch, cfg.temperature)
        logprobs = token_logprobs(policy.model, batch, cfg.temperature)
        loss, metrics = grpo_loss(logprobs, batch.old_logprobs, ref, batch.advantages, batch.loss_mask, grpo)
        (loss * share).backward()
        # How far the policy is from the sampler, token by token (ppo_kl's mean can cancel out).
        metrics["abs_ppo_kl"] = masked_mean((logprobs.detach() - batch.old_logprobs).abs(), batch.loss_mask).item()
        for k, v in metrics.items():
            sums[k] = sums.get(k, 0.0) + v * share
    if cfg.max_grad_norm > 0:
        sums["grad_norm"] = torch.nn.utils.clip_grad_norm_(policy.params, cfg.max_grad_norm).item()
    policy.optimizer.step()
    sums["n_tokens"] = float(total_tokens)
    sums["n_samples"] = float(len(samples))
    return sums


def train_on_samples(policy: Policy, samples: Sequence[TrainingSample], cfg: LocalTrainConfig,
                     device: str) -> dict[str, Any]:
    """Advantages, then updates_per_rollout optimizer steps. Skips cleanly (no step, weights and
    optimizer untouched) when nothing is trainable or every advantage is 0, and says why."""
    kept = trainable(samples)
    # Removed by a filter (filters.py marks them) is not aborted: those are counted in "filters".
    kept_ids = {id(s) for s in kept}
    aborted = sum(id(s) not in kept_ids and "masked_by" not in (s.metadata or {}) for s in samples)
    out: dict[str, Any] = {"n_samples": len(samples), "aborted": aborted, "n_trained_samples": 0,
                           "n_tokens": 0, "skipped": None, "updates": []}
    if not kept:
        out["skipped"] = "no trainable sample"
        return out
    advantages = episode_advantages(kept, normalize_std=cfg.grpo().normalize_std)
    if all(a == 0.0 for a in advantages):
        out["skipped"] = "every advantage is 0 (equal rewards within each group)"
        return out
    n_minibatches = min(cfg.updates_per_rollout, len(kept))
    bounds = [round(i * len(kept) / n_minibatches) for i in range(n_minibatches + 1)]
    for lo, hi in zip(bounds, bounds[1:]):
        out["updates"].append(update(policy, kept[lo:hi], advantages[lo:hi], cfg, device))
    out["n_trained_samples"] = len(kept)
    out["n_tokens"] = int(sum(u["n_tokens"] for u in out["updates"]))
    # Step-level figures: token-weighted means over the updates.
    for k in ("loss", "pg_loss", "kl", "clipfrac", "ppo_kl", "abs_ppo_kl", "ratio_mean"):
        values = [(u[k], u["n_tokens"]) for u in out["updates"] if k in u]
        if values:
            out[k] = sum(v * w for v, w in values) / sum(w for _, w in values)
    return out


# --------------------------------------------------------------------------------------------
# Checkpoints.


def save_checkpoint(policy: Policy, out: Path, step: int, metrics: list[dict]) -> None:
    policy.save(out, with_optimizer=True)
    rng = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    torch.save(rng, out / RNG_STATE)
    state = {"step": step, "base_model": policy.base_model, "lora": policy.cfg.lora, "metrics": metrics}
    (out / TRAINER_STATE).write_text(json.dumps(state, indent=1))


def restore_rng(checkpoint: Path) -> None:
    rng = torch.load(checkpoint / RNG_STATE, weights_only=False)  # Python's state is a tuple
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


# --------------------------------------------------------------------------------------------
# The loop.


def rollout_stats(samples: Sequence[TrainingSample]) -> dict[str, Any]:
    """Reward mean / std / pass rate over the episodes the verifier scored (one per trial)."""
    rewards = {}
    for s in samples:
        if s.reward is not None and s.status.value in ("completed", "truncated"):
            rewards.setdefault((s.group_index, s.index), s.reward)
    values = list(rewards.values())
    mean = sum(values) / len(values) if values else None
    tampered = {(s.group_index, s.index) for s in samples if s.metadata.get("tampering")}
    return {
        "n_tampered": len(tampered),  # episodes whose grader detected tampering (scored 0)
        "reward_mean": mean,
        "reward_std": math.sqrt(sum((v - mean) ** 2 for v in values) / len(values)) if values else None,
        "pass_rate": sum(v >= 1.0 for v in values) / len(values) if values else None,
        "n_scored": len(values),
    }


def server_logprob_gap(policy: Policy, samples: Sequence[TrainingSample], cfg: LocalTrainConfig, device: str,
                       recompute: bool) -> tuple[list[TrainingSample], dict[str, float]]:
    """How far the server's logprobs are from the trained policy's, over the sampled tokens (mean
    and max abs). With `recompute` (a server that does not take our weights) the samples' old
    logprobs become the trained policy's, so the PPO ratio starts at 1 as it does on-policy."""
    kept = trainable(samples)
    if not kept:
        return list(samples), {}
    diffs, recomputed = [], {}
    with torch.no_grad():
        for lo in range(0, len(kept), cfg.micro_batch_size):
            micro = kept[lo:lo + cfg.micro_batch_size]
            batch = make_batch(micro, [0.0] * len(micro), device)
            logprobs = token_logprobs(policy.model, batch, cfg.temperature)
            diffs.append((logprobs - batch.old_logprobs).abs()[batch.loss_mask.bool()])
            for i, s in enumerate(micro):
                mask = torch.tensor(s.loss_mask, dtype=torch.bool)
                ours = logprobs[i, logprobs.shape[1] - s.response_length:].cpu()
                recomputed[id(s)] = torch.where(mask, ours, 0.0).tolist()  # observations keep logprob 0
    gap = torch.cat(diffs)
    stats = {"server_logprob_gap": gap.mean().item(), "server_logprob_gap_max": gap.max().item()}
    if recompute:
        samples = [dataclasses.replace(s, rollout_log_probs=recomputed[id(s)]) if id(s) in recomputed else s
                   for s in samples]
    return list(samples), stats


class TaskStream:
    """Task names in a seeded shuffled order, epoch after epoch; `position` counts names drawn
    (kept in metrics.json, so a resumed run goes on where it stopped)."""

    def __init__(self, tasks: Sequence[str], seed: int, position: int = 0):
        self.tasks, self.seed, self.position = list(tasks), seed, position

    def _at(self, i: int) -> str:
        epoch, k = divmod(i, len(self.tasks))
        order = list(self.tasks)
        random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return order[k]

    def take(self, n: int) -> list[str]:
        """The next n names, without repeats (a window across two epochs may meet one twice)."""
        names: list[str] = []
        while len(names) < min(n, len(self.tasks)):
            name = self._at(self.position)
            self.position += 1
            if name not in names:
                names.append(name)
        return names


def _rebase(samples: list[TrainingSample], group_offset: int, n_samples: int) -> None:
    """Give a later rollout's groups indices after those of the rollouts before it in the step."""
    for s in samples:
        s.group_index += group_offset
        s.index += group_offset * n_samples
        if s.rollout_id is not None:
            s.rollout_id += group_offset * n_samples


def sample_step(guard: SignalGuard, runner: asyncio.Runner, cfg: LocalTrainConfig, policy_url: str, model_dir: str,
                step_dir: Path, tasks: list[str], stream: TaskStream,
                lora_name: str | None = None) -> tuple[list[TrainingSample], dict[str, Any]]:
    """One step's episodes, with the trajectory filters applied. The step's tasks are every task or
    the next rollout_batch_size of the stream; with dynamic sampling, groups without reward
    variance are dropped and the stream's next tasks are sampled to take their place, at most
    dynamic_sampling_max_rounds more rollouts (step_dir/refill_R/)."""
    names = tasks if cfg.rollout_batch_size is None else stream.take(cfg.rollout_batch_size)
    wanted = len(names)
    samples: list[TrainingSample] = []
    masked: dict[str, int] = {}
    errors = groups = 0
    for round_ in range(1 + (cfg.dynamic_sampling_max_rounds if cfg.dynamic_sampling else 0)):
        out_dir = step_dir if round_ == 0 else step_dir / f"refill_{round_}"
        summary = guard.run(run_rollouts(cfg.rollout(policy_url, model_dir, out_dir, names, lora_name)), runner)
        new = read_jsonl(out_dir / "samples.jsonl")
        _rebase(new, groups, cfg.n_samples)
        groups += len(names)
        errors += len(summary.get("errors") or {})
        for reason, n in apply_limit_filters(new, cfg.filters()).items():
            masked[reason] = masked.get(reason, 0) + n
        samples += new
        missing = wanted - len(varying_groups(samples))
        if not cfg.dynamic_sampling or missing <= 0:
            break
        names = stream.take(missing)
    if cfg.dynamic_sampling:
        masked["zero_std"] = drop_zero_std_groups(samples)
    return samples, {"errors": errors, "n_groups_sampled": groups,
                     "filters": {k: masked.get(k, 0) for k in ("timeout", "step_limit", "length_limit", "zero_std")},
                     "truncated_ratio": _truncated_ratio(samples)}


def _truncated_ratio(samples: Sequence[TrainingSample]) -> float | None:
    """Share of scored episodes that hit a limit (status truncated), as SLiME's rollout/truncated_ratio."""
    episodes = {(s.group_index, s.index): s.status.value for s in samples if s.reward is not None}
    return sum(v == "truncated" for v in episodes.values()) / len(episodes) if episodes else None


def evaluate(guard: SignalGuard, runner: asyncio.Runner, cfg: LocalTrainConfig, policy_url: str, model_dir: str,
             out_dir: Path, lora_name: str | None = None) -> dict[str, Any]:
    """Held-out pass@1 / pass@k of the policy being served now (trainers/evaluate.py); the samples
    stay in out_dir and are never trained on."""
    summary = guard.run(run_rollouts(cfg.eval_rollout(policy_url, model_dir, out_dir, lora_name)), runner)
    result = eval_metrics(summary["per_task_rewards"], cfg.eval_n_samples)
    result["truncated_ratio"] = _truncated_ratio(read_jsonl(out_dir / "samples.jsonl"))
    result["wall_s"] = summary["wall_seconds"]
    return result


def _tracker(cfg: LocalTrainConfig, out: Path, base_model: str, device: str):
    if not cfg.wandb_project:
        return None
    try:
        import wandb  # noqa: F401
    except ModuleNotFoundError:
        raise ConfigError("--wandb-project needs the wandb package (pip install wandb)") from None
    from slime_harbor.trainers.tracking import WandbRun

    config = _jsonable({**dataclasses.asdict(cfg), "base_model": base_model, "device": device})
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


class Learner:
    """The policy side of the loop: serves the policy (an embedded engine on the module being
    trained, or pushes to the external server at cfg.policy_url), trains it on a rollout's samples
    and saves it. train() drives it; examples/harbor/harbor_grpo_modal.py runs one on a Modal GPU."""

    def __init__(self, cfg: LocalTrainConfig, base_model: str, device: str, checkpoint: Path | None,
                 out: Path, start: int, host: str = "127.0.0.1"):
        from slime_harbor.policy.weights import WeightSync

        self.cfg, self.device = cfg, device
        self.policy = Policy.load(cfg, base_model, device, checkpoint)
        self._stack = contextlib.ExitStack()
        self.engine = self.sync = None
        if cfg.policy_url:
            self.url = cfg.policy_url
            self.sync = WeightSync(cfg.policy_url, cfg.weight_sync, out / "weights")
            if checkpoint or cfg.lora:  # the server must serve what we train from the first rollout on
                self.sync.push(self.policy.model, self.policy.tokenizer, start)
        else:
            from slime_harbor.policy.engine import EngineConfig, SamplingEngine
            from slime_harbor.policy.server import EmbeddedPolicyServer

            # The engine serves the very module the optimizer updates; a new seed per start so a
            # resumed run does not replay the samples of the steps before it.
            engine_config = EngineConfig(device=device, seed=cfg.seed + start)
            self.engine = self._stack.enter_context(SamplingEngine(self.policy.model, self.policy.tokenizer,
                                                                   engine_config))
            server = EmbeddedPolicyServer(engine=self.engine, model_name="policy", host=host)
            self.url = self._stack.enter_context(server).url

    @property
    def lora_name(self) -> str | None:
        """The adapter rollouts sample from on the external server (None: its own weights)."""
        return self.sync.lora_name if self.sync else None

    @property
    def weight_version(self) -> int:
        return self.engine.weight_version if self.engine else self.sync.version

    def train_step(self, samples: Sequence[TrainingSample], step: int) -> dict[str, Any]:
        """train_on_samples, then the server samples the updated weights."""
        gap: dict[str, float] = {}
        with self.engine.paused() if self.engine else contextlib.nullcontext():  # nothing samples meanwhile
            if self.sync:
                samples, gap = server_logprob_gap(self.policy, samples, self.cfg, self.device,
                                                  recompute=self.sync.mode == "none")
            result = train_on_samples(self.policy, samples, self.cfg, self.device)
        if result["updates"]:
            if self.engine:
                self.engine.update_model(self.policy.model)  # the next rollout samples from the new weights
            else:
                result["weights_pushed"] = self.sync.push(self.policy.model, self.policy.tokenizer, step)
        return {**result, **gap}

    def save_checkpoint(self, out: Path, step: int, metrics: list[dict]) -> None:
        save_checkpoint(self.policy, out, step, metrics)

    def save_final(self, out: Path) -> None:
        self.policy.save(out, with_optimizer=False)

    def close(self) -> None:
        self._stack.close()


def train(cfg: LocalTrainConfig, guard: SignalGuard | None = None, learner_factory=Learner) -> dict[str, Any]:
    """Run GRPO steps until step num_rollouts; returns the run summary (also in summary.json).
    With an entered SignalGuard (the command line's), a signal stops the run in order (see the
    module doc) and Interrupted is raised after summary.json is written.
    `learner_factory(cfg, base_model, device, checkpoint, out, start)` builds the policy side."""
    check_train_config(cfg)
    guard = guard or SignalGuard()  # not entered: signals keep their usual effect
    tasks, skipped_tasks = apply_manifest(discover_tasks(cfg.tasks_dir, cfg.task_names), cfg.task_manifest)
    tasks = [p.name for p in tasks]
    if not tasks:
        raise ConfigError(f"every task in {cfg.tasks_dir} is marked broken or flaky in {cfg.task_manifest}")
    checkpoint = find_checkpoint(cfg.resume) if cfg.resume else None
    state = json.loads((checkpoint / TRAINER_STATE).read_text()) if checkpoint else None
    if state and state["lora"] != cfg.lora:
        raise ConfigError(f"{checkpoint} was trained with lora={state['lora']}; pass the same --no-lora setting")
    base_model = state["base_model"] if state else str(_resolve_model(cfg.model))
    out = Path(cfg.output_dir or (checkpoint.parent if checkpoint else "runs/grpo-local"))
    out.mkdir(parents=True, exist_ok=True)
    device = resolve_device(cfg.device)

    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    start = state["step"] if state else 0
    metrics: list[dict] = list(state["metrics"]) if state else []
    learner = learner_factory(cfg, base_model, device, checkpoint, out, start)
    if checkpoint:
        restore_rng(checkpoint)
        print(f"resumed from {checkpoint} at step {start}", file=sys.stderr)
    (out / "config.json").write_text(json.dumps(_jsonable({**dataclasses.asdict(cfg), "base_model": base_model,
                                                            "device": device}), indent=1))
    last_checkpoint = str(checkpoint) if checkpoint else None
    started = time.monotonic()
    stream = TaskStream(tasks, cfg.seed, position=metrics[-1].get("task_stream_position", 0) if metrics else 0)
    interrupted: Interrupted | None = None
    tracker = None
    try:
        tracker = _tracker(cfg, out, base_model, device)
        with asyncio.Runner() as runner:

            def record_done(record: dict) -> None:
                (out / "metrics.json").write_text(json.dumps(metrics, indent=1))
                if tracker is not None:
                    tracker.log(record)

            if cfg.eval_tasks is not None and start == 0:  # step 0: the policy before any update
                evaluation = evaluate(guard, runner, cfg, learner.url, base_model, out / "eval" / "step_0",
                                      learner.lora_name)
                metrics.append({"step": 0, "eval": evaluation, "timings": {"eval_s": evaluation.pop("wall_s")}})
                record_done(metrics[-1])
                print(_eval_line(0, evaluation), file=sys.stderr)
            for step in range(start + 1, cfg.num_rollouts + 1):
                t0 = time.monotonic()
                sampled_version = learner.weight_version  # weight updates the server took before this rollout
                step_dir = out / "rollouts" / f"step_{step}"
                samples, sampling = sample_step(guard, runner, cfg, learner.url, base_model, step_dir, tasks, stream,
                                                learner.lora_name)
                # From here the step runs to its end (update, metrics, checkpoint) even if a
                # signal arrives; the signal is raised after it.
                with guard.deferred():
                    t1 = time.monotonic()
                    result = learner.train_step(samples, step)  # the next rollout samples from the new weights
                    t2 = time.monotonic()
                    record = {"step": step, **rollout_stats(samples), **result, **sampling,
                              "sampled_weight_version": sampled_version,
                              "task_stream_position": stream.position,
                              "timings": {"rollout_s": round(t1 - t0, 3), "train_s": round(t2 - t1, 3)}}
                    metrics.append(record)
                    (out / "metrics.json").write_text(json.dumps(metrics, indent=1))
                    print(_step_line(record), file=sys.stderr)
                    if step == cfg.num_rollouts or (cfg.save_every > 0 and step % cfg.save_every == 0):
                        learner.save_checkpoint(out / f"checkpoint_{step}", step, metrics)
                        last_checkpoint = str(out / f"checkpoint_{step}")
                # The evaluation after the step (a signal cancels it like a rollout: the step stays recorded).
                if cfg.eval_tasks is not None and (step == cfg.num_rollouts or (cfg.eval_every > 0 and step % cfg.eval_every == 0)):
                    record["eval"] = evaluate(guard, runner, cfg, learner.url, base_model, out / "eval" / f"step_{step}",
                                              learner.lora_name)
                    record["timings"]["eval_s"] = record["eval"].pop("wall_s")
                    print(_eval_line(step, record["eval"]), file=sys.stderr)
                record_done(record)
    except Interrupted as exc:
        interrupted = exc
    except BaseException:
        learner.close()
        if tracker is not None:
            tracker.finish()
        raise

    try:
        if interrupted is None:
            learner.save_final(out / "final")
    finally:
        learner.close()
    summary = _summary(metrics, cfg, base_model, out, last_checkpoint, time.monotonic() - started)
    summary["skipped_tasks"] = skipped_tasks  # broken or flaky in --task-manifest: never trained on
    summary["interrupted"] = interrupted is not None
    summary["reward_curve"] = _plot(out, metrics)
    if tracker is not None:
        if summary["reward_curve"]:
            tracker.log_image("rollout/reward_curve", Path(summary["reward_curve"]))
        summary["wandb_dir"] = str(tracker.dir)
        tracker.finish()
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    if interrupted is not None:
        print(f"interrupted after step {summary['last_step']}: metrics in {out}/metrics.json, "
              f"last checkpoint {last_checkpoint or 'none'}", file=sys.stderr)
        raise interrupted
    return summary


def _resolve_model(model: str | None) -> Path:
    if model is None:
        from slime_harbor.policy.tiny_model import ensure_tiny_model

        return ensure_tiny_model()
    # An absolute dir, so the adapter config of final/ points at the base from anywhere.
    return Path(model).resolve() if Path(model).exists() else Path(model)


def _step_line(r: dict) -> str:
    def f(x, fmt=".4f"):
        return "n/a" if x is None else format(x, fmt)

    what = f"skipped ({r['skipped']})" if r["skipped"] else (
        f"loss {f(r.get('loss'))} kl {f(r.get('kl'), '.2e')} ppo_kl {f(r.get('ppo_kl'), '.2e')} "
        f"clipfrac {f(r.get('clipfrac'), '.3f')} tokens {r['n_tokens']}")
    return (f"step {r['step']}: reward {f(r['reward_mean'], '.3f')} pass {f(r['pass_rate'], '.2f')} "
            f"aborted {r['aborted']}/{r['n_samples']}{_masked_text(r)} | {what} | rollout {r['timings']['rollout_s']:.1f}s "
            f"train {r['timings']['train_s']:.1f}s")


def _eval_line(step: int, e: dict) -> str:
    k = e["k"]
    def f(x):
        return "n/a" if x is None else f"{x:.3f}"
    return (f"eval after step {step}: pass@1 {f(e['pass@1'])} pass@{k} {f(e[f'pass@{k}'])} "
            f"({e['n_trials']} trials, {e['n_unscored']} unscored)")


def _masked_text(r: dict) -> str:
    masked = {k: v for k, v in (r.get("filters") or {}).items() if v}
    return (" masked " + ",".join(f"{k} {v}" for k, v in masked.items())) if masked else ""


def _summary(metrics, cfg, base_model, out, last_checkpoint, seconds) -> dict[str, Any]:
    evals = [{"step": m["step"], **{k: v for k, v in m["eval"].items() if k != "per_task"}}
             for m in metrics if "eval" in m]
    metrics = [m for m in metrics if "reward_mean" in m]  # training steps (step 0 holds only an evaluation)
    rewards = [m["reward_mean"] for m in metrics if m["reward_mean"] is not None]
    return {
        "steps": len(metrics),
        "last_step": metrics[-1]["step"] if metrics else 0,
        "skipped_steps": [m["step"] for m in metrics if m["skipped"]],
        "aborted_samples": sum(m["aborted"] for m in metrics),
        "trained_tokens": sum(m["n_tokens"] for m in metrics),
        "first_reward_mean": rewards[0] if rewards else None,
        "last_reward_mean": rewards[-1] if rewards else None,
        "base_model": base_model,
        "lora": cfg.lora,
        "final": str(out / "final") if (out / "final").is_dir() else None,
        "last_checkpoint": last_checkpoint,
        "masked_episodes": {k: sum(m.get("filters", {}).get(k, 0) for m in metrics)
                            for k in ("timeout", "step_limit", "length_limit", "zero_std")},
        "evals": evals,
        "wall_seconds_this_run": round(seconds, 2),
    }


def _jsonable(d: dict) -> dict:
    return {k: str(v) if isinstance(v, Path) else v for k, v in d.items()}


# --------------------------------------------------------------------------------------------
# Command line: one flag per field, help from the field's docstring.


def _field_docs(config_class: type | None = None) -> dict[str, str]:
    """The docstring under each field of a config dataclass (LocalTrainConfig by default), read from the source."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(config_class or LocalTrainConfig))
    body = tree.body[0].body
    docs = {}
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
            docs[node.target.id] = " ".join(str(nxt.value.value).split())
    return docs


FLAG_NAMES = {"tasks_dir": "--tasks", "lora": "--no-lora", "verifier_timeout": "--eval-timeout"}
# Names users already type (other GRPO scripts), accepted as well.
FLAG_ALIASES = {"policy_url": ["--vllm-url"], "step_limit": ["--agent-step-limit"]}


def build_parser() -> argparse.ArgumentParser:
    p = OneLineArgumentParser(
        prog="slime-harbor train-local", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter, argument_default=argparse.SUPPRESS,
    )
    p.add_argument("--test", action="store_true",
                   help=f"quick run: {', '.join(f'{k}={v}' for k, v in TEST_PRESET.items())}; other flags override")
    docs = _field_docs()
    defaults = LocalTrainConfig()
    for f in dataclasses.fields(LocalTrainConfig):
        flag = FLAG_NAMES.get(f.name, "--" + f.name.replace("_", "-"))
        default = getattr(defaults, f.name)
        help_text = f"{docs.get(f.name, '')} (default: {default})"
        if f.name == "lora":
            p.add_argument(flag, dest="lora", action="store_false", help=docs["lora"])
        elif default is False:  # switches: --progress, --mask-timeouts, --dynamic-sampling, ...
            p.add_argument(flag, action="store_true", help=docs[f.name])
        elif isinstance(default, list) or f.name == "task_names":
            p.add_argument(flag, dest=f.name, nargs="+", help=help_text)
        elif f.name == "reward_mapping":
            p.add_argument(flag, choices=["raw", "pm1"], help=help_text)
        else:
            # The annotation names the type where the default is None ("float | None", "Path | None").
            kind = {"bool": int, "int": int, "float": float, "Path": Path}.get(str(f.type).split("|")[0].strip(), str)
            p.add_argument(flag, *FLAG_ALIASES.get(f.name, []), dest=f.name, type=kind, help=help_text)
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
    cfg = config_from_args(argv)
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


if __name__ == "__main__":
    main()
