"""An HTTP policy server that speaks SGLang's protocol, over the batching SamplingEngine.

It stands in for the SGLang server (and router) SLiME talks to, so the whole chain runs on a
laptop or in tests, and it is the server the local trainer uses to serve its updated weights.

Endpoints:
    POST /generate              SGLang native: input_ids (or text), sampling_params, return_logprob,
                                rid -> text, output_ids, meta_info (output_token_logprobs,
                                finish_reason, prompt/completion tokens, weight_version).
                                sampling_params: temperature, top_p, top_k, max_new_tokens, stop,
                                stop_token_ids, ignore_eos, skip_special_tokens, no_stop_trim,
                                spaces_between_special_tokens, sampling_seed, and
                                custom_params.return_top_p_token_ids (SLiME's top-p replay: meta_info
                                gains top_p_token_ids / top_p_token_offsets, base64 int32 as SLiME's
                                SGLang patch sends them, and logprobs renormalised over the kept ids).
                                The X-SMG-Routing-Key header (SLiME under consistent hashing) is
                                accepted and means nothing to a single server. With
                                return_logprob and logprob_start_len >= 0, meta_info gains
                                input_token_logprobs (the prompt's, as SGLang reports them).
    POST /v1/completions        OpenAI completions as vLLM serves them: the prompt as text or token
                                ids; with return_token_ids, per-choice prompt_token_ids and token_ids;
                                logprobs.token_logprobs for the sampled tokens (token in, token out
                                on an OpenAI-compatible server); prompt_logprobs 0 adds the
                                prompt's, as vLLM reports them
    POST /abort_request         {"rid": ...} or {"abort_all": true}
    POST /update_weights_from_disk   SGLang's: {"model_path", "abort_all_requests"?, "weight_version"?}
                                -> {"success", "message", "num_paused_requests"}; swapped in once the
                                running requests end (new ones wait): each is sampled by one version
    POST /pause_generation      SGLang's (mode abort, SLiME's weight updates): requests in flight
                                end with finish_reason abort, new ones wait for /continue_generation
    POST /load_lora_adapter     SGLang's: {"lora_name", "lora_path"}; requests pick it by name
                                (/generate "lora_path", or the OpenAI "model" field as vLLM does)
    POST /unload_lora_adapter   SGLang's: {"lora_name"}
    POST /continue_generation   SGLang's: admit requests again
    POST /update_weight_version SGLang's and vLLM's: {"new_version": "N"} labels the weights served now
    GET  /model_info, /get_model_info   SGLang 0.5.23's: {"model_path", "weight_version", "lora_adapters"}
                                (it has no /get_weight_version: the version is here)
    GET  /server_info           SGLang's (what policy/probe.py reads): {"engine": "slime-harbor-embedded", "dtype",
                                "version", "max_total_num_tokens", "weight_version"}
    GET  /health, /health_generate, /v1/models, /v1/loads

Run it with `serve(model_dir)` (blocking, the CLI's `slime-harbor serve`) or in-process with
`EmbeddedPolicyServer(model_dir)` (a background thread on a free loopback port).
"""

from __future__ import annotations

import array
import asyncio
import base64
import os
import secrets
import socket
import threading
import time
from functools import cache
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response

from slime_harbor.exits import ConfigError
from slime_harbor.http_api import BadRequest, bad_request_reply, bearer_token, is_loopback, json_object, openai_error
from slime_harbor.policy.embedded_engine import EngineConfig, SamplingEngine
from slime_harbor.policy.engines.abilities import ADMIN_KEY_VAR
from slime_harbor.policy.engines.embedded import SERVER_NAME
from slime_harbor.policy.probe import forget
from slime_harbor.policy.sampling import Generation, SamplingParams

# SGLang sampling params we accept without implementing, with the value that makes them no-ops.
# Any other value would change the distribution the logprobs are reported for, so it is refused.
_NEUTRAL_PARAMS = {
    "n": 1,
    "min_p": 0.0,
    "min_new_tokens": 0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
}
# SGLang params accepted and ignored (SLiME sends none of them).
_IGNORED_PARAMS = {"logit_bias"}


UPDATE_ROUTES = frozenset({"/update_weights_from_disk", "/load_lora_adapter", "/unload_lora_adapter",
                           "/pause_generation", "/continue_generation", "/update_weight_version"})
"""The routes that change what the server samples or when: with an admin key, only a caller holding it
reaches them (a sandbox or another node that reaches the port must not swap the weights)."""


class PolicyServer:
    """The FastAPI app over one SamplingEngine (`.app`). With `admin_key`, UPDATE_ROUTES answer 401
    to a call without it as a bearer token, 403 to another key."""

    def __init__(self, engine: SamplingEngine, model_name: str = "tiny-qwen3", model_path: str | None = None,
                 admin_key: str | None = None):
        self.engine = engine
        self.model_name = model_name
        self.model_path = model_path  # what /get_model_info reports; updated by /update_weights_from_disk
        self.admin_key = admin_key
        self.app = FastAPI(title="slime-harbor policy server")
        self.app.exception_handler(BadRequest)(self._bad_request)
        self.app.exception_handler(ValueError)(self._bad_request)  # e.g. the engine refusing a prompt
        routes = [
            ("POST", "/generate", self.generate),
            ("POST", "/v1/completions", self.completions),
            ("POST", "/abort_request", self.abort_request),
            ("POST", "/update_weights_from_disk", self.update_weights_from_disk),
            ("POST", "/load_lora_adapter", self.load_lora_adapter),
            ("POST", "/unload_lora_adapter", self.unload_lora_adapter),
            ("POST", "/pause_generation", self.pause_generation),
            ("POST", "/continue_generation", self.continue_generation),
            ("POST", "/update_weight_version", self.update_weight_version),
            ("GET", "/model_info", self.model_info),
            ("GET", "/get_model_info", self.model_info),
            ("GET", "/server_info", self.server_info),
            ("GET", "/health", self.health),
            ("GET", "/health_generate", self.health_generate),
            ("GET", "/v1/models", self.models),
            ("GET", "/v1/loads", self.loads),
        ]
        for method, path, handler in routes:
            keyed = [Depends(self._admin)] if path in UPDATE_ROUTES else None
            self.app.add_api_route(path, handler, methods=[method], dependencies=keyed)

    def _admin(self, request: Request) -> None:
        """An update route's caller holds the admin key (where the server has one)."""
        if self.admin_key is None:
            return
        key = bearer_token(request)
        if not key:
            raise HTTPException(401, f"{request.url.path} needs the run's admin key (Authorization: Bearer)")
        if not secrets.compare_digest(key.encode(), self.admin_key.encode()):
            raise HTTPException(403, f"{request.url.path}: this is not the run's admin key")

    # ----- SGLang native ----------------------------------------------------------------------

    async def generate(self, request: Request) -> dict[str, Any]:
        body = await json_object(request)
        if body.get("stream"):
            raise BadRequest("streaming is not supported")
        if "input_ids" in body:
            prompt_ids = body["input_ids"]
            if not isinstance(prompt_ids, list) or not all(isinstance(t, int) for t in prompt_ids):
                raise BadRequest("input_ids must be one list of ints (batched requests are not supported)")
        elif isinstance(body.get("text"), str):
            prompt_ids = self.engine.tokenizer.encode(body["text"], add_special_tokens=False)
        else:
            raise BadRequest("give input_ids (a list of ints) or text (a string)")
        params = generate_sampling_params(body.get("sampling_params") or {})
        lora = body.get("lora_path")
        if lora is not None and not isinstance(lora, str):
            raise BadRequest("lora_path must be the name of one loaded adapter (batched requests are not supported)")
        start = body.get("logprob_start_len")
        if body.get("return_logprob") and start is not None and start >= 0:  # SGLang's prompt logprobs
            if not isinstance(start, int):
                raise BadRequest("logprob_start_len must be an integer")
            scored = await asyncio.to_thread(self.engine.prompt_logprobs, prompt_ids, lora)
        else:
            scored = None
        generation = await self.engine.agenerate(prompt_ids, params, rid=body.get("rid"), lora=lora)
        meta_info: dict[str, Any] = {
            "id": generation.rid,
            "finish_reason": generate_finish_reason(generation),
            "prompt_tokens": len(generation.prompt_ids),
            "completion_tokens": len(generation.token_ids),
            "cached_tokens": 0,
            "weight_version": generation.weight_version,
            # SGLang's spans of the versions that sampled the output: one here, since the engine
            # never swaps weights under a running request
            "weight_versions": [{"version": generation.weight_version, "start": 0, "end": len(generation.token_ids)}],
            "e2e_latency": generation.latency_s,
        }
        if body.get("return_logprob"):
            meta_info["output_token_logprobs"] = [
                [logprob, token, None]
                for logprob, token in zip(generation.logprobs, generation.token_ids, strict=True)
            ]
            if scored is not None:  # SGLang's shape: [logprob, token id, text], None for the first token
                pairs = [[None, prompt_ids[0], None]] + [[lp, t, None] for lp, t in zip(scored, prompt_ids[1:])]
                meta_info["input_token_logprobs"] = pairs[start:]
            if generation.top_p_token_ids:  # like the patched SGLang: only when there are some
                meta_info["top_p_token_ids"], meta_info["top_p_token_offsets"] = encode_top_p_token_ids(
                    generation.top_p_token_ids, generation.top_p_token_offsets
                )
        return {"text": generation.text, "output_ids": generation.token_ids, "meta_info": meta_info}

    async def abort_request(self, request: Request) -> dict[str, Any]:
        body = await json_object(request)
        if body.get("abort_all"):
            return {"aborted": self.engine.abort_all()}
        if not body.get("rid"):
            raise BadRequest('give "rid" or "abort_all": true')
        return {"aborted": int(self.engine.abort(str(body["rid"])))}

    # ----- OpenAI completions (vLLM's) --------------------------------------------------------

    async def completions(self, request: Request) -> dict[str, Any]:
        body = await json_object(request)
        if body.get("stream") or body.get("echo") or body.get("suffix"):
            raise BadRequest("stream, echo and suffix are not supported")
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            prompt_ids = self.engine.tokenizer.encode(prompt, add_special_tokens=False)
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            prompt_ids = prompt
        else:
            raise BadRequest("prompt must be a string or one list of token ids (batched prompts are not supported)")
        if (body.get("logprobs") or 0) > 1:
            raise BadRequest("top logprobs are not supported (logprobs must be 0 or 1)")
        if len(prompt_ids) >= self.engine.context_length:
            raise BadRequest(f"This model's maximum context length is {self.engine.context_length} tokens. "
                             f"However, your request has {len(prompt_ids)} input tokens.")
        params = openai_sampling_params(body, default_max_tokens=self.engine.context_length - len(prompt_ids))
        params.no_stop_trim = bool(body.get("include_stop_str_in_output"))
        lora = self._lora_for_model(body.get("model"))
        if (body.get("prompt_logprobs") or 0) > 0:
            raise BadRequest("top prompt logprobs are not supported (prompt_logprobs must be 0)")
        scored = (await asyncio.to_thread(self.engine.prompt_logprobs, prompt_ids, lora)
                  if body.get("prompt_logprobs") is not None else None)
        generation = await self.engine.agenerate(prompt_ids, params, lora=lora)
        choice: dict[str, Any] = {
            "index": 0,
            "text": generation.text,
            "logprobs": None,
            "finish_reason": generation.finish_reason,
            "stop_reason": generation.matched_stop,
        }
        if body.get("logprobs") is not None:
            tokens = [_token_bytes(self.engine.tokenizer, t).decode("utf-8", errors="replace")
                      for t in generation.token_ids]
            choice["logprobs"] = {
                "tokens": tokens,
                "token_logprobs": generation.logprobs,
                "top_logprobs": [{t: lp} for t, lp in zip(tokens, generation.logprobs, strict=True)],
                "text_offset": [],
            }
        if scored is not None:  # vLLM's shape: None for the first token, then {token id: Logprob}
            choice["prompt_logprobs"] = [None] + [
                {str(t): {"logprob": lp, "rank": None, "decoded_token": self.engine.tokenizer.decode([t])}}
                for lp, t in zip(scored, prompt_ids[1:])]
        if body.get("return_token_ids"):
            choice["prompt_token_ids"] = generation.prompt_ids
            choice["token_ids"] = generation.token_ids
        n_prompt, n_out = len(generation.prompt_ids), len(generation.token_ids)
        return {
            "id": f"cmpl-{generation.rid}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [choice],
            "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out},
        }

    def _lora_for_model(self, model: Any) -> str | None:
        """The adapter an OpenAI request's "model" names: vLLM's "<adapter>" or SGLang's
        "<base>:<adapter>"; anything else samples the base model."""
        if not isinstance(model, str):
            return None
        name = model if model in self.engine.lora_adapters else model.rpartition(":")[2]
        return name if name in self.engine.lora_adapters else None

    # ----- weights (SGLang's HTTP API) ---------------------------------------------------------

    async def update_weights_from_disk(self, request: Request) -> JSONResponse:
        body = await json_object(request)
        path = body.get("model_path")
        if not isinstance(path, str) or not path:
            raise BadRequest("give model_path (a HF checkpoint dir the server can read)")
        version = body.get("weight_version")  # SLiME names each update's version; we count otherwise
        if version is not None and not str(version).isdigit():
            raise BadRequest(f"weight_version must be a non-negative integer here, got {version!r}")
        try:
            version = await asyncio.to_thread(
                self.engine.update_weights_from_disk, path, abort_all=bool(body.get("abort_all_requests")),
                version=None if version is None else int(version),
            )
        except (OSError, ValueError, TimeoutError) as error:
            return JSONResponse(status_code=400, content={"success": False, "message": f"{type(error).__name__}: {error}",
                                                          "num_paused_requests": 0})
        self.model_path = path
        return JSONResponse({"success": True, "message": f"weights loaded from {path} (version {version})",
                             "num_paused_requests": 0})

    async def pause_generation(self, request: Request) -> dict[str, Any]:
        """SGLang's pause_generation in its default mode, abort (the one SLiME's weight updates use):
        the requests in flight end with finish_reason abort; new ones wait until continue_generation."""
        mode = (await json_object(request)).get("mode", "abort")
        if mode != "abort":
            raise BadRequest(f"pause_generation mode {mode!r} is not served here; only abort")
        return {"success": True, "num_aborted_requests": self.engine.pause_generation()}

    async def continue_generation(self) -> dict[str, Any]:
        self.engine.continue_generation()
        return {"success": True}

    async def load_lora_adapter(self, request: Request) -> JSONResponse:
        body = await json_object(request)
        name, path = body.get("lora_name"), body.get("lora_path")
        if not (isinstance(name, str) and name and isinstance(path, str) and path):
            raise BadRequest("give lora_name and lora_path (a peft adapter dir the server can read)")
        return await self._adapter_call(self.engine.load_lora_adapter, name, path)

    async def unload_lora_adapter(self, request: Request) -> JSONResponse:
        name = (await json_object(request)).get("lora_name")
        if not isinstance(name, str) or not name:
            raise BadRequest("give lora_name")
        return await self._adapter_call(self.engine.unload_lora_adapter, name)

    async def _adapter_call(self, method, *args) -> JSONResponse:
        """SGLang's reply to an adapter load / unload: success, error_message (400 on failure)."""
        try:
            await asyncio.to_thread(method, *args)
        except (OSError, ValueError) as error:
            return JSONResponse(status_code=400, content={"success": False, "error_message": f"{type(error).__name__}: {error}"})
        return JSONResponse({"success": True, "error_message": "", "loaded_adapters": dict(self.engine.lora_adapters)})

    async def model_info(self) -> dict[str, Any]:
        return {"model_path": self.model_path, "weight_version": str(self.engine.weight_version),
                "lora_adapters": dict(self.engine.lora_adapters)}

    async def server_info(self) -> dict[str, Any]:
        from slime_harbor import __version__

        return {"engine": SERVER_NAME, "version": __version__, "dtype": self.engine.config.dtype,
                "max_total_num_tokens": self.engine.context_length,
                "weight_version": str(self.engine.weight_version)}

    async def update_weight_version(self, request: Request) -> dict[str, Any]:
        version = (await json_object(request)).get("new_version")
        if not isinstance(version, str) or not version.isdigit():
            raise BadRequest(f"new_version must be a non-negative integer as a string here, got {version!r}")
        self.engine.weight_version = int(version)
        return {"success": True, "new_version": version}

    # ----- status -----------------------------------------------------------------------------

    async def health(self) -> Response:
        return Response(status_code=200)

    async def health_generate(self) -> Response:
        """Healthy only if the engine can actually produce a token."""
        await self.engine.agenerate([self.engine.pad_token_id], SamplingParams(max_new_tokens=1, ignore_eos=True))
        return Response(status_code=200)

    async def models(self) -> dict[str, Any]:
        model = {
            "id": self.model_name,
            "object": "model",
            "created": 0,
            "owned_by": "slime-harbor",
            "max_model_len": self.engine.context_length,
        }
        # vLLM lists each loaded adapter as a model of its own, with the base as its parent.
        adapters = [{**model, "id": name, "parent": self.model_name, "root": path}
                    for name, path in self.engine.lora_adapters.items()]
        return {"object": "list", "data": [model, *adapters]}

    async def loads(self) -> dict[str, Any]:
        running, queued = self.engine.num_pending()
        return {"num_running_reqs": running, "num_waiting_reqs": queued}

    async def _bad_request(self, request: Request, error: Exception) -> JSONResponse:
        if isinstance(error, BadRequest):
            return bad_request_reply(error)
        return openai_error(400, str(error), "invalid_request_error")


def generate_sampling_params(raw: dict[str, Any]) -> SamplingParams:
    """SGLang's `sampling_params` dict -> SamplingParams (400 on anything not supported)."""
    raw = dict(raw)
    _check_neutral(raw)
    for key in _IGNORED_PARAMS:
        raw.pop(key, None)
    try:
        return SamplingParams.from_generate_params(raw)
    except (TypeError, ValueError) as error:
        raise BadRequest(str(error)) from error


def generate_finish_reason(generation: Generation) -> dict[str, Any]:
    """SGLang's meta_info finish_reason: {"type": "stop", "matched": token id | string},
    {"type": "length", "length": tokens} or {"type": "abort", "message": ...}."""
    reason: dict[str, Any] = {"type": generation.finish_reason}
    if generation.finish_reason == "stop" and generation.matched_stop is not None:
        reason["matched"] = generation.matched_stop
    elif generation.finish_reason == "length":
        reason["length"] = len(generation.token_ids)
    elif generation.finish_reason == "abort":
        reason["message"] = "aborted by request"
    return reason


def encode_top_p_token_ids(ids: list[int], offsets: list[int]) -> tuple[str, str]:
    """Generation's flat kept ids and their offsets (token i kept ids[offsets[i]:offsets[i + 1]],
    len(offsets) = tokens + 1) as base64 of native int32, the way SLiME's SGLang patch sends them."""
    return _b64_int32(ids), _b64_int32(offsets)


def _b64_int32(values: list[int]) -> str:
    return base64.b64encode(array.array("i", values).tobytes()).decode("ascii")


def openai_sampling_params(body: dict[str, Any], default_max_tokens: int) -> SamplingParams:
    """An OpenAI completions request (plus vLLM's extras: top_k, ignore_eos, ...) -> SamplingParams."""
    _check_neutral(body)
    if body.get("top_logprobs"):
        raise BadRequest("top_logprobs is not supported")
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or default_max_tokens
    params: dict[str, Any] = {"max_new_tokens": max_tokens}
    for key in ("temperature", "top_p", "top_k", "stop", "stop_token_ids", "ignore_eos", "skip_special_tokens", "seed"):
        if body.get(key) is not None:
            params["sampling_seed" if key == "seed" else key] = body[key]
    return _sampling_params(params)


def _sampling_params(values: dict[str, Any]) -> SamplingParams:
    try:
        return SamplingParams(**values)
    except (TypeError, ValueError) as error:
        raise BadRequest(str(error)) from error


def _check_neutral(raw: dict[str, Any]) -> None:
    for key, neutral in _NEUTRAL_PARAMS.items():
        value = raw.pop(key, None)
        if value is not None and value != neutral:
            raise BadRequest(f"{key}={value!r} is not supported (only {neutral!r})")


@cache
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, inverted: the printable stand-in character -> its byte."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + extra)] = byte
            extra += 1
    return chars


def _token_bytes(tokenizer, token_id: int) -> bytes:
    """The exact bytes one token stands for (a byte-level token may hold part of a character)."""
    piece = tokenizer.convert_ids_to_tokens(token_id)
    if token_id in tokenizer.all_special_ids:
        return piece.encode()
    decoder = _byte_decoder()
    if all(ch in decoder for ch in piece):
        return bytes(decoder[ch] for ch in piece)
    return tokenizer.decode([token_id]).encode()  # not a byte-level vocab


def load_engine(model_dir: str | Path, engine_config: EngineConfig | None = None) -> SamplingEngine:
    import torch

    # The engine shares the machine with agents and sandboxes: keep torch's threads modest.
    torch.set_num_threads(min(torch.get_num_threads(), 2))
    return SamplingEngine.from_pretrained(model_dir, engine_config)


class EmbeddedPolicyServer:
    """A PolicyServer on a background thread, on a free loopback port; started on construction.

    Give `model_dir` to load a model (the server then owns and closes its engine) or `engine` to
    serve one the caller keeps (e.g. a trainer that updates its weights).
    """

    def __init__(
        self,
        model_dir: str | Path | None = None,
        *,
        engine: SamplingEngine | None = None,
        engine_config: EngineConfig | None = None,
        model_name: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        admin_key: str | None = None,
    ):
        import uvicorn

        if (model_dir is None) == (engine is None):
            raise ValueError("give exactly one of model_dir and engine")
        self._owns_engine = engine is None
        self.engine = engine or load_engine(model_dir, engine_config)
        name = model_name or (Path(model_dir).name if model_dir else "policy")
        admin_key = admin_key or os.environ.get(ADMIN_KEY_VAR)
        self.policy = PolicyServer(self.engine, name, str(model_dir) if model_dir else None, admin_key)
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # TCP_NODELAY (asyncio)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))
        self.host, self.port = self._socket.getsockname()[:2]
        self.url = f"http://{self.host}:{self.port}"
        config = uvicorn.Config(self.policy.app, log_level="warning", access_log=False, timeout_graceful_shutdown=5)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, name=f"policy-server-{self.port}", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the embedded policy server did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        """Abort pending requests, stop the HTTP thread, and close the engine if it is ours."""
        self.engine.abort_all()  # in-flight handlers return at once, so shutdown does not wait
        self._server.should_exit = True
        self._thread.join(timeout=30)
        self._socket.close()
        forget(self.url)
        if self._owns_engine:
            self.engine.close()

    def __enter__(self) -> EmbeddedPolicyServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def serve(
    model_dir: str | Path,
    host: str = "127.0.0.1",
    port: int = 30000,
    engine_config: EngineConfig | None = None,
    model_name: str | None = None,
) -> None:
    """Serve `model_dir` until interrupted (Ctrl-C / SIGTERM)."""
    import uvicorn

    admin_key = os.environ.get(ADMIN_KEY_VAR)
    if admin_key is None and not is_loopback(host):
        raise ConfigError(f"serve --host {host} listens beyond loopback: set {ADMIN_KEY_VAR} so that only the "
                          "run holding it can update the served weights")
    engine = load_engine(model_dir, engine_config)
    try:
        policy = PolicyServer(engine, model_name or Path(model_dir).name, str(model_dir), admin_key)
        uvicorn.run(policy.app, host=host, port=port, log_level="info", timeout_graceful_shutdown=5)
    except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C after its graceful shutdown
        pass
    finally:
        engine.close()
