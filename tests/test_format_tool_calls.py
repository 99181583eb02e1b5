"""Every chat format's tool calls and reasoning, through the gateway's four API dialects.

The policy's reply is a turn written by hand from the family's documentation (helpers/format_replies.py),
encoded by the format's real or family-faithful tokenizer: not produced by the renderer that then
parses it. For each format and each dialect (OpenAI chat completions, Anthropic Messages through the
Anthropic SDK, Responses through the OpenAI SDK, Gemini's generateContent as gemini-cli sends it):

- the agent receives the tool call bash(command="ls -la"), and the family's reasoning where it has one;
- the next turn, the tool's result sent back as that client sends it, is bridged: its prompt extends
  the first turn's prompt + completion token for token (the reasoning kept), one branch, one sample;
- the final turn's text reaches the agent with no tool call.
"""

from __future__ import annotations

import asyncio
import json
import uuid

import anthropic
import httpx
import openai
import pytest

from slime_harbor.gateway.server import Gateway
from slime_harbor.policy.sampling import Generation, SamplingParams
from helpers.dialects import (claude_echo, claude_results, claude_turn, codex_echo, codex_results, codex_turn,
                              gemini_body, gemini_echo, gemini_results, gemini_turn, session_root)
from slime_harbor.policy.chat_formats import sampled_part
from helpers.format_replies import COMMAND, REASONING, TURNS
from helpers.tool_gateway import SYSTEM, TASK, TOOLS

DIALECTS = ["chat", "anthropic", "responses", "gemini"]


class WrittenTurns:
    """The gateway's upstream: call k answers the format's k-th written turn (the sampled part of
    it, after what the call's prompt already holds), logprob 0 per token."""

    def __init__(self, tokenizer, turns: list[str]):
        self.tokenizer, self.turns, self.prompts = tokenizer, turns, []

    async def generate(self, input_ids, params, rid=None, routing_key=None) -> Generation:
        self.prompts.append(list(input_ids))
        text = sampled_part(self.turns[min(len(self.prompts), len(self.turns)) - 1], self.tokenizer.decode(input_ids))
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return Generation(token_ids=ids, logprobs=[0.0] * len(ids), text=text, finish_reason="stop",
                          rid=rid or uuid.uuid4().hex)

    async def abort(self, rid):
        pass

    async def aclose(self):
        pass


def chat_echo(message) -> dict:
    calls = message.tool_calls or []
    return {"role": "assistant", "content": message.content or "",
            **({"reasoning_content": message.reasoning_content} if getattr(message, "reasoning_content", None) else {}),
            **({"tool_calls": [c.model_dump() for c in calls]} if calls else {})}


async def two_turns(session, dialect: str) -> list[dict]:
    """The agent's two turns in `dialect`; each turn's reply as (tool calls, reasoning, text)."""
    seen = []
    if dialect == "chat":
        client = openai.AsyncOpenAI(base_url=session.openai_base_url(), api_key="k", max_retries=0)
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
        for k in range(2):
            reply = (await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)).choices[0]
            message = reply.message
            calls = [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]
            seen.append({"calls": calls, "reasoning": getattr(message, "reasoning_content", None),
                         "text": message.content or "", "finish": reply.finish_reason})
            messages += [chat_echo(message)] + [{"role": "tool", "tool_call_id": c.id, "content": "a.txt\nb.txt"}
                                                for c in message.tool_calls or []]
        await client.close()
    elif dialect == "anthropic":
        client = anthropic.AsyncAnthropic(base_url=session_root(session), api_key="k", max_retries=0)
        messages = [{"role": "user", "content": TASK}]
        for k in range(2):
            reply = await claude_turn(client, messages, k)
            seen.append({"calls": [(b.name, b.input) for b in reply.content if b.type == "tool_use"],
                         "reasoning": "".join(b.thinking for b in reply.content if b.type == "thinking") or None,
                         "text": "".join(b.text for b in reply.content if b.type == "text"), "finish": reply.stop_reason})
            messages += [claude_echo(reply), claude_results(reply, k)]
        await client.close()
    elif dialect == "responses":
        client = openai.AsyncOpenAI(base_url=session.openai_base_url(), api_key="k", max_retries=0)
        items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": TASK}]}]
        for k in range(2):
            reply = await codex_turn(client, items, k)
            seen.append({"calls": [(i.name, json.loads(i.arguments)) for i in reply.output if i.type == "function_call"],
                         "reasoning": "".join(s.text for i in reply.output if i.type == "reasoning" for s in i.summary) or None,
                         "text": reply.output_text, "finish": reply.status})
            items += codex_echo(reply) + codex_results(reply, k)
        await client.close()
    else:
        contents = [{"role": "user", "parts": [{"text": TASK}]}]
        async with httpx.AsyncClient(timeout=60) as http:
            for k in range(2):
                reply = await gemini_turn(http, session_root(session), gemini_body(contents), k)
                parts = reply["candidates"][0]["content"]["parts"]
                seen.append({"calls": [(p["functionCall"]["name"], p["functionCall"]["args"]) for p in parts
                                       if "functionCall" in p],
                             "reasoning": "".join(p["text"] for p in parts if p.get("thought")) or None,
                             "text": "".join(p.get("text", "") for p in parts if not p.get("thought")),
                             "finish": reply["candidates"][0]["finishReason"]})
                contents += [gemini_echo(reply, k), gemini_results(reply, k)]
    return seen


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("renderer", list(TURNS))
def test_a_written_tool_call_reaches_the_agent_and_the_next_turn_bridges(renderer, dialect, format_model, tmp_path):
    model_dir, tokenizer = format_model(renderer)
    turns = TURNS[renderer]
    upstream = WrittenTurns(tokenizer, [turns.tool_turn, turns.final_turn])

    async def main():
        gateway = Gateway(None, model_dir, upstream=upstream)
        await gateway.start()
        try:
            session = gateway.open_session("s", tmp_path / "gw", SamplingParams(max_new_tokens=256))
            seen = await two_turns(session, dialect)
            await gateway.close_session("s")
            return session, seen
        finally:
            await gateway.aclose()

    session, seen = asyncio.run(main())
    first, final = seen
    assert first["calls"] == [("bash", {"command": COMMAND})], first
    assert (first["reasoning"] or "").strip() == (REASONING if turns.reasons else ""), first
    assert final["calls"] == [] and final["text"].strip() == "Done.", final
    # one branch: the second prompt is the first prompt + its completion + the tool's result, token for token
    assert session.stats["branches"] == 1 and session.stats["trained"] == 2, session.stats
    (detail,) = session.rollout_details()
    prompts, completions = detail["prompt_token_ids"], detail["completion_token_ids"]
    assert prompts[1][: len(prompts[0]) + len(completions[0])] == prompts[0] + completions[0]
    assert upstream.prompts == prompts
    assert completions[0][-1] in gateway_stops(model_dir, tokenizer, renderer)
    if turns.reasons:  # the reasoning the policy sampled is in the next prompt as it was sampled
        assert REASONING in tokenizer.decode(prompts[1][len(prompts[0]):])


def gateway_stops(model_dir, tokenizer, renderer) -> list[int]:
    from slime_harbor.policy.renderer import make_renderer

    return make_renderer(model_dir, tokenizer, renderer).get_stop_token_ids()


@pytest.mark.parametrize("renderer", list(TURNS))
def test_agent_sfts_bash_call_is_the_gateways_tool_call_and_bridges(renderer, format_model):
    """What agent SFT's scripted policy answers in each format (chat_formats.ChatFormat.bash_call)
    parses into the bash tool call, ends on a stop token, and bridges onto the tool's result."""
    from slime_harbor.policy.renderer import make_renderer
    from slime_harbor.trainers.agent_sft import reply_ids

    model_dir, tokenizer = format_model(renderer)
    renderer_ = make_renderer(model_dir, tokenizer)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    prompt = renderer_.render_ids(messages, tools=TOOLS, add_generation_prompt=True)
    reply = reply_ids(renderer_, tokenizer, prompt, 'printf "%s\\n" a > out.txt')
    parsed = renderer_.parse_response(reply, tools=TOOLS, prompt_ids=prompt)
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("bash", {"command": 'printf "%s\\n" a > out.txt'})]
    assert reply[-1] in renderer_.get_stop_token_ids()
    bridged = renderer_.bridge_to_next_turn(prompt, reply, [{"role": "tool", "tool_call_id": "call_0", "content": "ok"}],
                                            tools=TOOLS)
    assert bridged is not None and bridged.token_ids[: len(prompt) + len(reply)] == prompt + reply


@pytest.mark.parametrize("renderer", list(TURNS))
def test_native_sft_episodes_close_each_turn_in_the_format(renderer, format_model):
    """The native agent's SFT episode in each format: every reply closed by the format's end of a
    text turn (a stop token of its renderer), each observation bridged on the sampled tokens."""
    from slime_harbor.policy.renderer import make_renderer
    from slime_harbor.trainers.sft import native_agent_episode

    model_dir, tokenizer = format_model(renderer)
    renderer_ = make_renderer(model_dir, tokenizer)
    replies = ["THOUGHT: look first.\n\n```bash\nls\n```", "THOUGHT: done.\n\n```bash\nsubmit\n```"]
    ids, mask = native_agent_episode(renderer_, tokenizer, TASK, replies, [(0, "a.txt")])
    trained = [t for t, m in zip(ids, mask) if m]
    ends = [i for i, t in enumerate(trained) if t in renderer_.get_stop_token_ids()]
    assert len(ends) == 2 and ends[-1] == len(trained) - 1  # each reply ends on one stop token
    assert tokenizer.decode(trained).count("```bash") == 2


@pytest.mark.parametrize("renderer", list(TURNS))
def test_system_messages_where_claude_code_and_codex_put_them(renderer, format_model, tmp_path):
    """Claude Code 2.1 sends its environment block as a system message after the first user turn;
    Codex sends its instructions and a developer message before the task. Qwen3.5, Qwen3.6 and
    Nemotron 3's templates take one system message, first (renderers refuses any other: the gateway
    answered 500): there the gateway folds the others (one leading system message; a later one into
    the user message before it, as a <system-reminder> block), elsewhere each is a system turn. In
    every format both agents get their tool call and the next turn bridges on one branch."""
    from helpers.dialects import ANTHROPIC_TOOLS, RESPONSES_TOOLS

    from slime_harbor.policy.chat_formats import FORMATS

    model_dir, tokenizer = format_model(renderer)
    turns = TURNS[renderer]
    environment = "# Environment\nWorking directory: /app"

    async def main():
        upstream = WrittenTurns(tokenizer, [turns.tool_turn, turns.final_turn, turns.tool_turn, turns.final_turn])
        gateway = Gateway(None, model_dir, upstream=upstream)
        await gateway.start()
        try:
            claude = gateway.open_session("claude", tmp_path / "claude", SamplingParams(max_new_tokens=256))
            client = anthropic.AsyncAnthropic(base_url=session_root(claude), api_key="k", max_retries=0)
            messages = [{"role": "user", "content": TASK}, {"role": "system", "content": environment}]
            first = await client.messages.create(model="m", max_tokens=256, system=SYSTEM, messages=messages,
                                                 tools=ANTHROPIC_TOOLS)
            messages += [claude_echo(first), claude_results(first, 0)]
            second = await client.messages.create(model="m", max_tokens=256, system=SYSTEM, messages=messages,
                                                  tools=ANTHROPIC_TOOLS)
            await client.close()
            codex = gateway.open_session("codex", tmp_path / "codex", SamplingParams(max_new_tokens=256))
            client = openai.AsyncOpenAI(base_url=codex.openai_base_url(), api_key="k", max_retries=0)
            items = [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": environment}]},
                     {"type": "message", "role": "user", "content": [{"type": "input_text", "text": TASK}]}]
            third = await client.responses.create(model="m", instructions=SYSTEM, input=items, tools=RESPONSES_TOOLS)
            items += codex_echo(third) + codex_results(third, 0)
            fourth = await client.responses.create(model="m", instructions=SYSTEM, input=items, tools=RESPONSES_TOOLS)
            await client.close()
            return (claude, codex), (first, second, third, fourth), upstream.prompts
        finally:
            await gateway.aclose()

    sessions, (first, second, third, fourth), prompts = asyncio.run(main())
    assert [(b.name, b.input) for b in first.content if b.type == "tool_use"] == [("bash", {"command": COMMAND})]
    assert [(i.name, json.loads(i.arguments)) for i in third.output if i.type == "function_call"] == \
        [("bash", {"command": COMMAND})]
    assert second.content and fourth.output_text.strip() == "Done."
    for session in sessions:
        assert session.stats["branches"] == 1 and session.stats["errors"] == 0, session.stats
    claude_prompt = tokenizer.decode(prompts[0])
    assert environment in claude_prompt and SYSTEM in claude_prompt
    folded = FORMATS[renderer].system_first
    assert ("<system-reminder>\n" + environment in claude_prompt) == folded
    assert claude_prompt.index(TASK) < claude_prompt.index(environment)  # where Claude Code put it


def test_a_conversation_the_renderer_refuses_is_a_400_not_a_500(tiny_model_dir, tmp_path, monkeypatch):
    """Whatever a format's renderer refuses (renderers raises ValueError) is the client's 400 with
    the renderer's reason, in every dialect; the gateway once answered 500 (an unhandled error)."""
    async def main():
        gateway = Gateway("http://127.0.0.1:9", tiny_model_dir)
        await gateway.start()

        def refuse(*args, **kwargs):
            raise ValueError("System message must be at the beginning.")

        monkeypatch.setattr(gateway.renderer, "render_ids", refuse)
        try:
            session = gateway.open_session("s", tmp_path / "gw", SamplingParams(max_new_tokens=8))
            async with httpx.AsyncClient(timeout=30) as http:
                chat = await http.post(session.openai_base_url() + "/chat/completions",
                                       json={"model": "m", "messages": [{"role": "user", "content": TASK}]})
                claude = await http.post(session_root(session) + "/v1/messages",
                                         json={"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": TASK}]})
            return chat, claude
        finally:
            await gateway.aclose()

    for response in asyncio.run(main()):
        assert response.status_code == 400, response.text
        assert "qwen3 chat format cannot render these messages: System message must be at the beginning" in response.text
