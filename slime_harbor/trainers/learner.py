"""The learner of the local GRPO trainer: the policy (a torch module, LoRA adapters by default), its
update step on a rollout's samples (grpo.grpo_loss over micro-batches, AdamW), its checkpoints,
and how the policy is served meanwhile (an embedded engine on the very module being trained, or
weights pushed to an external server: policy/weights.py). trainers/local.py's loop drives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import json
import random
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from slime_harbor.exits import ConfigError
from slime_harbor.grpo import episode_advantages, grpo_loss, masked_mean, rft_loss
from slime_harbor.policy.chat_formats import keep_record
from slime_harbor.policy.weights import peft_quietly
from slime_harbor.samples import SampleStatus, TrainingSample, is_success
from slime_harbor.trainers.local_config import TRAINER_STATE, LocalTrainConfig

OPTIMIZER_STATE = "optimizer.pt"
RNG_STATE = "rng.pt"


@dataclass
class Batch:
    """Samples left-padded to one width, with per-response-token tensors right-aligned to R."""

    input_ids: torch.Tensor  # [B, W]
    attention_mask: torch.Tensor  # [B, W]
    position_ids: torch.Tensor  # [B, W]
    targets: torch.Tensor  # [B, R] the last R tokens of each row
    loss_mask: torch.Tensor  # [B, R] 1 = sampled by the policy; 0 = observation, prompt, padding
    old_logprobs: torch.Tensor  # [B, R] the sampler's logprobs, or (use_tis) the learner's recomputation
    advantages: torch.Tensor  # [B, 1]
    rollout_logprobs: torch.Tensor  # [B, R] the sampler's logprobs


def make_batch(samples: Sequence[TrainingSample], advantages: Sequence[float], device="cpu",
               old_logprobs: Sequence[Sequence[float]] | None = None) -> Batch:
    """Left padding puts every response at the end of its row, so one `logits_to_keep` covers all.
    `old_logprobs` (one list per sample, its response's length) replace the sampler's as the old
    policy's; without them the sampler's are both."""
    width = max(len(s.tokens) for s in samples)
    resp = max(s.response_length for s in samples)
    b = len(samples)
    input_ids = torch.zeros((b, width), dtype=torch.long)
    attention = torch.zeros((b, width), dtype=torch.long)
    loss_mask = torch.zeros((b, resp), dtype=torch.float32)
    rollout = torch.zeros((b, resp), dtype=torch.float32)
    old = torch.zeros((b, resp), dtype=torch.float32)
    for i, s in enumerate(samples):
        n = s.response_length
        input_ids[i, width - len(s.tokens):] = torch.tensor(s.tokens)
        attention[i, width - len(s.tokens):] = 1
        loss_mask[i, resp - n:] = torch.tensor(s.loss_mask, dtype=torch.float32)
        rollout[i, resp - n:] = torch.tensor(s.rollout_log_probs, dtype=torch.float32)
        old[i, resp - n:] = torch.tensor(old_logprobs[i] if old_logprobs is not None else s.rollout_log_probs,
                                         dtype=torch.float32)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)  # as the engine's prefill: pads do not shift positions
    return Batch(
        input_ids.to(device), attention.to(device), positions.to(device), input_ids[:, width - resp:].to(device),
        loss_mask.to(device), old.to(device), torch.tensor(list(advantages), dtype=torch.float32)[:, None].to(device),
        rollout.to(device),
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

            # lora_dropout 0: the trained forward pass must be the one the engine sampled with.
            lora = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
                              target_modules=list(cfg.lora_target_modules), task_type="CAUSAL_LM")
            from peft.utils.error import NoMatchingPeftModuleError

            try:
                with peft_quietly():
                    model = (PeftModel.from_pretrained(base, checkpoint, is_trainable=True) if checkpoint is not None
                             else get_peft_model(base, lora))
            except NoMatchingPeftModuleError:
                # A model whose attention projections have other names (a Mamba- or linear-attention-
                # only one); layers without them (a hybrid's Mamba layers) are fine as long as some match.
                raise ConfigError(f"--lora-target-modules {' '.join(cfg.lora_target_modules)}: no module of "
                                  f"{base_model} ({base.config.model_type}) has these names; name its linear layers, "
                                  "or train every weight with --no-lora") from None
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
        keep_record(self.base_model, out)
        if with_optimizer:
            torch.save(self.optimizer.state_dict(), out / OPTIMIZER_STATE)


def recompute_old_logprobs(policy: Policy, samples: Sequence[TrainingSample], cfg: LocalTrainConfig,
                           device: str) -> list[list[float]]:
    """Each sample's response logprobs under the learner's current weights, no grad, 0.0 where
    masked as the sampler's are: the old policy of --use-tis (as SLiME's actor recomputes log_probs
    before training) and of a server that does not take our weights."""
    out: list[list[float]] = []
    with torch.no_grad():
        for start in range(0, len(samples), cfg.micro_batch_size):
            micro = samples[start:start + cfg.micro_batch_size]
            logprobs = token_logprobs(policy.model, make_batch(micro, [0.0] * len(micro), device), cfg.temperature).cpu()
            for i, s in enumerate(micro):
                ours = logprobs[i, logprobs.shape[1] - s.response_length:]
                out.append(torch.where(torch.tensor(s.loss_mask, dtype=torch.bool), ours, 0.0).tolist())
    return out


def update(policy: Policy, samples: Sequence[TrainingSample], advantages: Sequence[float],
           cfg: LocalTrainConfig, device: str, old_logprobs: Sequence[Sequence[float]] | None = None) -> dict[str, float]:
    """One optimizer step on `samples`: grpo_loss over all of them, accumulated micro-batch by
    micro-batch with weights that make the sum equal the loss of the whole minibatch.
    `old_logprobs`: the learner's recomputation (--use-tis), else the sampler's logprobs are old."""
    grpo = cfg.grpo()
    total_tokens = sum(sum(s.loss_mask) for s in samples)
    policy.optimizer.zero_grad(set_to_none=True)
    sums: dict[str, float] = {}
    for start in range(0, len(samples), cfg.micro_batch_size):
        micro = samples[start:start + cfg.micro_batch_size]
        batch = make_batch(micro, advantages[start:start + cfg.micro_batch_size], device,
                           old_logprobs[start:start + cfg.micro_batch_size] if old_logprobs is not None else None)
        # token-level reduction: the micro-batch's mean weighs by its share of the tokens;
        # sequence-level: by its share of the samples.
        share = (batch.loss_mask.sum().item() / total_tokens if grpo.loss_level == "token"
                 else len(micro) / len(samples))
        logprobs = token_logprobs(policy.model, batch, cfg.temperature)
        if cfg.objective == "rft":
            loss, metrics = rft_loss(logprobs, batch.loss_mask, grpo.loss_level)
        else:
            ref = policy.reference_logprobs(batch, cfg.temperature)
            loss, metrics = grpo_loss(logprobs, batch.old_logprobs, ref, batch.advantages, batch.loss_mask, grpo,
                                      rollout_logprobs=batch.rollout_logprobs)
        (loss * share).backward()
        # How far the policy is from the sampler, token by token (ppo_kl's mean can cancel out).
        metrics["abs_ppo_kl"] = masked_mean((logprobs.detach() - batch.rollout_logprobs).abs(), batch.loss_mask).item()
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
    # Removed samples by how their episode ended: aborted (a transient failure) and failed (a
    # permanent one: no reward, an image that does not build) apart; those a filter or the hack
    # monitor masked are counted in "filters" (filters.mask_counts).
    out: dict[str, Any] = {"n_samples": len(samples), "aborted": sum(s.status == SampleStatus.ABORTED for s in samples),
                           "failed": sum(s.status == SampleStatus.FAILED for s in samples), "n_trained_samples": 0,
                           "n_tokens": 0, "skipped": None, "updates": []}
    if not kept:
        out["skipped"] = "no trainable sample"
        return out
    if cfg.objective == "rft":  # the successful episodes only, each token's likelihood raised alike
        kept = [s for s in kept if is_success(s.reward)]
        if not kept:
            out["skipped"] = "no successful episode to fine-tune on"
            return out
        advantages = [1.0] * len(kept)
    else:
        advantages = episode_advantages(kept, normalize_std=cfg.grpo().normalize_std)
        if all(a == 0.0 for a in advantages):
            out["skipped"] = "every advantage is 0 (equal rewards within each group)"
            return out
    n_minibatches = min(cfg.updates_per_rollout, len(kept))
    bounds = [round(i * len(kept) / n_minibatches) for i in range(n_minibatches + 1)]
    # --use-tis: the old policy is the learner's weights before this step's first update
    old = recompute_old_logprobs(policy, kept, cfg, device) if cfg.use_tis and cfg.objective == "grpo" else None
    for lo, hi in zip(bounds, bounds[1:]):
        out["updates"].append(update(policy, kept[lo:hi], advantages[lo:hi], cfg, device,
                                     old[lo:hi] if old is not None else None))
    out["n_trained_samples"] = len(kept)
    out["n_tokens"] = int(sum(u["n_tokens"] for u in out["updates"]))
    # Step-level figures: token-weighted means over the updates.
    for k in ("loss", "pg_loss", "nll", "kl", "clipfrac", "ppo_kl", "abs_ppo_kl", "ratio_mean",
              "tis", "tis_clipfrac", "tis_abs", "ois"):
        values = [(u[k], u["n_tokens"]) for u in out["updates"] if k in u]
        if values:
            out[k] = sum(v * w for v, w in values) / sum(w for _, w in values)
    return out


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


def server_logprob_gap(policy: Policy, samples: Sequence[TrainingSample], cfg: LocalTrainConfig, device: str,
                       recompute: bool) -> tuple[list[TrainingSample], dict[str, float]]:
    """How far the server's logprobs are from the trained policy's, over the sampled tokens (mean
    and max abs). With `recompute` (a server that does not take our weights) the samples' old
    logprobs become the trained policy's, so the PPO ratio starts at 1 as it does on-policy."""
    kept = trainable(samples)
    if not kept:
        return list(samples), {}
    ours = recompute_old_logprobs(policy, kept, cfg, device)
    gap = torch.cat([(torch.tensor(lp) - torch.tensor(s.rollout_log_probs)).abs()[torch.tensor(s.loss_mask, dtype=torch.bool)]
                     for s, lp in zip(kept, ours)])
    stats = {"server_logprob_gap": gap.mean().item(), "server_logprob_gap_max": gap.max().item()}
    if recompute:
        recomputed = {id(s): lp for s, lp in zip(kept, ours)}
        samples = [dataclasses.replace(s, rollout_log_probs=recomputed[id(s)]) if id(s) in recomputed else s
                   for s in samples]
    return list(samples), stats


class Learner:
    """The policy side of the loop: serves the policy (an embedded engine, or pushes to the external
    server at cfg.policy_url), trains it on a rollout's samples and saves it. train() drives it;
    examples/harbor/harbor_grpo_modal.py runs one on a Modal GPU.

    Versions: weight version v is the weights after v updates (0: as loaded). Each train_step(N)
    publishes version N, also when it had nothing to train, and the server labels every call with
    the version that sampled it. Synchronous (max_staleness 0), the engine serves the very module
    being trained, paused while it trains. Asynchronous, it serves a copy that the trainer never
    touches, sampling on while the update runs; publishing hands it the next copy, which it takes
    between calls (calls in flight finish on the old one)."""

    def __init__(self, cfg: LocalTrainConfig, base_model: str, device: str, checkpoint: Path | None,
                 out: Path, start: int, host: str = "127.0.0.1"):
        from slime_harbor.policy.weight_check import WeightCheck
        from slime_harbor.policy.weights import WeightSync

        self.cfg, self.device = cfg, device
        self.policy = Policy.load(cfg, base_model, device, checkpoint)
        self._stack = contextlib.ExitStack()
        self.engine = self.sync = None
        self.asynchronous = cfg.max_staleness > 0
        if cfg.policy_url:
            self.url = cfg.policy_url
            # Asynchronous, full (merged) weights: a call names no adapter, so it samples the
            # server's current weights, whichever update it spans (check_train_config refuses lora).
            mode = "disk" if self.asynchronous and cfg.weight_sync == "auto" else cfg.weight_sync
            self.sync = WeightSync(cfg.policy_url, mode, out / "weights", pause=cfg.update_pause)
            # The server must serve what we train from the first rollout on, and label its calls
            # with our versions when staleness is judged on them.
            pushed = bool(checkpoint or cfg.lora or self.asynchronous) and self.sync.push(
                self.policy.model, self.policy.tokenizer, start)
            cause = ("the server was started on another model than --model" if not pushed else
                     "the server's base model is not --model, or it did not load the adapter" if self.sync.lora_name
                     else "the server did not take the pushed weights whole")
        else:
            from slime_harbor.policy.embedded_engine import EngineConfig, SamplingEngine
            from slime_harbor.policy.server import EmbeddedPolicyServer

            # The engine serves the very module the optimizer updates; a new seed per start so a
            # resumed run does not replay the samples of the steps before it.
            engine_config = EngineConfig(device=device, seed=cfg.seed + start)
            served = copy.deepcopy(self.policy.model) if self.asynchronous else self.policy.model
            self.engine = self._stack.enter_context(SamplingEngine(served, self.policy.tokenizer, engine_config))
            self.engine.weight_version = start
            # Its updates happen in this process: no caller needs its update routes, so a key no
            # one holds shuts them to anything that reaches the port (a sandbox, another node).
            server = EmbeddedPolicyServer(engine=self.engine, model_name="policy", host=host,
                                          admin_key=secrets.token_hex(24))
            self.url = self._stack.enter_context(server).url
            cause = "the engine's copy of the weights is not the trained module"
        # Before the first rollout: the server samples the weights this run starts from (an
        # engine started on another model, or a push that did not take, stops the run here).
        self.check = WeightCheck(self.url, cfg.weight_check, lora_name=self.lora_name)
        try:
            self.check_figures = self.check.check(self.policy.model, self.policy.tokenizer, start, cause)
        except BaseException:  # a refused check (or an interrupt) leaves no server or engine behind: raised again
            self.close()
            raise

    @property
    def lora_name(self) -> str | None:
        """The adapter rollouts sample from on the external server (None: its own weights)."""
        return self.sync.lora_name if self.sync else None

    @property
    def weight_version(self) -> int:
        return self.engine.weight_version if self.engine else self.sync.version

    def train_step(self, samples: Sequence[TrainingSample], step: int) -> dict[str, Any]:
        """train_on_samples, then the server samples version `step` (the updated weights). Safe to
        run in a worker thread while rollouts go on (asynchronous)."""
        gap: dict[str, float] = {}
        # Synchronous, the engine serves this very module: nothing samples while it changes.
        paused = self.engine.paused() if self.engine and not self.asynchronous else contextlib.nullcontext()
        with paused:
            if self.sync:
                samples, gap = server_logprob_gap(self.policy, samples, self.cfg, self.device,
                                                  recompute=self.sync.mode == "none")
            result = train_on_samples(self.policy, samples, self.cfg, self.device)
        if kept := trainable(samples):  # the run's first trained sample is its probe from now on
            self.check.fix_probe(kept[0].tokens)
        if self.engine:
            # Every update advances the version, one that trained nothing too.
            changed = result["updates"] and self.asynchronous
            self.engine.update_model(copy.deepcopy(self.policy.model) if changed else self.engine.model, version=step)
            cause = "the engine's copy of the weights is not the trained module"
        else:
            result["weights_pushed"] = self.sync.push(self.policy.model, self.policy.tokenizer, step)
            cause = ("the server did not take the pushed adapter" if self.sync.lora_name else
                     "the server did not take the pushed weights whole (a layer it failed to load: read its log)")
        # The served weights are the trained ones, before anything samples them (a server that
        # takes no weights, --weight-sync none, keeps its own: nothing to compare after updates).
        self.check.lora_name = self.lora_name
        if not self.sync or self.sync.mode != "none":
            result.update(self.check.check(self.policy.model, self.policy.tokenizer, step, cause))
        return {**result, **gap}

    def frozen_policy(self):
        """A module holding the weights of the current version that nothing will change: what an
        evaluation samples while updates go on (the engine's own copy, asynchronous)."""
        if self.engine and self.asynchronous:
            return self.engine.model
        return copy.deepcopy(self.policy.model)

    @contextlib.asynccontextmanager
    async def serving_frozen(self, version: int):
        """A second embedded server on frozen_policy() (version `version`, the current one), its
        sampling seeded apart from the run's and from every other version's: what a held-out
        evaluation samples while updates go on. Yields its URL; the server (started and stopped in
        a thread, off the event loop) and its engine end with the block, however it ends."""
        from slime_harbor.policy.embedded_engine import EngineConfig, SamplingEngine
        from slime_harbor.policy.server import EmbeddedPolicyServer

        engine = SamplingEngine(self.frozen_policy(), self.policy.tokenizer,
                                EngineConfig(device=self.device, seed=self.cfg.seed + 1_000_003 * (version + 1)))
        try:
            server = await asyncio.to_thread(EmbeddedPolicyServer, engine=engine, model_name="policy")
            try:
                yield server.url
            finally:
                await asyncio.to_thread(server.stop)
        finally:
            engine.close()

    def save_checkpoint(self, out: Path, step: int, metrics: list[dict]) -> None:
        save_checkpoint(self.policy, out, step, metrics)

    def save_final(self, out: Path) -> None:
        self.policy.save(out, with_optimizer=False)

    def close(self) -> None:
        self._stack.close()
