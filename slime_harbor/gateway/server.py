"""The gateway's HTTP server: the agents' APIs in, SGLang `/generate` token ids out.

Responsible for: the HTTP server with every dialect's routes (chat.py, anthropic.py,
responses.py, gemini.py, each a wire.Dialect), the sessions (opened with an API key of their
own, found by URL path or by that key, closed with their calls in flight aborted), the upstream
policy client, and the model family's renderer. Not responsible for: an API's wire format (the dialects), one turn from
admission to delivery (turn.py: `Gateway.complete` builds a GatewayTurn), which tokens a prompt
is (session.py: branches and bridges) or how messages become tokens (policy/renderer.py: PyPI
`renderers`, one renderer per model family)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import socket
import time
from pathlib import Path
from typing import Protocol

from fastapi import FastAPI, Request

from slime_harbor.gateway.anthropic import Messages
from slime_harbor.gateway.chat import ChatCompletions
from slime_harbor.gateway.gemini import GenerateContent
from slime_harbor.gateway.responses import Responses
from slime_harbor.gateway.session import fold_system_messages, GatewaySession, normalise_messages
from slime_harbor.gateway.turn import GatewayTurn, TurnRequest
from slime_harbor.gateway.wire import Dialect, KeyRefused
from slime_harbor.http_api import BadRequest, bearer_token, is_loopback
from slime_harbor.policy.chat_formats import FORMATS
from slime_harbor.policy.client import PolicyClient
from slime_harbor.policy.renderer import make_renderer
from slime_harbor.policy.sampling import Generation, SamplingParams
from slime_harbor.policy.wire_api import GENERATE_API

KEY_NEEDED = "this gateway needs the session's API key (Authorization: Bearer, x-api-key or x-goog-api-key)"
"""The 401's message, with keys on (the key itself is never echoed)."""

ABORT_WAIT_SEC = 10.0
"""How long closing a session keeps aborting its calls in flight until the server has answered them."""


class _InLoopServer:
    """uvicorn serving in the caller's event loop, leaving the process's signals alone (Ctrl-C
    belongs to the run, which closes the gateway itself)."""

    def __init__(self, app, sock: socket.socket):
        import uvicorn

        class Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self):
                yield

        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                                timeout_graceful_shutdown=2)
        self.server = Server(config)
        self.task = asyncio.get_running_loop().create_task(self.server.serve(sockets=[sock]))

    async def started(self) -> None:
        while not self.server.started:
            if self.task.done():
                await self.task
                raise RuntimeError("the gateway's HTTP server did not start")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        self.server.should_exit = True
        # wait, not await: at asyncio.run's end the task is already cancelled, and the rest of
        # the gateway (its socket, its upstream's client session) must still be closed after it.
        await asyncio.wait({self.task})


class Upstream(Protocol):
    """What the gateway calls for its samples: PolicyClient's methods (a policy server by URL), or
    any object with them (agent_sft's ScriptedPolicy answers from a script)."""

    async def generate(self, input_ids: list[int], params: SamplingParams, rid: str | None = None,
                       routing_key: str | None = None) -> Generation: ...

    async def abort(self, rid: str) -> None: ...

    async def aclose(self) -> None: ...


class Gateway:
    """A recording OpenAI-compatible gateway in front of an SGLang-protocol policy (see the module docstring).

    The policy is `upstream_url` (a PolicyClient is built for it with `upstream_api`, `lora_name`
    `reissue_aborted` and `keep_interrupted`), or `upstream`: an Upstream already built, in place of the URL (pass
    None as upstream_url); the gateway closes it in aclose()."""

    def __init__(self, upstream_url: str | None, model_dir: str | Path, host: str = "127.0.0.1", port: int = 0,
                 served_model_name: str = "policy", upstream_api: str = GENERATE_API, lora_name: str | None = None,
                 reissue_aborted: bool = False, keep_interrupted: bool = True, *, upstream: Upstream | None = None,
                 renderer: str | None = None, require_keys: bool | None = None):
        from transformers import AutoTokenizer

        if (upstream is None) == (upstream_url is None):
            raise ValueError("the gateway takes one upstream: upstream_url or upstream (an Upstream object)")
        if upstream is not None and (upstream_api != GENERATE_API or lora_name is not None or reissue_aborted):
            raise ValueError("upstream_api, lora_name and reissue_aborted configure the client built from "
                             "upstream_url, not an Upstream object")
        self.model_dir = str(model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.renderer = make_renderer(self.model_dir, self.tokenizer, renderer)
        self.chat_format = FORMATS.get(self.renderer.config.name)
        config = json.loads((Path(self.model_dir) / "config.json").read_text())
        self.max_context_len = int(config.get("max_position_embeddings") or self.tokenizer.model_max_length)
        self.served_model_name = served_model_name
        self.upstream: Upstream = upstream if upstream is not None else PolicyClient(
            upstream_url, lora_path=lora_name, api=upstream_api, model=served_model_name,
            reissue_aborted=reissue_aborted, keep_interrupted=keep_interrupted,
            tokenizer=self.tokenizer)  # see PolicyClient.generate
        self.host, self.port = host, port
        self.require_keys = not is_loopback(host) if require_keys is None else require_keys
        """Every call must carry its session's own key (else 401, another key 403). On by default
        beyond loopback, where any host that reaches the port could otherwise drive a session named in
        a path; on loopback only this machine's sandboxes reach it, each through its own forward."""
        self.sessions: dict[str, GatewaySession] = {}
        self._sessions_by_key: dict[str, GatewaySession] = {}  # each open session under its api_key
        self._server: _InLoopServer | None = None
        self._socket: socket.socket | None = None
        self.app = FastAPI(title="slime-harbor gateway", docs_url=None, redoc_url=None, openapi_url=None)
        self.dialects = [dialect(self) for dialect in (ChatCompletions, Messages, Responses, GenerateContent)]
        for dialect in self.dialects:  # each declares its routes
            dialect.add_routes(self.app)

    def messages(self, raw) -> list[dict]:
        """A request's messages as the policy's chat format takes them: checked and normalised
        (session.normalise_messages), system messages folded where the format takes only a first
        one (session.fold_system_messages). 400 on anything malformed."""
        messages = normalise_messages(raw)
        return fold_system_messages(messages) if self.chat_format and self.chat_format.system_first else messages

    def render_prompt(self, messages: list[dict], tools: list | None) -> list[int]:
        """The conversation rendered whole, ready to generate; a conversation the format's
        renderer refuses is a 400 that says why (never a 500)."""
        try:
            return self.renderer.render_ids(messages, tools=tools, add_generation_prompt=True)
        except (ValueError, TypeError, KeyError) as error:
            first = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise BadRequest(f"the {self.renderer.config.name} chat format cannot render these messages: {first}",
                             param="messages") from None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def sample_adapter(self, lora_name: str | None) -> None:
        """Later calls sample from this LoRA adapter on the upstream (train-local pushes one per
        update under a new name, between updates); None = the served model itself."""
        if not isinstance(self.upstream, PolicyClient):
            raise ValueError("an Upstream object picks its own weights")
        self.upstream.lora_path = lora_name

    async def start(self) -> None:
        # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and
        # without it every reply waits ~40 ms for the client's delayed ACK (Nagle).
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        self._socket = sock
        self._server = _InLoopServer(self.app, sock)
        await self._server.started()

    def open_session(self, session_id: str, record_dir: str | Path, sampling: SamplingParams | None = None,
                     routing_key: str | None = None, sampling_seed: int | None = None,
                     max_context_len: int | None = None) -> GatewaySession:
        """A new session named `session_id` (the path /s/<session_id>/ reaches it), with an API key of
        its own: a random secret, never a name the trial's records hold elsewhere. Harbor replaces
        the value of every sensitive agent variable (OPENAI_API_KEY, ...) with [REDACTED] in every
        file of the trial dir, so a key that were the trial's name would erase that name from its
        records; the secret is scrubbed alone."""
        if session_id in self.sessions:
            raise ValueError(f"gateway session {session_id!r} is already open")
        session = GatewaySession(self, session_id, record_dir, sampling or SamplingParams(), routing_key,
                                 sampling_seed, max_context_len or self.max_context_len,
                                 api_key=f"sk-{secrets.token_hex(24)}")
        self.sessions[session_id] = session
        self._sessions_by_key[session.api_key] = session
        return session

    async def abort_upstream(self, calls: list[tuple[str, asyncio.Task]]) -> None:
        """Stop upstream calls (rid, task) on the server, then drop them here.

        A request still in transit misses an abort (the server does not know its rid yet), so the
        abort is repeated until the server has answered every call: once it has, the request no
        longer runs there. Cancelling the client side alone would leave it generating on the server.
        """
        tasks = [task for _, task in calls]
        deadline = time.monotonic() + ABORT_WAIT_SEC
        while tasks:
            for rid, _ in calls:
                await self.upstream.abort(rid)
            _, pending = await asyncio.wait(tasks, timeout=0.2)
            if not pending or time.monotonic() > deadline:
                break
        for task in tasks:
            task.cancel()

    async def close_session(self, session_id: str) -> GatewaySession:
        """Abort the session's in-flight upstream calls, flush its files; it stays readable."""
        session = self.sessions.pop(session_id)
        self._sessions_by_key.pop(session.api_key, None)
        session.closed = True
        await self.abort_upstream(list(session.in_flight.items()))
        for _ in range(100):  # let the handlers of cancelled calls record them (they answer 503)
            if not session.open_calls:
                break
            await asyncio.sleep(0.05)
        await session.flush()
        return session

    async def aclose(self) -> None:
        for session_id in list(self.sessions):
            await self.close_session(session_id)
        if self._server is not None:
            await self._server.stop()
            self._server = None
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        await self.upstream.aclose()

    # ---- serving one turn -------------------------------------------------------------------
    def session_of(self, request: Request, session_id: str | None, api_key: str | None = None) -> GatewaySession:
        """The open session the path names (`session_id`), else the one whose api_key the request
        carries: `api_key` (a dialect's own header), else its bearer token or x-api-key.
        LookupError when there is none; with require_keys, KeyRefused for a call on a session without
        its key (401) or with another (403). The key is never echoed."""
        if api_key is None:
            api_key = bearer_token(request) or request.headers.get("x-api-key")
        if session_id is not None:
            session = self.sessions.get(session_id)
            if session is None:
                raise LookupError(f"no open gateway session {session_id!r}")
            if self.require_keys and not secrets.compare_digest((api_key or "").encode(), session.api_key.encode()):
                raise KeyRefused(403, "this API key is not the session's") if api_key else KeyRefused(401, KEY_NEEDED)
            return session
        session = self._sessions_by_key.get(api_key or "")
        if session is None:
            if self.require_keys and not api_key:
                raise KeyRefused(401, KEY_NEEDED)
            raise LookupError("no open gateway session has this API key (or name the session in the path: "
                              "/s/<session>/...)")
        return session

    async def complete(self, request: Request, session: GatewaySession, asked: TurnRequest, dialect: Dialect):
        """One model call, whichever dialect asked for it: admitted, sampled and delivered as one
        GatewayTurn (turn.py), answered in the dialect's format (streamed or not)."""
        return await GatewayTurn(self, dialect, request, session, asked).respond()
