"""Where a trial's time goes: Harbor's own phase timings of every trial under a run dir (each
trial's result.json: environment setup, agent setup, agent execution, verifier) and the tokens
its samples hold (samples.jsonl beside the trials), as means per trial.

    PYTHONPATH=$PWD .venv/bin/python bench/trial_time.py RUN_DIR [RUN_DIR ...]

RUN_DIR: a rollout's out dir or anything above it (a demo's --out: its evaluations and GRPO
rollouts); the trials are found by their result.json. Concurrent trials overlap, so the phase
means add up to a trial's wall time, not the run's.
"""

from __future__ import annotations

import argparse
import json
import statistics
from datetime import datetime
from pathlib import Path

PHASES = ("environment_setup", "agent_setup", "agent_execution", "verifier")


def _seconds(timing: dict | None) -> float | None:
    if not timing or not timing.get("started_at") or not timing.get("finished_at"):
        return None
    return (datetime.fromisoformat(timing["finished_at"]) - datetime.fromisoformat(timing["started_at"])).total_seconds()


def trial_phases(run_dir: Path) -> list[dict[str, float]]:
    """Per trial: the seconds of each phase Harbor timed, and of the whole trial."""
    trials = []
    for path in sorted(run_dir.rglob("result.json")):
        result = json.loads(path.read_text())
        if "agent_execution" not in result:  # a job's result.json, not a trial's
            continue
        row = {phase: _seconds(result.get(phase)) for phase in PHASES}
        row["trial"] = _seconds(result)
        trials.append({k: v for k, v in row.items() if v is not None})
    return trials


def sample_tokens(run_dir: Path) -> list[tuple[int, int]]:
    """(prompt tokens, sampled tokens: loss mask 1) of every sample under run_dir."""
    out = []
    for path in run_dir.rglob("samples.jsonl"):
        for line in path.read_text().splitlines():
            s = json.loads(line)
            out.append((len(s["tokens"]) - s["response_length"], sum(s["loss_mask"])))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dirs", nargs="+", type=Path)
    a = p.parse_args()
    for run_dir in a.run_dirs:
        trials = trial_phases(run_dir)
        if not trials:
            raise SystemExit(f"no trial result.json under {run_dir}")
        means = {k: statistics.mean(t[k] for t in trials if k in t) for k in (*PHASES, "trial") if any(k in t for t in trials)}
        print(f"{run_dir}: {len(trials)} trials; mean seconds per trial: "
              + ", ".join(f"{k} {v:.2f}" for k, v in means.items()))
        tokens = sample_tokens(run_dir)
        if tokens:
            print(f"  {len(tokens)} samples: mean {statistics.mean(p for p, _ in tokens):.0f} prompt tokens, "
                  f"{statistics.mean(s for _, s in tokens):.0f} sampled tokens")


if __name__ == "__main__":
    main()
