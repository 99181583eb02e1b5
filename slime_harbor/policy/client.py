"""Client for SGLang's native `/generate` endpoint (token in, token out), or for OpenAI-compatible
servers (vLLM, verifiers / prime-rl's inference server) through `/v1/completions` with token-id
prompts and token ids + logprobs back (`api="openai"`).

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
import uuid

import aiohttp
import orjson

from slime_harbor.policy.sampling import Generation, SamplingParams
from slime_harbor.samples import top_p_offsets_ok


class PolicyServerError(RuntimeError):
    """The policy server is unreachable or answered something unusable (an infra failure).

    `status_code`: the HTTP status it answered with, None when it could not be reached at all."""

    def __init__(self, message: str, status_code: int | None = None):
        super().__init__(message)
        self.status_code = status_code


API_KINDS = ("sglang", "openai")
MAX_REISSUES = 8
"""Times one call is sampled again after the server aborted it on its own (weight updates)."""


class PolicyClient:
    def __init__(self, base_url: str, request_timeout_sec: float = 600.0, connect_retries: int = 3,
                 lora_path: str | None = None, api: str = "sglang", model: str | None = None,
                 reissue_aborted: bool = False):
        """`api`: sglang (POST {base_url}/generate) | openai (POST {base_url}/completions, base_url
        being the OpenAI base, e.g. http://host:8000/v1; `model` names the served model).
        `reissue_aborted`: sample again a call the server aborted on its own (asynchronous
        training, where that is a weight update); off, such a call comes back aborted (a SLiME
        round ending, an operator's abort_all: the episode ends)."""
        if api not in API_KINDS:
            raise ValueError(f"api must be one of {API_KINDS}, got {api!r}")
        self.base_url = base_url.rstrip("/")
        self.connect_retries = connect_retries
        self.lora_path = lora_path  # SGLang's per-request LoRA adapter (by name); None = the base model
        self._in_flight: set[str] = set()  # rids of generate() calls not yet returned
        self._aborting: set[str] = set()  # those of them this client asked the server to abort
        self.reissue_aborted = reissue_aborted
        self.api, self.model = api, model
        self._version_url: str | bool | None = None  # openai: where the served version is read (False: nowhere)
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

        With reissue_aborted, a call the server aborts on its own is sampled again, whole, with the
        same rid: SGLang's pause_generation (SLiME's weight update) and vLLM's /pause?mode=abort
        abort the requests in flight and hold new ones until the new weights are in, so the caller
        gets one completion sampled by one version, as if the update had come before it. A call
        this client aborted (abort()) comes back aborted."""
        rid = rid or uuid.uuid4().hex
        reissues = MAX_REISSUES if self.reissue_aborted else 0
        self._in_flight.add(rid)
        try:
            attempt = 0
            while True:
                if self.api == "openai":
                    generation = await self._complete(input_ids, params, rid)
                else:
                    generation = await self._generate_once(input_ids, params, rid, routing_key)
                if generation.finish_reason != "abort" or rid in self._aborting or attempt == reissues:
                    generation.reissued = attempt
                    return generation
                await asyncio.sleep(min(0.05 * 2**attempt, 2.0))
                attempt += 1
        finally:
            self._in_flight.discard(rid)
            self._aborting.discard(rid)

    async def _generate_once(self, input_ids: list[int], params: SamplingParams, rid: str,
                             routing_key: str | None) -> Generation:
        payload = {
            "input_ids": input_ids if isinstance(input_ids, list) else list(input_ids),
            # Special tokens and stop strings stay in the text, so text and token ids agree.
            "sampling_params": {**params.to_sglang(), "skip_special_tokens": False, "no_stop_trim": True,
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
        if params.return_top_p_token_ids and params.truncates and generation.token_ids:
            generation.top_p_token_ids, generation.top_p_token_offsets = self._top_p(meta, generation.token_ids)
        return generation

    def _top_p(self, meta: dict, token_ids: list[int]) -> tuple[list[int], list[int]]:
        """meta_info's kept ids (base64 int32 or lists), checked: SLiME would reject them later."""
        if "top_p_token_ids" not in meta or "top_p_token_offsets" not in meta:
            raise PolicyServerError(
                f"{self.base_url}/generate returned no top_p_token_ids although asked "
                "(an SGLang without SLiME's top-p patch?)"
            )
        ids, offsets = decode_int32(meta["top_p_token_ids"]), decode_int32(meta["top_p_token_offsets"])
        if not top_p_offsets_ok(ids, offsets, len(token_ids)):
            raise PolicyServerError(
                f"{self.base_url}/generate returned malformed top-p offsets ({len(offsets)} for "
                f"{len(token_ids)} tokens, {len(ids)} ids)"
            )
        return ids, offsets

    async def _complete(self, input_ids: list[int], params: SamplingParams, rid: str) -> Generation:
        """The same turn through vLLM's OpenAI completions: token ids in, token ids + logprobs out."""
        if params.return_top_p_token_ids:
            raise PolicyServerError("top-p replay (return_top_p_token_ids) needs SGLang's /generate, not /v1/completions")
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
            "logprobs": 0,  # the sampled token's logprob only
            "return_token_ids": True,
            "skip_special_tokens": False,
            "include_stop_str_in_output": True,
        }
        before = await self._served_version()
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
        if before != after and finish != "abort":
            # An update finished while the call ran: which weights sampled it is not known. vLLM
            # aborts the calls in flight when it pauses for an update, so this is a call that
            # ended just before the pause; it is sampled again (or, not reissuing, unlabelled).
            finish, before = ("abort" if self.reissue_aborted else finish), None
        return Generation(token_ids=token_ids, logprobs=logprobs, text=choice.get("text", ""),
                          finish_reason=finish, rid=rid, matched_stop=choice.get("stop_reason"),
                          weight_version=before)

    async def _served_version(self) -> str | None:
        """The weight version an OpenAI-compatible server serves now, where it says (vLLM's
        /weight_info, at the root above /v1), read before and after each call: its completions
        carry none, and a call sampled between two equal reads was sampled by that version."""
        if self._version_url is False:
            return None
        url = self._version_url or self.base_url.removesuffix("/v1") + "/weight_info"
        try:
            async with self._http().get(url, timeout=aiohttp.ClientTimeout(total=10.0)) as response:
                body = await response.json(content_type=None) if response.status == 200 else None
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            body = None
        version = body.get("weight_version") if isinstance(body, dict) else None
        if version is None:
            self._version_url = False  # this server does not say (not vLLM): calls are unlabelled
            return None
        self._version_url = url
        return str(version)

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


def decode_int32(value) -> list[int]:
    """An int32 array as SGLang's meta_info carries it: base64 of native int32 bytes, or a list."""
    if isinstance(value, str):
        return array.array("i", base64.b64decode(value)).tolist()
    return [int(v) for v in value]
