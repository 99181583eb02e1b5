"""What the gateway's dialects share: the turn they translate a request into, and one turn's reply streamed.

A dialect (chat.py, anthropic.py, responses.py, gemini.py) declares its routes (`add_routes`),
translates its request into one `TurnRequest` (chat-completions messages and function tools, the
format the renderer takes) and serves it with `Gateway.complete(request, session, turn, wire)`:
the same rendering, branches, sampling and recording for every API. Its `Wire` writes the
finished call back in the dialect's format: `reply()` for a JSON answer, `head()` / `events()` /
`keepalive()` / `error()` for its SSE stream, whose bookkeeping is `Wire.stream`, one for all.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from fastapi.responses import JSONResponse

from slime_harbor.gateway.session import PolicyUnavailable, canonical, normalise_messages
from slime_harbor.http_api import BadRequest, bad_request_reply, openai_error

# While the policy samples, a stream sends the dialect's keepalive this often: clients with an
# idle timer (Codex resets its own only on data events) must not give up on a long generation.
KEEPALIVE_S = 10.0


@dataclass
class TurnRequest:
    """One model call as every dialect asks for it. Fields are as the client sent them (after the
    dialect's translation); `Gateway.complete` checks them."""

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
        """Every dialect's SSE stream: the head at once, keepalives while the policy samples, the
        dialect's events, or its error event once headers are sent. The reply counts as delivered
        once its last event is sent, and is trained only then; a client that leaves mid-generation
        has its upstream call aborted."""
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


def openai_error_for(error: Exception) -> JSONResponse:
    """The OpenAI-shaped answer (chat completions, Responses) to a request the gateway refused:
    400 a malformed request, 404 an unknown session, 503 the policy cannot answer."""
    if isinstance(error, BadRequest):
        return bad_request_reply(error)
    if isinstance(error, LookupError):
        return openai_error(404, str(error.args[0]), "not_found_error", None, "session_not_found")
    return openai_error(503, str(error), "service_unavailable", None, "policy_unavailable")

