"""What a local GRPO run records (its loop is loop.py, for every K): the run itself (TrainingRun:
its learner, its metrics.json records, its checkpoints), the rollout figures of a step
(rollout_stats, truncated_ratio), its sampling figures and its metrics.json record
(step_sampling, step_record), the task stream steps draw from, the lines a step and an
evaluation print, and the run's summary.json.
"""

from __future__ import annotations

import json
import math
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slime_harbor.converter import WEIGHT_SYNC_COUNTS
from slime_harbor.grading.grade import run_counts
from slime_harbor.filters import MASK_REASONS, drop_zero_std_groups, mask_counts
from slime_harbor.episode import Episode
from slime_harbor.samples import SampleStatus, is_success
from slime_harbor.tasks.task_dir import discover_tasks
from slime_harbor.trainers.local_config import LocalTrainConfig


@dataclass
class TrainingRun:
    """One run of either loop: the config, the learner (trainers/learner.py's Learner, or what a
    learner_factory built), the step (= weight version) it starts from, the metrics so far, and
    how a finished step or evaluation is recorded."""

    cfg: LocalTrainConfig
    out: Path
    learner: Any
    base_model: str
    start: int
    metrics: list[dict]
    tracker: Any = None  # tracking.WandbRun, or None
    last_checkpoint: str | None = None
    twins: dict = field(default_factory=dict)  # impossible_twin.twin_table of the run's tasks

    def record_done(self, record: dict) -> None:
        """metrics.json rewritten (an evaluation may complete a record after its step), and wandb told."""
        (self.out / "metrics.json").write_text(json.dumps(self.metrics, indent=1))
        if self.tracker is not None:
            self.tracker.log(record)

    def finish_step(self, record: dict) -> None:
        """A trained step: recorded, its line printed, and checkpoint_N (weight version N) written
        when due."""
        self.metrics.append(record)
        (self.out / "metrics.json").write_text(json.dumps(self.metrics, indent=1))
        print(step_line(record), file=sys.stderr)
        step = record["step"]
        if step == self.cfg.num_rollouts or (self.cfg.save_every > 0 and step % self.cfg.save_every == 0):
            self.learner.save_checkpoint(self.out / f"checkpoint_{step}", step, self.metrics)
            self.last_checkpoint = str(self.out / f"checkpoint_{step}")

    def record_eval(self, record: dict, result: dict, version: int) -> None:
        """A held-out evaluation of weight version `version` (trainers/evaluate.py's figures) into
        the record of the step it follows (step 0: before any update), its line printed."""
        result["weight_version"] = version
        record["eval"] = result
        record.setdefault("timings", {})["eval_s"] = result.pop("wall_s")
        print(eval_line(record["step"], result), file=sys.stderr)
        self.record_done(record)

    def eval_due(self, step: int) -> bool:
        """Whether the held-out evaluation runs after `step` (every eval_every steps, and the last)."""
        return step == self.cfg.num_rollouts or (self.cfg.eval_every > 0 and step % self.cfg.eval_every == 0)

    def canary_stream(self) -> TaskStream | None:
        """The impossible tasks' stream (--canary-tasks; None without), resumed where the last step left it."""
        if self.cfg.canary_tasks is None:
            return None
        position = self.metrics[-1].get("canary_stream_position", 0) if self.metrics else 0
        return TaskStream([p.name for p in discover_tasks(self.cfg.canary_tasks)], self.cfg.seed, position)


def rollout_stats(episodes: Sequence[Episode]) -> dict[str, Any]:
    """Reward mean / std / pass rate over the episodes the verifier scored (one per trial)."""
    values = [e.reward for e in episodes if e.scored]
    mean = sum(values) / len(values) if values else None
    return {
        # episodes whose grader detected tampering (scored 0)
        "n_tampered": sum(bool(e.metadata.get("tampering")) for e in episodes),
        **run_counts(episodes),  # every defence's counters (grade.COUNTERS), hack_rate, twin_coverage
        "reward_mean": mean,
        "reward_std": math.sqrt(sum((v - mean) ** 2 for v in values) / len(values)) if values else None,
        "pass_rate": sum(map(is_success, values)) / len(values) if values else None,
        "n_scored": len(values),
    }


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


def truncated_ratio(episodes: Sequence[Episode]) -> float | None:
    """Share of scored episodes that hit a limit (status truncated), as SLiME's rollout/truncated_ratio."""
    scored = [e.status for e in episodes if e.scored]
    return sum(s == SampleStatus.TRUNCATED for s in scored) / len(scored) if scored else None


def step_sampling(episodes: Sequence[Episode], errors: int, n_groups: int,
                  dynamic_sampling: bool) -> dict[str, Any]:
    """A step's sampling figures once all its groups are in (masked by the trajectory filters and
    the hack monitor already), from either loop: with dynamic sampling the groups without reward
    variance are masked now. `filters`: episodes masked per reason (filters.mask_counts: zero_std
    counts episodes, as every reason does); `n_groups_zero_std`: the groups dynamic sampling
    dropped; `errors`: the episodes the verifier did not score; `n_groups_sampled`."""
    dropped = drop_zero_std_groups(episodes) if dynamic_sampling else 0
    return {"errors": errors, "n_groups_sampled": n_groups, "filters": mask_counts(episodes),
            "n_groups_zero_std": dropped, "truncated_ratio": truncated_ratio(episodes)}


def step_record(step: int, episodes: Sequence[Episode], update: dict[str, Any], sampling: dict[str, Any],
                versions: dict[str, Any], positions: dict[str, int], timings: dict[str, float]) -> dict[str, Any]:
    """metrics.json's record of a trained step, from either loop: its episodes' rollout figures
    (rollout_stats), the update's (Learner.train_step), its sampling figures (step_sampling), the
    weight versions its episodes were sampled by, where the task streams stand after it (a
    resumed run goes on from there) and its timings."""
    return {"step": step, **rollout_stats(episodes), **update, **sampling, **versions, **weight_sync_figures(episodes),
            **positions, "timings": timings}


def weight_sync_figures(episodes: Sequence[Episode]) -> dict[str, int]:
    """What the weight updates did to a step's episodes: their model calls an update interrupted,
    the sampled tokens thrown away for it, the prompt tokens prefilled again (converter's
    weight_sync counts), and the sampled tokens of the episodes masked as stale."""
    figures = {f"weight_sync/{k}": sum((e.metadata.get("weight_sync") or {}).get(k, 0) for e in episodes)
               for k in WEIGHT_SYNC_COUNTS}
    figures["weight_sync/stale_masked_tokens"] = sum(sum(m for seg in e.segments for m in seg.loss_mask)
                                                     for e in episodes if e.masked_by == "stale")
    return figures


def step_line(r: dict) -> str:
    def f(x, fmt=".4f"):
        return "n/a" if x is None else format(x, fmt)

    what = f"skipped ({r['skipped']})" if r["skipped"] else (
        f"loss {f(r.get('loss'))} kl {f(r.get('kl'), '.2e')} ppo_kl {f(r.get('ppo_kl'), '.2e')} "
        f"clipfrac {f(r.get('clipfrac'), '.3f')} tokens {r['n_tokens']}")
    return (f"step {r['step']}: reward {f(r['reward_mean'], '.3f')} pass {f(r['pass_rate'], '.2f')} "
            + (f"hacks {r['hack_rate']:.2f} " if r.get("hack_rate") else "")
            + (f"twin {r['twin_coverage']:.2f} (impossible passes {r['hack/passes_impossible']}, errors "
               f"{r['hack/twin_errors']}, {r['time/twin_s']:.1f}s) " if r.get("twin_coverage") is not None else "")
            + (f"watched {r['grader_watch/watched']}/{r['grader_watch/watched'] + r['grader_watch/unwatched']} "
               f"(reads_grader {r.get('hack/reads_grader', 0)}) " if "grader_watch/watched" in r else "")
            + (f"canaries passed {r['canary_pass_rate']:.2f} " if r.get("canary_pass_rate") is not None else "")
            + f"aborted {r['aborted']}/{r['n_samples']}" + (f" failed {r['failed']}" if r.get("failed") else "")
            + f"{masked_text(r)} | {what} | rollout {r['timings']['rollout_s']:.1f}s "
            f"train {r['timings']['train_s']:.1f}s"
            + (f" (learner waited {r['timings']['learner_wait_s']:.1f}s)" if "learner_wait_s" in r["timings"] else "")
            + (f" | served weights {r['weight_sync/probe_gap']:.1e} from trained" if "weight_sync/probe_gap" in r else "")
            + (f" | interrupted calls {r['weight_sync/interrupted_calls']}, tokens discarded "
               f"{r['weight_sync/discarded_tokens']}, prefilled again {r['weight_sync/reprefill_tokens']}"
               if r.get("weight_sync/interrupted_calls") else ""))


def eval_line(step: int, e: dict) -> str:
    k = e["k"]
    def f(x):
        return "n/a" if x is None else f"{x:.3f}"
    return (f"eval after step {step}: pass@1 {f(e['pass@1'])} pass@{k} {f(e[f'pass@{k}'])} "
            f"({e['n_trials']} trials, {e['n_unscored']} unscored)")


def masked_text(r: dict) -> str:
    masked = {k: v for k, v in (r.get("filters") or {}).items() if v}
    return (" masked " + ",".join(f"{k} {v}" for k, v in masked.items())) if masked else ""


def run_summary(metrics, cfg, base_model, out, last_checkpoint, seconds) -> dict[str, Any]:
    evals = [{"step": m["step"], **{k: v for k, v in m["eval"].items() if k != "per_task"}}
             for m in metrics if "eval" in m]
    metrics = [m for m in metrics if "reward_mean" in m]  # training steps (step 0 holds only an evaluation)
    rewards = [m["reward_mean"] for m in metrics if m["reward_mean"] is not None]
    return {
        "steps": len(metrics),
        "last_step": metrics[-1]["step"] if metrics else 0,
        "skipped_steps": [m["step"] for m in metrics if m["skipped"]],
        "aborted_samples": sum(m["aborted"] for m in metrics),  # samples of aborted episodes (transient failures)
        "failed_samples": sum(m.get("failed", 0) for m in metrics),  # of failed ones (permanent: no reward, ...)
        "trained_tokens": sum(m["n_tokens"] for m in metrics),
        "first_reward_mean": rewards[0] if rewards else None,
        "last_reward_mean": rewards[-1] if rewards else None,
        "base_model": base_model,
        "renderer": cfg.renderer,  # the chat format the run spoke
        "lora": cfg.lora,
        "final": str(out / "final") if (out / "final").is_dir() else None,
        "last_checkpoint": last_checkpoint,
        "masked_episodes": {k: sum(m.get("filters", {}).get(k, 0) for m in metrics) for k in MASK_REASONS},
        # asynchronous: how long the learner waited for complete groups, over all updates
        "learner_wait_s": round(sum(m["timings"].get("learner_wait_s", 0.0) for m in metrics), 2),
        "evals": evals,
        # trials of impossible tasks that passed: hacks that nothing caught, for a person to read
        **({"canary_passes": [t for m in metrics for t in m.get("canary_passes", [])]}
           if any("canary_pass_rate" in m for m in metrics) else {}),
        "wall_seconds_this_run": round(seconds, 2),
    }
