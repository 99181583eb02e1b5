"""What our two HTTP servers share: the policy server (SGLang's protocol, policy/server.py) and the
gateway (the agents' APIs, gateway/). A request either is a JSON object the server can serve or is
refused with a 400 that names the field at fault, in OpenAI's error shape, which both speak. And
which bind addresses stay on this machine (is_loopback: both ask for a key beyond it), and the
bearer token a request carries (bearer_token: the key both read).
"""

from __future__ import annotations

import json
from typing import Any

import orjson
from fastapi import Request
from fastapi.responses import JSONResponse


class BadRequest(ValueError):
    """A request refused with a 400; `param` names the field at fault, `code` a machine-readable reason."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.param, self.code = param, code


async def json_object(request: Request) -> dict[str, Any]:
    """The request's body as a JSON object (every request both servers serve is one), else BadRequest."""
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
    """OpenAI's error reply: `{"error": {"message", "type", "param", "code"}}`."""
    return JSONResponse(status_code=status, content={"error": {"message": message, "type": kind, "param": param,
                                                               "code": code}})


def bad_request_reply(error: BadRequest) -> JSONResponse:
    return openai_error(400, str(error), "invalid_request_error", error.param, error.code)


def is_loopback(host: str) -> bool:
    """Whether a bind address is this machine's loopback (127.0.0.0/8, ::1, localhost)."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve beyond this machine
        return False


def bearer_token(request: Request) -> str | None:
    """The request's `Authorization: Bearer <token>` token (None without one)."""
    auth = request.headers.get("authorization", "")
    return auth[7:].strip() if auth.lower().startswith("bearer ") else None
