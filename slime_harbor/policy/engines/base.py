"""What an engine is: a policy server at a URL, of one kind, whoever started it. The kind's class is
the one place its differences live; what it can do beyond sampling it declares as abilities
(engines/abilities.py), the way our sandboxes declare theirs.

    Engine            a kind: its name (probe's kind; the `--engine` name of one we start), the wire
                      API it speaks (policy/wire_api.py), and `recognise`, which tells it from a
                      server's own answers
    ServerAnswers     a server's answers to the GETs kinds are told apart by, each asked once
    Unrecognised      a URL no kind recognised (not up, or not a policy server): the default wire
                      API, whose requests will say what is wrong
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import ClassVar

import httpx

from slime_harbor.policy.wire_api import GENERATE_API, WIRE_API_TYPES, WireAPI

INITIAL_WEIGHT_VERSION = "0"
"""The label of the weights an engine starts with; each update is labelled with the update count."""


class EngineMissing(RuntimeError):
    """The engine's venv is not installed (one line naming the setup script)."""


class ServerAnswers:
    """The JSON objects a server's root answers on GET ``path`` (None: no answer, not 200, not an
    object), each asked at most once."""

    def __init__(self, url: str, timeout: float = 10.0):
        self.url, self.timeout = url.rstrip("/"), timeout
        self._answers: dict[str, dict | None] = {}

    def get(self, path: str) -> dict | None:
        if path not in self._answers:
            self._answers[path] = get_json(self.url + path, self.timeout)
        return self._answers[path]

    @property
    def models(self) -> list[dict]:
        """Its OpenAI /v1/models list."""
        return [m for m in (self.get("/v1/models") or {}).get("data") or [] if isinstance(m, dict)]

    @property
    def context_len(self) -> int | None:
        """The lowest max_model_len its /v1/models states."""
        return min((int(m["max_model_len"]) for m in self.models if m.get("max_model_len")), default=None)

    @property
    def served_model(self) -> str | None:
        """The first model name its /v1/models lists (the OpenAI API's model field)."""
        models = self.models
        return str(models[0]["id"]) if models and models[0].get("id") else None


class Engine:
    """A policy server of one kind at ``url``. Subclasses set the class attributes, recognise their
    kind from a server's answers, and declare their abilities (engines/abilities.py)."""

    name: ClassVar[str]
    """The kind: what probe reports, and the `--engine` name of one we start."""
    wire_api: ClassVar[str]
    """One of WIRE_APIS (policy/wire_api.py): how clients sample from it."""

    def __init__(self, url: str, context_len: int | None = None, served_model: str | None = None,
                 serves_lora: bool = False):
        self.url = url.rstrip("/")
        self.context_len = context_len
        """Prompt + completion tokens one request may hold on this server (None: it does not say)."""
        self.served_model = served_model
        """The first model name its /v1/models lists (the OpenAI API's model field)."""
        self.serves_lora = serves_lora
        """Whether it loads LoRA adapters by name now (ours always; SGLang started with --enable-lora)."""

    @classmethod
    def recognise(cls, answers: ServerAnswers) -> Engine | None:
        """This kind's engine at answers.url, if its answers are this kind's; else None."""
        return None

    @property
    def kind(self) -> str:
        return self.name

    @property
    def api(self) -> str:
        """Its wire API's `policy_api` name."""
        return self.wire_api

    @property
    def wire(self) -> type[WireAPI]:
        return WIRE_API_TYPES[self.wire_api]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r}, context_len={self.context_len})"


class Unrecognised(Engine):
    """A URL that answered none of the kinds' questions: not up yet, or not a policy server. It is
    sampled with the default wire API, whose requests then say what is wrong."""

    name = "unknown"
    wire_api = GENERATE_API


def get_json(url: str, timeout: float = 10.0) -> dict | None:
    """GET ``url``'s JSON object (None: unreachable, not 200, not an object)."""
    try:
        reply = httpx.get(url, timeout=timeout)
    except (httpx.HTTPError, httpx.InvalidURL):
        return None
    if reply.status_code != 200:
        return None
    try:
        body = reply.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def package_path() -> Path:
    """A directory holding only the slime_harbor package (a link to it), for an engine's
    PYTHONPATH: the directory it is installed in may hold this venv's other packages too."""
    from slime_harbor.cache import cache_dir

    package = Path(__file__).resolve().parents[2]
    root = cache_dir() / "engines" / "slime-harbor-path"
    link = root / "slime_harbor"
    if not (link.is_symlink() and link.resolve() == package):
        root.mkdir(parents=True, exist_ok=True)
        temporary = root / f".slime_harbor.{os.getpid()}"
        temporary.unlink(missing_ok=True)
        temporary.symlink_to(package, target_is_directory=True)
        temporary.replace(link)  # atomic: engines started at once never see it missing
    return root
