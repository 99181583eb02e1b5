"""One gateway turn, from admission to delivery: the object that carries one model call.

A dialect (chat.py, anthropic.py, responses.py, gemini.py; wire.py) translates its request into a
`TurnRequest`; `GatewayTurn` admits it (the request's own checks, the run's sampling, the
session's limits and the prompt's place on a branch: `GatewaySession.admit`), samples it upstream
while watching the client, parses the completion into a chat message with the model family's
renderer, and delivers the reply in the dialect's format, whole or streamed, through one path:
the reply is committed to its branch (trained) once its last byte is handed over, and the call
is recorded as finished either way.

Not responsible for: an API's wire format (the dialect writes every reply and event from this
turn), which tokens a prompt is (session.py), the HTTP server and the sessions (server.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import time
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from slime_harbor.gateway.session import GatewaySession, PolicyUnavailable
from slime_harbor.http_api import BadRequest
from slime_harbor.policy.client import PolicyServerError
from slime_harbor.policy.sampling import SamplingParams, turn_seed

# While the policy samples, a stream sends the dialect's keepalive this often: clients with an
# idle timer (Codex resets its own only on data events) must not give up on a long generation.
KEEPALIVE_S = 10.0


@dataclass
class TurnRequest:
    """One model call as every dialect asks for it. Fields are as the client sent them (after the
    dialect's translation); `GatewayTurn` checks them."""

    messages: Any
    """Chat-completions messages (system, user, assistant with tool_calls / reasoning_content, tool)."""
    tools: list[dict[str, Any]] | None = None
    """Function tools: `{"type": "function", "function": {"name", "description"?, "parameters"}}`."""
    max_tokens: Any = None
    """The client's cap on new tokens (None: the run's); never above the run's."""
    stop: Any = None
    """The client's stop strings, added to the run's."""
    stream: Any = False
    model: str | None = None
    """The model name the reply echoes (None: the served name)."""
    include_usage: bool = False
    """Chat's stream_options.include_usage: a usage chunk ends the stream."""
    body: dict[str, Any] | None = None
    """The request as the client sent it, where the reply echoes its settings (Responses)."""


def run_sampling(run: SamplingParams, asked: TurnRequest) -> SamplingParams:
    """The run's sampling, with the request's max_tokens (capped) and stop strings added. The
    request's temperature / top_p are ignored: the run's are what the policy is trained under."""
    requested = asked.max_tokens
    if requested is not None and (not isinstance(requested, int) or isinstance(requested, bool) or requested < 1):
        raise BadRequest("max_tokens must be a positive integer", param="max_tokens")
    stop = asked.stop or []
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise BadRequest("stop must be a string or a list of strings", param="stop")
    return dataclasses.replace(
        run, max_new_tokens=min(run.max_new_tokens, requested or run.max_new_tokens),
        stop=list(dict.fromkeys([*run.stop, *stop])),
    )


class GatewayTurn:
    """One model call, whichever dialect asked for it (see the module docstring). Built by
    `Gateway.complete`; the dialect reads `call` (what was sampled, and its parsed `message`),
    `model`, `asked`, `request`, `created` and `sequence` to write the reply."""

    def __init__(self, gateway, dialect, request: Request, session: GatewaySession, asked: TurnRequest):
        if not isinstance(asked.stream, bool):
            raise BadRequest("stream must be a boolean", param="stream")
        messages = gateway.messages(asked.messages)
        params = run_sampling(session.sampling, asked)
        self.gateway, self.dialect, self.request, self.session, self.asked = gateway, dialect, request, session, asked
        self.placement, self.call = session.admit(messages, asked.tools)
        room = session.max_context_len - len(self.call.prompt_ids)
        seed = session.sampling_seed
        self.params = dataclasses.replace(
            params, max_new_tokens=min(params.max_new_tokens, room),
            sampling_seed=turn_seed(seed, self.call.index) if seed is not None else None)
        self.model = asked.model if isinstance(asked.model, str) else gateway.served_model_name
        self.created = int(time.time())
        self.sequence = itertools.count()
        """The reply's SSE sequence numbers (Responses numbers its events)."""

    async def respond(self):
        """The reply: a JSON answer, or an SSE stream (no cache or proxy buffering between the
        agent and a stream, as OpenAI's and Anthropic's APIs send)."""
        if self.asked.stream:
            return StreamingResponse(self.deliver(), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        async with contextlib.aclosing(self.deliver()) as delivery:
            reply = [part async for part in delivery]
        return JSONResponse(reply[0])

    async def deliver(self):
        """The one delivery path. Whole: sample, then the dialect's reply (a client that left
        meanwhile gets none). Streamed: the dialect's head at once, keepalives while the policy
        samples, its events, or its error event once headers are sent (a whole reply's errors
        raise to the dialect instead). The reply counts as delivered once its last part is handed
        over, and is trained only then; the call is recorded as finished either way, and a client
        that leaves mid-generation has its upstream call aborted."""
        stream, task = self.asked.stream, None
        try:
            if not stream:
                await self.sample()
                if await self.request.is_disconnected():
                    raise PolicyUnavailable("the client went away")
                yield self.dialect.reply(self)
            else:
                for event in self.dialect.head(self):
                    yield event
                task = asyncio.get_running_loop().create_task(self.sample())
                while not (await asyncio.wait({task}, timeout=KEEPALIVE_S))[0]:
                    yield self.dialect.keepalive(self)
                try:
                    task.result()
                except BadRequest as error:  # headers are sent: the error goes in the stream
                    yield self.dialect.error_event(self, str(error), "invalid_request_error")
                    return
                except PolicyUnavailable as error:
                    yield self.dialect.error_event(self, str(error), "api_error")
                    return
                for event in self.dialect.events(self):
                    yield event
            self.session.commit(self.placement, self.call)
        finally:
            if task is not None and not task.done():  # the client left mid-generation: the task aborts upstream
                task.cancel()
            self.session.finished(self.call)

    async def sample(self) -> None:
        """Sample the call upstream, watching the client: if it goes away, the upstream request is
        aborted. Fills the call's completion and its chat message."""
        call, session = self.call, self.session
        upstream = self.gateway.upstream.generate(call.prompt_ids, self.params, rid=call.rid,
                                                  routing_key=session.routing_key)
        task = asyncio.get_running_loop().create_task(upstream)
        with session.upstream_call(call, task):
            try:
                while True:
                    done, _ = await asyncio.wait({task}, timeout=0.2)
                    if done:
                        break
                    if await self.request.is_disconnected():
                        await self.gateway.abort_upstream([(call.rid, task)])
                        call.error = "client disconnected"
                        raise PolicyUnavailable("the client went away")
                generation = task.result()
            except asyncio.CancelledError:
                if not task.done():
                    await self.gateway.abort_upstream([(call.rid, task)])
                call.error = "cancelled"
                if session.closed:
                    raise PolicyUnavailable("the session is closed") from None
                raise
            except PolicyServerError as error:
                session.count_error()
                call.error = str(error)
                if error.status_code is not None and error.status_code < 500:
                    raise BadRequest(f"the policy server refused the request: {error}") from None
                session.policy_lost()
                raise PolicyUnavailable(f"the policy server is unavailable: {error}") from None
        call.sampled(generation)
        if generation.finish_reason == "abort":
            call.error = "aborted upstream"
            raise PolicyUnavailable("the policy server aborted the request" + (" (session closed)" if session.closed else ""))
        call.message = self.parsed_message()

    def parsed_message(self) -> dict[str, Any]:
        """The completion parsed by the family's renderer into an OpenAI assistant message."""
        call = self.call
        parsed = self.gateway.renderer.parse_response(call.completion_ids, tools=self.asked.tools,
                                                      prompt_ids=call.prompt_ids)
        content = parsed.content
        for stop in self.params.stop:  # OpenAI's reply leaves out the stop string (the tokens keep it)
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
