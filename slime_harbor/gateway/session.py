"""One trial's conversation through the gateway: branches of exact tokens, the calls, the files.

A branch is one token-exact sample in the making: the token ids sampled so far with the
template tokens between them (prompt_0 + c_0 + bridge_1 + c_1 + ...), and the canonical form of the
messages those tokens stand for. A request whose messages are a branch's messages plus new
user / tool messages continues the branch: its prompt is the branch's tokens bridged to the next
turn by the renderer (PyPI `renderers`' `bridge_to_next_turn`), never a re-render of the history,
so the agent re-serialising what the gateway said cannot change a token. A request that edits the
history (a compaction, a dropped turn) is rendered whole and starts a new branch: a new sample of
the same episode.

Canonical form (what "the same messages" means): assistant content whitespace-stripped, with any
inline <think> block and the reasoning ignored; tool-call arguments compared as parsed JSON, their
ids ignored; other messages compared exactly (OpenAI text parts joined).

Side calls: harnesses also ask the model things outside the episode's conversation (Claude Code:
a title for the session, whether a bash command is safe; such requests carry no tools). When the
session closes, a delivered call without tools, in a session whose main conversation has tools (a
branch with trained calls that carries tools), is a side call: served and recorded, not trained.
A session in which no request carries tools (terminus-2's JSON-in-text) has no side calls.

Files (in the session's record dir): calls.jsonl, one line per call when it ends (plus
`{"event": "superseded", ...}` and, at close, `{"event": "side_call", ...}` lines), and
session.json at close. A call's prompt is either
`prompt_ids` (whole) or, for a continuation or retry, `prompt_prefix` {call: k, tokens: n} +
`prompt_new_ids`: the prompt is the first n tokens of call k's prompt + completion_ids, then the new
ids (k < the call's index; resolve k's own prompt the same way first). `usage.prompt_tokens` is the
whole prompt's length. The converter reads the in-memory session (rollout_details), not this file.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import orjson
from harbor.models.trajectories import (Agent, FinalMetrics, Metrics, Observation, ObservationResult, Step,
                                        ToolCall, Trajectory)
from harbor.utils.trajectory_utils import format_trajectory_json

from slime_harbor.episode import CONTEXT_EXCEEDED, STEP_LIMIT
from slime_harbor.http_api import BadRequest
from slime_harbor.policy.renderer import bridge_ids
from slime_harbor.policy.sampling import Generation, SamplingParams

ROLES = ("system", "developer", "user", "assistant", "tool")


STEP_LIMIT_CODE = "step_limit_reached"
"""The error code of a call refused because its session used its step limit (max_calls)."""


class PolicyUnavailable(Exception):
    """The policy cannot answer (down, or the session is closing): the agent gets a 503."""


def text_of(content: Any, where: str) -> str:
    """A message's content as one string: a string, None, or a list of OpenAI text parts."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and part.get("type") in ("text", "input_text", "output_text") and isinstance(
                part.get("text"), str
            ):
                texts.append(part["text"])
            else:
                raise BadRequest(f"{where}.content: only text parts are supported", param=f"{where}.content")
        return "".join(texts)
    raise BadRequest(f"{where}.content must be a string, null or a list of text parts", param=f"{where}.content")


SYSTEM_REMINDER = "<system-reminder>\n{}\n</system-reminder>\n"
"""How a system message the format cannot take where it stands reaches the model (SLiME's agent
adapters fold them so, in Claude Code's own tag)."""


def fold_system_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages for a format whose renderer takes one system message, first, and refuses or
    drops any other (chat_formats.ChatFormat.system_first): the system
    messages that open the conversation become one (joined by a blank line: Codex's instructions
    and developer message), and each later one is appended to the user message before it (or put
    in front of the next one) as a <system-reminder> block (Claude Code's environment block after
    its first user turn). The same messages always fold the same way, so a conversation that
    grows keeps its earlier turns as they were."""
    lead = 0
    while lead < len(messages) and messages[lead]["role"] == "system":
        lead += 1
    out = [{"role": "system", "content": "\n\n".join(m["content"] for m in messages[:lead])}] if lead else []
    pending: list[str] = []  # later system messages with no user message before them yet
    for message in messages[lead:]:
        if message["role"] == "system":
            user = next((m for m in reversed(out) if m["role"] == "user"), None)
            if user is None:
                pending.append(message["content"])
            else:
                user["content"] += "\n" + SYSTEM_REMINDER.format(message["content"])
            continue
        message = dict(message)
        if message["role"] == "user" and pending:
            message["content"] = "".join(SYSTEM_REMINDER.format(t) for t in pending) + message["content"]
            pending = []
        out.append(message)
    if pending:
        out.append({"role": "user", "content": "".join(SYSTEM_REMINDER.format(t) for t in pending)})
    return out


def normalise_messages(raw: Any) -> list[dict[str, Any]]:
    """The request's messages, checked, in the shape the renderer takes (string content, a
    developer message as system, tool-call arguments as given). 400 on anything malformed."""
    if not isinstance(raw, list) or not raw:
        raise BadRequest("messages must be a non-empty list", param="messages")
    messages = []
    for i, message in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise BadRequest(f"{where} must be an object with a role in {list(ROLES)}", param=where)
        role = "system" if message["role"] == "developer" else message["role"]
        out: dict[str, Any] = {"role": role, "content": text_of(message.get("content"), where)}
        if role == "assistant":
            for key in ("reasoning_content", "reasoning"):
                if isinstance(message.get(key), str):
                    out["reasoning_content"] = message[key]
            calls = message.get("tool_calls") or []
            if not isinstance(calls, list):
                raise BadRequest(f"{where}.tool_calls must be a list", param=f"{where}.tool_calls")
            if calls:
                out["tool_calls"] = []
            for k, call in enumerate(calls):
                function = call.get("function") if isinstance(call, dict) else None
                if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not isinstance(
                    function.get("arguments", "{}"), (str, dict)
                ):
                    raise BadRequest(f"{where}.tool_calls[{k}] must have function.name and function.arguments",
                                     param=f"{where}.tool_calls")
                out["tool_calls"].append({"id": call.get("id"), "type": "function",
                                          "function": {"name": function["name"], "arguments": function.get("arguments", "{}")}})
        if role == "tool":
            out["tool_call_id"] = message.get("tool_call_id")
        messages.append(out)
    return messages


def _canonical_arguments(arguments: str | dict) -> str:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return arguments.strip()
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical(message: dict[str, Any]) -> tuple:
    """What identifies a (normalised) message when the agent sends it back."""
    if message["role"] != "assistant":
        return (message["role"], message["content"])
    content = message["content"]
    if "</think>" in content:  # reasoning some clients keep inline; reasoning is not compared
        content = content.split("</think>", 1)[1]
    calls = tuple(
        (c["function"]["name"], _canonical_arguments(c["function"]["arguments"])) for c in message.get("tool_calls") or []
    )
    return ("assistant", content.strip(), calls)


def tools_key(tools: list | None) -> bytes:
    """Which tools a request offers, as a comparable key (Claude Code sends ~50 kB of them per call)."""
    try:
        return orjson.dumps(tools or [], option=orjson.OPT_SORT_KEYS)
    except TypeError:  # what orjson cannot encode (an int beyond 64 bits) the stdlib can
        return json.dumps(tools or [], sort_keys=True).encode()


@dataclass
class Call:
    """One upstream call: what was sent, what came back, and what became of the reply."""

    index: int
    branch: int
    prompt_ids: list[int]
    request: tuple  # canonical messages of the request
    rid: str
    started: float = field(default_factory=time.monotonic)
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    weight_version: str | None = None
    reissued: int = 0  # times the server aborted it on its own (a weight update) and it was asked for again
    version_spans: list[tuple[str, int, int]] | None = None  # (version, start, end) over completion_ids
    interrupted: bool = False  # a weight update interrupted it (Generation.interrupted)
    discarded_tokens: int = 0  # sampled, then thrown away at an update (Generation.discarded_tokens)
    reprefill_tokens: int = 0  # prefilled again at an update (Generation.reprefill_tokens)
    top_p_token_ids: list[int] | None = None
    top_p_token_offsets: list[int] | None = None
    latency_s: float | None = None
    delivered: bool = False
    trained: bool = False
    superseded_by: int | None = None
    side_call: bool = False  # delivered outside the main conversation (see the module docstring)
    error: str | None = None
    message: dict[str, Any] | None = None  # the OpenAI assistant message delivered
    new_messages: list[dict[str, Any]] = field(default_factory=list)  # what this request added (ATIF)
    # (call index, n): the prompt starts with the first n tokens of that call's prompt + completion
    # (a continuation or a retry); calls.jsonl then holds only the rest of the prompt.
    prompt_prefix: tuple[int, int] | None = None

    def sampled(self, generation: Generation) -> None:
        """What the upstream call returned."""
        self.latency_s = time.monotonic() - self.started
        self.completion_ids, self.logprobs = generation.token_ids, generation.logprobs
        self.finish_reason, self.weight_version = generation.finish_reason, generation.weight_version
        self.reissued, self.version_spans, self.interrupted = (generation.reissued, generation.version_spans,
                                                               generation.interrupted)
        self.discarded_tokens, self.reprefill_tokens = generation.discarded_tokens, generation.reprefill_tokens
        self.top_p_token_ids, self.top_p_token_offsets = generation.top_p_token_ids, generation.top_p_token_offsets

    def usage(self) -> dict[str, int]:
        n_prompt, n_out = len(self.prompt_ids), len(self.completion_ids)
        return {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out}

    def record(self, session_id: str) -> dict[str, Any]:
        """The call's calls.jsonl line. A prompt that extends an earlier call's prompt + completion
        is written as `prompt_prefix` {call, tokens} + `prompt_new_ids` instead of `prompt_ids`, so
        a line's size (and the cost of writing it) follows the call's new tokens, not the history."""
        if self.prompt_prefix is None:
            prompt: dict[str, Any] = {"prompt_ids": self.prompt_ids}
        else:
            source, n = self.prompt_prefix
            prompt = {"prompt_prefix": {"call": source, "tokens": n}, "prompt_new_ids": self.prompt_ids[n:]}
        return {
            "session": session_id, "call": self.index, "branch": self.branch, "rid": self.rid,
            **prompt, "completion_ids": self.completion_ids, "logprobs": self.logprobs,
            "finish_reason": self.finish_reason, "weight_version": self.weight_version,
            "reissued": self.reissued, "version_spans": self.version_spans, "interrupted": self.interrupted,
            "discarded_tokens": self.discarded_tokens, "reprefill_tokens": self.reprefill_tokens,
            "top_p_token_ids": self.top_p_token_ids, "top_p_token_offsets": self.top_p_token_offsets,
            "latency_s": self.latency_s, "delivered": self.delivered, "trained": self.trained,
            "error": self.error, "usage": self.usage(),
        }


@dataclass
class Branch:
    """Token-exact history: `calls` are its trained calls, each prompt extending the previous
    prompt + completion. With no call yet, `first_prompt` is what its first call samples from."""

    index: int
    tools: bytes  # tools_key of the requests on this branch
    canon: tuple  # canonical messages the tokens stand for (ending with the gateway's last reply)
    first_prompt: list[int]
    calls: list[Call] = field(default_factory=list)
    version: int = 0  # bumped by every commit: a call started on an older version forks instead


@dataclass
class Placement:
    """Where one request's prompt comes from (GatewaySession.resolve)."""

    branch: Branch
    prompt_ids: list[int]
    version: int
    supersedes: Call | None = None  # an identical retry of the branch's last call
    prefix: tuple[int, int] | None = None  # Call.prompt_prefix


class GatewaySession:
    """One trial's session. Built by Gateway.open_session; read after Gateway.close_session."""

    def __init__(self, gateway, session_id: str, record_dir: Path | str, sampling: SamplingParams,
                 routing_key: str | None, sampling_seed: int | None, max_context_len: int, *, api_key: str):
        self.gateway = gateway
        self.session_id = session_id
        self.api_key = api_key  # the agent's key: names the session where the path does not; never recorded
        self.record_dir = Path(record_dir)
        self.sampling = sampling
        self.routing_key = routing_key
        self.sampling_seed = sampling_seed
        self.max_context_len = max_context_len
        self.exit_reason: str | None = None
        self.max_calls: int | None = None  # delivered calls allowed (an agent without a turn limit)
        self.calls: list[Call] = []
        self.branches: list[Branch] = []
        self.closed = False
        self.in_flight: dict[str, asyncio.Task] = {}  # rid -> the task awaiting the upstream
        self.open_calls: set[int] = set()  # calls whose handler has not finished them yet
        self._errors = 0
        self._pending_lines: list[Call | dict] = []
        self._writer: asyncio.Task | None = None
        self._file_lock = threading.Lock()

    def openai_base_url(self, host: str | None = None) -> str:
        return f"http://{host or self.gateway.host}:{self.gateway.port}/s/{self.session_id}/v1"

    # ---- admitting a call -------------------------------------------------------------------
    def admit(self, messages: list[dict], tools: list | None) -> tuple[Placement, Call]:
        """A request's call, opened: checked against the session's limits (a lost policy, the step
        limit, the context limit), its prompt placed among the branches (`resolve`)."""
        if self.exit_reason == "policy_unavailable":  # the trial is aborted: fail fast
            raise PolicyUnavailable("the policy server is unavailable")
        if self.max_calls is not None and (self.steps_taken(tools) or 0) >= self.max_calls:
            # The agent has no turn limit of its own (Codex): the episode ends here, scored truncated.
            # Its side calls neither count nor are refused.
            self.exit_reason = STEP_LIMIT
            raise BadRequest(f"the episode's step limit ({self.max_calls} model calls) is reached",
                             code=STEP_LIMIT_CODE)
        request = tuple(canonical(m) for m in messages)
        placement = self.resolve(messages, request, tools)
        prompt = placement.prompt_ids
        if self.max_context_len - len(prompt) <= 0:
            # The episode ends here whatever the agent does with the 400 (raises, exits non-zero,
            # stops): the converter reads this, not the agent's exception. An agent that makes room
            # and goes on clears it (commit).
            self.exit_reason = CONTEXT_EXCEEDED
            self.count_error()
            raise BadRequest(
                f"This model's maximum context length is {self.max_context_len} tokens. However, your request "
                f"has {len(prompt)} input tokens. Please reduce the length of the input messages.",
                param="messages", code="context_length_exceeded")
        index = len(self.calls)
        call = Call(index=index, branch=placement.branch.index, prompt_ids=prompt, request=request,
                    rid=f"{self.session_id}-{index}-{uuid.uuid4().hex[:8]}", prompt_prefix=placement.prefix)
        call.new_messages = placement.supersedes.new_messages if placement.supersedes \
            else _new_messages(messages, placement)
        self.calls.append(call)
        self.open_calls.add(call.index)
        return placement, call

    @contextlib.contextmanager
    def upstream_call(self, call: Call, task: asyncio.Task):
        """While the call samples upstream: closing the session aborts it."""
        self.in_flight[call.rid] = task
        try:
            yield
        finally:
            self.in_flight.pop(call.rid, None)

    def policy_lost(self) -> None:
        """The policy server is unavailable: the trial is aborted, later calls fail fast."""
        self.exit_reason = "policy_unavailable"

    # ---- branches -------------------------------------------------------------------------
    def resolve(self, messages: list[dict], request: tuple, tools: list | None) -> Placement:
        """The prompt of a request: an identical retry, a continuation (bridged), or a new branch."""
        key = tools_key(tools)
        for branch in reversed(self.branches):
            if branch.tools != key:
                continue
            if not branch.calls and branch.canon == request:  # its first call was never delivered
                return Placement(branch, branch.first_prompt, branch.version)
            for position, call in enumerate(branch.calls):
                # Lengths first: a continuation shares every message of an earlier request, and a
                # tuple compare walks that shared history (the long task prompt) before it differs.
                if len(call.request) != len(request) or call.request != request:
                    continue
                if position == len(branch.calls) - 1:
                    return Placement(branch, call.prompt_ids, branch.version, supersedes=call,
                                prefix=(call.index, len(call.prompt_ids)))
                # A retry of an older call after later ones: a fork from that call's exact prompt.
                return self._new_branch(key, request, call.prompt_ids)
        candidates = [b for b in self.branches if b.tools == key and b.calls and len(b.canon) < len(request)
                      and request[: len(b.canon)] == b.canon]
        if candidates:
            branch = max(candidates, key=lambda b: len(b.canon))
            last = branch.calls[-1]
            bridged = bridge_ids(self.gateway.renderer, last.prompt_ids, last.completion_ids,
                                 messages[len(branch.canon):], tools=tools)
            if bridged is not None:
                return Placement(branch, bridged, branch.version,
                                 prefix=(last.index, len(last.prompt_ids) + len(last.completion_ids)))
        return self._new_branch(key, request, self.gateway.render_prompt(messages, tools))

    def _new_branch(self, key: str, request: tuple, prompt: list[int]) -> Placement:
        branch = Branch(index=len(self.branches), tools=key, canon=request, first_prompt=list(prompt))
        self.branches.append(branch)
        return Placement(branch, branch.first_prompt, branch.version)

    def commit(self, placement: Placement, call: Call) -> None:
        """A delivered reply joins its branch (and is trained): the branch now stands for the
        request's messages + this reply."""
        reply = canonical(normalise_messages([call.message])[0])
        branch = placement.branch
        if branch.version != placement.version:
            # Another call of the same state committed meanwhile (the agent sampled in parallel):
            # this one is a sample of its own, from its exact prompt.
            branch = self._new_branch(branch.tools, call.request, call.prompt_ids).branch
        elif placement.supersedes is not None:
            old = branch.calls.pop()
            old.trained, old.superseded_by = False, call.index
            self._queue({"event": "superseded", "session": self.session_id, "call": old.index, "by": call.index})
        call.branch, call.delivered, call.trained = branch.index, True, True
        branch.calls.append(call)
        branch.canon = call.request + (reply,)
        branch.version += 1
        if self.exit_reason == CONTEXT_EXCEEDED:  # the agent made room (compacted) and went on
            self.exit_reason = None

    def steps_taken(self, tools: list | None) -> int | None:
        """The model calls that count toward the step limit before a call with these tools, or None
        when that call is a side call (it has no tools in a session whose conversation has them:
        a title, a loop check), which is served whatever the count."""
        no_tools = tools_key(None)
        with_tools = [c for c in self.calls if c.delivered and self.branches[c.branch].tools != no_tools]
        if tools:
            return len(with_tools)
        if with_tools:
            return None
        return sum(c.delivered for c in self.calls)

    def settle_side_calls(self) -> None:
        """At close: the branches without tools in a session whose main conversation has tools are
        side calls, recorded and not trained (a `side_call` event line per call)."""
        no_tools = tools_key(None)
        if not any(b.calls and b.tools != no_tools for b in self.branches):
            return
        for branch in self.branches:
            if branch.tools != no_tools or not branch.calls:
                continue
            for call in branch.calls:
                call.trained, call.side_call = False, True
                self._pending_lines.append({"event": "side_call", "session": self.session_id, "call": call.index})
            branch.calls = []

    # ---- what the converter reads ---------------------------------------------------------
    def rollout_details(self) -> list[dict[str, Any]]:
        """One Harbor RolloutDetail-shaped dict per branch with trained calls, in branch order."""
        details = []
        for branch in self.branches:
            if not branch.calls:
                continue
            calls = branch.calls
            extra: dict[str, Any] = {
                "finish_reason": [c.finish_reason for c in calls],
                "weight_version": [c.weight_version for c in calls],
                "version_spans": [c.version_spans for c in calls],
                "branch": branch.index,
                "call_index": [c.index for c in calls],
            }
            if self.sampling.return_top_p_token_ids:
                extra["top_p_token_ids"] = [c.top_p_token_ids for c in calls]
                extra["top_p_token_offsets"] = [c.top_p_token_offsets for c in calls]
            details.append({
                "prompt_token_ids": [c.prompt_ids for c in calls],
                "completion_token_ids": [c.completion_ids for c in calls],
                "logprobs": [c.logprobs for c in calls],
                "extra": extra,
            })
        return details

    @property
    def stats(self) -> dict[str, int]:
        return {
            "calls": len(self.calls),
            "delivered": sum(c.delivered for c in self.calls),
            "trained": sum(c.trained for c in self.calls),
            "superseded_retries": sum(c.superseded_by is not None for c in self.calls),
            "side_calls": sum(c.side_call for c in self.calls),
            "undelivered": sum(not c.delivered for c in self.calls),
            "branches": sum(bool(b.calls) for b in self.branches),
            "errors": self._errors,
        }

    @property
    def weight_sync(self) -> dict[str, int]:
        """What weight updates did to its calls, all of them (trained or not): see Generation."""
        return {"interrupted_calls": sum(c.interrupted for c in self.calls),
                "discarded_tokens": sum(c.discarded_tokens for c in self.calls),
                "reprefill_tokens": sum(c.reprefill_tokens for c in self.calls)}

    def count_error(self) -> None:
        self._errors += 1

    # ---- files ----------------------------------------------------------------------------
    def finished(self, call: Call) -> None:
        """A call is over (delivered or not): its line goes to calls.jsonl, off the event loop."""
        if not call.delivered:
            call.error = call.error or "the client left before the reply was sent"
        self.open_calls.discard(call.index)
        self._queue(call)

    def _queue(self, item: Call | dict) -> None:
        self._pending_lines.append(item)
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(asyncio.to_thread(self._drain))

    def _drain(self) -> None:
        with self._file_lock:
            if not self._pending_lines:
                return
            lines, self._pending_lines = self._pending_lines, []
            self.record_dir.mkdir(parents=True, exist_ok=True)
            with open(self.record_dir / "calls.jsonl", "a") as f:
                for item in lines:
                    f.write(json.dumps(item.record(self.session_id) if isinstance(item, Call) else item) + "\n")

    async def flush(self) -> None:
        """Settle the side calls; write every pending line, the session summary, and the ATIF
        trajectory if the agent wrote none."""
        self.settle_side_calls()
        if self._writer is not None:
            await self._writer
        await asyncio.to_thread(self._write_files)

    def _write_files(self) -> None:
        self._drain()
        self.record_dir.mkdir(parents=True, exist_ok=True)
        summary = {
            "session": self.session_id, "exit_reason": self.exit_reason, "stats": self.stats,
            "weight_sync": self.weight_sync,
            "calls": [{"call": c.index, "branch": c.branch, "delivered": c.delivered, "trained": c.trained,
                       "superseded_by": c.superseded_by, "side_call": c.side_call} for c in self.calls],
        }
        (self.record_dir / "session.json").write_text(json.dumps(summary, indent=1) + "\n")
        path = self.record_dir.parent / "trajectory.json"
        if not path.exists() and (trajectory := self.trajectory()) is not None:
            path.write_text(format_trajectory_json(trajectory.to_json_dict()))

    def trajectory(self) -> Trajectory | None:
        """The delivered turns as an ATIF-v1.8 trajectory (what `slime-harbor view` shows); None
        when no call was delivered (ATIF wants at least one step)."""
        delivered = [c for c in self.calls if c.delivered]
        if not delivered:
            return None
        model = self.gateway.served_model_name
        steps: list[Step] = []
        now = datetime.now(timezone.utc).isoformat()

        def add(source: str, message: str, **fields) -> Step:
            steps.append(Step(step_id=len(steps) + 1, timestamp=now, source=source, message=message, **fields))
            return steps[-1]

        last_agent: Step | None = None
        for call in delivered:
            for message in call.new_messages:
                if message["role"] == "tool" and last_agent is not None:
                    if last_agent.observation is None:
                        last_agent.observation = Observation(results=[])
                    call_id = message.get("tool_call_id")
                    if call_id and call_id in {tc.tool_call_id for tc in last_agent.tool_calls or []}:
                        result = ObservationResult(source_call_id=call_id, content=message["content"])
                    else:  # ATIF's source_call_id must name a tool call of this step: an id the agent
                        # chose itself (the gateway ignores ids when it matches turns) goes in extra
                        result = ObservationResult(content=message["content"],
                                                   extra={"tool_call_id": call_id} if call_id else None)
                    last_agent.observation.results.append(result)
                elif message["role"] in ("system", "user"):
                    add(message["role"], message["content"])
            reply = call.message or {}
            tool_calls = [ToolCall(tool_call_id=tc["id"], function_name=tc["function"]["name"],
                                   arguments=_arguments_dict(tc["function"]["arguments"]))
                          for tc in reply.get("tool_calls") or []]
            last_agent = add(
                "agent", reply.get("content") or "", model_name=model,
                reasoning_content=reply.get("reasoning_content") or None, tool_calls=tool_calls or None,
                metrics=Metrics(prompt_tokens=len(call.prompt_ids), completion_tokens=len(call.completion_ids),
                                completion_token_ids=call.completion_ids, logprobs=call.logprobs,
                                # ATIF has no fields for which sample the call is in, whether it is
                                # trained, or which weights sampled it.
                                extra={"branch": call.branch, "trained": call.trained,
                                       "weight_version": call.weight_version}),
            )
        return Trajectory(
            session_id=self.session_id,
            agent=Agent(name="slime-harbor-gateway", version="0.1.0", model_name=model),
            steps=steps,
            final_metrics=FinalMetrics(
                total_prompt_tokens=sum(len(c.prompt_ids) for c in delivered),
                total_completion_tokens=sum(len(c.completion_ids) for c in delivered),
                total_steps=len(steps),
            ),
            # ATIF has no field for why the session ended or for the gateway's call counts.
            extra={"exit_reason": self.exit_reason, "gateway": self.stats},
        )


def _new_messages(messages: list[dict], placement: Placement) -> list[dict]:
    """The messages this request adds to its branch (all of them on a new branch): the ATIF steps."""
    known = len(placement.branch.canon) if placement.branch.calls else 0
    return messages[known:] if known <= len(messages) else messages


def _arguments_dict(arguments: str | dict) -> dict[str, Any]:
    if isinstance(arguments, dict):
        return arguments
    try:
        value = json.loads(arguments)
    except ValueError:
        return {"raw": arguments}
    return value if isinstance(value, dict) else {"value": value}
