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
