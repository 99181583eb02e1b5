"""OpenAI Chat Completions on the gateway's sessions (what most agents speak: LiteLLM, aider,
OpenHands, opencode, ...).

Routes: `POST {api_base}/chat/completions` and `GET {api_base}/models`, where `{api_base}` is
`/s/<session>/v1`, or `/v1` with the session's API key (`Authorization: Bearer <key>`).
`/models` lists the served model with its `max_model_len`, in Anthropic's shape when the request
carries `anthropic-version` (Anthropic SDKs list models on the same path).

Chat messages are the gateway's own turn format, so the request passes through nearly as sent:
`messages`, function `tools`, `max_tokens` (or `max_completion_tokens`), `stop`, `stream`
(`stream_options.include_usage` adds the usage chunk). `n` must be 1; `temperature`, `top_p` and
the other sampling fields are ignored (the run's sampling is what the policy is trained under).
Errors are OpenAI's `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from slime_harbor.gateway.turn import GatewayTurn, TurnRequest
from slime_harbor.gateway.wire import Dialect, openai_refusal, sse
from slime_harbor.http_api import BadRequest


def finish_reason(call) -> str:
    if call.message and call.message.get("tool_calls"):
        return "tool_calls"
    return "length" if call.finish_reason == "length" else "stop"


class ChatCompletions(Dialect):
    """OpenAI Chat Completions (see the module docstring). A reply is a chat.completion, or its SSE
    stream of chat.completion.chunk: the role chunk at once, then (once sampled) reasoning /
    content / tool-call deltas, the finish chunk, the usage chunk if asked, [DONE]."""

    def add_routes(self, app) -> None:
        for prefix in ("/s/{session_id}/v1", "/v1"):
            self.route(app, prefix + "/chat/completions", self.chat_completions, ["POST"])
            self.route(app, prefix + "/models", self.models, ["GET"])

    def refusal(self, error: Exception) -> JSONResponse:
        return openai_refusal(error)

    @staticmethod
    def parse(body: dict[str, Any]) -> TurnRequest:
        if body.get("n") not in (None, 1):
            raise BadRequest("only n=1 is supported", param="n")
        tools = body.get("tools") or None
        if tools is not None and (not isinstance(tools, list) or not all(
                isinstance(t, dict) and isinstance((t.get("function") or {}).get("name"), str) for t in tools)):
            raise BadRequest("tools must be a list of {type: function, function: {name, ...}}", param="tools")
        options = body.get("stream_options")
        stop = body.get("stop")
        return TurnRequest(messages=body.get("messages"), tools=tools,
                           max_tokens=body.get("max_completion_tokens", body.get("max_tokens")),
                           stop=[stop] if isinstance(stop, str) else stop, stream=body.get("stream") or False,
                           model=body.get("model"),
                           include_usage=bool(options.get("include_usage")) if isinstance(options, dict) else False)

    async def chat_completions(self, request: Request, session_id: str | None = None):
        return await self.serve(request, session_id, self.parse)

    async def models(self, request: Request, session_id: str | None = None) -> JSONResponse:
        for dialect in self.gateway.dialects:  # another API's client on the shared path (Anthropic's)
            if dialect is not self and (listed := dialect.model_list(request)) is not None:
                return JSONResponse(listed)
        return JSONResponse({"object": "list", "data": [{
            "id": self.gateway.served_model_name, "object": "model", "created": 0, "owned_by": "slime-harbor",
            "max_model_len": self.gateway.max_context_len}]})

    # ---- the reply ---------------------------------------------------------------------------------
    def _head(self, turn: GatewayTurn) -> dict[str, Any]:
        return {"id": f"chatcmpl-{turn.call.rid}", "object": "chat.completion.chunk", "created": turn.created,
                "model": turn.model}

    def _chunk(self, turn: GatewayTurn, delta: dict[str, Any], finish: str | None = None) -> str:
        return sse(None, {**self._head(turn), "choices": [
            {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]})

    def reply(self, turn: GatewayTurn) -> dict[str, Any]:
        call = turn.call
        return {"id": f"chatcmpl-{call.rid}", "object": "chat.completion", "created": turn.created,
                "model": turn.model,
                "choices": [{"index": 0, "message": call.message, "finish_reason": finish_reason(call),
                             "logprobs": None}],
                "usage": call.usage()}

    def head(self, turn: GatewayTurn) -> list[str]:
        return [self._chunk(turn, {"role": "assistant", "content": ""})]

    def events(self, turn: GatewayTurn) -> list[str]:
        call = turn.call
        message, out = call.message, []
        if message.get("reasoning_content"):
            out.append(self._chunk(turn, {"reasoning_content": message["reasoning_content"]}))
        if message.get("content"):
            out.append(self._chunk(turn, {"content": message["content"]}))
        for k, tool_call in enumerate(message.get("tool_calls") or []):
            function = tool_call["function"]
            out.append(self._chunk(turn, {"tool_calls": [{"index": k, "id": tool_call["id"], "type": "function",
                                                          "function": {"name": function["name"], "arguments": ""}}]}))
            out.append(self._chunk(turn, {"tool_calls": [{"index": k, "function": {"arguments": function["arguments"]}}]}))
        out.append(self._chunk(turn, {}, finish_reason(call)))
        if turn.asked.include_usage:
            out.append(sse(None, {**self._head(turn), "choices": [], "usage": call.usage()}))
        out.append("data: [DONE]\n\n")
        return out

    def keepalive(self, turn: GatewayTurn) -> str:
        return ": keepalive\n\n"  # an SSE comment: OpenAI's SDKs read only data: lines

    def error_event(self, turn: GatewayTurn, message: str, kind: str) -> str:
        return sse(None, {"error": {"message": message, "type": kind, "param": None, "code": None}})
