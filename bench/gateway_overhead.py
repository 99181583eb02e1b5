"""Added latency per call of the model gateway over a direct SGLang /generate call with the same tokens.

    PYTHONPATH=$PWD .venv/bin/python bench/gateway_overhead.py [--calls 30] [--histories 1k,8k,32k]

Three processes: this one (the client), the gateway (slime_harbor.gateway.server.Gateway on the tiny
model's tokenizer) and an instant stub upstream that speaks SGLang's /generate exactly (fixed
reply: a Qwen3 tool call ending with <|im_end|>, output_token_logprobs, finish_reason,
weight_version), so the figure is the gateway's own cost. Per case, each session starts with a
history of about H tokens (one long user message) and then appends one reply + one short tool
result per call, as an agent does; only those appended calls are timed (the first call is a full
render). The direct baseline posts the same input_ids the gateway sent, to the same stub, with
the same concurrency (after every session's gateway call of that step).
Prints one line per case: history=32k concurrency=1 median_added_ms=...
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import shutil
import socket
import statistics
import sys
import time
from pathlib import Path

REPLY = ('I will look.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call><|im_end|>')
TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run a command.", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_stub(model_dir: str, port: int) -> None:
    """The upstream: answers /generate at once with REPLY's tokens, as SGLang formats them."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route
    from transformers import AutoTokenizer

    reply_ids = AutoTokenizer.from_pretrained(model_dir).encode(REPLY, add_special_tokens=False)
    last_prompt: dict[str, list[int]] = {}  # gateway session -> the input_ids of its latest call

    async def generate(request: Request) -> JSONResponse:
        body = await request.json()
        rid = str(body.get("rid") or "")
        if not rid.startswith("direct-"):
            last_prompt[rid.split("-")[0]] = body["input_ids"]
        meta = {"id": body.get("rid"), "finish_reason": {"type": "stop", "matched": reply_ids[-1]},
                "prompt_tokens": len(body["input_ids"]), "completion_tokens": len(reply_ids), "cached_tokens": 0,
                "weight_version": "0", "e2e_latency": 0.0,
                "output_token_logprobs": [[-0.5, t, None] for t in reply_ids]}
        return JSONResponse({"text": REPLY, "output_ids": reply_ids, "meta_info": meta})

    async def abort(request: Request) -> JSONResponse:
        return JSONResponse({"aborted": 0})

    async def last(request: Request) -> JSONResponse:
        return JSONResponse(last_prompt.get(request.path_params["session"]))

    app = Starlette(routes=[Route("/generate", generate, methods=["POST"]),
                            Route("/last/{session}", last, methods=["GET"]),
                            Route("/abort_request", abort, methods=["POST"])])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def run_gateway(upstream: str, model_dir: str, port: int, sessions: int, record_root: str) -> None:
    from slime_harbor.gateway.server import Gateway
    from slime_harbor.policy.sampling import SamplingParams

    async def main():
        gateway = Gateway(upstream, model_dir, port=port)
        for i in range(sessions):
            gateway.open_session(f"s{i}", Path(record_root) / f"s{i}" / "agent" / "gateway",
                                 SamplingParams(max_new_tokens=64), max_context_len=64 * 1024)  # a stub has room
        await gateway.start()
        await asyncio.Event().wait()  # until terminated

    asyncio.run(main())


def wait_for(port: int, deadline_s: float = 60) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise SystemExit(f"nothing listens on port {port}")


def history_text(tokenizer, n_tokens: int) -> str:
    from slime_harbor.policy.tiny_model import CORPUS

    unit = CORPUS
    per_unit = len(tokenizer.encode(unit, add_special_tokens=False))
    text = unit * (n_tokens // per_unit + 1)
    ids = tokenizer.encode(text, add_special_tokens=False)[:n_tokens]
    return tokenizer.decode(ids)


async def one_session(http, gateway_url: str, session: str, history: str, calls: int, step) -> None:
    """One agent: the long first call (untimed), then `calls` appended turns, each timed through
    the gateway; `step(k, seconds)` waits for every session's call k (a barrier) before the next."""
    url = f"{gateway_url}/s/{session}/v1/chat/completions"
    messages = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": history}]
    for k in range(calls + 1):
        started = time.perf_counter()
        response = await http.post(url, json={"model": "policy", "messages": messages, "tools": TOOLS})
        through = time.perf_counter() - started
        if response.status_code != 200:
            raise SystemExit(f"gateway answered {response.status_code}: {response.text[:300]}")
        message = response.json()["choices"][0]["message"]
        messages = messages + [{"role": "assistant", "content": message["content"], "tool_calls": message["tool_calls"]},
                               {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"],
                                "content": f"file_{k}.txt README.md"}]
        await step(k, through)


async def direct_call(http, stub_url: str, session: str, k: int) -> float:
    """The same tokens straight to the upstream: the prompt the gateway sent for this call."""
    import orjson

    prompt_ids = (await http.get(f"{stub_url}/last/{session}")).json()
    payload = {"input_ids": prompt_ids, "sampling_params": {"max_new_tokens": 64}, "return_logprob": True,
               "rid": f"direct-{session}-{k}"}
    started = time.perf_counter()
    # Encoded as the gateway's PolicyClient encodes it (orjson), so the difference is the gateway's cost.
    (await http.post(f"{stub_url}/generate", content=orjson.dumps(payload),
                     headers={"Content-Type": "application/json"})).json()
    return time.perf_counter() - started


async def run_case(gateway_url, stub_url, tokenizer, history_tokens, concurrency, calls, first_session):
    """Per call index k: all sessions call the gateway at once; then, once all have, the same
    prompts go straight to the stub at once. Added = median(through) - median(direct) per k."""
    import httpx

    history = history_text(tokenizer, history_tokens)
    sessions = [f"s{first_session + i}" for i in range(concurrency)]
    through: dict[int, list[float]] = {}
    added: list[float] = []
    limits = httpx.Limits(max_connections=2 * concurrency + 4)
    async with httpx.AsyncClient(timeout=300, limits=limits) as http:
        barrier = asyncio.Barrier(concurrency)

        async def step(k: int, seconds: float) -> None:
            through.setdefault(k, []).append(seconds)
            if await barrier.wait() == 0 and k > 0:  # one session times the direct calls of step k
                direct = await asyncio.gather(*[direct_call(http, stub_url, s, k) for s in sessions])
                added.append((statistics.median(through[k]) - statistics.median(direct)) * 1000)
            await barrier.wait()

        await asyncio.gather(*[one_session(http, gateway_url, s, history, calls, step) for s in sessions])
    return added


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20, help="timed calls per session")
    parser.add_argument("--histories", default="1k,8k,32k", help="history sizes in tokens (k = 1024)")
    parser.add_argument("--concurrency", default="1,32", help="sessions running at once")
    args = parser.parse_args()
    import tempfile

    import httpx
    from transformers import AutoTokenizer

    from slime_harbor.policy.tiny_model import ensure_tiny_model

    model_dir = str(ensure_tiny_model())
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    histories = [int(h.rstrip("k")) * 1024 if h.endswith("k") else int(h) for h in args.histories.split(",")]
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    n_sessions = len(histories) * sum(concurrencies)
    record_root = Path(tempfile.mkdtemp(prefix="gateway-bench-"))
    ctx = mp.get_context("spawn")
    stub_port, gateway_port = free_port(), free_port()
    stub = ctx.Process(target=run_stub, args=(model_dir, stub_port), daemon=True)
    gateway = ctx.Process(target=run_gateway, args=(f"http://127.0.0.1:{stub_port}", model_dir, gateway_port,
                                                    n_sessions, str(record_root)), daemon=True)
    stub.start()
    gateway.start()
    try:
        wait_for(stub_port)
        wait_for(gateway_port)
        first = 0
        for history in histories:
            for concurrency in concurrencies:
                label = f"{history // 1024}k" if history % 1024 == 0 else str(history)
                try:  # one figure per call step (median over the sessions' calls of that step)
                    added = asyncio.run(run_case(f"http://127.0.0.1:{gateway_port}", f"http://127.0.0.1:{stub_port}",
                                                 tokenizer, history, concurrency, args.calls, first))
                except (httpx.HTTPError, SystemExit) as error:
                    print(f"history={label} concurrency={concurrency} failed: {type(error).__name__}: {error}", flush=True)
                    continue
                finally:
                    first += concurrency
                print(f"history={label} concurrency={concurrency} median_added_ms={statistics.median(added):.2f} "
                      f"p90_added_ms={statistics.quantiles(added, n=10)[-1]:.2f} calls={len(added) * concurrency}", flush=True)
    finally:
        for process in (gateway, stub):
            process.terminate()
            process.join(10)
        shutil.rmtree(record_root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
