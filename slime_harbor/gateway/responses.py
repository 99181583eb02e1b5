"""OpenAI Responses on the gateway's sessions (what Codex speaks).

Routes: `POST {api_base}/responses` (`/s/<session>/v1/responses`, or `/v1/responses` with the
session's API key), streamed or not. A websocket attempt on the same path (Codex can try
Responses over a websocket first) is refused with a 426 and an OpenAI-style error before the
handshake completes, so the client falls back to HTTP.

A request becomes the chat-completions turn the gateway serves (same template, exact tokens for
the gateway's own earlier replies, branches, the run's sampling, recording): `instructions` -> a
system message; `input` a string (one user message) or items: messages (input_text /
output_text parts; developer -> system), and consecutive assistant-side items (an assistant
message, `reasoning`, `function_call`) folded into ONE assistant message, so the gateway's reply
sent back as items is recognised as its own; `function_call_output` -> a tool message; flat
function tools -> chat tools (other tool types are left out: nothing here could run them);
`max_output_tokens` as chat's `max_tokens`. `store` is accepted and ignored; state lives in the
client: `previous_response_id` is refused (400), clients resend the history with `store=false`.

Whose parts: the item folding is the one verifiers 0.4's `v1/dialects/responses.py`
(`parse_request`, `fold_assistant`) uses; the code is ours because verifiers' dialect is a relay
(pydantic messages with content parts and provider state, and a text-only `stream_events`),
which would need a second translation into the renderer's dicts and could not stream reasoning
or function calls.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request, WebSocket
from fastapi.responses import JSONResponse

from slime_harbor.gateway.turn import GatewayTurn, TurnRequest
from slime_harbor.gateway.wire import Dialect, function_tool, openai_refusal, sse, tool_objects
from slime_harbor.http_api import BadRequest, openai_error

ASSISTANT_ITEMS = ("reasoning", "function_call")


async def refuse_websocket(websocket: WebSocket, session_id: str | None = None) -> None:
    """HTTP 426 instead of the handshake: Responses over websockets is not served."""
    await websocket.send_denial_response(openai_error(
        426, "Responses over a websocket are not supported by this gateway; use HTTP (POST /responses)",
        "invalid_request_error", None, "websocket_not_supported"))


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for k, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text", "text") \
                    or not isinstance(part.get("text"), str):
                raise BadRequest(f"{where}[{k}]: only input_text / output_text parts are supported", param=where)
            texts.append(part["text"])
        return "".join(texts)
    raise BadRequest(f"{where} must be a string or a list of text parts", param=where)


def chat_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """`instructions` + `input` as chat-completions messages."""
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions:
        if not isinstance(instructions, str):
            raise BadRequest("instructions must be a string", param="instructions")
        messages.append({"role": "system", "content": instructions})
    raw = body.get("input")
    items = [{"type": "message", "role": "user", "content": raw}] if isinstance(raw, str) else raw
    if not isinstance(items, list) or not items or not all(isinstance(i, dict) for i in items):
        raise BadRequest("input must be a non-empty string or list of items", param="input")
    assistant: dict[str, Any] | None = None  # the assistant message the current run of items builds
    for k, item in enumerate(items):
        where = f"input[{k}]"
        kind = item.get("type") or ("message" if "role" in item else None)
        role = item.get("role")
        if kind in ASSISTANT_ITEMS or (kind == "message" and role == "assistant"):
            if assistant is None:
                assistant = {"role": "assistant", "content": ""}
                messages.append(assistant)
            if kind == "message":
                assistant["content"] += _text(item.get("content"), f"{where}.content")
            elif kind == "reasoning":
                parts = [*(item.get("summary") or []), *(item.get("content") or [])]
                text = "\n".join(p.get("text", "") for p in parts if isinstance(p, dict))
                if text:
                    assistant["reasoning_content"] = assistant.get("reasoning_content", "") + text
            else:
                if not isinstance(item.get("name"), str):
                    raise BadRequest(f"{where}: a function_call needs a name", param=where)
                assistant.setdefault("tool_calls", []).append({
                    "id": item.get("call_id"), "type": "function",
                    "function": {"name": item["name"], "arguments": item.get("arguments") or "{}"}})
            continue
        assistant = None
        if kind == "function_call_output":
            output = item.get("output")
            content = output if isinstance(output, str) else _text(output, f"{where}.output") \
                if isinstance(output, list) else json.dumps(output)
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": content})
        elif kind == "message" and role in ("user", "system", "developer"):
            messages.append({"role": role, "content": _text(item.get("content"), f"{where}.content")})
        else:
            raise BadRequest(f"{where}: unsupported input item (type {kind!r}, role {role!r}); supported: "
                             "messages, reasoning, function_call, function_call_output", param="input")
    return messages


def chat_tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    tools = tool_objects(body, "{type: function, name, parameters}")
    if tools is None:
        return None
    out = [function_tool(t.get("name"), t.get("description"), t.get("parameters"), f"tools[{k}]")
           for k, t in enumerate(tools) if t.get("type") == "function"]
    return out or None


class Responses(Dialect):
    """OpenAI Responses (see the module docstring). A reply is a Response object, or its SSE
    stream of events."""

    def add_routes(self, app) -> None:
        for prefix in ("/s/{session_id}/v1", "/v1"):
            self.route(app, prefix + "/responses", self.responses, ["POST"])
            app.add_api_websocket_route(prefix + "/responses", refuse_websocket)

    def refusal(self, error: Exception) -> JSONResponse:
        return openai_refusal(error)

    @staticmethod
    def parse(body: dict[str, Any]) -> TurnRequest:
        if body.get("previous_response_id"):
            raise BadRequest("previous_response_id is not supported: send the whole conversation as input "
                             "(store=false)", param="previous_response_id")
        return TurnRequest(messages=chat_messages(body), tools=chat_tools(body),
                           max_tokens=body.get("max_output_tokens"), stream=body.get("stream", False),
                           model=body.get("model"), body=body)

    async def responses(self, request: Request, session_id: str | None = None):
        return await self.serve(request, session_id, self.parse)

    # ---- the reply ---------------------------------------------------------------------------------
    @staticmethod
    def _items(turn: GatewayTurn) -> list[dict[str, Any]]:
        rid, message, items = turn.call.rid, turn.call.message, []
        if message.get("reasoning_content"):
            items.append({"type": "reasoning", "id": f"rs_{rid}", "summary": [
                {"type": "summary_text", "text": message["reasoning_content"]}]})
        if message.get("content"):
            items.append({"type": "message", "id": f"msg_{rid}", "role": "assistant", "status": "completed",
                          "content": [{"type": "output_text", "text": message["content"], "annotations": [],
                                       "logprobs": []}]})
        for k, tool_call in enumerate(message.get("tool_calls") or []):
            items.append({"type": "function_call", "id": f"fc_{rid}_{k}", "call_id": tool_call["id"],
                          "name": tool_call["function"]["name"], "arguments": tool_call["function"]["arguments"],
                          "status": "completed"})
        return items

    @staticmethod
    def _response(turn: GatewayTurn, output: list | None) -> dict[str, Any]:
        """The Response object; `output` None: still in progress. A reply cut at the token limit is
        `incomplete` (OpenAI's status) but still ends with response.completed, as a chat reply
        with finish_reason length is still a reply the agent goes on from."""
        call, asked = turn.call, turn.asked.body
        done = output is not None
        length = done and call.finish_reason == "length" and not call.message.get("tool_calls")
        n_in, n_out = len(call.prompt_ids), len(call.completion_ids) if done else 0
        return {
            "id": f"resp_{call.rid}", "object": "response", "created_at": turn.created, "model": turn.model,
            "status": "incomplete" if length else "completed" if done else "in_progress",
            "incomplete_details": {"reason": "max_output_tokens"} if length else None, "error": None,
            "output": output or [], "instructions": asked.get("instructions"),
            "max_output_tokens": asked.get("max_output_tokens"), "parallel_tool_calls": True,
            "tool_choice": asked.get("tool_choice") or "auto", "tools": asked.get("tools") or [],
            "store": False, "metadata": asked.get("metadata") or {}, "text": {"format": {"type": "text"}},
            "usage": {"input_tokens": n_in, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": n_out,
                      "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": n_in + n_out} if done else None,
        }

    def reply(self, turn: GatewayTurn) -> dict[str, Any]:
        return self._response(turn, self._items(turn))

    @staticmethod
    def _event(turn: GatewayTurn, kind: str, **payload) -> str:
        return sse(kind, {"type": kind, "sequence_number": next(turn.sequence), **payload})

    def head(self, turn: GatewayTurn) -> list[str]:
        response = self._response(turn, None)
        return [self._event(turn, "response.created", response=response),
                self._event(turn, "response.in_progress", response=response)]

    def keepalive(self, turn: GatewayTurn) -> str:
        return self._event(turn, "response.in_progress", response=self._response(turn, None))

    def events(self, turn: GatewayTurn) -> list[str]:
        out, items = [], self._items(turn)
        for index, item in enumerate(items):
            ids = {"item_id": item["id"], "output_index": index}
            if item["type"] == "message":
                text = item["content"][0]["text"]
                empty = {**item["content"][0], "text": ""}
                out += [self._event(turn, "response.output_item.added", output_index=index,
                                    item={**item, "status": "in_progress", "content": []}),
                        self._event(turn, "response.content_part.added", **ids, content_index=0, part=empty),
                        self._event(turn, "response.output_text.delta", **ids, content_index=0, delta=text,
                                    logprobs=[]),
                        self._event(turn, "response.output_text.done", **ids, content_index=0, text=text,
                                    logprobs=[]),
                        self._event(turn, "response.content_part.done", **ids, content_index=0,
                                    part=item["content"][0])]
            elif item["type"] == "function_call":
                out += [self._event(turn, "response.output_item.added", output_index=index,
                                    item={**item, "status": "in_progress", "arguments": ""}),
                        self._event(turn, "response.function_call_arguments.delta", **ids, delta=item["arguments"]),
                        self._event(turn, "response.function_call_arguments.done", **ids, name=item["name"],
                                    arguments=item["arguments"])]
            else:  # reasoning: its summary as one part
                text = item["summary"][0]["text"]
                out += [self._event(turn, "response.output_item.added", output_index=index,
                                    item={**item, "summary": []}),
                        self._event(turn, "response.reasoning_summary_part.added", **ids, summary_index=0,
                                    part={"type": "summary_text", "text": ""}),
                        self._event(turn, "response.reasoning_summary_text.delta", **ids, summary_index=0,
                                    delta=text),
                        self._event(turn, "response.reasoning_summary_text.done", **ids, summary_index=0, text=text),
                        self._event(turn, "response.reasoning_summary_part.done", **ids, summary_index=0,
                                    part=item["summary"][0])]
            out.append(self._event(turn, "response.output_item.done", output_index=index, item=item))
        out.append(self._event(turn, "response.completed", response=self._response(turn, items)))
        return out

    def error_event(self, turn: GatewayTurn, message: str, kind: str) -> str:
        # response.failed is what Responses clients (Codex) act on.
        return self._event(turn, "response.failed", response={
            "id": "resp_failed", "object": "response", "created_at": turn.created, "status": "failed", "output": [],
            "error": {"code": "server_error" if kind == "api_error" else "invalid_request", "message": message}})
