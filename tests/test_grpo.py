"""GRPO maths: hand-computed values for every formula, and equality with SLiME's own functions.

The SLiME comparison runs when `slime.utils.ppo_utils` imports (put a SLiME checkout on
PYTHONPATH); it is skipped, with the reason, where SLiME is absent (CI).
"""

import importlib.util
import math

import pytest
import torch

from slime_harbor import grpo
from slime_harbor.grpo import (
    GRPOConfig,
    group_advantages,
    grpo_loss,
    masked_mean,
    own_compute_approx_kl,
    own_compute_policy_loss,
    reduce_loss,
)

T = torch.tensor


def slime_is_importable() -> bool:
    try:
        return importlib.util.find_spec("slime.utils.ppo_utils") is not None
    except ModuleNotFoundError:
        return False


needs_slime = pytest.mark.skipif(
    not slime_is_importable(), reason="slime is not importable (put a SLiME checkout on PYTHONPATH)"
)


# Both implementations must pass the closed-form tests: ours always, SLiME's when present.
KL_FUNCTIONS = [pytest.param(own_compute_approx_kl, id="own")]
LOSS_FUNCTIONS = [pytest.param(own_compute_policy_loss, id="own")]
if grpo.USING_SLIME:
    KL_FUNCTIONS.append(pytest.param(grpo.compute_approx_kl, id="slime"))
    LOSS_FUNCTIONS.append(pytest.param(grpo.compute_policy_loss, id="slime"))


# ---- KL estimators -------------------------------------------------------------------------

# log_ratio = log_probs - base = [0.5, -0.5]
LP, BASE = T([0.0, -1.0]), T([-0.5, -0.5])
K3 = [math.exp(-0.5) - 1 + 0.5, math.exp(0.5) - 1 - 0.5]  # exp(-x) - 1 + x at x = 0.5, -0.5


@pytest.mark.parametrize("kl_fn", KL_FUNCTIONS)
@pytest.mark.parametrize(
    "kl_type, expected",
    [("k1", [0.5, -0.5]), ("k2", [0.125, 0.125]), ("k3", K3), ("low_var_kl", K3)],
)
def test_kl_estimators_closed_form(kl_fn, kl_type, expected):
    assert kl_fn(LP, BASE, kl_type).tolist() == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("kl_fn", KL_FUNCTIONS)
def test_low_var_kl_is_clamped_and_k3_is_not(kl_fn):
    lp, base = T([0.0]), T([-20.0])  # k3 = exp(-20) - 1 + 20 ~ 19
    assert kl_fn(lp, base, "k3").item() == pytest.approx(19.0, abs=1e-6)
    assert kl_fn(lp, base, "low_var_kl").item() == pytest.approx(10.0)


@pytest.mark.parametrize("kl_fn", KL_FUNCTIONS)
def test_importance_ratio_scales_before_the_clamp(kl_fn):
    ratio = T([0.5, 2.0])
    got = kl_fn(T([0.0, 0.0]), T([-20.0, -0.5]), "low_var_kl", importance_ratio=ratio)
    # 0.5 * 19 = 9.5 stays under the clamp; 2 * (exp(-0.5) - 0.5).
    assert got.tolist() == pytest.approx([9.5, 2 * K3[0]], abs=1e-5)


def test_unknown_kl_type_raises():
    with pytest.raises(ValueError, match="kl_loss_type"):
        own_compute_approx_kl(LP, BASE, "k4")


# ---- clipped policy loss -------------------------------------------------------------------


def ppo_kl_for(ratios):
    """ppo_kl = log pi_old - log pi = -log(ratio)."""
    return -torch.log(T(ratios))


@pytest.mark.parametrize("loss_fn", LOSS_FUNCTIONS)
def test_policy_loss_clips_both_sides_asymmetrically(loss_fn):
    ratios = [1.5, 1.5, 0.5, 0.5, 1.25, 1.25, 1.0]
    adv = T([1.0, -1.0, 1.0, -1.0, 1.0, 1.0, 2.0])
    eps_high = [0.28, 0.28, 0.28, 0.28, 0.28, 0.2, 0.28]  # one case with a symmetric clip
    losses, fracs = [], []
    for r, a, hi in zip(ratios, adv, eps_high):
        loss, frac = loss_fn(ppo_kl_for([r]), a.reshape(1), 0.2, hi)
        losses.append(loss.item())
        fracs.append(frac.item())
    assert losses == pytest.approx(
        [
            -1.28,  # A > 0, ratio above 1 + 0.28: clipped, no further push up
            1.5,  # A < 0, ratio above the range: pessimistic max keeps the unclipped loss
            -0.5,  # A > 0, ratio below the range: unclipped (still pushed up)
            0.8,  # A < 0, ratio below 1 - 0.2: clipped at 0.8
            -1.25,  # 1.25 is inside the clip-higher range: not clipped ...
            -1.2,  # ... but would be with a symmetric 0.2 clip
            -2.0,  # ratio 1: loss = -A
        ],
        abs=1e-6,
    )
    assert fracs == [1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0]


@pytest.mark.parametrize("loss_fn", LOSS_FUNCTIONS)
def test_dual_clip_caps_negative_advantage_loss(loss_fn):
    ratios, adv = [5.0, 2.0, 5.0], T([-1.0, -1.0, 1.0])
    loss, _ = loss_fn(ppo_kl_for(ratios), adv, 0.2, 0.28, eps_clip_c=3.0)
    # -A*ratio = 5 capped at -A*3 = 3; 2 < 3 untouched; A > 0 is clipped as usual at -1.28.
    assert loss.tolist() == pytest.approx([3.0, 2.0, -1.28], abs=1e-6)
    loss_no_dual, _ = loss_fn(ppo_kl_for(ratios), adv, 0.2, 0.28)
    assert loss_no_dual.tolist() == pytest.approx([5.0, 2.0, -1.28], abs=1e-6)


def test_dual_clip_bound_must_exceed_one():
    with pytest.raises(ValueError, match="eps_clip_c"):
        own_compute_policy_loss(ppo_kl_for([1.0]), T([-1.0]), 0.2, 0.28, eps_clip_c=1.0)
    with pytest.raises(ValueError, match="eps_clip_c"):
        GRPOConfig(eps_clip_c=0.5)


# ---- group advantages ----------------------------------------------------------------------


def test_group_advantages_unequal_interleaved_groups():
    rewards = [1.0, 1.0, 0.0, 0.5, 0.0, 1.0]
    groups = [0, 1, 0, 1, 0, 0]  # group 0: [1, 0, 0, 1] mean 0.5; group 1: [1, 0.5] mean 0.75
    adv = group_advantages(rewards, groups)
    assert adv.dtype == torch.float32
    assert adv.tolist() == pytest.approx([0.5, 0.25, -0.5, -0.25, -0.5, 0.5])


def test_group_advantages_after_removed_samples():
    # Prompt "a" kept 3 of 4 samples, prompt "b" kept 1: a lone sample has no baseline.
    adv = group_advantages(T([1.0, 0.0, 0.0, 1.0]), ["a", "a", "a", "b"])
    assert adv.tolist() == pytest.approx([2 / 3, -1 / 3, -1 / 3, 0.0])


def test_group_advantages_std_normalisation():
    adv = group_advantages([1.0, 0.0, 0.0, 1.0, 0.3, 0.3, 7.0], [0, 0, 0, 0, 1, 1, 2], normalize_std=True)
    std = math.sqrt((4 * 0.25) / 3)  # Bessel-corrected std of [1, 0, 0, 1], as torch.std
    a = 0.5 / (std + 1e-6)
    # equal rewards -> 0 (not NaN); a group of one -> 0
    assert adv.tolist() == pytest.approx([a, -a, -a, a, 0.0, 0.0, 0.0], abs=1e-6)


def test_group_advantages_length_mismatch_raises():
    with pytest.raises(ValueError):
        group_advantages([1.0, 0.0], [0])


# ---- reductions ----------------------------------------------------------------------------

PER_TOKEN = T([[1.0, 2.0, 3.0], [4.0, float("nan"), float("inf")]])
MASK = T([[1, 1, 1], [1, 0, 0]])


def test_token_and_sequence_reductions():
    assert reduce_loss(PER_TOKEN, MASK, "token").item() == pytest.approx((1 + 2 + 3 + 4) / 4)
    assert reduce_loss(PER_TOKEN, MASK, "sequence").item() == pytest.approx((2 + 4) / 2)
    assert masked_mean(PER_TOKEN, MASK, dim=-1).tolist() == pytest.approx([2.0, 4.0])
    with pytest.raises(ValueError):
        reduce_loss(PER_TOKEN, MASK, "batch")


def test_fully_masked_sample_counts_in_sequence_mean_only():
    per_token = torch.cat([PER_TOKEN, T([[9.0, 9.0, 9.0]])])
    mask = torch.cat([MASK, T([[0, 0, 0]])])
    assert reduce_loss(per_token, mask, "token").item() == pytest.approx(2.5)
    assert reduce_loss(per_token, mask, "sequence").item() == pytest.approx((2 + 4 + 0) / 3)


# ---- the composed loss ---------------------------------------------------------------------


def test_grpo_config_defaults_and_validation():
    cfg = GRPOConfig()
    assert (cfg.eps_clip, cfg.eps_clip_high, cfg.eps_clip_c) == (0.2, 0.28, None)
    assert (cfg.kl_coef, cfg.kl_loss_type, cfg.use_kl_loss) == (0.001, "low_var_kl", True)
    assert (cfg.normalize_std, cfg.loss_level) == (False, "token")
    with pytest.raises(ValueError):
        GRPOConfig(kl_loss_type="k9")
    with pytest.raises(ValueError):
        GRPOConfig(loss_level="batch")


def test_grpo_loss_on_policy_closed_form_and_gradient():
    # On-policy step (logprobs == old): ratio 1, nothing clipped, d loss / d logprob = -A / N.
    lp = T([[-1.0, -2.0, -0.5], [-1.5, -9.0, float("-inf")]], requires_grad=True)
    old = lp.detach().clone()
    ref = T([[-1.5, -2.0, -0.5], [-1.0, 0.0, 0.0]])  # log_ratio to ref: [0.5, 0, 0], [-0.5]
    adv = T([[1.0], [-2.0]])  # one advantage per sample, broadcast over tokens
    mask = T([[1, 1, 1], [1, 0, 0]])
    cfg = GRPOConfig(kl_loss_type="k1", kl_coef=0.1)

    loss, metrics = grpo_loss(lp, old, ref, adv, mask, cfg)
    pg = -(1 + 1 + 1 - 2) / 4
    kl = (0.5 + 0 + 0 - 0.5) / 4
    assert metrics["pg_loss"] == pytest.approx(pg)
    assert metrics["kl"] == pytest.approx(kl)
    assert loss.item() == pytest.approx(pg + 0.1 * kl)
    assert metrics["clipfrac"] == 0.0 and metrics["ratio_mean"] == pytest.approx(1.0)
    assert metrics["ppo_kl"] == pytest.approx(0.0)

    loss.backward()
    # pg: -A/4 per token; k1 KL: d(lp - ref)/d lp = 1, times 0.1 / 4. Masked tokens: exactly 0,
    # even the -inf padding.
    g = 0.1 / 4
    assert lp.grad.flatten().tolist() == pytest.approx([-0.25 + g] * 3 + [0.5 + g, 0.0, 0.0])


def test_grpo_loss_sequence_level_weighs_samples_equally():
    lp = T([[-1.0, -1.0, -1.0], [-1.0, 0.0, 0.0]])
    adv = T([[1.0], [-2.0]])
    mask = T([[1, 1, 1], [1, 0, 0]])
    cfg = GRPOConfig(loss_level="sequence", use_kl_loss=False)
    loss, metrics = grpo_loss(lp, lp, None, adv, mask, cfg)
    assert loss.item() == pytest.approx((-1.0 + 2.0) / 2)
    assert "kl" not in metrics


def test_grpo_loss_clipped_tokens_get_no_gradient():
    old = T([[0.0, 0.0, 0.0]])
    lp = torch.log(T([[1.5, 0.5, 1.1]])).requires_grad_()  # ratios 1.5 and 0.5 clip, 1.1 not
    adv = T([[1.0, -1.0, 1.0]])
    cfg = GRPOConfig(use_kl_loss=False)
    loss, metrics = grpo_loss(lp, old, None, adv, T([[1, 1, 1]]), cfg)
    assert metrics["clipfrac"] == pytest.approx(2 / 3)
    assert metrics["ratio_mean"] == pytest.approx((1.5 + 0.5 + 1.1) / 3)
    loss.backward()
    # d(-ratio * A)/d lp = -ratio * A / N for the unclipped token only.
    assert lp.grad.flatten().tolist() == pytest.approx([0.0, 0.0, -1.1 / 3])


def test_grpo_loss_kl_needs_reference():
    lp = T([[-1.0]])
    with pytest.raises(ValueError, match="ref_logprobs"):
        grpo_loss(lp, lp, None, T([[1.0]]), T([[1]]), GRPOConfig())


def test_grpo_loss_ignores_kl_when_disabled():
    lp, ref = T([[-1.0, -1.0]]), T([[-3.0, -3.0]])
    cfg = GRPOConfig(use_kl_loss=False, kl_coef=1.0)
    loss, metrics = grpo_loss(lp, lp, ref, T([[1.0, 1.0]]), T([[1, 1]]), cfg)
    assert loss.item() == pytest.approx(-1.0)
    assert metrics["kl"] > 0  # still reported for monitoring


# ---- SLiME switch and equality with SLiME --------------------------------------------------


def test_switch_matches_slime_availability():
    assert grpo.USING_SLIME == slime_is_importable()
    if not grpo.USING_SLIME:
        assert grpo.compute_approx_kl is own_compute_approx_kl
        assert grpo.compute_policy_loss is own_compute_policy_loss


@needs_slime
@pytest.mark.parametrize("kl_type", ["k1", "k2", "k3", "low_var_kl"])
def test_kl_equals_slime_on_random_tensors(kl_type):
    from slime.utils import ppo_utils

    assert grpo.compute_approx_kl is ppo_utils.compute_approx_kl
    gen = torch.Generator().manual_seed(0)
    lp = torch.randn(64, generator=gen) * 3  # wide enough to hit the low_var_kl clamp
    base = torch.randn(64, generator=gen) * 3
    ratio = torch.rand(64, generator=gen) * 2
    for importance_ratio in (None, ratio):
        ours = own_compute_approx_kl(lp, base, kl_type, importance_ratio=importance_ratio)
        theirs = ppo_utils.compute_approx_kl(lp, base, kl_type, importance_ratio=importance_ratio)
        torch.testing.assert_close(ours, theirs)


@needs_slime
@pytest.mark.parametrize("eps_clip_c", [None, 3.0])
def test_policy_loss_equals_slime_on_random_tensors(eps_clip_c):
    from slime.utils import ppo_utils

    assert grpo.compute_policy_loss is ppo_utils.compute_policy_loss
    gen = torch.Generator().manual_seed(1)
    ppo_kl = torch.randn(256, generator=gen) * 0.7  # ratios from ~0.1 to ~8: all regimes
    adv = torch.randn(256, generator=gen)
    ours = own_compute_policy_loss(ppo_kl, adv, 0.2, 0.28, eps_clip_c=eps_clip_c)
    theirs = ppo_utils.compute_policy_loss(ppo_kl, adv, 0.2, 0.28, eps_clip_c=eps_clip_c)
    torch.testing.assert_close(ours[0], theirs[0])
    torch.testing.assert_close(ours[1], theirs[1])
    assert 0 < theirs[1].mean() < 1  # both clipped and unclipped tokens were compared


# --- truncated importance sampling (--use-tis) ------------------------------------------------


def tis_tensors(seed: int = 2):
    gen = torch.Generator().manual_seed(seed)
    shape = (3, 40)
    logprobs = -torch.rand(shape, generator=gen) * 3
    old = logprobs + torch.randn(shape, generator=gen) * 0.05  # the learner's recomputation
    rollout = old + torch.randn(shape, generator=gen) * 0.8  # the sampler: ratios from ~0.1 to ~10
    mask = (torch.rand(shape, generator=gen) > 0.2).float()
    adv = torch.randn(3, 1, generator=gen)
    return logprobs, old, rollout, mask, adv


def test_tis_weights_each_token_by_the_clamped_ratio_and_reports_slimes_metrics():
    logprobs, old, rollout, mask, adv = tis_tensors()
    plain = GRPOConfig(use_kl_loss=False)
    tis = GRPOConfig(use_kl_loss=False, use_tis=True, tis_clip=2.0, tis_clip_low=0.5)
    loss, metrics = grpo_loss(logprobs, old, None, adv, mask, tis, rollout_logprobs=rollout)
    ratio = (old - rollout).exp()
    weights = ratio.clamp(0.5, 2.0)
    per_token, _ = own_compute_policy_loss(old - logprobs, adv.expand_as(logprobs), 0.2, 0.28)
    torch.testing.assert_close(loss, (per_token * weights * mask).sum() / mask.sum())
    assert 0 < metrics["tis_clipfrac"] < 1  # clamped and unclamped tokens
    torch.testing.assert_close(torch.tensor(metrics["tis"]), (ratio * mask).sum() / mask.sum())
    assert set(metrics) >= {"tis", "tis_clipfrac", "tis_abs", "ois"}
    # the sampler's logprobs equal to the old ones: every weight is 1, the loss is the plain one
    same, _ = grpo_loss(logprobs, old, None, adv, mask, tis, rollout_logprobs=old)
    torch.testing.assert_close(same, grpo_loss(logprobs, old, None, adv, mask, plain)[0])
    with pytest.raises(ValueError, match="use_tis needs rollout_logprobs"):
        grpo_loss(logprobs, old, None, adv, mask, tis)
    with pytest.raises(ValueError, match="tis_clip_low"):
        GRPOConfig(use_tis=True, tis_clip=1.0, tis_clip_low=2.0)


def slime_vanilla_tis_function():
    """SLiME's own vanilla_tis_function, compiled from slime/backends/megatron_utils/loss.py (the
    module imports megatron.core; the function needs torch alone)."""
    import ast
    from pathlib import Path

    spec = importlib.util.find_spec("slime")
    source = Path(list(spec.submodule_search_locations)[0]) / "backends" / "megatron_utils" / "loss.py"
    tree = ast.parse(source.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "vanilla_tis_function")
    namespace = {"torch": torch, "Any": object}
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(source), "exec"), namespace)
    return namespace["vanilla_tis_function"]


@needs_slime
@pytest.mark.parametrize("clip_low", [0.0, 0.5])
def test_tis_equals_slimes_vanilla_tis_function(clip_low):
    from argparse import Namespace

    logprobs, old, rollout, mask, adv = tis_tensors(3)
    config = GRPOConfig(use_kl_loss=False, use_tis=True, tis_clip=2.0, tis_clip_low=clip_low, loss_level="sequence")
    ours, metrics = grpo_loss(logprobs, old, None, adv, mask, config, rollout_logprobs=rollout)
    # SLiME: per-token pg_loss over the concatenated samples, times its TIS weights, reduced per sample
    per_token, _ = grpo.compute_policy_loss(old - logprobs, adv.expand_as(logprobs), 0.2, 0.28)
    args = Namespace(tis_clip=2.0, tis_clip_low=clip_low)
    rows = range(len(mask))
    pg, _, tis_metrics = slime_vanilla_tis_function()(
        args, pg_loss=torch.cat([per_token[i] for i in rows]), train_log_probs=[old[i] for i in rows],
        rollout_log_probs=[rollout[i] for i in rows], loss_masks=[mask[i] for i in rows])
    pg = pg.view_as(mask)
    theirs = torch.stack([(pg[i] * mask[i]).sum() / mask[i].sum() for i in rows]).mean()
    torch.testing.assert_close(ours, theirs)
    for name in ("tis", "tis_clipfrac", "tis_abs"):
        value = tis_metrics[name].view_as(mask)
        expected = torch.stack([(value[i] * mask[i]).sum() / mask[i].sum() for i in rows]).mean()
        torch.testing.assert_close(torch.tensor(metrics[name]), expected)
