"""Held-out evaluation: pass@1 and pass@k of a policy on Harbor tasks it is not trained on.

An evaluation is an ordinary rollout (rollout.run_rollouts: real Harbor Trials, the agent sampling
from the policy, each task's verifier) with the evaluation's own sampling settings and its own
output dir; its episodes (those the rollout returns) are read for metrics only, never trained on.

pass@k per task is the unbiased estimator of Chen et al. (2021), as SLiME's
slime/observability/metric_utils.py computes it: with n scored episodes of which c succeeded,

    pass@k = 1 - C(n - c, k) / C(n, k)

the chance that at least one of k episodes drawn without replacement from the n succeeds. A
success is samples.is_success: a verifier reward >= 1 (Harbor's binary tasks write 1 or 0). Trials the verifier did
not score (infrastructure failures) are left out of n and counted, as in training, so an outage
does not read as a policy that got worse.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from slime_harbor.rollout import run_rollout_episodes
from slime_harbor.samples import pass_at_k, is_success
from slime_harbor.trainers.local_config import LocalTrainConfig
from slime_harbor.trainers.training_run import truncated_ratio


async def evaluation(cfg: LocalTrainConfig, policy_url: str, model_dir: str, out_dir: Path,
                     lora_name: str | None = None) -> dict[str, Any]:
    """Held-out pass@1 / pass@k of the policy served at policy_url: cfg's eval_rollout (the
    held-out tasks, eval_n_samples each, the eval sampling settings) into out_dir."""
    rollouts = await run_rollout_episodes(cfg.eval_rollout(policy_url, model_dir, out_dir, lora_name))
    result = eval_metrics(rollouts.summary["per_task_rewards"], cfg.eval_n_samples)
    result["truncated_ratio"] = truncated_ratio(rollouts.episodes)
    result["wall_s"] = rollouts.summary["wall_seconds"]
    return result


def eval_metrics(per_task_rewards: Mapping[str, Sequence[float | None]], k: int) -> dict[str, Any]:
    """pass@1 and pass@k per task and overall (the mean over tasks, each task weighing the same),
    from each task's episode rewards (None = not scored)."""
    per_task: dict[str, dict[str, Any]] = {}
    for task, rewards in sorted(per_task_rewards.items()):
        scored = [float(r) for r in rewards if r is not None]
        n, c = len(scored), sum(map(is_success, scored))
        per_task[task] = {
            "n": n, "n_success": c, "n_unscored": len(rewards) - n,
            "reward_mean": sum(scored) / n if n else None,
            "pass@1": pass_at_k(n, c, 1) if n else None,
            f"pass@{k}": pass_at_k(n, c, k) if n else None,
        }

    def mean_over_tasks(key: str) -> float | None:
        values = [m[key] for m in per_task.values() if m[key] is not None]
        return sum(values) / len(values) if values else None

    return {
        "k": k,
        "pass@1": mean_over_tasks("pass@1"),
        f"pass@{k}": mean_over_tasks(f"pass@{k}"),
        "reward_mean": mean_over_tasks("reward_mean"),
        "n_tasks": len(per_task),
        "n_trials": sum(len(r) for r in per_task_rewards.values()),
        "n_unscored": sum(m["n_unscored"] for m in per_task.values()),
        "per_task": per_task,
    }
