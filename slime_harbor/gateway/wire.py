"""What the gateway's other wire formats (anthropic.py, responses.py) share: one turn streamed.

A dialect translates its request into the chat-completions body the gateway serves
(`Gateway.complete(..., wire=...)`: the same rendering, branches, sampling and recording), and a
`Wire` writes the finished call back in the dialect's format: `reply()` for a JSON answer,
`head()` / `events()` / `keepalive()` / `error()` for its SSE stream.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import orjson

from fastapi import Request
from fastapi.responses import JSONResponse

from slime_harbor.gateway.session import BadRequest, PolicyUnavailable, canonical, normalise_messages

# While the policy samples, a stream sends the dialect's keepalive this often: clients with an
# idle timer (Codex resets its own only on data events) must not give up on a long generation.
KEEPALIVE_S = 10.0


class Wire:
    """One request's reply in a dialect's format (subclassed per dialect)."""

    def reply(self, call, model: str) -> dict[str, Any]:
        raise NotImplementedError

    def head(self, call, model: str) -> list[str]:
        """SSE events sent before sampling starts."""
        return []

    def events(self, call, model: str) -> list[str]:
        """SSE events of the sampled reply, to the stream's last one."""
        raise NotImplementedError

    def keepalive(self, call, model: str) -> str:
        raise NotImplementedError

    def error(self, message: str, kind: str) -> str:
        raise NotImplementedError

    async def stream(self, gateway, request, session, turn, call, params, tools, model: str):
        """The chat stream's bookkeeping (server.Gateway._stream) with this dialect's events: the
        reply counts as delivered once its last event is sent, and is trained only then."""
        delivered = False
        task = None
        try:
            for event in self.head(call, model):
                yield event
            task = asyncio.get_running_loop().create_task(gateway.generate_call(request, session, call, params, tools))
            while not (await asyncio.wait({task}, timeout=KEEPALIVE_S))[0]:
                yield self.keepalive(call, model)
            try:
                task.result()
            except BadRequest as error:  # headers are sent: the error goes in the stream
                yield self.error(str(error), "invalid_request_error")
                return
            except PolicyUnavailable as error:
                yield self.error(str(error), "api_error")
                return
            for event in self.events(call, model):
                yield event
            session.commit(turn, call, canonical(normalise_messages([call.message])[0]))
            delivered = True
        finally:
            if task is not None and not task.done():  # the client left mid-generation: the task aborts upstream
                task.cancel()
            if not delivered:
                call.delivered = False
                call.error = call.error or "the client left before the reply was sent"
            session.finished(call)


def sse(event: str | None, payload: dict[str, Any]) -> str:
    return (f"event: {event}\n" if event else "") + "data: " + json.dumps(payload, ensure_ascii=False) + "\n\n"


def tool_objects(body: dict[str, Any], shape: str) -> list[dict[str, Any]] | None:
    """A request's `tools`: None when it has none, else its list of objects (BadRequest naming the
    dialect's tool `shape` when it is not one)."""
    tools = body.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise BadRequest(f"tools must be a list of {shape}", param="tools")
    return tools


def function_tool(name: Any, description: Any, parameters: Any, where: str) -> dict[str, Any]:
    """A dialect's tool declaration as the chat-completions tool the renderer takes (key order as
    OpenAI clients send it, so the same tools render to the same tokens whichever API sent them)."""
    if not isinstance(name, str) or not name:
        raise BadRequest(f"{where}.name must be a non-empty string", param=where)
    function: dict[str, Any] = {"name": name}
    if isinstance(description, str):
        function["description"] = description
    function["parameters"] = parameters if isinstance(parameters, dict) else {"type": "object", "properties": {}}
    return {"type": "function", "function": function}


async def json_object(request: Request) -> dict[str, Any]:
    """The request's body as a JSON object (every dialect's requests are one), else BadRequest."""
    raw = await request.body()
    try:
        # orjson: an agent resends its whole history every call; 130 kB of it parses in ~0.2 ms
        # here against ~0.7 ms with the stdlib, which stays the fallback for what orjson refuses
        # and Python's json accepts (lone surrogates in strings, NaN).
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        try:
            body = json.loads(raw)
        except ValueError as error:
            raise BadRequest(f"the body is not JSON: {error}") from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


def openai_error(status: int, message: str, kind: str, param: str | None = None, code: str | None = None) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"message": message, "type": kind, "param": param,
                                                               "code": code}})


def openai_error_for(error: Exception) -> JSONResponse:
    """The OpenAI-shaped answer (chat completions, Responses) to a request the gateway refused:
    400 a malformed request, 404 an unknown session, 503 the policy cannot answer."""
    if isinstance(error, BadRequest):
        return openai_error(400, str(error), "invalid_request_error", error.param, error.code)
    if isinstance(error, LookupError):
        return openai_error(404, str(error.args[0]), "not_found_error", None, "session_not_found")
    return openai_error(503, str(error), "service_unavailable", None, "policy_unavailable")

