"""Anthropic Messages on the gateway's sessions (what Claude Code speaks).

Routes: `POST {root}/v1/messages` (streamed or not) and `{root}/v1/messages/count_tokens`, where
`{root}` is the session root `/s/<session>` (`anthropic_base_url(session)`: an OpenAI `api_base`
without its `/v1`, since Anthropic SDKs append `/v1/messages` to their base URL), or nothing, the
session then found by its key in `x-api-key` or the bearer token (ANTHROPIC_AUTH_TOKEN); `HEAD /`
(and the session root) answers 200 for clients that probe the base URL. `GET /v1/models` answers in
Anthropic's shape when the request carries `anthropic-version` (chat.ChatCompletions.models). Errors
are Anthropic's `{"type": "error", "error": {"type": ..., "message": ...}}`.

A request becomes the chat-completions turn the gateway serves (same template, exact tokens for
the gateway's own earlier replies, branches, the run's sampling, recording): `system` (a string or
text blocks; `cache_control` ignored) -> a system message; assistant blocks fold into one message
(thinking -> reasoning_content, text -> content, tool_use -> tool_calls); a user turn's
tool_result blocks become tool messages (in order, before the turn's text); `tools`
(name, description, input_schema) -> function tools; `max_tokens` and `stop_sequences` as
chat's `max_tokens` / `stop`; `metadata`, `temperature`, `thinking`, `tool_choice` ignored.

Whose parts: the block mapping above is the one verifiers 0.4's `v1/dialects/anthropic.py`
(`parse_messages`) uses; the code is ours because verifiers' dialect is a relay (it parses a copy
into pydantic messages with content parts, flat tool calls and provider state, and its
`stream_events` emits a text-only stream), which would need a second translation into the
renderer's dicts and could not stream thinking or tool_use blocks.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request, Response
from fastapi.responses import JSONResponse

from slime_harbor.gateway.turn import GatewayTurn, TurnRequest
from slime_harbor.gateway.wire import Dialect, function_tool, sse, status_of, tool_objects
from slime_harbor.http_api import BadRequest, json_object

# Anthropic's error types by HTTP status (https://docs.anthropic.com/en/api/errors).
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 503: "api_error"}


def anthropic_base_url(session, host: str | None = None) -> str:
    """The session's root, what ANTHROPIC_BASE_URL should be (the SDK appends /v1/messages)."""
    return session.openai_base_url(host).removesuffix("/v1")


def error_response(status: int, message: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={
        "type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message}})


def _text(content: Any, where: str) -> str:
    """A system prompt or tool result: a string or a list of text blocks (other keys ignored)."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        texts = []
        for k, block in enumerate(content):
            if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
                raise BadRequest(f"{where}[{k}]: only text blocks are supported here", param=where)
            texts.append(block["text"])
        return "\n\n".join(texts) if where == "system" else "".join(texts)
    raise BadRequest(f"{where} must be a string or a list of text blocks", param=where)


def chat_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's `system` + `messages` as chat-completions messages."""
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise BadRequest("messages: field required (a non-empty list)", param="messages")
    messages: list[dict[str, Any]] = []
    if body.get("system"):
        messages.append({"role": "system", "content": _text(body["system"], "system")})
    for i, message in enumerate(raw):
        where = f"messages.{i}"
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant", "system"):
            raise BadRequest(f"{where}.role must be 'user', 'assistant' or 'system'", param=where)
        content = message.get("content")
        if message["role"] == "system":
            # Claude Code (2.1.x) puts its environment block in the message list as a system
            # message after the first user turn; the chat template renders it as a system turn there.
            messages.append({"role": "system", "content": _text(content, f"{where}.content")})
            continue
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list) or not all(isinstance(b, dict) for b in blocks):
            raise BadRequest(f"{where}.content must be a string or a list of content blocks", param=where)
        if message["role"] == "assistant":
            out: dict[str, Any] = {"role": "assistant", "content": "", "tool_calls": []}
            reasoning = []
            for k, block in enumerate(blocks):
                kind = block.get("type")
                if kind == "text":
                    out["content"] += block.get("text") or ""
                elif kind == "thinking":
                    reasoning.append(block.get("thinking") or "")
                elif kind == "tool_use":
                    if not isinstance(block.get("name"), str):
                        raise BadRequest(f"{where}.content.{k}: tool_use needs a name", param=where)
                    out["tool_calls"].append({"id": block.get("id"), "type": "function", "function": {
                        "name": block["name"], "arguments": json.dumps(block.get("input") or {}, ensure_ascii=False)}})
                elif kind != "redacted_thinking":  # nothing the policy could have sampled
                    raise BadRequest(f"{where}.content.{k}: unsupported assistant block type {kind!r}", param=where)
            if reasoning:
                out["reasoning_content"] = "".join(reasoning)
            if not out["tool_calls"]:
                del out["tool_calls"]
            messages.append(out)
            continue
        texts = []
        for k, block in enumerate(blocks):
            kind = block.get("type")
            if kind == "tool_result":
                result = _text(block.get("content"), f"{where}.content.{k}.content")
                messages.append({"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": result})
            elif kind == "text":
                texts.append(block.get("text") or "")
            else:
                raise BadRequest(f"{where}.content.{k}: only text and tool_result blocks are supported in a user "
                                 f"turn, not {kind!r}", param=where)
        if texts or not any(b.get("type") == "tool_result" for b in blocks):
            messages.append({"role": "user", "content": "".join(texts)})
    return messages


def chat_tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Client tools as function tools; Anthropic's server tools (web search, ...) have no
    input_schema and nothing here could run them, so they are left out."""
    tools = tool_objects(body, "{name, description, input_schema}")
    if tools is None:
        return None
    out = [function_tool(t.get("name"), t.get("description"), t.get("input_schema"), f"tools.{k}")
           for k, t in enumerate(tools) if t.get("type") in (None, "custom") or "input_schema" in t]
    return out or None


class Messages(Dialect):
    """Anthropic Messages (see the module docstring). A reply is an Anthropic Message, or its SSE
    stream of events."""

    def add_routes(self, app) -> None:
        # "/s/{session_id}/v1/v1": a client handed the session's OpenAI base URL (ending in /v1) as its
        # Anthropic base URL, to which the SDK appends /v1/messages again.
        for prefix in ("/s/{session_id}/v1", "/v1", "/s/{session_id}/v1/v1"):
            self.route(app, prefix + "/messages", self.messages, ["POST"])
            self.route(app, prefix + "/messages/count_tokens", self.count_tokens, ["POST"])
        for path in ("/", "/s/{session_id}", "/s/{session_id}/v1"):
            self.route(app, path, self.head_probe, ["HEAD"])

    def refusal(self, error: Exception) -> JSONResponse:
        return error_response(*status_of(error))

    def model_list(self, request: Request) -> dict[str, Any] | None:
        """An Anthropic SDK (it sends anthropic-version) lists models in its own shape."""
        if "anthropic-version" not in request.headers:
            return None
        name = self.gateway.served_model_name
        model = {"type": "model", "id": name, "display_name": name, "created_at": "1970-01-01T00:00:00Z"}
        return {"data": [model], "has_more": False, "first_id": name, "last_id": name}

    @staticmethod
    def parse(body: dict[str, Any]) -> TurnRequest:
        max_tokens = body.get("max_tokens")
        if max_tokens is None:
            raise BadRequest("max_tokens: field required", param="max_tokens")
        stop = body.get("stop_sequences") or []
        if not isinstance(stop, list):
            raise BadRequest("stop_sequences must be a list of strings", param="stop_sequences")
        return TurnRequest(messages=chat_messages(body), tools=chat_tools(body), max_tokens=max_tokens, stop=stop,
                           stream=body.get("stream", False), model=body.get("model"))

    async def head_probe(self, request: Request, session_id: str | None = None) -> Response:
        return Response(status_code=200)

    async def messages(self, request: Request, session_id: str | None = None):
        return await self.serve(request, session_id, self.parse)

    async def count_tokens(self, request: Request, session_id: str | None = None):
        """The prompt's length as the policy's template renders it (a fresh render: a session's
        bridged prompt can differ by a few template tokens). No session needed, nothing recorded."""
        body = await json_object(request)
        messages = chat_messages(body)
        ids = self.gateway.render_prompt(self.gateway.messages(messages), chat_tools(body))
        return JSONResponse({"input_tokens": len(ids)})

    # ---- the reply ---------------------------------------------------------------------------------
    @staticmethod
    def _blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = []
        if message.get("reasoning_content"):
            blocks.append({"type": "thinking", "thinking": message["reasoning_content"], "signature": ""})
        if message.get("content"):
            blocks.append({"type": "text", "text": message["content"]})
        for tool_call in message.get("tool_calls") or []:
            blocks.append({"type": "tool_use", "id": tool_call["id"], "name": tool_call["function"]["name"],
                           "input": json.loads(tool_call["function"]["arguments"] or "{}")})
        return blocks

    def _stop(self, turn: GatewayTurn) -> tuple[str, str | None]:
        call = turn.call
        if call.message.get("tool_calls"):
            return "tool_use", None
        if call.finish_reason == "length":
            return "max_tokens", None
        text = self.gateway.tokenizer.decode(call.completion_ids, skip_special_tokens=True)
        matched = next((s for s in turn.asked.stop if text.endswith(s)), None)
        return ("stop_sequence", matched) if matched else ("end_turn", None)

    @staticmethod
    def _message(turn: GatewayTurn, content: list, stop: tuple[str | None, str | None], output: int):
        call = turn.call
        return {"id": f"msg_{call.rid}", "type": "message", "role": "assistant", "model": turn.model,
                "content": content, "stop_reason": stop[0], "stop_sequence": stop[1],
                "usage": {"input_tokens": len(call.prompt_ids), "output_tokens": output}}

    def reply(self, turn: GatewayTurn) -> dict[str, Any]:
        call = turn.call
        return self._message(turn, self._blocks(call.message), self._stop(turn), len(call.completion_ids))

    def head(self, turn: GatewayTurn) -> list[str]:
        return [sse("message_start", {"type": "message_start", "message": self._message(turn, [], (None, None), 0)})]

    def events(self, turn: GatewayTurn) -> list[str]:
        out = []
        for index, block in enumerate(self._blocks(turn.call.message)):
            if block["type"] == "thinking":
                start, deltas = {**block, "thinking": ""}, [{"type": "thinking_delta", "thinking": block["thinking"]},
                                                            {"type": "signature_delta", "signature": ""}]
            elif block["type"] == "text":
                start, deltas = {**block, "text": ""}, [{"type": "text_delta", "text": block["text"]}]
            else:
                start = {**block, "input": {}}
                deltas = [{"type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}]
            out.append(sse("content_block_start", {"type": "content_block_start", "index": index,
                                                   "content_block": start}))
            out += [sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d})
                    for d in deltas]
            out.append(sse("content_block_stop", {"type": "content_block_stop", "index": index}))
        stop_reason, stop_sequence = self._stop(turn)
        out.append(sse("message_delta", {"type": "message_delta",
                                         "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                                         "usage": {"output_tokens": len(turn.call.completion_ids)}}))
        out.append(sse("message_stop", {"type": "message_stop"}))
        return out

    def keepalive(self, turn: GatewayTurn) -> str:
        return sse("ping", {"type": "ping"})

    def error_event(self, turn: GatewayTurn, message: str, kind: str) -> str:
        return sse("error", {"type": "error", "error": {"type": kind, "message": message}})
