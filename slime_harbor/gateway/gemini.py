"""Google Gemini `generateContent` on the gateway's sessions (what gemini-cli speaks).

Routes, under `{root}` the session root `/s/<session>` (`gemini_base_url(session)`, what
GOOGLE_GEMINI_BASE_URL should be: the SDK appends `/v1beta/models/...`) or nothing, the session
then found by its API key (`x-goog-api-key`, `?key=`, or as for the other dialects a bearer token
or `x-api-key`): `POST {root}/v1beta/models/{model}:generateContent`,
`...:streamGenerateContent` (with `?alt=sse` an SSE stream, each event `data:` a
GenerateContentResponse; without it the same reply as a JSON array of one),
`...:countTokens` (`{"totalTokens": n}` as the policy's template renders the prompt: no session
needed, nothing recorded, not a step) and `GET {root}/v1beta/models[/{model}]`. `{root}/v1` (an
OpenAI api_base handed over as the Gemini base URL) reaches the same routes. The model named in
the path is echoed as `modelVersion`; the policy answers whatever it names. Errors are Google's
`{"error": {"code", "message", "status"}}` (400 INVALID_ARGUMENT, 404 NOT_FOUND, 503
UNAVAILABLE); a refusal with a code (the step limit's `step_limit_reached`, the context limit's
`context_length_exceeded`) carries it in the message and as an ErrorInfo `reason`.

A request becomes the chat-completions turn the gateway serves (same template, exact tokens for
the gateway's own earlier replies, branches, the run's sampling, recording): `systemInstruction`
(its text parts) -> a system message; `contents` in order: a `model` turn -> one assistant
message (text parts -> content, `thought: true` text -> reasoning_content, `functionCall`
{name, args} -> tool_calls; `thoughtSignature` ignored), a `user` turn -> its `functionResponse`
parts as tool messages (in order, before the turn's text) and its text parts as a user message;
`tools[].functionDeclarations` (name, description, `parametersJsonSchema` or `parameters`, whose
OpenAPI type names are lower-cased) -> function tools, other Gemini tools (search, code
execution) left out; `generationConfig.maxOutputTokens` and `stopSequences` as chat's
`max_tokens` / `stop`; the rest of generationConfig (temperature, topP, topK, thinkingConfig,
response schemas), `toolConfig`, `safetySettings` and `cachedContent` ignored.

Call ids: older Gemini formats carry none, newer ones an `id` on functionCall / functionResponse.
A call without one gets `call_<content index>_<k>`, and a response without one takes the id of
the earliest unanswered call of its name (else its position's), so the same history always
becomes the same messages. (The renderer and session.canonical ignore tool-call ids anyway: the
tokens do not depend on them.) A tool result renders as its `response` object's JSON, except the
`{"output": "<text>"}` gemini-cli sends for a tool's output, which renders as the text.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from slime_harbor.gateway.session import GatewaySession
from slime_harbor.gateway.turn import GatewayTurn, TurnRequest
from slime_harbor.gateway.wire import Dialect, function_tool, status_of, tool_objects
from slime_harbor.http_api import BadRequest, json_object

STATUSES = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
            503: "UNAVAILABLE"}
ACTIONS = ("generateContent", "streamGenerateContent", "countTokens")


def gemini_base_url(session, host: str | None = None) -> str:
    """The session's root, what GOOGLE_GEMINI_BASE_URL should be (the SDK appends /v1beta/...)."""
    return session.openai_base_url(host).removesuffix("/v1")


def error_response(status: int, message: str, code: str | None = None) -> JSONResponse:
    error: dict[str, Any] = {"code": status, "message": f"{message} ({code})" if code else message,
                             "status": STATUSES.get(status, "INTERNAL")}
    if code:
        error["details"] = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": code,
                             "domain": "slime-harbor"}]
    return JSONResponse(status_code=status, content={"error": error})


def _parts(content: Any, where: str) -> list[dict[str, Any]]:
    parts = content.get("parts") if isinstance(content, dict) else None
    if parts is None:
        parts = []
    if not isinstance(parts, list) or not all(isinstance(p, dict) for p in parts):
        raise BadRequest(f"{where}.parts must be a list of parts", param=where)
    return parts


def _system(body: dict[str, Any]) -> str | None:
    """`systemInstruction`: a Content (its text parts) or a plain string."""
    system = body.get("systemInstruction", body.get("system_instruction"))
    if system is None or isinstance(system, str):
        return system or None
    texts = []
    for k, part in enumerate(_parts(system, "systemInstruction")):
        if not isinstance(part.get("text"), str):
            raise BadRequest(f"systemInstruction.parts[{k}]: only text parts are supported",
                             param="systemInstruction")
        texts.append(part["text"])
    return "\n".join(texts) or None


def _tool_result(response: Any) -> str:
    if isinstance(response, dict) and list(response) == ["output"] and isinstance(response["output"], str):
        return response["output"]
    return json.dumps(response if response is not None else {}, ensure_ascii=False)


def chat_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's `systemInstruction` + `contents` as chat-completions messages."""
    contents = body.get("contents")
    if isinstance(contents, dict):  # one Content
        contents = [contents]
    if not isinstance(contents, list) or not contents or not all(isinstance(c, dict) for c in contents):
        raise BadRequest("contents: field required (a non-empty list of Content)", param="contents")
    messages: list[dict[str, Any]] = []
    system = _system(body)
    if system:
        messages.append({"role": "system", "content": system})
    pending: list[tuple[str, str]] = []  # (name, id) of the calls the last model turn made, unanswered
    for i, content in enumerate(contents):
        where = f"contents[{i}]"
        role = content.get("role") or "user"
        parts = _parts(content, where)
        if role == "model":
            out: dict[str, Any] = {"role": "assistant", "content": "", "tool_calls": []}
            reasoning = []
            for k, part in enumerate(parts):
                if isinstance(part.get("text"), str):
                    if part.get("thought"):
                        reasoning.append(part["text"])
                    else:
                        out["content"] += part["text"]
                elif isinstance(part.get("functionCall"), dict):
                    call = part["functionCall"]
                    if not isinstance(call.get("name"), str) or not call["name"]:
                        raise BadRequest(f"{where}.parts[{k}]: a functionCall needs a name", param=where)
                    args = call.get("args")
                    call_id = call.get("id") if isinstance(call.get("id"), str) and call["id"] else f"call_{i}_{k}"
                    out["tool_calls"].append({"id": call_id, "type": "function", "function": {
                        "name": call["name"], "arguments": json.dumps(args if args is not None else {},
                                                                      ensure_ascii=False)}})
                elif set(part) - {"thought", "thoughtSignature", "thought_signature", "partMetadata"}:
                    raise BadRequest(f"{where}.parts[{k}]: only text and functionCall parts are supported in a "
                                     f"model turn, not {sorted(part)}", param=where)
            if reasoning:
                out["reasoning_content"] = "".join(reasoning)
            pending = [(c["function"]["name"], c["id"]) for c in out["tool_calls"]]
            if not out["tool_calls"]:
                del out["tool_calls"]
            messages.append(out)
            continue
        if role != "user":
            raise BadRequest(f"{where}.role must be 'user' or 'model', not {role!r}", param=where)
        texts, results = [], 0
        for k, part in enumerate(parts):
            if isinstance(part.get("functionResponse"), dict):
                response = part["functionResponse"]
                name = response.get("name")
                call_id = response.get("id") if isinstance(response.get("id"), str) and response["id"] else None
                if call_id is None:
                    call_id = next((c for n, c in pending if n == name), f"call_{i}_{k}")
                pending = [(n, c) for n, c in pending if c != call_id]
                if any(not isinstance(p, dict) or set(p) - {"text"} for p in response.get("parts") or []):
                    raise BadRequest(f"{where}.parts[{k}]: functionResponse parts other than text (inline data, "
                                     "files) are not supported", param=where)
                messages.append({"role": "tool", "tool_call_id": call_id,
                                 "content": _tool_result(response.get("response"))})
                results += 1
            elif isinstance(part.get("text"), str):
                if not part.get("thought"):  # a user turn's thought text is nothing the policy said
                    texts.append(part["text"])
            else:
                raise BadRequest(f"{where}.parts[{k}]: only text and functionResponse parts are supported in a "
                                 f"user turn, not {sorted(part)}", param=where)
        if texts or not results:
            messages.append({"role": "user", "content": "\n".join(texts)})
    return messages


def _lower_types(schema: Any) -> Any:
    """An OpenAPI `Schema` (Gemini's `parameters`: "OBJECT", "STRING") in JSON Schema's spelling."""
    if isinstance(schema, dict):
        return {k: v.lower() if k == "type" and isinstance(v, str) else _lower_types(v) for k, v in schema.items()}
    if isinstance(schema, list):
        return [_lower_types(v) for v in schema]
    return schema


def chat_tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    tools = tool_objects(body, "Tool objects")
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(tools):
        declarations = tool.get("functionDeclarations", tool.get("function_declarations")) or []
        if not isinstance(declarations, list) or not all(isinstance(d, dict) for d in declarations):
            raise BadRequest(f"tools[{i}].functionDeclarations must be a list", param="tools")
        for k, d in enumerate(declarations):
            schema = d.get("parametersJsonSchema", d.get("parameters_json_schema"))
            if schema is None:
                schema = _lower_types(d.get("parameters"))
            out.append(function_tool(d.get("name"), d.get("description"), schema,
                                     f"tools[{i}].functionDeclarations[{k}]"))
    return out or None


def _data(payload: dict[str, Any]) -> str:
    return "data: " + json.dumps(payload, ensure_ascii=False) + "\r\n\r\n"



class GenerateContent(Dialect):
    """Google Gemini generateContent (see the module docstring). A reply is a
    GenerateContentResponse, or its SSE stream of them (a JSON array of one for
    streamGenerateContent without alt=sse)."""

    def add_routes(self, app) -> None:
        for root in ("/s/{session_id}", "", "/s/{session_id}/v1"):
            self.route(app, root + "/v1beta/models/{model_action}", self.post, ["POST"])
            self.route(app, root + "/v1beta/models/{model_action}", self.model, ["GET"])
            self.route(app, root + "/v1beta/models", self.models, ["GET"])

    def refusal(self, error: Exception) -> JSONResponse:
        status, message = status_of(error)
        return error_response(status, message, error.code if isinstance(error, BadRequest) else None)

    def session_of(self, request: Request, session_id: str | None) -> GatewaySession:
        # Without a session in the path its key finds it: gemini-cli sends x-goog-api-key, REST clients ?key=
        return self.gateway.session_of(request, session_id,
                                       request.headers.get("x-goog-api-key") or request.query_params.get("key"))

    @staticmethod
    def parse(body: dict[str, Any], model: str, stream: bool) -> TurnRequest:
        config = body.get("generationConfig", body.get("generation_config")) or {}
        if not isinstance(config, dict):
            raise BadRequest("generationConfig must be an object", param="generationConfig")
        stop = config.get("stopSequences") or []
        if not isinstance(stop, list):
            raise BadRequest("generationConfig.stopSequences must be a list of strings", param="generationConfig")
        if config.get("candidateCount") not in (None, 1):
            raise BadRequest("only candidateCount=1 is supported", param="generationConfig.candidateCount")
        return TurnRequest(messages=chat_messages(body), tools=chat_tools(body),
                           max_tokens=config.get("maxOutputTokens"), stop=stop, stream=stream, model=model)

    async def post(self, request: Request, model_action: str, session_id: str | None = None):
        model, _, action = model_action.rpartition(":")
        if not model or action not in ACTIONS:
            return error_response(404, f"unknown method {model_action!r}: this gateway serves "
                                       f"models/<model>:{{{','.join(ACTIONS)}}}")
        if action == "countTokens":
            return await self.count_tokens(request)
        sse = action == "streamGenerateContent" and request.query_params.get("alt") == "sse"
        return await self.serve(request, session_id, lambda body: self.parse(body, model, sse))

    async def count_tokens(self, request: Request) -> JSONResponse:
        """The prompt's length as the policy's template renders it (a fresh render, like
        Anthropic's count_tokens). `contents` (+ systemInstruction, tools), or a whole
        `generateContentRequest`. No session needed, nothing recorded."""
        body = await json_object(request)
        inner = body.get("generateContentRequest", body.get("generate_content_request"))
        if isinstance(inner, dict):
            body = inner
        ids = self.gateway.render_prompt(self.gateway.messages(chat_messages(body)), chat_tools(body))
        return JSONResponse({"totalTokens": len(ids)})

    def _model(self, name: str) -> dict[str, Any]:
        return {"name": f"models/{name}", "baseModelId": name, "version": "1", "displayName": name,
                "description": f"the policy served by the slime-harbor gateway ({self.gateway.served_model_name})",
                "inputTokenLimit": self.gateway.max_context_len, "outputTokenLimit": self.gateway.max_context_len,
                "supportedGenerationMethods": ["generateContent", "countTokens"]}

    async def models(self, request: Request, session_id: str | None = None) -> JSONResponse:
        return JSONResponse({"models": [self._model(self.gateway.served_model_name)]})

    async def model(self, request: Request, model_action: str, session_id: str | None = None) -> JSONResponse:
        return JSONResponse(self._model(model_action))

    # ---- the reply ---------------------------------------------------------------------------------
    @staticmethod
    def _reply_parts(message: dict[str, Any]) -> list[dict[str, Any]]:
        parts = []
        if message.get("reasoning_content"):
            parts.append({"text": message["reasoning_content"], "thought": True})
        if message.get("content"):
            parts.append({"text": message["content"]})
        for tool_call in message.get("tool_calls") or []:
            parts.append({"functionCall": {"id": tool_call["id"], "name": tool_call["function"]["name"],
                                           "args": json.loads(tool_call["function"]["arguments"] or "{}")}})
        return parts

    @staticmethod
    def _response(turn: GatewayTurn, parts: list, last: bool) -> dict[str, Any]:
        call = turn.call
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
        response: dict[str, Any] = {"candidates": [candidate]}
        if last:
            length = call.finish_reason == "length" and not call.message.get("tool_calls")
            candidate["finishReason"] = "MAX_TOKENS" if length else "STOP"
            n_in, n_out = len(call.prompt_ids), len(call.completion_ids)
            response["usageMetadata"] = {"promptTokenCount": n_in, "candidatesTokenCount": n_out,
                                         "totalTokenCount": n_in + n_out}
        response["modelVersion"] = turn.model
        response["responseId"] = call.rid
        return response

    def reply(self, turn: GatewayTurn):
        """The response; streamGenerateContent without alt=sse (a whole reply) as a JSON array of one."""
        response = self._response(turn, self._reply_parts(turn.call.message), last=True)
        array = turn.request.path_params.get("model_action", "").endswith(":streamGenerateContent")
        return [response] if array else response

    def events(self, turn: GatewayTurn) -> list[str]:
        """One event per part, the last with finishReason and usage (as Gemini's own stream ends)."""
        parts = self._reply_parts(turn.call.message) or [{"text": ""}]
        return [_data(self._response(turn, [part], last=k == len(parts) - 1)) for k, part in enumerate(parts)]

    def keepalive(self, turn: GatewayTurn) -> str:
        return ": keepalive\n\n"  # an SSE comment: the SDK reads only data: events

    def error_event(self, turn: GatewayTurn, message: str, kind: str) -> str:
        status = 503 if kind == "api_error" else 400
        return _data({"error": {"code": status, "message": message, "status": STATUSES[status]}})
