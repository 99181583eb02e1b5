"""Client for SGLang's native `/generate` endpoint (token in, token out), or for OpenAI-compatible
servers (vLLM, verifiers / prime-rl's inference server) through `/v1/completions` with token-id
prompts and token ids + logprobs back (`api="openai"`).

A call that a weight update interrupts (the server aborts it, SGLang's and vLLM's pause with mode
abort, ours) goes on from where it stopped (keep_interrupted): the tokens it had sampled are
kept with their logprobs and the version that sampled them, and the rest is asked for from the
prompt plus those tokens under the new weights (`continued`), until one completion is whole
(`join`). SGLang's retract pause does the same inside the engine; its meta_info.weight_versions
spans say which tokens each version sampled, and the client keeps them (Generation.version_spans).

The same client talks to SGLang's router in production and to our embedded policy server here:
both speak the protocol below, so nothing else in the chain knows which one it is using. Either
way a call returns a `sampling.Generation`, the same one our engine produces.

    POST {base_url}/generate
      {"input_ids": [...], "sampling_params": {...}, "return_logprob": true, "rid": "..."}
    -> {"text": ..., "meta_info": {"output_token_logprobs": [[logprob, token_id, _], ...],
                                   "finish_reason": {"type": "stop"|"length"|"abort", ...},
                                   "top_p_token_ids", "top_p_token_offsets" (top-p replay)}}
"""

from __future__ import annotations

import array
import asyncio
import base64
import dataclasses
import uuid

import aiohttp
import orjson

from slime_harbor.policy.sampling import Generation, SamplingParams
from slime_harbor.policy.wire_api import GENERATE_API, WIRE_APIS
from slime_harbor.samples import top_p_offsets_ok


class PolicyServerError(RuntimeError):
    """The policy server is unreachable or answered something unusable (an infra failure).

    `status_code`: the HTTP status it answered with, None when it could not be reached at all."""

    def __init__(self, message: str, status_code: int | None = None):
        super().__init__(message)
        self.status_code = status_code


MAX_REISSUES = 8
"""Times one call is asked for again after the server aborted it on its own (weight updates)."""


class PolicyClient:
    def __init__(self, base_url: str, request_timeout_sec: float = 600.0, connect_retries: int = 3,
                 lora_path: str | None = None, api: str = GENERATE_API, model: str | None = None,
                 reissue_aborted: bool = False, keep_interrupted: bool = True, tokenizer=None):
        """`api`: sglang (POST {base_url}/generate) | openai (POST {base_url}/completions, base_url
        being the OpenAI base, e.g. http://host:8000/v1; `model` names the served model).
        `reissue_aborted`: ask again for a call the server aborted on its own (asynchronous
        training, where that is a weight update); off, such a call comes back aborted (a SLiME
        round ending, an operator's abort_all: the episode ends). `keep_interrupted`: asked again,
        the call goes on from the tokens it had (off: it is sampled again whole, and what it had
        is discarded). `tokenizer`: decodes a joined completion's text and finds a stop string
        across a break (without one, the parts' texts are joined and such a stop is missed)."""
        if api not in WIRE_APIS:
            raise ValueError(f"api must be one of {WIRE_APIS}, got {api!r}")
        self.base_url = base_url.rstrip("/")
        self.connect_retries = connect_retries
        self.lora_path = lora_path  # SGLang's per-request LoRA adapter (by name); None = the base model
        self._in_flight: set[str] = set()  # rids of generate() calls not yet returned
        self._aborting: set[str] = set()  # those of them this client asked the server to abort
        self.reissue_aborted = reissue_aborted
        self.keep_interrupted = keep_interrupted
        self.tokenizer = tokenizer
        self.api, self.model = api, model
        self._version_url: str | bool | None = None  # openai: where the served version is read (False: nowhere)
        self._pause_url: bool | None = None  # openai: False once the server has shown it has no /is_paused
        self._timeout = aiohttp.ClientTimeout(total=request_timeout_sec, connect=10.0)
        # aiohttp, not httpx: about 1 ms less per request (1.8 -> 0.9 ms for a 1k-token prompt,
        # bench/gateway_overhead.py's stub), which the gateway adds to every agent call. A session
        # belongs to one event loop: made on first use in the running loop (a client used from two
        # asyncio.run()s gets one per loop).
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._session._loop is not loop:
            # Idle connections are dropped after 2 s, before the server's own keep-alive timeout
            # (uvicorn's, which SGLang and our servers run, is 5 s) can close one under a request
            # about to be sent on it (a ServerDisconnectedError: an aborted trial for nothing).
            self._session = aiohttp.ClientSession(
                timeout=self._timeout, connector=aiohttp.TCPConnector(keepalive_timeout=2.0, limit=100))
        return self._session

    async def generate(
        self, input_ids: list[int], params: SamplingParams, rid: str | None = None, routing_key: str | None = None
    ) -> Generation:
        """One turn. `routing_key` goes out as X-SMG-Routing-Key: under SGLang's router with
        consistent hashing, every turn of an episode then lands on the same engine (prefix cache).

        With reissue_aborted, a call the server aborts on its own is asked for again with the
        same rid: SGLang's pause_generation (SLiME's weight update) and vLLM's /pause?mode=abort
        abort the requests in flight and hold new ones until the new weights are in. With
        keep_interrupted the new request continues the tokens sampled so far (the caller gets one
        completion whose version_spans say which weights sampled which tokens); without, it
        samples the call again whole, as if the update had come before it. A call this client
        aborted (abort()) comes back aborted, with what it had."""
        rid = rid or uuid.uuid4().hex
        input_ids = input_ids if isinstance(input_ids, list) else list(input_ids)
        reissues = MAX_REISSUES if self.reissue_aborted else 0
        self._in_flight.add(rid)
        try:
            kept = Generation(token_ids=[], logprobs=[], text="", finish_reason="abort", rid=rid, version_spans=[])
            breaks: list[int] = []  # len(kept) at each continuation
            discarded = reprefill = 0
            while True:
                asked = continued(params, len(kept.token_ids), self.api)
                if asked.max_new_tokens == 0:  # the kept tokens used the whole budget
                    part = Generation(token_ids=[], logprobs=[], text="", finish_reason="length", rid=rid,
                                      weight_version=kept.weight_version, version_spans=[])
                    cached, trusted = len(input_ids) + len(kept.token_ids), True
                elif self.api == "openai":
                    part, cached, trusted = await self._complete(input_ids + kept.token_ids, asked, rid)
                else:
                    part, cached, trusted = await self._generate_once(input_ids + kept.token_ids, asked, rid,
                                                                      routing_key)
                if breaks or kept.reissued:  # this request resumed the call: what it prefilled again
                    reprefill += max(0, len(input_ids) + len(kept.token_ids) - cached)
                reprefill += sum(len(input_ids) + len(kept.token_ids) + start  # SGLang's retract, inside one request
                                 for _, start, _ in (part.version_spans or [])[1:])
                attempt = kept.reissued
                if part.finish_reason != "abort" or rid in self._aborting or attempt == reissues:
                    whole = join(kept, part)
                    if breaks and self.tokenizer is not None:
                        whole = self._settle_joins(whole, params, breaks)
                    whole.reissued, whole.discarded_tokens, whole.reprefill_tokens = attempt, discarded, reprefill
                    return whole
                if self.keep_interrupted and trusted:
                    if part.token_ids:
                        breaks.append(len(kept.token_ids) + len(part.token_ids))
                    kept = join(kept, part)
                else:  # sampled again whole: what it had is lost
                    discarded += len(kept.token_ids) + len(part.token_ids)
                    kept = Generation(token_ids=[], logprobs=[], text="", finish_reason="abort", rid=rid,
                                      version_spans=[])
                    breaks = []
                kept.reissued = attempt + 1
                await asyncio.sleep(min(0.05 * 2**attempt, 2.0))
        finally:
            self._in_flight.discard(rid)
            self._aborting.discard(rid)

    def _settle_joins(self, whole: Generation, params: SamplingParams, breaks: list[int]) -> Generation:
        """A joined completion's text decoded from its ids (a character may be split across a
        break), cut at a stop string that straddles a break: the server saw only the tokens
        after the break, so it missed one that began before it."""
        ids = whole.token_ids
        window = max((len(s.encode()) for s in params.stop), default=0) + 2  # tokens: each decodes to >= 1 byte
        for b in breaks if params.stop else []:
            for end in range(b + 1, min(b + window, len(ids)) + 1):
                tail = self.tokenizer.decode(ids[max(0, end - window):end], skip_special_tokens=False)
                found = next((stop for stop in params.stop if stop in tail), None)
                if found is None:
                    continue
                # The earliest end of a stop string after this break (none lies wholly before it:
                # the server checked those tokens); the server's own stop where it found one.
                if end < len(ids) or whole.finish_reason != "stop":
                    whole = cut(whole, end)
                    whole.finish_reason, whole.matched_stop = "stop", found
                whole.text = self.tokenizer.decode(whole.token_ids, skip_special_tokens=False)
                return whole
        whole.text = self.tokenizer.decode(whole.token_ids, skip_special_tokens=False)
        return whole

    async def _generate_once(self, input_ids: list[int], params: SamplingParams, rid: str,
                             routing_key: str | None) -> tuple[Generation, int, bool]:
        """One /generate request: (its Generation, the prompt tokens the server had cached,
        whether the version of its tokens is known or the server labels none)."""
        payload = {
            "input_ids": input_ids if isinstance(input_ids, list) else list(input_ids),
            # Special tokens and stop strings stay in the text, so text and token ids agree.
            "sampling_params": {**params.to_generate_params(), "skip_special_tokens": False, "no_stop_trim": True,
                                "spaces_between_special_tokens": False},
            "return_logprob": True,
            "rid": rid,
        }
        if self.lora_path:
            payload["lora_path"] = self.lora_path
        headers = {"X-SMG-Routing-Key": routing_key} if routing_key else None
        reply = await self._post("/generate", payload, headers)
        meta = reply.get("meta_info") or {}
        pairs = meta.get("output_token_logprobs")
        if pairs is None:
            raise PolicyServerError(f"{self.base_url}/generate returned no meta_info.output_token_logprobs")
        finish = meta.get("finish_reason") or {}
        if not isinstance(finish, dict):
            finish = {"type": str(finish)}
        generation = Generation(
            token_ids=[int(p[1]) for p in pairs],
            logprobs=[float(p[0]) for p in pairs],
            text=reply.get("text", ""),
            finish_reason=finish.get("type", "stop"),
            rid=rid,
            matched_stop=finish.get("matched"),
            weight_version=None if meta.get("weight_version") is None else str(meta["weight_version"]),
        )
        generation.version_spans = version_spans(meta, len(generation.token_ids))
        if generation.version_spans:
            generation.weight_version = generation.version_spans[0][0]  # the oldest: what staleness reads
        if params.return_top_p_token_ids and params.truncates and generation.token_ids:
            generation.top_p_token_ids, generation.top_p_token_offsets = self._top_p(meta, generation.token_ids)
        return generation, int(meta.get("cached_tokens") or 0), True

    def _top_p(self, meta: dict, token_ids: list[int]) -> tuple[list[int], list[int]]:
        """meta_info's kept ids (base64 int32 or lists), checked: SLiME would reject them later."""
        if "top_p_token_ids" not in meta or "top_p_token_offsets" not in meta:
            raise PolicyServerError(
                f"{self.base_url}/generate returned no top_p_token_ids although asked "
                "(a server without SLiME's top-p patch?)"
            )
        ids, offsets = decode_int32(meta["top_p_token_ids"]), decode_int32(meta["top_p_token_offsets"])
        if not top_p_offsets_ok(ids, offsets, len(token_ids)):
            raise PolicyServerError(
                f"{self.base_url}/generate returned malformed top-p offsets ({len(offsets)} for "
                f"{len(token_ids)} tokens, {len(ids)} ids)"
            )
        return ids, offsets

    async def _complete(self, input_ids: list[int], params: SamplingParams, rid: str) -> tuple[Generation, int, bool]:
        """The same turn through vLLM's OpenAI completions: token ids in, token ids + logprobs out;
        as _generate_once returns it."""
        if params.return_top_p_token_ids:
            raise PolicyServerError("top-p replay (return_top_p_token_ids) needs the /generate API, not /v1/completions")
        payload = {
            "model": self.lora_path or self.model,  # vLLM: a LoRA adapter is served as a model name
            "prompt": list(input_ids),
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k,
            "stop": list(params.stop) or None,
            "stop_token_ids": list(params.stop_token_ids) or None,
            "seed": params.sampling_seed,
            "ignore_eos": params.ignore_eos,  # vLLM's extra parameter, as SGLang's
            "logprobs": 0,  # the sampled token's logprob only
            "return_token_ids": True,
            "skip_special_tokens": False,
            "include_stop_str_in_output": True,
        }
        before = await self._served_version(unpaused=True)
        reply = await self._post("/completions", payload)
        after = await self._served_version()
        try:
            choice = reply["choices"][0]
            token_ids = [int(t) for t in choice["token_ids"]]
            logprobs = [float(lp) for lp in choice["logprobs"]["token_logprobs"]]
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise PolicyServerError(
                f"{self.base_url}/completions returned no token ids + logprobs ({type(exc).__name__}: {exc}); "
                "the server must honour return_token_ids and logprobs (vLLM >= 0.10.2)"
            ) from exc
        if len(token_ids) != len(logprobs):
            raise PolicyServerError(f"{len(token_ids)} token ids but {len(logprobs)} logprobs")
        finish = choice.get("finish_reason") or "stop"
        # `before` was read while the server was not paused, just before the call went in: the
        # weights it was admitted under. A call a pause aborted ran under them (vLLM's pause
        # aborts before the reload), whatever the label says after.
        trusted = before == after or finish == "abort" or self._version_url is False
        if not trusted:
            # An update finished while the call ran and it was not aborted: it ended just before
            # the pause, or went in as a pause began and ran under the new weights; which is not
            # known. It is sampled again whole (or, not reissuing, unlabelled).
            finish, before = ("abort" if self.reissue_aborted else finish), None
        generation = Generation(token_ids=token_ids, logprobs=logprobs, text=choice.get("text", ""),
                                finish_reason=finish, rid=rid, matched_stop=choice.get("stop_reason"),
                                weight_version=before,
                                version_spans=[(before, 0, len(token_ids))] if before is not None and token_ids else
                                ([] if before is not None else None))
        details = (reply.get("usage") or {}).get("prompt_tokens_details") or {}
        return generation, int(details.get("cached_tokens") or 0), trusted

    async def _served_version(self, unpaused: bool = False) -> str | None:
        """The weight version an OpenAI-compatible server serves now, where it says (vLLM's
        /weight_info, at the root above /v1), read before and after each call: its completions
        carry none, and a call sampled between two equal reads was sampled by that version.
        `unpaused`: read once the server is not paused (vLLM's /is_paused) for an update, whose
        label moves only at its end: a call sent during the pause waits and runs under the new
        weights, so the label read then would be the old one."""
        if self._version_url is False:
            return None
        root = self.base_url.removesuffix("/v1")
        url = self._version_url or root + "/weight_info"
        deadline = asyncio.get_running_loop().time() + self._timeout.total
        while True:
            # Unpaused before and after the read: an update (seconds long) cannot have moved the
            # label in between (its label moves just before it resumes).
            paused = unpaused and await self._paused(root)
            body = await self._get_json(url)
            version = body.get("weight_version") if isinstance(body, dict) else None
            if version is None:
                self._version_url = False  # this server does not say (not vLLM): calls are unlabelled
                return None
            self._version_url = url
            paused = paused or (unpaused and await self._paused(root))
            if not paused or asyncio.get_running_loop().time() > deadline:
                return str(version)
            await asyncio.sleep(0.05)

    async def _paused(self, root: str) -> bool:
        """vLLM's /is_paused; False where the server has none (asked once)."""
        if self._pause_url is False:
            return False
        body = await self._get_json(root + "/is_paused")
        if body is None or "is_paused" not in body:
            self._pause_url = False
            return False
        return body["is_paused"] is True

    async def _get_json(self, url: str) -> dict | None:
        try:
            async with self._http().get(url, timeout=aiohttp.ClientTimeout(total=10.0)) as response:
                body = await response.json(content_type=None) if response.status == 200 else None
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            body = None
        return body if isinstance(body, dict) else None

    async def abort(self, rid: str) -> None:
        """Ask the server to stop a running request (best effort: the trial is ending anyway)."""
        if self.api == "openai":
            return  # no per-request abort in the OpenAI API; closing the connection ends it on vLLM
        if rid in self._in_flight:  # an abort after the call returned must not be remembered
            self._aborting.add(rid)
        try:
            async with self._http().post(f"{self.base_url}/abort_request", json={"rid": rid},
                                         timeout=aiohttp.ClientTimeout(total=5.0)) as response:
                await response.read()
        except (aiohttp.ClientError, asyncio.TimeoutError):
            pass

    async def chat(self, messages: list[dict], max_tokens: int = 256, temperature: float = 0.0) -> str:
        """One OpenAI chat completion's text (api="openai": POST {base_url}/chat/completions): for
        a model that is asked, not trained (the hack monitor's judge)."""
        if self.api != "openai":
            raise ValueError("chat needs api='openai' (an OpenAI-compatible base URL)")
        reply = await self._post("/chat/completions", {"model": self.model, "messages": messages,
                                                      "max_tokens": max_tokens, "temperature": temperature})
        try:
            return reply["choices"][0]["message"]["content"] or ""
        except (KeyError, IndexError, TypeError) as exc:
            raise PolicyServerError(f"{self.base_url}/chat/completions answered no message: {str(reply)[:200]}") from exc

    async def _post(self, path: str, payload: dict, headers: dict[str, str] | None = None) -> dict:
        url = f"{self.base_url}{path}"
        # orjson: a 32k-token input_ids list encodes in ~0.5 ms, not ~5 ms (stdlib json).
        body = orjson.dumps(payload)
        for attempt in range(self.connect_retries + 1):
            try:
                async with self._http().post(url, data=body, headers={"Content-Type": "application/json",
                                                                      **(headers or {})}) as response:
                    status, raw = response.status, await response.read()
                break
            except aiohttp.ClientConnectorError as exc:
                # A router restarting for a weight update refuses connections briefly; a dead one
                # keeps refusing and becomes an infra failure, never a reward.
                if attempt == self.connect_retries:
                    raise PolicyServerError(f"policy server at {self.base_url} is unreachable: {exc}") from exc
                await asyncio.sleep(0.5 * 2**attempt)
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                raise PolicyServerError(f"request to {url} failed: {type(exc).__name__}: {exc}") from exc
        if status != 200:
            raise PolicyServerError(f"{url} answered HTTP {status}: {raw[:500].decode(errors='replace')}",
                                    status_code=status)
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise PolicyServerError(f"{url} answered something that is not JSON: {raw[:200]!r}") from exc

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()


def version_spans(meta: dict, n_tokens: int) -> list[tuple[str, int, int]] | None:
    """meta_info's version spans over a reply's n_tokens tokens (SGLang's weight_versions, else one
    span of its weight_version), empty spans dropped; None when it names no version."""
    spans = meta.get("weight_versions")
    if isinstance(spans, list) and spans:
        out = []
        for span in spans:
            try:
                version, start, end = ((span.get("version"), span.get("start"), span.get("end"))
                                       if isinstance(span, dict) else tuple(span))
                start, end = int(start), int(end)
            except (TypeError, ValueError):  # not a span: the reply's weight_version below
                out = []
                break
            if version is not None and end > start:
                out.append((str(version), start, min(end, n_tokens)))
        if out and out[0][1] == 0 and out[-1][2] == n_tokens and all(a[2] == b[1] for a, b in zip(out, out[1:])):
            return out
    version = meta.get("weight_version")
    if version is None:
        return None
    return [(str(version), 0, n_tokens)] if n_tokens else []


def continued(params: SamplingParams, kept: int, api: str) -> SamplingParams:
    """The sampling of a request that continues a call from its `kept` tokens: the new-token
    budget (and with it the context budget, which the gateway folds into it) shrinks by them.
    The turn's seed stream carries on: SGLang's (and our engine's) noise is keyed by the seed
    and the token's position, so the same seed goes on where it stopped; vLLM draws a seeded
    request's noise in order from its start, so the rest gets a seed of its own (the same one
    would replay the noise of the tokens kept)."""
    if not kept:
        return params
    seed = params.sampling_seed
    if seed is not None and api == "openai":
        seed = (seed * 1_000_003 + kept) % 2**63
    return dataclasses.replace(params, max_new_tokens=max(0, params.max_new_tokens - kept), sampling_seed=seed)


def join(kept: Generation, part: Generation) -> Generation:
    """The tokens kept from an interrupted call, followed by what the request that continued it
    sampled: one completion (ids, logprobs, version spans, top-p replay arrays; the part's end)."""
    if not kept.token_ids and not kept.version_spans:
        part.reissued = kept.reissued
        return part
    n = len(kept.token_ids)
    spans = list(kept.version_spans or [])
    for version, start, end in part.version_spans or []:
        if spans and spans[-1][0] == version and spans[-1][2] == n + start:
            spans[-1] = (version, spans[-1][1], n + end)
        else:
            spans.append((version, n + start, n + end))
    known = kept.version_spans is not None and part.version_spans is not None
    top_p = None, None
    if kept.top_p_token_offsets is not None or part.top_p_token_offsets is not None:
        ids, offsets = kept.top_p_token_ids or [], kept.top_p_token_offsets or [0]
        more_ids, more_offsets = part.top_p_token_ids or [], part.top_p_token_offsets or [0]
        top_p = ids + more_ids, offsets + [offsets[-1] + o for o in more_offsets[1:]]
    return Generation(
        token_ids=kept.token_ids + part.token_ids, logprobs=kept.logprobs + part.logprobs,
        text=kept.text + part.text, finish_reason=part.finish_reason, rid=part.rid, matched_stop=part.matched_stop,
        weight_version=(spans[0][0] if spans else part.weight_version) if known else None,
        version_spans=spans if known else None, top_p_token_ids=top_p[0], top_p_token_offsets=top_p[1],
        reissued=kept.reissued)


def cut(generation: Generation, n: int) -> Generation:
    """The first n tokens of a completion (spans and top-p replay arrays with them)."""
    spans = None if generation.version_spans is None else [
        (v, start, min(end, n)) for v, start, end in generation.version_spans if start < n]
    top_p = generation.top_p_token_ids, generation.top_p_token_offsets
    if top_p[1] is not None:
        top_p = top_p[0][:top_p[1][n]], top_p[1][:n + 1]
    return dataclasses.replace(generation, token_ids=generation.token_ids[:n], logprobs=generation.logprobs[:n],
                               version_spans=spans, top_p_token_ids=top_p[0], top_p_token_offsets=top_p[1])


def decode_int32(value) -> list[int]:
    """An int32 array as SGLang's meta_info carries it: base64 of native int32 bytes, or a list."""
    if isinstance(value, str):
        return array.array("i", base64.b64decode(value)).tolist()
    return [int(v) for v in value]
