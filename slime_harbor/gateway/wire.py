"""What the gateway's dialects share: the `Dialect` base class, one subclass per API.

A dialect (chat.py, anthropic.py, responses.py, gemini.py) is the single place an API lives: it
declares its routes (`add_routes`), translates its request into one `TurnRequest` (turn.py:
chat-completions messages and function tools, the format the renderer takes) served by
`Gateway.complete` as one `GatewayTurn` (the same rendering, branches, sampling and recording for
every API), and writes that turn's reply in its format: `reply()` for a JSON answer, `head()` /
`events()` / `keepalive()` / `error_event()` for its SSE stream (delivered by `GatewayTurn.deliver`,
one path for all). A refused request (400 malformed, 404 unknown session, 503 the policy cannot
answer) is answered in the dialect's error shape (`refusal`) by every route it registers with
`route`, written once here.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from slime_harbor.gateway.session import GatewaySession, PolicyUnavailable
from slime_harbor.gateway.turn import GatewayTurn, TurnRequest
from slime_harbor.http_api import BadRequest, bad_request_reply, json_object, openai_error

class KeyRefused(Exception):
    """A call on a session without that session's own key (401), or with another key (403). The
    key is never echoed."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


REFUSED = (BadRequest, LookupError, KeyRefused, PolicyUnavailable)
"""What a route answers with the dialect's error reply instead of raising."""


class Dialect:
    """One API on the gateway's sessions (see the module docstring); subclassed per API."""

    def __init__(self, gateway):
        self.gateway = gateway

    def add_routes(self, app) -> None:
        """Register the dialect's routes on `app` (with `route`)."""
        raise NotImplementedError

    def route(self, app, path: str, handler, methods: list[str]) -> None:
        """`handler` served at `path`, a refused request answered by `refusal`."""

        @functools.wraps(handler)  # FastAPI reads the handler's parameters through the wrapper
        async def refusing(*args, **kwargs):
            try:
                return await handler(*args, **kwargs)
            except REFUSED as error:
                return self.refusal(error)

        app.add_api_route(path, refusing, methods=methods)

    def refusal(self, error: Exception) -> Response:
        """The dialect's error reply: 400 for a BadRequest, 404 for an unknown session (LookupError),
        401 / 403 for a call without the session's key or with another (KeyRefused), 503 when the
        policy cannot answer (PolicyUnavailable)."""
        raise NotImplementedError

    def model_list(self, request: Request) -> dict[str, Any] | None:
        """`GET .../v1/models` in this dialect's shape when the request is its client's (the path
        is shared: OpenAI's and Anthropic's SDKs both list models there); None: not its client."""
        return None

    def session_of(self, request: Request, session_id: str | None) -> GatewaySession:
        return self.gateway.session_of(request, session_id)

    async def serve(self, request: Request, session_id: str | None, parse) -> Response:
        """One turn: the session (404 first), the body `parse`d into a TurnRequest, the turn's reply."""
        session = self.session_of(request, session_id)
        asked: TurnRequest = parse(await json_object(request))
        return await self.gateway.complete(request, session, asked, self)

    # ---- the turn's reply in the dialect's format ------------------------------------------------
    def reply(self, turn: GatewayTurn) -> Any:
        raise NotImplementedError

    def head(self, turn: GatewayTurn) -> list[str]:
        """SSE events sent before sampling starts."""
        return []

    def events(self, turn: GatewayTurn) -> list[str]:
        """SSE events of the sampled reply, to the stream's last one."""
        raise NotImplementedError

    def keepalive(self, turn: GatewayTurn) -> str:
        raise NotImplementedError

    def error_event(self, turn: GatewayTurn, message: str, kind: str) -> str:
        """The stream's error once headers are sent; `kind` is invalid_request_error or api_error."""
        raise NotImplementedError


def status_of(error: Exception) -> tuple[int, str]:
    """A refused request's HTTP status and message (see Dialect.refusal)."""
    if isinstance(error, BadRequest):
        return 400, str(error)
    if isinstance(error, LookupError):
        return 404, str(error.args[0])
    if isinstance(error, KeyRefused):
        return error.status, str(error)
    return 503, str(error)


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


def openai_refusal(error: Exception) -> JSONResponse:
    """The OpenAI-shaped answer (chat completions, Responses) to a request the gateway refused."""
    status, message = status_of(error)
    if status == 400:
        return bad_request_reply(error)
    if status == 404:
        return openai_error(404, message, "not_found_error", None, "session_not_found")
    if status in (401, 403):  # OpenAI's own types and code for a missing or wrong key
        kind = "authentication_error" if status == 401 else "permission_error"
        return openai_error(status, message, kind, None, "invalid_api_key")
    return openai_error(503, message, "service_unavailable", None, "policy_unavailable")
