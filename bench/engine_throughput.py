"""Policy-engine throughput on this machine: our embedded engine against the real SGLang and vLLM.

Each engine serves the same model (the cached tiny offline model, unless --model-dir, or --renderer
NAME: that chat format's tiny checkpoint, tiny_model.ensure_tiny_model(renderer=NAME), its family's
own architecture; the model's layers and parameters are printed) and gets the same prompt,
tokenized once with the model's tokenizer and sent as token ids, with the same sampling
(temperature 1.0, ignore_eos, logprobs of the sampled tokens), so every request makes exactly
--max-new-tokens tokens:

    embedded   slime_harbor.policy.server.EmbeddedPolicyServer in this process, as the trainers
               run it (EngineConfig(max_batch_size=max(32, --concurrency)), all else its defaults);
               POST /generate with input_ids
    sglang     the real SGLang (policy/engine_launcher.py EngineProcess: its own venv, this machine's CPU
               flags, at most 8 running requests); POST /generate with input_ids
    vllm       the real vLLM (EngineProcess, CPU flags, --max-num-seqs 8); it has no /generate, so
               POST /v1/completions with the token ids as the prompt and the served model name

The engines run one at a time (one is stopped, in a finally, before the next starts), each on a
free loopback port. A real engine's output goes to a temp log whose path is printed if it fails;
an engine that is not installed is skipped with a line saying why (scripts/setup-sglang.sh,
scripts/setup-vllm.sh install them). Per engine: start-up time (real engines: from process start
to /health 200; embedded: from constructing the server to /health 200, in this process, whose
imports of torch, transformers and the server are timed apart and printed as a note), then a
warm-up, then --rounds single requests and --rounds waves of --concurrency simultaneous requests,
interleaved so that background load hits both settings alike; medians are reported.

    .venv/bin/python bench/engine_throughput.py [--engines embedded,sglang,vllm] [--max-new-tokens 256]
        [--concurrency 8] [--rounds 3] [--model-dir DIR | --renderer NAME]

Prints one line per engine, then each real engine's ratio to the embedded one:

    embedded  start   1.2 s   1 stream  180.3 tok/s   8 streams  610.2 tok/s (3.4x)
    sglang    start  38.2 s   1 stream   41.0 tok/s   8 streams  210.3 tok/s (5.1x)
    sglang / embedded: 1 stream 0.23x, 8 streams 0.34x

(tok/s: generated tokens per second of wall time; "(5.1x)": that engine's N streams over its
1 stream.) Progress and notes go to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

PROMPT = "THOUGHT: I will list the files first.\n```bash\n"
WARMUP_TOKENS = 16


@dataclass
class Target:
    """Where and how to ask an engine for tokens."""

    url: str
    api: str  # "generate" (SGLang's /generate: SGLang, embedded) or "openai" (vLLM's /v1/completions)
    model: str | None = None  # the served model name (openai)

    def request(self, prompt_ids: list[int], max_new_tokens: int) -> tuple[str, dict]:
        if self.api == "openai":
            return "/v1/completions", {
                "model": self.model, "prompt": prompt_ids, "max_tokens": max_new_tokens,
                "ignore_eos": True, "temperature": 1.0, "logprobs": 0,
            }  # fmt: skip
        return "/generate", {
            "input_ids": prompt_ids,
            "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True, "stop_token_ids": [],
                                "temperature": 1.0},
            "return_logprob": True,
        }  # fmt: skip

    def completion_tokens(self, reply: dict) -> int:
        return reply["usage"]["completion_tokens"] if self.api == "openai" else reply["meta_info"]["completion_tokens"]


@dataclass
class Result:
    engine: str
    start_s: float | None = None
    single: float | None = None
    batched: float | None = None
    note: str = ""  # e.g. the embedded engine's rows per decode step
    error: str | None = None  # skipped or failed: why


async def tokens_per_second(client: httpx.AsyncClient, target: Target, prompt_ids: list[int], concurrency: int,
                            max_new_tokens: int) -> float:
    """Generated tokens/s of one wave of `concurrency` simultaneous fixed-length requests."""
    path, body = target.request(prompt_ids, max_new_tokens)
    started = time.perf_counter()
    replies = await asyncio.gather(*(client.post(target.url + path, json=body) for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    counts = []
    for reply in replies:
        if reply.status_code != 200:
            raise RuntimeError(f"{path} answered HTTP {reply.status_code}: {reply.text[:300]}")
        counts.append(target.completion_tokens(reply.json()))
    if any(n != max_new_tokens for n in counts):  # ignore_eos: anything else is not the same work
        raise RuntimeError(f"asked for {max_new_tokens} tokens per request, got {counts}")
    return sum(counts) / elapsed


async def measure(target: Target, prompt_ids: list[int], concurrency: int, rounds: int,
                  max_new_tokens: int) -> tuple[float, float]:
    """Median tokens/s of 1 stream and of `concurrency` streams, rounds interleaved so that
    background load on a shared machine hits both settings alike."""
    async with httpx.AsyncClient(timeout=900, trust_env=False) as client:
        # warm-up: the first forward passes (and the first batched ones) are slow
        await tokens_per_second(client, target, prompt_ids, concurrency, WARMUP_TOKENS)
        await tokens_per_second(client, target, prompt_ids, 1, WARMUP_TOKENS)
        single, batched = [], []
        for _ in range(rounds):
            single.append(await tokens_per_second(client, target, prompt_ids, 1, max_new_tokens))
            batched.append(await tokens_per_second(client, target, prompt_ids, concurrency, max_new_tokens))
    return statistics.median(single), statistics.median(batched)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_embedded(model_dir: Path, prompt_ids: list[int], args) -> Result:
    from slime_harbor.policy.embedded_engine import EngineConfig
    from slime_harbor.policy.engine_launcher import wait_healthy
    from slime_harbor.policy.server import EmbeddedPolicyServer

    started = time.perf_counter()
    server = EmbeddedPolicyServer(model_dir, engine_config=EngineConfig(max_batch_size=max(32, args.concurrency)))
    try:
        wait_healthy(server.url, 120.0)
        start_s = time.perf_counter() - started
        log(f"embedded serves {model_dir} at {server.url}, started in {start_s:.1f} s")
        single, batched = asyncio.run(measure(Target(server.url, "generate"), prompt_ids, args.concurrency,
                                              args.rounds, args.max_new_tokens))
        rows = server.engine.stats.max_rows_per_step
    finally:
        server.stop()
    return Result("embedded", start_s, single, batched, note=f"  (up to {rows} rows per decode step)")


def run_real(engine: str, model_dir: Path, prompt_ids: list[int], args) -> Result:
    from slime_harbor.policy.engine_launcher import EngineMissing, EngineProcess

    fd, log_path = tempfile.mkstemp(prefix=f"engine-throughput-{engine}-", suffix=".log")
    os.close(fd)
    try:
        process = EngineProcess(engine, model_dir, "127.0.0.1", free_port(), log_path=log_path)
    except EngineMissing as e:
        os.unlink(log_path)
        return Result(engine, error=f"skipped: {e}")
    ok = False
    try:
        log(f"starting {engine} on {process.url} (log: {log_path}; a minute or so)")
        try:
            process.start()
        except Exception as e:
            return Result(engine, error=f"failed to start: {e} (its log: {log_path})")
        log(f"{engine} serves {model_dir} at {process.url}, started in {process.started_in_sec:.1f} s")
        try:
            target = Target(process.url, "generate")
            if engine == "vllm":
                models = httpx.get(process.url + "/v1/models", timeout=30, trust_env=False).json()
                target = Target(process.url, "openai", models["data"][0]["id"])
            single, batched = asyncio.run(measure(target, prompt_ids, args.concurrency, args.rounds,
                                                  args.max_new_tokens))
        except Exception as e:
            return Result(engine, process.started_in_sec, error=f"failed while generating: {e} (its log: {log_path})")
        ok = True
        return Result(engine, process.started_in_sec, single, batched)
    finally:
        if process.process is not None:
            log(f"stopping {engine} (its processes take 20-30 s to exit)")
        process.stop()
        if ok:
            os.unlink(log_path)


PATTERN_KINDS = {"M": "mamba2", "E": "moe", "*": "attention", "-": "mlp"}
"""Nemotron-H's hybrid_override_pattern letters."""


def describe(model_dir: Path) -> str:
    """The model's type, parameters (and those outside the embedding and LM head, which the large
    vocabularies dominate) and its layers by kind, from its config.json and weights."""
    import collections
    import json
    import math

    from safetensors import safe_open

    config = json.loads((model_dir / "config.json").read_text())
    total = outside = 0
    for weights in model_dir.glob("*.safetensors"):
        with safe_open(weights, "pt") as f:
            for name in f.keys():
                n = math.prod(f.get_slice(name).get_shape())
                total += n
                outside += 0 if "embed" in name or "lm_head" in name else n
    kinds = (config.get("layer_types") or [PATTERN_KINDS.get(c, c) for c in config.get("hybrid_override_pattern") or ""]
             or ["attention"] * config.get("num_hidden_layers", 0))
    counts = ", ".join(f"{n} {kind}" for kind, n in collections.Counter(kinds).items())
    return (f"{config.get('model_type')}, {total / 1e6:.1f} M parameters ({outside / 1e6:.2f} M outside the "
            f"embedding and LM head), {len(kinds)} layers: {counts}")


def ratio(x: float) -> str:
    return f"{x:.1f}x" if x >= 1 else f"{x:.2f}x"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", default="embedded,sglang,vllm", help="comma-separated, run in this order")
    parser.add_argument("--model-dir", help="HF model dir (default: the cached tiny offline model)")
    parser.add_argument("--renderer", help="a chat format's tiny checkpoint instead (make-model --renderer NAME)")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3, help="timed waves per setting (median reported)")
    args = parser.parse_args()
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = set(engines) - {"embedded", "sglang", "vllm"}
    if unknown:
        parser.error(f"unknown engines: {', '.join(sorted(unknown))} (embedded, sglang, vllm)")
    if args.model_dir and args.renderer:
        parser.error("--model-dir and --renderer name two models: give one")
    # SIGTERM (e.g. a timeout) unwinds like Ctrl-C, so the finally blocks stop the running engine.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    # The embedded engine runs in this process: time its imports (torch, transformers, the server)
    # apart, since a real engine's start-up figure includes its own.
    started = time.perf_counter()
    import slime_harbor.policy.server  # noqa: F401
    import_s = time.perf_counter() - started
    from transformers import AutoTokenizer

    from slime_harbor.policy.tiny_model import ensure_tiny_model

    model_dir = Path(args.model_dir) if args.model_dir else ensure_tiny_model(renderer=args.renderer or "qwen3")
    prompt_ids = AutoTokenizer.from_pretrained(model_dir).encode(PROMPT, add_special_tokens=False)
    log(f"model {model_dir} ({describe(model_dir)}), prompt {len(prompt_ids)} tokens, {args.max_new_tokens} new "
        f"tokens per request, 1 and {args.concurrency} streams, median of {args.rounds} rounds, {os.cpu_count()} CPUs")
    if args.concurrency > 8 and {"sglang", "vllm"} & set(engines):
        log(f"note: on a CPU the real engines run at most 8 requests at once (engine_launcher.py); the other "
            f"{args.concurrency - 8} of each wave wait")

    results = []
    for engine in engines:
        if engine == "embedded":
            try:
                results.append(run_embedded(model_dir, prompt_ids, args))
            except Exception as e:
                results.append(Result(engine, error=f"failed: {e}"))
        else:
            results.append(run_real(engine, model_dir, prompt_ids, args))

    n = args.concurrency
    for r in results:
        if r.error:
            print(f"{r.engine:<9} {r.error}")
            continue
        print(f"{r.engine:<9} start {r.start_s:5.1f} s   1 stream {r.single:7.1f} tok/s   "
              f"{n} streams {r.batched:7.1f} tok/s ({ratio(r.batched / r.single)}){r.note}")
    base = next((r for r in results if r.engine == "embedded" and not r.error), None)
    if base is not None:
        for r in results:
            if r.engine != "embedded" and not r.error:
                print(f"{r.engine} / embedded: 1 stream {ratio(r.single / base.single)}, "
                      f"{n} streams {ratio(r.batched / base.batched)}")
        print(f"(embedded start-up is in this process, after {import_s:.1f} s spent importing torch, "
              f"transformers and the server, which a real engine's start-up includes)")


if __name__ == "__main__":
    main()
