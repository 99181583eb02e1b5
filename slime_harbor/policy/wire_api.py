"""How a client talks to a policy server: the wire API, a concept apart from which engine serves it
(an engine declares the one it speaks: policy/engines/). One class per dialect, found by its
`policy_api` name (WIRE_API_TYPES); each says where its requests go and how a prompt is scored
(the weight check's request). Sampling itself is policy/client.py's, one method per dialect.

    GenerateAPI      "sglang": POST {root}/generate with token ids (SGLang's native API, which our
                     embedded server and SGLang's router speak too)
    CompletionsAPI   "openai": POST {base}/completions with token ids (base: the OpenAI base,
                     {root}/v1; vLLM, and any OpenAI-compatible server that returns token ids)
"""

from __future__ import annotations

from typing import ClassVar

import httpx


class UnscoredPrompt(RuntimeError):
    """The server answered a scoring request without the prompt's logprobs (one line)."""


class WireAPI:
    name: ClassVar[str]
    """Its `policy_api` value."""
    lora_prefix: ClassVar[str] = ""
    """Where, under the server's root, its adapter endpoints (load_lora_adapter, ...) are."""

    @classmethod
    def base(cls, root: str) -> str:
        """The URL its sampling requests are made under, from the server's root."""
        return root.rstrip("/")

    @classmethod
    def score(cls, root: str, tokens: list[int], model: str | None, lora_name: str | None,
              timeout_s: float) -> list[float]:
        """log p(token i | tokens before it), i >= 1, at temperature 1, from one prefill on the
        server at ``root``; UnscoredPrompt when it answers none, httpx's errors when unreachable."""
        raise NotImplementedError


class GenerateAPI(WireAPI):
    name = "sglang"

    @classmethod
    def score(cls, root, tokens, model, lora_name, timeout_s):
        # return_logprob + logprob_start_len 0 -> meta_info.input_token_logprobs; max_new_tokens 0:
        # a prefill only (SGLang answers it; ours then draws no sampling seed).
        body = {"input_ids": list(tokens), "sampling_params": {"max_new_tokens": 0, "temperature": 1.0},
                "return_logprob": True, "logprob_start_len": 0}
        if lora_name:
            body["lora_path"] = lora_name
        url = cls.base(root) + "/generate"
        reply = _post_json(url, body, timeout_s)
        try:
            pairs = reply["meta_info"]["input_token_logprobs"][1:]
            if [int(p[1]) for p in pairs] != list(tokens[1:]):
                raise ValueError("its token ids are not the probe's")
            return [float(p[0]) for p in pairs]
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise UnscoredPrompt(f"{url} returned no input_token_logprobs ({type(exc).__name__}: {exc})") from None


class CompletionsAPI(WireAPI):
    name = "openai"
    lora_prefix = "/v1"

    @classmethod
    def base(cls, root: str) -> str:
        root = root.rstrip("/")
        return root if root.endswith("/v1") else root + "/v1"

    @classmethod
    def score(cls, root, tokens, model, lora_name, timeout_s):
        # prompt_logprobs 0 -> choices[0].prompt_logprobs (a LoRA adapter is served as a model name)
        body = {"model": lora_name or model, "prompt": list(tokens), "max_tokens": 1, "temperature": 1.0,
                "prompt_logprobs": 0}
        url = cls.base(root) + "/completions"
        reply = _post_json(url, body, timeout_s)
        try:
            entries = reply["choices"][0]["prompt_logprobs"][1:]
            return [float(entry[str(t)]["logprob"]) for entry, t in zip(entries, tokens[1:], strict=True)]
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise UnscoredPrompt(f"{url} returned no prompt_logprobs ({type(exc).__name__}: {exc})") from None


WIRE_API_TYPES: dict[str, type[WireAPI]] = {api.name: api for api in (GenerateAPI, CompletionsAPI)}
GENERATE_API = GenerateAPI.name
COMPLETIONS_API = CompletionsAPI.name
WIRE_APIS = tuple(WIRE_API_TYPES)
"""The `policy_api` values."""


def _post_json(url: str, body: dict, timeout_s: float) -> dict:
    reply = httpx.post(url, json=body, timeout=timeout_s)
    if reply.status_code != 200:
        raise UnscoredPrompt(f"{url} answered HTTP {reply.status_code}: {reply.text[:200]}")
    try:
        answer = reply.json()
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise UnscoredPrompt(f"{url} answered something other than a JSON object")
    return answer
