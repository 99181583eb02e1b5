"""Training throughput: one local GRPO update (ours) vs TRL's GRPOTrainer loss, same model and batch.

A fixed batch: one prompt, --batch-size completions of exactly --completion-tokens tokens sampled
from the model by our SamplingEngine (so old logprobs are real sampler logprobs), rewards 0..B-1.
Both sides do the same work per step, on LoRA adapters (peft) over the same base weights:
    reference forward (adapters disabled, no grad) + policy forward + loss + backward + AdamW step
    ours: slime_harbor.trainers.local.update (grpo_loss, token-level mean, low_var_kl)
    TRL:  GRPOTrainer._get_per_token_logps_and_entropies (reference) + GRPOTrainer.compute_loss
          with loss_type="bnpo" (token-level mean), beta = kl coef, epsilon 0.2 / 0.28
Reported: trained tokens/s of each (median over --steps after --warmup) and their ratio. Before
timing, both losses are computed on the same inputs with old logprobs shifted off the current
policy (so the ratio is not 1 and the clip engages): the same formula, they should agree to ~1e-6.

    .venv/bin/python bench/train_throughput.py [--model-dir DIR | --hidden-size 512 --layers 4]
        [--batch-size 8] [--completion-tokens 128]

TRL is imported here only (pip install trl); without it the bench says so and reports ours alone.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from slime_harbor.policy.embedded_engine import EngineConfig, SamplingEngine
from slime_harbor.policy.sampling import SamplingParams
from slime_harbor.grpo import grpo_loss
from slime_harbor.trainers.local_config import LocalTrainConfig
from slime_harbor.trainers.learner import make_batch, Policy, token_logprobs, update
from slime_harbor.samples import SampleStatus, TrainingSample

PROMPT = "Write a shell command that counts the lines of every .py file, then submit.\n"


def sample_batch(policy: Policy, batch_size: int, completion_tokens: int) -> list[TrainingSample]:
    """batch_size fixed-length completions of one prompt, with the sampler's logprobs."""
    prompt = policy.tokenizer.encode(PROMPT, add_special_tokens=False)
    params = SamplingParams(max_new_tokens=completion_tokens, ignore_eos=True, sampling_seed=None)
    with SamplingEngine(policy.model, policy.tokenizer, EngineConfig(seed=0)) as engine:
        generations = [f.result() for f in [engine.submit(prompt, params) for _ in range(batch_size)]]
    return [
        TrainingSample(tokens=g.prompt_ids + g.token_ids, response_length=len(g.token_ids),
                       loss_mask=[1] * len(g.token_ids), rollout_log_probs=g.logprobs, reward=float(i),
                       status=SampleStatus.COMPLETED, group_index=0, index=i, rollout_id=i)
        for i, g in enumerate(generations)
    ]


def median_seconds(steps: dict, rounds: int, warmup: int) -> dict[str, float]:
    """Median wall time of each named step, run in alternation (round robin) so that background
    load on the machine hits every contender alike."""
    for _ in range(warmup):
        for step in steps.values():
            step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            started = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - started)
    return {name: statistics.median(t) for name, t in times.items()}


def trl_trainer(model, tokenizer, cfg: LocalTrainConfig, batch_size: int, completion_tokens: int, out: Path):
    """A GRPOTrainer around `model` (a PeftModel), configured as our loss, never asked to generate."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=str(out), per_device_train_batch_size=batch_size, num_generations=batch_size,
        gradient_accumulation_steps=1, learning_rate=cfg.lr, weight_decay=cfg.weight_decay,
        max_grad_norm=cfg.max_grad_norm, beta=cfg.kl_coef, epsilon=cfg.eps_clip, epsilon_high=cfg.eps_clip_high,
        loss_type="bnpo", max_completion_length=completion_tokens, temperature=cfg.temperature, use_cpu=True,
        report_to=[], logging_strategy="no", save_strategy="no", bf16=False,
    )
    dataset = Dataset.from_dict({"prompt": [PROMPT] * batch_size})
    trainer = GRPOTrainer(model=model, reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
                          args=args, train_dataset=dataset, processing_class=tokenizer)
    trainer.create_optimizer()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's own loop, which we do not run
    return trainer


def trl_inputs(samples: list[TrainingSample], advantages: list[float]) -> dict[str, torch.Tensor]:
    """What GRPOTrainer._generate_and_score_completions hands compute_loss, built from our samples."""
    prompt = torch.tensor([s.prompt_ids for s in samples])  # one prompt: no padding needed
    completion = torch.tensor([s.response_ids for s in samples])
    mask = torch.tensor([s.loss_mask for s in samples])
    return {
        "prompt_ids": prompt, "prompt_mask": torch.ones_like(prompt),
        "completion_ids": completion, "completion_mask": mask,
        "advantages": torch.tensor(advantages), "num_items_in_batch": mask.sum(),
        "old_per_token_logps": torch.tensor([s.rollout_log_probs for s in samples]),
    }


def off_policy(samples: list[TrainingSample]) -> list[TrainingSample]:
    """Copies whose old logprobs are shifted by +-0.3 per token: pi / pi_old = exp(-+0.3), past the clip."""
    shifted = []
    for s in samples:
        lps = [lp + (0.3 if k % 2 else -0.3) for k, lp in enumerate(s.rollout_log_probs)]
        shifted.append(TrainingSample(**{**s.__dict__, "rollout_log_probs": lps}))
    return shifted


def loss_agreement(ours: Policy, trainer, samples, advantages, cfg: LocalTrainConfig, completion_tokens: int):
    """(our loss, TRL's loss) on the same off-policy inputs, both policies at the same weights."""
    samples = off_policy(samples)
    batch = make_batch(samples, advantages)
    with torch.no_grad():
        ref = ours.reference_logprobs(batch, cfg.temperature)
        logprobs = token_logprobs(ours.model, batch, cfg.temperature)
        our_loss, _ = grpo_loss(logprobs, batch.old_logprobs, ref, batch.advantages, batch.loss_mask, cfg.grpo())
        inputs = trl_inputs(samples, advantages)
        inputs["ref_per_token_logps"] = ref
        their_loss = trainer.compute_loss(trainer.model, inputs)
    return our_loss.item(), their_loss.item()


def build_model(hidden_size: int, layers: int, out: Path) -> str:
    """The tiny model's tokenizer and architecture, scaled up (random weights)."""
    from slime_harbor.policy.tiny_model import TinyModelConfig, build_tiny_model

    heads = max(hidden_size // 64, 2)
    config = TinyModelConfig(hidden_size=hidden_size, intermediate_size=3 * hidden_size, num_hidden_layers=layers,
                             num_attention_heads=heads, num_key_value_heads=max(heads // 2, 1), head_dim=64,
                             initializer_range=0.02)
    return str(build_tiny_model(out, config=config))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", default=None, help="HF causal LM dir (default: the tiny offline model)")
    ap.add_argument("--hidden-size", type=int, default=None, help="instead: a tiny-architecture model this wide")
    ap.add_argument("--layers", type=int, default=4, help="layers of the --hidden-size model")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--completion-tokens", type=int, default=128)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    with tempfile.TemporaryDirectory() as tmp:
        if a.hidden_size:
            a.model_dir = build_model(a.hidden_size, a.layers, Path(tmp) / "model")
        elif a.model_dir is None:
            from slime_harbor.policy.tiny_model import ensure_tiny_model

            a.model_dir = str(ensure_tiny_model())
        run(a, Path(tmp))


def run(a: argparse.Namespace, tmp: Path) -> None:
    cfg = LocalTrainConfig(model=a.model_dir, lr=1e-6, device="cpu", micro_batch_size=a.batch_size)
    torch.manual_seed(0)
    ours = Policy.load(cfg, a.model_dir, "cpu")
    samples = sample_batch(ours, a.batch_size, a.completion_tokens)
    rewards = torch.tensor([s.reward for s in samples])
    advantages = (rewards - rewards.mean()).tolist()  # one group: reward minus the group mean
    tokens = sum(sum(s.loss_mask) for s in samples)
    print(f"model {a.model_dir}: {sum(p.numel() for p in ours.model.parameters()):,} params, "
          f"{len(ours.params)} trainable LoRA tensors; batch {a.batch_size} x {a.completion_tokens} "
          f"completion tokens (+{len(samples[0].prompt_ids)} prompt), {a.threads} threads")

    try:
        import trl
    except ModuleNotFoundError:
        trl = None
    if trl is not None:
        torch.manual_seed(0)
        theirs = Policy.load(cfg, a.model_dir, "cpu")  # same base, same adapter init
        trainer = trl_trainer(theirs.model, theirs.tokenizer, cfg, a.batch_size, a.completion_tokens, tmp / "trl")
        trainer.model.train()  # compute_loss reads model.training for its accumulation normaliser
        mine, other = loss_agreement(ours, trainer, samples, advantages, cfg, a.completion_tokens)
        print(f"same loss on off-policy inputs: ours {mine:.8f}  TRL {other:.8f}  |diff| {abs(mine - other):.2e}")

    steps = {"ours": lambda: update(ours, samples, advantages, cfg, "cpu")}
    if trl is not None:
        steps["trl"] = trl_step_function(trainer, samples, advantages, cfg, a.completion_tokens)
    seconds = median_seconds(steps, a.steps, a.warmup)
    print(f"ours  (local_trainer.update): {tokens / seconds['ours']:10.1f} tokens/s   "
          f"({seconds['ours'] * 1000:.1f} ms/step)")
    if trl is None:
        print("TRL is not installed (pip install trl): no comparison")
        return
    print(f"TRL {trl.__version__} (GRPOTrainer.compute_loss, bnpo): {tokens / seconds['trl']:10.1f} tokens/s   "
          f"({seconds['trl'] * 1000:.1f} ms/step)")
    print(f"ratio ours / TRL (tokens/s): {seconds['trl'] / seconds['ours']:.2f}x  (median of {a.steps} interleaved steps)")


def trl_step_function(trainer, samples, advantages, cfg: LocalTrainConfig, completion_tokens: int):
    """One TRL update: reference logprobs as TRL gets them for a new adapter, compute_loss, backward, AdamW."""
    model = trainer.model
    inputs = trl_inputs(samples, advantages)
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)

    def step() -> None:
        with torch.no_grad(), model.disable_adapter():
            inputs["ref_per_token_logps"] = trainer._get_per_token_logps_and_entropies(
                model, input_ids, attention, completion_tokens)[0]
        trainer.compute_loss(model, inputs).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=True)

    return step


if __name__ == "__main__":
    main()
