"""The gateway's HTTP server: the agents' APIs in, SGLang `/generate` token ids out.

Responsible for: serving one turn whichever dialect asked for it (`Gateway.complete`): sessions
by URL path or API key, the run's sampling replacing the agent's, the step and context limits,
the upstream call and its faults, the reply parsed into a chat message. Not responsible for: an
API's wire format (the dialects: chat.py, anthropic.py, responses.py, gemini.py, over wire.py),
which tokens a prompt is (session.py: branches and bridges) or how messages become tokens (PyPI
`renderers`, one renderer per model family).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import socket
import time
import uuid
from pathlib import Path
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from slime_harbor.gateway.session import (STEP_LIMIT_CODE, Call, GatewaySession, PolicyUnavailable, canonical,
                                          normalise_messages)
from slime_harbor.gateway.wire import TurnRequest, Wire
from slime_harbor.http_api import BadRequest
from slime_harbor.policy.client import PolicyClient, PolicyServerError
from slime_harbor.policy.sampling import Generation, SamplingParams, turn_seed

# config.json model_type -> the renderers config that speaks the family's chat format. Qwen2.5 and
# Qwen3 (dense and MoE) share ChatML with Hermes-style <tool_call> JSON; Qwen3's renderer also
# handles <think> blocks. thinking_retention="all": a bridge keeps every sampled reasoning token
# (the Jinja template would drop reasoning of earlier turns, which is a re-render, i.e. drift).
RENDERER_FAMILIES = {"qwen2": "qwen3", "qwen3": "qwen3", "qwen3_moe": "qwen3"}
ABORT_WAIT_SEC = 10.0
"""How long closing a session keeps aborting its calls in flight until the server has answered them."""


class GatewayError(ValueError):
    """The gateway cannot serve this model (one line, at construction)."""


def make_renderer(model_dir: str | Path, tokenizer):
    """The renderer of the model's family, read from its config.json model_type."""
    from renderers import create_renderer
    from renderers.configs import Qwen3RendererConfig

    config_path = Path(model_dir) / "config.json"
    try:
        model_type = json.loads(config_path.read_text()).get("model_type")
    except (OSError, ValueError) as error:
        raise GatewayError(f"cannot read the model's config.json at {config_path}: {error}") from error
    family = RENDERER_FAMILIES.get(model_type)
    if family is None:
        raise GatewayError(
            f"the gateway has no chat renderer/parser for model family {model_type!r} ({model_dir}); "
            f"supported model_type values: {', '.join(sorted(RENDERER_FAMILIES))}"
        )
    try:
        return create_renderer(tokenizer, Qwen3RendererConfig(thinking_retention="all"))
    except AssertionError as error:  # renderers asserts the family's special tokens exist
        raise GatewayError(f"{model_dir}: the tokenizer lacks the {family} chat format's tokens ({error})") from error


class _InLoopServer:
    """uvicorn serving in the caller's event loop, leaving the process's signals alone (Ctrl-C
    belongs to the run, which closes the gateway itself)."""

    def __init__(self, app, sock: socket.socket):
        import uvicorn

        class Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self):
                yield

        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                                timeout_graceful_shutdown=2)
        self.server = Server(config)
        self.task = asyncio.get_running_loop().create_task(self.server.serve(sockets=[sock]))

    async def started(self) -> None:
        while not self.server.started:
            if self.task.done():
                await self.task
                raise RuntimeError("the gateway's HTTP server did not start")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        self.server.should_exit = True
        await self.task


class Upstream(Protocol):
    """What the gateway calls for its samples: PolicyClient's methods (a policy server by URL), or
    any object with them (agent_sft's ScriptedPolicy answers from a script)."""

    async def generate(self, input_ids: list[int], params: SamplingParams, rid: str | None = None,
                       routing_key: str | None = None) -> Generation: ...

    async def abort(self, rid: str) -> None: ...

    async def aclose(self) -> None: ...


class Gateway:
    """A recording OpenAI-compatible gateway in front of an SGLang-protocol policy (see the module docstring).

    The policy is `upstream_url` (a PolicyClient is built for it with `upstream_api`, `lora_name`
    and `reissue_aborted`), or `upstream`: an Upstream already built, in place of the URL (pass
    None as upstream_url); the gateway closes it in aclose()."""

    def __init__(self, upstream_url: str | None, model_dir: str | Path, host: str = "127.0.0.1", port: int = 0,
                 served_model_name: str = "policy", upstream_api: str = "sglang", lora_name: str | None = None,
                 reissue_aborted: bool = False, *, upstream: Upstream | None = None):
        from transformers import AutoTokenizer

        if (upstream is None) == (upstream_url is None):
            raise ValueError("the gateway takes one upstream: upstream_url or upstream (an Upstream object)")
        if upstream is not None and (upstream_api != "sglang" or lora_name is not None or reissue_aborted):
            raise ValueError("upstream_api, lora_name and reissue_aborted configure the client built from "
                             "upstream_url, not an Upstream object")
        self.model_dir = str(model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.renderer = make_renderer(self.model_dir, self.tokenizer)
        self.stop_token_ids = frozenset(self.renderer.get_stop_token_ids())
        config = json.loads((Path(self.model_dir) / "config.json").read_text())
        self.max_context_len = int(config.get("max_position_embeddings") or self.tokenizer.model_max_length)
        self.served_model_name = served_model_name
        self.upstream: Upstream = upstream if upstream is not None else PolicyClient(
            upstream_url, lora_path=lora_name, api=upstream_api, model=served_model_name,
            reissue_aborted=reissue_aborted)  # see PolicyClient.generate
        self.host, self.port = host, port
        self.sessions: dict[str, GatewaySession] = {}
        self._server: _InLoopServer | None = None
        self._socket: socket.socket | None = None
        self.app = FastAPI(title="slime-harbor gateway", docs_url=None, redoc_url=None, openapi_url=None)
        from slime_harbor.gateway import anthropic, chat, gemini, responses  # each declares its routes

        for dialect in (chat, anthropic, responses, gemini):
            dialect.add_routes(self)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and
        # without it every reply waits ~40 ms for the client's delayed ACK (Nagle).
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        self._socket = sock
        self._server = _InLoopServer(self.app, sock)
        await self._server.started()

    def open_session(self, session_id: str, record_dir: str | Path, sampling: SamplingParams | None = None,
                     routing_key: str | None = None, sampling_seed: int | None = None,
                     max_context_len: int | None = None) -> GatewaySession:
        if session_id in self.sessions:
            raise ValueError(f"gateway session {session_id!r} is already open")
        session = GatewaySession(self, session_id, record_dir, sampling or SamplingParams(), routing_key,
                                 sampling_seed, max_context_len or self.max_context_len)
        self.sessions[session_id] = session
        return session

    async def _abort_upstream(self, calls: list[tuple[str, asyncio.Task]]) -> None:
        """Stop upstream calls (rid, task) on the server, then drop them here.

        A request still in transit misses an abort (the server does not know its rid yet), so the
        abort is repeated until the server has answered every call: once it has, the request no
        longer runs there. Cancelling the client side alone would leave it generating on the server.
        """
        tasks = [task for _, task in calls]
        deadline = time.monotonic() + ABORT_WAIT_SEC
        while tasks:
            for rid, _ in calls:
                await self.upstream.abort(rid)
            _, pending = await asyncio.wait(tasks, timeout=0.2)
            if not pending or time.monotonic() > deadline:
                break
        for task in tasks:
            task.cancel()

    async def close_session(self, session_id: str) -> GatewaySession:
        """Abort the session's in-flight upstream calls, flush its files; it stays readable."""
        session = self.sessions.pop(session_id)
        session.closed = True
        await self._abort_upstream(list(session.in_flight.items()))
        for _ in range(100):  # let the handlers of cancelled calls record them (they answer 503)
            if not session.open_calls:
                break
            await asyncio.sleep(0.05)
        await session.flush()
        return session

    async def aclose(self) -> None:
        for session_id in list(self.sessions):
            await self.close_session(session_id)
        if self._server is not None:
            await self._server.stop()
            self._server = None
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        await self.upstream.aclose()

    # ---- serving one turn -------------------------------------------------------------------
    def session_of(self, request: Request, session_id: str | None) -> GatewaySession:
        if session_id is None:  # no session in the path: the API key names it
            auth = request.headers.get("authorization", "")
            session_id = auth[7:].strip() if auth.lower().startswith("bearer ") else request.headers.get("x-api-key")
        session = self.sessions.get(session_id or "")
        if session is None:
            raise LookupError(f"no open gateway session {session_id!r}")
        return session

    async def complete(self, request: Request, session: GatewaySession, asked: TurnRequest, wire: Wire):
        """One model call, whichever dialect asked for it: checked against the session's limits,
        rendered (or bridged) to its branch's tokens, sampled under the run's sampling, parsed, and
        answered by `wire` in the dialect's format (streamed or not). Recorded for training once
        the reply is delivered."""
        if not isinstance(asked.stream, bool):
            raise BadRequest("stream must be a boolean", param="stream")
        messages = normalise_messages(asked.messages)
        tools = asked.tools
        params = self._sampling(session, asked)
        if session.exit_reason == "policy_unavailable":  # the trial is aborted: fail fast
            raise PolicyUnavailable("the policy server is unavailable")
        if session.max_calls is not None and (session.steps_taken(tools) or 0) >= session.max_calls:
            # The agent has no turn limit of its own (Codex): the episode ends here, scored truncated.
            # Its side calls neither count nor are refused.
            session.exit_reason = "step_limit"
            raise BadRequest(f"the episode's step limit ({session.max_calls} model calls) is reached",
                             code=STEP_LIMIT_CODE)
        request_canon = tuple(canonical(m) for m in messages)
        turn = session.resolve(messages, request_canon, tools)
        prompt = turn.prompt_ids
        room = session.max_context_len - len(prompt)
        if room <= 0:
            session.exit_reason = "context_limit"
            session.count_error()
            raise BadRequest(
                f"This model's maximum context length is {session.max_context_len} tokens. However, your request "
                f"has {len(prompt)} input tokens. Please reduce the length of the input messages.",
                param="messages", code="context_length_exceeded")
        call = Call(index=len(session.calls), branch=turn.branch.index, prompt_ids=prompt, request=request_canon,
                    rid=f"{session.session_id}-{len(session.calls)}-{uuid.uuid4().hex[:8]}", prompt_prefix=turn.prefix)
        call.new_messages = turn.supersedes.new_messages if turn.supersedes else _new_messages(messages, turn)
        session.calls.append(call)
        session.open_calls.add(call.index)
        seed = session.sampling_seed
        params = dataclasses.replace(params, max_new_tokens=min(params.max_new_tokens, room),
                                     sampling_seed=turn_seed(seed, call.index) if seed is not None else None)
        model = asked.model if isinstance(asked.model, str) else self.served_model_name
        if asked.stream:
            # No cache or proxy buffering between the agent and a stream (as OpenAI's and Anthropic's APIs send).
            return StreamingResponse(wire.stream(self, request, session, turn, call, params, tools, model),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        delivered = False
        try:
            await self.generate_call(request, session, call, params, tools)
            if await request.is_disconnected():
                raise PolicyUnavailable("the client went away")
            reply = wire.reply(call, model)
            session.commit(turn, call, canonical(normalise_messages([call.message])[0]))
            delivered = True
            return JSONResponse(reply)
        finally:
            if not delivered:
                call.delivered = False
            session.finished(call)

    def _sampling(self, session: GatewaySession, asked: TurnRequest) -> SamplingParams:
        """The run's sampling, with the request's max_tokens (capped) and stop strings added. The
        request's temperature / top_p are ignored: the run's are what the policy is trained under."""
        params = session.sampling
        requested = asked.max_tokens
        if requested is not None and (not isinstance(requested, int) or isinstance(requested, bool) or requested < 1):
            raise BadRequest("max_tokens must be a positive integer", param="max_tokens")
        stop = asked.stop or []
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
            raise BadRequest("stop must be a string or a list of strings", param="stop")
        return dataclasses.replace(
            params, max_new_tokens=min(params.max_new_tokens, requested or params.max_new_tokens),
            stop=list(dict.fromkeys([*params.stop, *stop])),
        )

    async def generate_call(self, request: Request, session: GatewaySession, call: Call, params: SamplingParams,
                        tools: list | None) -> None:
        """Sample the call upstream, watching the client: if it goes away, the upstream request is
        aborted. Fills the call's completion and its OpenAI message."""
        task = asyncio.get_running_loop().create_task(
            self.upstream.generate(call.prompt_ids, params, rid=call.rid, routing_key=session.routing_key))
        session.in_flight[call.rid] = task
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=0.2)
                if done:
                    break
                if await request.is_disconnected():
                    await self._abort_upstream([(call.rid, task)])
                    call.error = "client disconnected"
                    raise PolicyUnavailable("the client went away")
            generation = task.result()
        except asyncio.CancelledError:
            if not task.done():
                await self._abort_upstream([(call.rid, task)])
            call.error = "cancelled"
            if session.closed:
                raise PolicyUnavailable("the session is closed") from None
            raise
        except PolicyServerError as error:
            session.count_error()
            call.error = str(error)
            if error.status_code is not None and error.status_code < 500:
                raise BadRequest(f"the policy server refused the request: {error}") from None
            session.exit_reason = "policy_unavailable"
            raise PolicyUnavailable(f"the policy server is unavailable: {error}") from None
        finally:
            session.in_flight.pop(call.rid, None)
        call.latency_s = time.monotonic() - call.started
        call.completion_ids, call.logprobs = generation.token_ids, generation.logprobs
        call.finish_reason, call.weight_version = generation.finish_reason, generation.weight_version
        call.reissued = generation.reissued
        call.top_p_token_ids, call.top_p_token_offsets = generation.top_p_token_ids, generation.top_p_token_offsets
        if generation.finish_reason == "abort":
            call.error = "aborted upstream"
            raise PolicyUnavailable("the policy server aborted the request" + (" (session closed)" if session.closed else ""))
        call.message = self._message(call, params, tools)

    def _message(self, call: Call, params: SamplingParams, tools: list | None) -> dict[str, Any]:
        """The completion parsed by the family's renderer into an OpenAI assistant message."""
        parsed = self.renderer.parse_response(call.completion_ids, tools=tools, prompt_ids=call.prompt_ids)
        content = parsed.content
        for stop in params.stop:  # OpenAI's reply leaves out the stop string (the tokens keep it)
            if content.endswith(stop):
                content = content[: -len(stop)]
                break
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if parsed.reasoning_content:
            message["reasoning_content"] = parsed.reasoning_content
        ok = [c for c in parsed.tool_calls if c.status == "ok" and c.name]
        if ok:
            message["tool_calls"] = [
                {"id": f"call_{call.index}_{k}", "type": "function",
                 "function": {"name": c.name, "arguments": c.arguments if isinstance(c.arguments, str)
                              else json.dumps(c.arguments if c.arguments is not None else {}, ensure_ascii=False)}}
                for k, c in enumerate(ok)
            ]
            message["content"] = content or None  # OpenAI: null content beside tool calls
        return message


def _new_messages(messages: list[dict], turn) -> list[dict]:
    """The messages this request adds to its branch (all of them on a new branch): the ATIF steps."""
    known = len(turn.branch.canon) if turn.branch.calls else 0
    return messages[known:] if known <= len(messages) else messages
