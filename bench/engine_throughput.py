"""Policy-server throughput: 1 stream vs N concurrent /generate requests over real HTTP.

Starts the embedded policy server on the tiny model (built into a temp dir unless --model-dir),
then times fixed-length generations (ignore_eos, so every request makes exactly
--max-new-tokens tokens): --rounds single requests and --rounds waves of --concurrency
simultaneous requests, interleaved; the medians are reported. Continuous batching should make the second figure several
times the first (target on a 2-core machine: >= 3x with 8 concurrent).

    .venv/bin/python bench/engine_throughput.py [--max-new-tokens 256] [--concurrency 8]

Prints generated tokens/s for both and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time

import httpx

from slime_harbor.policy.engine import EngineConfig
from slime_harbor.policy.server import EmbeddedPolicyServer
from slime_harbor.policy.tiny_model import build_tiny_model


async def tokens_per_second(client: httpx.AsyncClient, url: str, concurrency: int, max_new_tokens: int) -> float:
    """Generated tokens/s of one wave of `concurrency` simultaneous fixed-length requests."""
    body = {
        "text": "THOUGHT: I will list the files first.\n```bash\n",
        "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True, "stop_token_ids": []},
        "return_logprob": True,
    }
    started = time.perf_counter()
    replies = await asyncio.gather(*(client.post(url + "/generate", json=body) for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    for reply in replies:
        reply.raise_for_status()
    return sum(r.json()["meta_info"]["completion_tokens"] for r in replies) / elapsed


async def measure(url: str, concurrency: int, rounds: int, max_new_tokens: int) -> tuple[float, float]:
    """Median tokens/s of 1 stream and of `concurrency` streams, rounds interleaved so that
    background load on a shared machine hits both settings alike."""
    async with httpx.AsyncClient(timeout=600) as client:
        await tokens_per_second(client, url, 2, 16)  # warm-up: the first forward passes are slow
        single, batched = [], []
        for _ in range(rounds):
            single.append(await tokens_per_second(client, url, 1, max_new_tokens))
            batched.append(await tokens_per_second(client, url, concurrency, max_new_tokens))
    return statistics.median(single), statistics.median(batched)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", help="HF model dir (default: build the tiny model)")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5, help="timed waves per setting (median reported)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model_dir or build_tiny_model(tmp)
        with EmbeddedPolicyServer(
            model_dir, engine_config=EngineConfig(max_batch_size=max(32, args.concurrency))
        ) as server:
            single, batched = asyncio.run(measure(server.url, args.concurrency, args.rounds, args.max_new_tokens))
            rows = server.engine.stats.max_rows_per_step
    print(f"1 stream:              {single:8.1f} tokens/s (median of {args.rounds})")
    print(f"{args.concurrency} concurrent requests: {batched:8.1f} tokens/s  (up to {rows} rows per decode step)")
    print(f"ratio:                 {batched / single:8.2f}x")


if __name__ == "__main__":
    main()
