"""What keeping interrupted calls saves when weight updates land on long generations: train-local
--policy-url URL --max-staleness 1 --weight-sync disk, an update every step, with
--keep-interrupted off (before: a call an update aborts is sampled again whole) and on (after: it
goes on from its tokens), against our policy server over HTTP and the real SGLang.

Generation-heavy: the agent (bench/long_call_agent.py) makes two chat calls per episode, each
asking for --max-new-tokens (the untrained tiny model writes to the limit), so nearly all of a
trial is decoding and every update lands on calls in flight. The task is a bundled one whose
verifier flips a coin (GRPO needs rewards that differ within a group, and the untrained model
solves nothing), so every update trains. Both arms of an engine start from the same weights
(train-local pushes its start weights first) and seed. One line per arm:

    engine=E keep=on|off updates=U trained_episodes=N wall_s=W episodes_per_min=R
    interrupted_per_update=I discarded_per_update=D reprefill_per_update=P decoded=T recorded=C

  trained_episodes       episodes the updates trained on (not masked, not failed)
  episodes_per_min       trained_episodes / wall_s x 60 (wall_s: the training run's)
  interrupted_per_update weight_sync/interrupted_calls per update (metrics.json)
  discarded_per_update   weight_sync/discarded_tokens per update: sampled tokens no trained sample
                         holds because an update interrupted their call
  reprefill_per_update   weight_sync/reprefill_tokens per update: prompt (+ kept) tokens prefilled again
  decoded                the engine's own count of tokens it returned over the run (ours:
                         EngineStats.generated_tokens; SGLang: sglang:generation_tokens_total,
                         --enable-metrics), the cross-check of discarded:
  recorded               what the run's recordings account for: every call's completion in
                         calls.jsonl (trained or not) + every call's discarded_tokens. decoded -
                         recorded is what the trials in flight had sampled when the run ended and
                         tore them down (no recording holds a cancelled call's tokens).

    .venv/bin/python bench/interrupted_calls.py [--engines embedded sglang] [--updates 6] ...
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import shutil
import signal
import sys
import time
from pathlib import Path

import httpx

from slime_harbor.policy.tiny_model import build_tiny_model
from slime_harbor.run_config import DEFAULT_TASKS
from slime_harbor.samples import read_jsonl
from slime_harbor.trainers.local import train
from slime_harbor.trainers.local_config import LocalTrainConfig

AGENT = "long_call_agent:LongCallAgent"  # this folder is on the import path when run as a script


@dataclasses.dataclass
class BenchConfig:
    out: Path = Path("runs/interrupted_calls")
    engines: tuple[str, ...] = ("embedded", "sglang")
    """embedded: our policy server (slime-harbor serve) over HTTP | sglang: the real SGLang."""
    keep: tuple[str, ...] = ("off", "on")
    """The arms, in the order they run on one engine (the first also warms the engine up)."""
    updates: int = 6
    """Updates per arm (one per step, K = 1)."""
    n_samples: int = 4
    concurrency: int = 8
    max_new_tokens: int = 768
    """Tokens each call asks for: long enough for an update to land while it decodes."""
    seed: int = 0
    lr: float = 1e-4


def decoded_tokens(engine: str, server) -> int:
    """The engine's own count of the tokens it returned so far."""
    if engine == "embedded":
        return server.engine.stats.generated_tokens
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    return int(sum(float(v) for v in re.findall(r"^sglang:generation_tokens_total\{[^}]*\} (\S+)$", text, re.M)))


def recorded_tokens(run: Path) -> int:
    """Every recorded call's completion and discarded tokens (the run's gateway recordings)."""
    total = 0
    for calls in (run / "rollouts" / "trials").glob("*/agent/gateway/calls.jsonl"):
        for line in calls.read_text().splitlines():
            call = json.loads(line)
            if "call" in call and "event" not in call:
                total += len(call.get("completion_ids") or []) + int(call.get("discarded_tokens") or 0)
    return total


COIN_VERIFIER = """#!/bin/bash
# A coin flip: rewards that differ within a group, whatever the policy wrote.
mkdir -p /logs/verifier
echo $((RANDOM % 2)) > /logs/verifier/reward.txt
"""


def coin_tasks(out: Path) -> Path:
    """Two bundled tasks whose verifiers flip a coin."""
    tasks = out / "tasks"
    for name in ("dedupe-lines", "count-errors"):
        if not (tasks / name).exists():
            shutil.copytree(DEFAULT_TASKS / name, tasks / name)
        (tasks / name / "tests" / "test.sh").write_text(COIN_VERIFIER)
    return tasks


def run_arm(cfg: BenchConfig, engine: str, server, model_dir: Path, keep: str) -> dict:
    out = cfg.out / engine / f"keep_{keep}"
    before = decoded_tokens(engine, server)
    summary = train(LocalTrainConfig(
        tasks_dir=coin_tasks(cfg.out), model=str(model_dir), agent=AGENT, env="local",
        n_samples=cfg.n_samples, concurrency=cfg.concurrency, step_limit=2, max_new_tokens=cfg.max_new_tokens,
        lora=False, device="cpu", num_rollouts=cfg.updates, lr=cfg.lr, kl_coef=0.0, updates_per_rollout=1,
        output_dir=out, save_every=0, seed=cfg.seed, max_staleness=1, policy_url=server.url, weight_sync="disk",
        keep_interrupted=keep, use_tis=True, impossible_twin="off",
    ))
    decoded = decoded_tokens(engine, server) - before
    metrics = [m for m in json.loads((out / "metrics.json").read_text()) if m["step"] > 0]
    trained = 0
    for m in metrics:
        kept = {(s.group_index, s.rollout_id) for s in read_jsonl(out / "rollouts" / f"step_{m['step']}" / "samples.jsonl")
                if not s.remove_sample and s.reward is not None and any(s.loss_mask)}
        trained += len(kept) if m["skipped"] is None else 0
    wall = summary["wall_seconds_this_run"]
    per_update = {k: round(sum(m[f"weight_sync/{k}"] for m in metrics) / len(metrics), 1)
                  for k in ("interrupted_calls", "discarded_tokens", "reprefill_tokens")}
    return {"engine": engine, "keep": keep, "updates": len(metrics), "trained_episodes": trained, "wall_s": round(wall, 1),
            "episodes_per_min": round(trained / wall * 60, 2),
            "interrupted_per_update": per_update["interrupted_calls"],
            "discarded_per_update": per_update["discarded_tokens"],
            "reprefill_per_update": per_update["reprefill_tokens"],
            "decoded": decoded, "recorded": recorded_tokens(out)}


def serving(engine: str, model_dir: Path, out: Path):
    if engine == "embedded":
        from slime_harbor.policy.server import EmbeddedPolicyServer

        return EmbeddedPolicyServer(model_dir)
    from slime_harbor.policy.engine_launcher import EngineProcess

    port = httpx_free_port()
    return EngineProcess("sglang", model_dir, port=port, log_path=out / "sglang.log",
                         extra_args=["--enable-metrics"]).start()


def httpx_free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = BenchConfig()
    p.add_argument("--out", type=Path, default=defaults.out)
    p.add_argument("--engines", nargs="+", choices=("embedded", "sglang"), default=list(defaults.engines))
    p.add_argument("--keep", nargs="+", choices=("off", "on"), default=list(defaults.keep))
    p.add_argument("--updates", type=int, default=defaults.updates)
    p.add_argument("--n-samples", type=int, default=defaults.n_samples)
    p.add_argument("--concurrency", type=int, default=defaults.concurrency)
    p.add_argument("--max-new-tokens", type=int, default=defaults.max_new_tokens)
    p.add_argument("--seed", type=int, default=defaults.seed)
    a = p.parse_args(argv)
    cfg = BenchConfig(out=a.out, engines=tuple(a.engines), keep=tuple(a.keep), updates=a.updates, n_samples=a.n_samples,
                      concurrency=a.concurrency, max_new_tokens=a.max_new_tokens, seed=a.seed)
    cfg.out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped bench stops its engine too
    model_dir = build_tiny_model(cfg.out / "tiny_model", seed=0)
    started, arms = time.monotonic(), []
    for engine in cfg.engines:
        with serving(engine, model_dir, cfg.out) as server:
            for keep in cfg.keep:
                arm = run_arm(cfg, engine, server, model_dir, keep)
                arms.append(arm)
                print(" ".join(f"{k}={v}" for k, v in arm.items()), flush=True)
    (cfg.out / "results.json").write_text(json.dumps({"arms": arms, "config": {k: str(v) for k, v in vars(cfg).items()},
                                                      "wall_s": round(time.monotonic() - started, 1)}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
