"""How each API's own client holds a tool conversation through the gateway: the Anthropic SDK as
Claude Code, the OpenAI SDK's Responses as Codex, raw httpx as gemini-cli. Each dialect's turn (its
call, streamed on odd turns), its echo (the reply sent back as that client sends it: whitespace and
argument order changed) and its results (the tool outputs in that API's shape)."""

from __future__ import annotations

import json

import anthropic

from slime_harbor.gateway.anthropic import anthropic_base_url
from helpers.tool_gateway import observation, SYSTEM, TOOLS


ANTHROPIC_TOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"],
                    "input_schema": t["function"]["parameters"]} for t in TOOLS]


RESPONSES_TOOLS = [{"type": "function", "name": t["function"]["name"], "description": t["function"]["description"],
                    "parameters": t["function"]["parameters"], "strict": False} for t in TOOLS]


def session_root(session) -> str:
    """What a host-side agent given the OpenAI api_base uses as an Anthropic base URL."""
    assert anthropic_base_url(session) == session.openai_base_url().removesuffix("/v1")
    return anthropic_base_url(session)


def claude_echo(message: anthropic.types.Message) -> dict:
    """The reply as Claude Code sends it back: its blocks, text whitespace changed, tool input
    re-serialised by the SDK (a dict)."""
    blocks = []
    for block in message.content:
        block = block.model_dump(exclude_none=True)
        if block["type"] == "text":
            block["text"] = block["text"].strip() + "\n"
        if block["type"] == "tool_use":
            block["input"] = dict(reversed(list(block["input"].items())))
        blocks.append(block)
    return {"role": "assistant", "content": blocks}


def claude_results(message: anthropic.types.Message, k: int) -> dict:
    uses = [b for b in message.content if b.type == "tool_use"]
    if not uses:
        return {"role": "user", "content": observation(k)}
    # tool_result content as a string on even turns, as text blocks on odd ones
    content = observation(k) if k % 2 == 0 else [{"type": "text", "text": observation(k)}]
    return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": b.id, "content": content}
                                        for b in uses]}


async def claude_turn(client, messages, k):
    kwargs = dict(model="claude-whatever", max_tokens=1000, messages=messages, tools=ANTHROPIC_TOOLS,
                  system=[{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}],
                  metadata={"user_id": "someone"}, extra_body={"temperature": 0.0},
                  extra_headers={"anthropic-beta": "interleaved-thinking-2025-05-14"})
    if k % 2:
        async with client.messages.stream(**kwargs) as stream:
            return await stream.get_final_message()
    return await client.messages.create(**kwargs)


def codex_echo(response) -> list[dict]:
    """The reply's output items as Codex sends them back (store=false): reasoning, the message
    (whitespace changed), function calls with re-serialised arguments."""
    items = []
    for item in response.output:
        item = item.model_dump(exclude_none=True)
        if item["type"] == "message":
            item["content"] = [{"type": "output_text", "text": "  " + item["content"][0]["text"].strip()}]
        if item["type"] == "function_call":
            item["arguments"] = json.dumps(dict(reversed(list(json.loads(item["arguments"]).items()))), indent=1)
        items.append(item)
    return items


def codex_results(response, k: int) -> list[dict]:
    calls = [i for i in response.output if i.type == "function_call"]
    if not calls:
        return [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": observation(k)}]}]
    return [{"type": "function_call_output", "call_id": c.call_id, "output": observation(k)} for c in calls]


async def codex_turn(client, items, k):
    kwargs = dict(model="gpt-whatever", instructions=SYSTEM, input=items, tools=RESPONSES_TOOLS, store=False,
                  max_output_tokens=1000, temperature=0.0, reasoning={"effort": "low"})
    if k % 2:
        async with client.responses.stream(**kwargs) as stream:
            return await stream.get_final_response()
    return await client.responses.create(**kwargs)


GEMINI_TOOLS = [{"functionDeclarations": [{"name": t["function"]["name"], "description": t["function"]["description"],
                                           "parametersJsonSchema": t["function"]["parameters"]} for t in TOOLS]},
                {"googleSearch": {}}]  # a Gemini-side tool nothing here runs: left out


GEMINI_MODEL = "gemini-2.5-pro"


def gemini_body(contents, **extra) -> dict:
    """A request as gemini-cli 0.61 sends it: systemInstruction with a role, its own sampling."""
    return {"contents": contents, "systemInstruction": {"role": "user", "parts": [{"text": SYSTEM}]},
            "tools": GEMINI_TOOLS, "generationConfig": {"temperature": 1, "topP": 0.95, "topK": 64, "thinkingConfig": {
                "includeThoughts": True, "thinkingBudget": 8192}, "maxOutputTokens": 1000}, **extra}


def gemini_sse(lines: list[str]) -> list[dict]:
    assert all(line.startswith("data: ") for line in lines), lines
    return [json.loads(line[6:]) for line in lines]


def gemini_merge(chunks: list[dict]) -> dict:
    """The streamed chunks as one response (what the SDK's callers assemble): every chunk's parts,
    the last chunk's finishReason and usage."""
    parts = [p for c in chunks for p in c["candidates"][0]["content"]["parts"]]
    last = chunks[-1]
    return {**last, "candidates": [{**last["candidates"][0], "content": {"role": "model", "parts": parts}}]}


async def gemini_turn(http, root: str, body: dict, k: int, **kwargs) -> dict:
    """Turn k: streamed (alt=sse, as gemini-cli asks) on odd turns, generateContent on even ones."""
    if k % 2:
        url = f"{root}/v1beta/models/{GEMINI_MODEL}:streamGenerateContent"
        kwargs["params"] = {"alt": "sse", **kwargs.get("params", {})}
        async with http.stream("POST", url, json=body, **kwargs) as response:
            assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
            return gemini_merge(gemini_sse([line async for line in response.aiter_lines() if line]))
    response = await http.post(f"{root}/v1beta/models/{GEMINI_MODEL}:generateContent", json=body, **kwargs)
    assert response.status_code == 200, response.text
    return response.json()


def gemini_echo(reply: dict, k: int) -> dict:
    """The model turn as gemini-cli sends it back: thought parts dropped, a thoughtSignature on the
    first functionCall, args re-serialised; the call ids kept on even turns, dropped on odd ones
    (older Gemini formats carry none)."""
    parts = []
    for part in reply["candidates"][0]["content"]["parts"]:
        if part.get("thought"):
            continue
        if "functionCall" in part:
            call = part["functionCall"]
            call = {"name": call["name"], "args": dict(reversed(list(call["args"].items())))} | (
                {"id": call["id"]} if k % 2 == 0 else {})
            part = {"functionCall": call, "thoughtSignature": "skip_thought_signature_validator"}
        else:
            part = {"text": part["text"].strip() + "\n"}
        parts.append(part)
    return {"role": "model", "parts": parts}


def gemini_results(reply: dict, k: int) -> dict:
    calls = [p["functionCall"] for p in reply["candidates"][0]["content"]["parts"] if "functionCall" in p]
    if not calls:
        return {"role": "user", "parts": [{"text": observation(k)}]}
    return {"role": "user", "parts": [{"functionResponse": {"name": c["name"], "response": {"output": observation(k)}}
                                       | ({"id": c["id"]} if k % 2 == 0 else {})} for c in calls]}
