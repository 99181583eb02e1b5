"""GRPO maths: group-relative advantages and the clipped policy loss with a KL penalty.

Every trainer uses this file: the SLiME hooks compute advantages with `episode_advantages`, and
the local trainer computes its loss with `grpo_loss`. The two core formulas follow SLiME's
`slime/utils/ppo_utils.py` exactly (same signatures, same semantics). They are written out
here so the maths can be read and run without SLiME; where SLiME is importable its own
functions are used instead, so a run under SLiME and a run here compute the same thing
(`USING_SLIME` says which is in use; tests check the two agree).

Shapes: per-token tensors are [batch, response_len], padded; `loss_mask` is 1 on tokens the
policy sampled and 0 on observation, template and padding tokens. Masked positions may hold
anything (even -inf): `grpo_loss` zeroes them before any arithmetic, so neither the loss nor
its gradient can turn NaN through padding.

One GRPO step, as SLiME composes it (slime/backends/megatron_utils/loss.py):
    ppo_kl   = old_logprobs - logprobs           per token, log(pi_old / pi)
    ratio    = exp(-ppo_kl)                      pi / pi_old
    pg_loss  = reduce(max(-ratio * A, -clip(ratio, 1 - eps_clip, 1 + eps_clip_high) * A))
    loss     = pg_loss + kl_coef * reduce(approx_kl(logprobs, ref_logprobs))
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from slime_harbor.samples import episode_key

KL_LOSS_TYPES = ("k1", "k2", "k3", "low_var_kl")
LOSS_LEVELS = ("token", "sequence")


@dataclass
class GRPOConfig:
    """Knobs of the GRPO loss. Defaults are SLiME's GRPO recipe (scripts/run-qwen3-4B.sh)."""

    eps_clip: float = 0.2
    """Lower clip range: the ratio pi/pi_old is clipped below at 1 - eps_clip."""
    eps_clip_high: float = 0.28
    """Upper clip range: clipped above at 1 + eps_clip_high. Larger than eps_clip (DAPO's
    clip-higher) so unlikely tokens with positive advantage can still grow."""
    eps_clip_c: float | None = None
    """Dual-clip bound (> 1) on the loss of negative-advantage tokens: caps -A * ratio at
    -A * eps_clip_c when the ratio has run far above 1. None disables it."""
    kl_coef: float = 0.001
    """Weight of the KL penalty towards the reference policy (SLiME's --kl-loss-coef)."""
    kl_loss_type: str = "low_var_kl"
    """KL estimator: k1, k2, k3 or low_var_kl (k3 clamped to [-10, 10])."""
    use_kl_loss: bool = True
    """Add the KL penalty to the loss (needs reference logprobs)."""
    normalize_std: bool = False
    """Divide group-centred rewards by the group's std (GRPO) or not (Dr. GRPO). Read by
    callers of `group_advantages`; the loss itself takes advantages as given."""
    loss_level: Literal["token", "sequence"] = "token"
    """Loss reduction: "token" = mean over every unmasked token of the batch (long
    trajectories weigh more); "sequence" = mean over samples of each sample's token mean."""
    use_tis: bool = False
    """Truncated importance sampling (SLiME's --use-tis): each token's policy-gradient loss times
    clamp(exp(old - rollout), tis_clip_low, tis_clip), old being the learner's own logprobs of the
    weights that sampled (a recomputation) and rollout the sampler's. Corrects for the sampler
    not being the learner (another engine, precision or weight version)."""
    tis_clip: float = 2.0
    """Upper bound of the TIS weight (SLiME's --tis-clip)."""
    tis_clip_low: float = 0.0
    """Lower bound of the TIS weight (SLiME's --tis-clip-low)."""

    def __post_init__(self) -> None:
        if self.kl_loss_type not in KL_LOSS_TYPES:
            raise ValueError(f"kl_loss_type must be one of {KL_LOSS_TYPES}, got {self.kl_loss_type!r}")
        if self.loss_level not in LOSS_LEVELS:
            raise ValueError(f"loss_level must be one of {LOSS_LEVELS}, got {self.loss_level!r}")
        if self.eps_clip_c is not None and self.eps_clip_c <= 1.0:
            raise ValueError(f"eps_clip_c must be > 1.0 (or None), got {self.eps_clip_c}")
        if not 0 <= self.tis_clip_low <= self.tis_clip:
            raise ValueError(f"need 0 <= tis_clip_low <= tis_clip, got {self.tis_clip_low} and {self.tis_clip}")


# --------------------------------------------------------------------------------------------
# The two formulas, written out (SLiME's ppo_utils.compute_approx_kl / compute_policy_loss).


def own_compute_approx_kl(
    log_probs: torch.Tensor,
    log_probs_base: torch.Tensor,
    kl_loss_type: str,
    importance_ratio: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_base) from the logprobs of the sampled tokens.

    Estimators from http://joschu.net/blog/kl-approx.html, with log_ratio = log pi - log pi_base:
        k1 = log_ratio                      unbiased, high variance, can be negative
        k2 = log_ratio**2 / 2               biased, low variance
        k3 = exp(-log_ratio) - 1 + log_ratio   unbiased, low variance, never negative
    low_var_kl is k3 clamped to [-10, 10] so one wild token cannot blow up the loss.
    `importance_ratio` (pi / pi_old) reweights tokens sampled by pi_old (DeepSeek-V3.2).
    """
    log_ratio = log_probs.float() - log_probs_base.float()

    if kl_loss_type == "k1":
        kl = log_ratio
    elif kl_loss_type == "k2":
        kl = log_ratio**2 / 2.0
    elif kl_loss_type in ("k3", "low_var_kl"):
        # With r = pi_base / pi: E_pi[r - 1 - log r] = KL(pi || pi_base), and r - 1 - log r >= 0.
        log_r = -log_ratio
        kl = log_r.exp() - 1 - log_r
    else:
        raise ValueError(f"Unknown kl_loss_type: {kl_loss_type}")

    if importance_ratio is not None:
        kl = importance_ratio * kl

    # SLiME clamps after the importance ratio, and only for low_var_kl.
    if kl_loss_type == "low_var_kl":
        kl = torch.clamp(kl, min=-10, max=10)
    return kl


def own_compute_policy_loss(
    ppo_kl: torch.Tensor,
    advantages: torch.Tensor,
    eps_clip: float,
    eps_clip_high: float,
    eps_clip_c: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO clipped surrogate per token. Returns (pg_losses, clipfrac), both per token.

    ppo_kl = log pi_old - log pi, so ratio = pi / pi_old = exp(-ppo_kl). Taking the max of the
    two losses is the pessimistic choice: the clipped term only wins when the ratio has moved
    past the clip range in the direction the advantage rewards, and then its gradient is 0.
    clipfrac is 1 where the clipped term won.
    """
    ratio = (-ppo_kl).exp()
    unclipped = -ratio * advantages
    clipped = -ratio.clamp(1 - eps_clip, 1 + eps_clip_high) * advantages
    pg_losses = torch.maximum(unclipped, clipped)
    clipfrac = torch.gt(clipped, unclipped).float()

    if eps_clip_c is not None:
        # Dual clip: for A < 0 the loss -ratio*A grows without bound as the ratio grows;
        # cap it at -eps_clip_c * A (the gradient is 0 there).
        if eps_clip_c <= 1.0:
            raise ValueError(f"eps_clip_c must be > 1.0 for dual-clip PPO, got {eps_clip_c}")
        capped = torch.minimum(pg_losses, -eps_clip_c * advantages)
        pg_losses = torch.where(advantages < 0, capped, pg_losses)

    return pg_losses, clipfrac


# Use SLiME's own functions when SLiME is installed, so the local trainer and the tests exercise
# the code SLiME trains with. Only a missing module switches to ours: a broken install is loud.
try:
    from slime.utils.ppo_utils import compute_approx_kl as _slime_compute_approx_kl
    from slime.utils.ppo_utils import compute_policy_loss as _slime_compute_policy_loss
except ModuleNotFoundError:
    USING_SLIME = False
    compute_approx_kl = own_compute_approx_kl
    compute_policy_loss = own_compute_policy_loss
else:
    USING_SLIME = True
    compute_approx_kl = _slime_compute_approx_kl
    compute_policy_loss = _slime_compute_policy_loss


# --------------------------------------------------------------------------------------------
# Advantages and reductions.


def group_advantages(
    rewards: Sequence[float] | torch.Tensor,
    group_ids: Sequence[Hashable],
    normalize_std: bool = False,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Group-relative advantage of each sample: its reward minus its group's mean reward.

    A group is the samples of one prompt (`Sample.group_index`); groups may have any size,
    in any order, so callers pass only the samples they keep (removed samples, fan-out of one
    trajectory into several samples). A group of one has no baseline: advantage 0.
    With `normalize_std`, divide by (std + eps), std with Bessel's correction as SLiME's
    torch.std; a group whose rewards are all equal gets 0, not NaN.
    Returns a float32 tensor with one advantage per sample, in input order.
    """
    rewards = torch.as_tensor(rewards, dtype=torch.float32).flatten()
    if len(group_ids) != len(rewards):
        raise ValueError(f"{len(rewards)} rewards but {len(group_ids)} group ids")

    members: dict[Hashable, list[int]] = {}
    for i, gid in enumerate(group_ids):
        members.setdefault(gid, []).append(i)

    advantages = torch.zeros_like(rewards)
    for idx in members.values():
        if len(idx) < 2:
            continue
        group = rewards[idx]
        centred = group - group.mean()
        if normalize_std:
            centred = centred / (group.std() + eps)
        advantages[idx] = centred
    return advantages


def episode_advantages(samples: Sequence, rewards: Sequence[float] | None = None, normalize_std: bool = False) -> list[float]:
    """Group-relative advantage per sample, where each EPISODE counts once in its group's baseline.

    An episode is (group_index, rollout_id or index): the converter splits an episode whose
    tokens came as several segments sharing one rollout_id, and those segments must neither
    weigh their episode twice in the mean nor get different advantages. It is given samples, as
    the episodes left (train-local's update batch, SLiME's Samples). Pass only kept samples
    (not remove_sample); `rewards` defaults to each sample's `.reward`.
    """
    rewards = [float(s.reward) for s in samples] if rewards is None else [float(r) for r in rewards]
    episodes: dict[tuple, float] = {}
    for s, r in zip(samples, rewards, strict=True):
        episodes.setdefault(episode_key(s), r)
    keys = list(episodes)
    values = group_advantages([episodes[k] for k in keys], [k[0] for k in keys], normalize_std=normalize_std)
    by_episode = dict(zip(keys, values.tolist()))
    return [by_episode[episode_key(s)] for s in samples]


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `values` where mask is 1 (over all elements, or along `dim`).

    Masked positions are replaced, not multiplied, by 0 so padding holding inf/NaN is harmless.
    An all-masked slice gives 0 (denominator clamped to 1, as SLiME does).
    """
    mask = mask.bool()
    kept = torch.where(mask, values, torch.zeros_like(values))
    if dim is None:
        return kept.sum() / mask.sum().clamp_min(1)
    return kept.sum(dim=dim) / mask.sum(dim=dim).clamp_min(1)


def reduce_loss(
    per_token: torch.Tensor, mask: torch.Tensor, level: Literal["token", "sequence"] = "token"
) -> torch.Tensor:
    """Reduce a [batch, len] per-token loss to a scalar.

    token:    sum over every unmasked token / number of unmasked tokens (SLiME's
              --calculate-per-token-loss); every sampled token weighs the same.
    sequence: mean over samples of each sample's masked mean (SLiME's default); every sample
              weighs the same. A sample with no unmasked token adds 0 but still counts.
    """
    if level == "token":
        return masked_mean(per_token, mask)
    if level == "sequence":
        return masked_mean(per_token, mask, dim=-1).mean()
    raise ValueError(f"level must be one of {LOSS_LEVELS}, got {level!r}")


# --------------------------------------------------------------------------------------------
# The loss.


def rft_loss(logprobs: torch.Tensor, loss_mask: torch.Tensor,
             level: Literal["token", "sequence"] = "token") -> tuple[torch.Tensor, dict[str, float]]:
    """Rejection fine-tuning: the negative log-likelihood of the sampled tokens of successful
    episodes (the caller keeps only those), reduced like the GRPO loss. No advantage, clip or KL:
    what GRPO is compared with in bench/learning.py."""
    nll = reduce_loss(-torch.where(loss_mask.bool(), logprobs, torch.zeros_like(logprobs)), loss_mask, level)
    return nll, {"loss": nll.item(), "nll": nll.item()}


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor | None,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    config: GRPOConfig,
    rollout_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO loss for one batch, composed as SLiME's policy_loss_function.

    logprobs:     [B, T] logprobs of the sampled tokens under the policy being trained (grad).
    old_logprobs: [B, T] logprobs when sampled (rollout logprobs, or the trainer's recompute).
    ref_logprobs: [B, T] logprobs under the frozen reference policy; needed if use_kl_loss.
    advantages:   [B, T] per-token advantages ([B, 1] broadcasts one per sample).
    loss_mask:    [B, T] 1 = token sampled by the policy, 0 = observation / template / padding.
    rollout_logprobs: [B, T] the sampler's logprobs; needed if use_tis (old_logprobs are then the
                  learner's recomputation).
    Returns (loss, metrics) with metrics loss, pg_loss, clipfrac, ppo_kl, ratio_mean, with
    reference logprobs kl, and with use_tis SLiME's tis, tis_clipfrac, tis_abs and ois (each
    reduced the same way as the loss).
    """
    if config.use_kl_loss and ref_logprobs is None:
        raise ValueError("use_kl_loss needs ref_logprobs")
    if config.use_tis and rollout_logprobs is None:
        raise ValueError("use_tis needs rollout_logprobs")
    mask = loss_mask.bool()

    def kept(x: torch.Tensor) -> torch.Tensor:
        # Zero masked positions first: exp(-inf - -inf) is NaN, and a NaN anywhere in the
        # graph would reach the model's gradients even though the loss never reads it.
        return torch.where(mask, x, torch.zeros_like(x))

    logprobs, advantages = kept(logprobs), kept(advantages)
    old_logprobs = kept(old_logprobs.detach())
    ppo_kl = old_logprobs - logprobs
    pg_losses, clipfrac = compute_policy_loss(
        ppo_kl, advantages, config.eps_clip, config.eps_clip_high, eps_clip_c=config.eps_clip_c
    )
    metrics: dict[str, float] = {}
    if config.use_tis:  # SLiME's vanilla_tis_function, on the same tensors
        tis = (old_logprobs - kept(rollout_logprobs.detach())).exp()
        weights = tis.clamp(min=config.tis_clip_low, max=config.tis_clip)
        pg_losses = pg_losses * weights
        with torch.no_grad():
            for name, value in (("tis", tis), ("tis_clipfrac", (weights != tis).float()), ("tis_abs", (tis - 1).abs()),
                                ("ois", (-ppo_kl).exp())):
                metrics[name] = reduce_loss(value, loss_mask, config.loss_level).item()
    pg_loss = reduce_loss(pg_losses, loss_mask, config.loss_level)
    loss = pg_loss

    if ref_logprobs is not None:
        kl = compute_approx_kl(logprobs, kept(ref_logprobs.detach()), kl_loss_type=config.kl_loss_type)
        kl_loss = reduce_loss(kl, loss_mask, config.loss_level)
        metrics["kl"] = kl_loss.item()
        if config.use_kl_loss:
            loss = loss + config.kl_coef * kl_loss

    with torch.no_grad():
        metrics["loss"] = loss.item()
        metrics["pg_loss"] = pg_loss.item()
        metrics["clipfrac"] = reduce_loss(clipfrac, loss_mask, config.loss_level).item()
        metrics["ppo_kl"] = reduce_loss(ppo_kl, loss_mask, config.loss_level).item()
        metrics["ratio_mean"] = reduce_loss((-ppo_kl).exp(), loss_mask, config.loss_level).item()
    return loss, metrics
