"""What a policy server's URL serves, from the server's own answers, whoever started it: an engine
of one of the kinds in policy/engines/ (ENGINE_KINDS, asked in order), with its context limit and
its abilities. So `--policy-url` takes any engine's root with no other flag.

    probe(url)                 the Engine there (its kind's class; Unrecognised when none answers)
    weight_version(url)        the version it serves now, where its kind says (ReportsVersion)
    server_dtype(url)          float32 | bfloat16 | ..., where its kind says (ReportsDtype)
    forget(url)                called by a server this package stops: the next one on its port is asked anew
"""

from __future__ import annotations

from slime_harbor.policy import engines
from slime_harbor.policy.engines.abilities import ReportsDtype, ReportsVersion
from slime_harbor.policy.engines.base import Engine, ServerAnswers, Unrecognised

_RECOGNISED: dict[str, Engine] = {}
"""Engines already recognised, by root URL (a URL nothing answered yet is asked again next time; a
server this package stops is forgotten, since its port may next serve another kind or nothing)."""


def probe(url: str, timeout: float = 10.0) -> Engine:
    """The engine at ``url`` (a server's root), from its own answers; asked once per URL."""
    url = url.rstrip("/")
    if url in _RECOGNISED:
        return _RECOGNISED[url]
    answers = ServerAnswers(url, timeout)
    for kind in engines.ENGINE_KINDS:  # read now: a kind registered later counts
        engine = kind.recognise(answers)
        if engine is not None:
            _RECOGNISED[url] = engine
            return engine
    return Unrecognised(url, answers.context_len, answers.served_model)


def weight_version(url: str) -> str | None:
    """The weight version ``url`` serves now (None where its kind does not say)."""
    engine = probe(url)
    return engine.weight_version() if isinstance(engine, ReportsVersion) else None


def server_dtype(url: str) -> str | None:
    """The dtype ``url`` computes in (None where its kind does not say)."""
    engine = probe(url)
    return engine.dtype() if isinstance(engine, ReportsDtype) else None


def forget(url: str) -> None:
    """Drop what ``url`` was recognised as: its server stopped."""
    _RECOGNISED.pop(url.rstrip("/"), None)
