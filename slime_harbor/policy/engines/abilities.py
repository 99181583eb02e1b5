"""What an engine can do beyond sampling, declared in one place (as environments/abilities.py does
for sandboxes). An ability is a class an engine inherits; whoever needs one asks
``isinstance(engine, Ability)`` (``issubclass`` for a kind not yet started), never by an engine's name.
An engine that lacks one simply cannot do it: the trainers then say so and do without (no weight
push: old logprobs are recomputed; no version: its calls are unlabelled; no scoring: no weight check).

    StartsFromVenv     we start it as a child process from its own venv (its set-up script, its
                       command line, what it needs once healthy): policy/engine_launcher.py
    ReportsVersion     says (and takes a label for) the weight version it serves
    ReportsDtype       says the dtype it computes in (the weight check's bound depends on it)
    UpdatesFromDisk    pauses the calls in flight, loads full weights from a path, labels them, resumes
    LoadsLoRA          loads and unloads LoRA adapters by name (rollouts name the one they sample)
    ScoresPrompts      scores a prompt from one prefill through its wire API (the weight check)

The update endpoints answer through `call`, which sends the run's key (`ADMIN_KEY_VAR`) as a bearer
token where the environment holds one: WeightSyncError when the server fails or refuses,
EndpointMissing (one of them) when it does not serve the endpoint at all (404 / 405), which a
trainer in weight sync "auto" reads as "this server takes no pushes".
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar

import httpx


ADMIN_KEY_VAR = "SLIME_HARBOR_ADMIN_KEY"
"""The variable holding the key a policy server's weight-update routes take (our embedded server
refuses them without it where it has one; SGLang's --admin-api-key reads the same bearer token)."""


def admin_headers() -> dict[str, str]:
    """The run's key as a bearer token, for an update call (none where the environment holds none)."""
    import os

    key = os.environ.get(ADMIN_KEY_VAR)
    return {"Authorization": f"Bearer {key}"} if key else {}


class WeightSyncError(RuntimeError):
    """The server refused or failed a weight update: training on would sample stale weights."""


class EndpointMissing(WeightSyncError):
    """The server does not serve an update's endpoint (HTTP 404 or 405)."""


class StartsFromVenv(ABC):
    """A kind we start as a child process, from the venv its set-up script installs (under the
    engines cache, keyed by its version)."""

    setup_script: ClassVar[str]
    """The script that installs its venv (in the repository)."""

    @classmethod
    @abstractmethod
    def venv_name(cls, gpu: bool) -> str:
        """The venv's directory name under the engines cache."""

    @classmethod
    def python(cls, gpu: bool) -> Path:
        """The Python its command runs with (EngineMissing, naming the set-up script, when its venv
        is not installed)."""
        from slime_harbor.cache import cache_dir
        from slime_harbor.policy.engines.base import EngineMissing

        venv = cache_dir() / "engines" / cls.venv_name(gpu)
        python = venv / "bin" / "python"
        if not (venv / ".installed").is_file() or not python.exists():
            raise EngineMissing(f"{cls.name} is not installed (no {venv}): run 'bash {cls.setup_script}' first")
        return python

    @classmethod
    @abstractmethod
    def command(cls, python: Path, model: str, host: str, port: int, gpu: bool,
                env: dict[str, str]) -> list[str]:
        """The argv that serves ``model`` on host:port at weight version INITIAL_WEIGHT_VERSION
        (as far as its flags allow); it may add to ``env``, the engine's environment."""

    @classmethod
    def after_start(cls, url: str) -> None:
        """What a healthy engine still needs before it serves (nothing by default)."""


class ReportsVersion(ABC):
    @abstractmethod
    def weight_version(self) -> str | None:
        """The weight version it serves now (None: it does not say)."""

    @abstractmethod
    def set_weight_version(self, version: str, timeout_s: float = 60.0) -> None:
        """Label the weights it serves (WeightSyncError when it refuses)."""


class ReportsDtype(ABC):
    @abstractmethod
    def dtype(self) -> str | None:
        """The torch dtype it computes in (float32, bfloat16, ...; None: it does not say)."""


class UpdatesFromDisk(ABC):
    pause_modes: ClassVar[tuple[str, ...]]
    """How it can pause the calls in flight for an update (weights.PAUSE_MODES it has)."""

    @abstractmethod
    def update_from_disk(self, path: Path, version: str, pause: str, timeout_s: float) -> None:
        """Pause (``pause``), load the full weights saved at ``path``, label them ``version``, resume
        (resumed even when the load fails). WeightSyncError when any step fails."""


class LoadsLoRA(ABC):
    serves_lora: bool
    """Whether this server loads adapters now (a kind that can may have been started without it)."""

    @abstractmethod
    def load_lora(self, name: str, path: Path, timeout_s: float) -> None:
        """Load the adapter saved at ``path`` under ``name`` (one of that name left by an earlier
        run is unloaded first). WeightSyncError when it fails."""

    @abstractmethod
    def unload_lora(self, name: str, timeout_s: float) -> None:
        """Unload the adapter ``name`` (WeightSyncError when it fails)."""


class ScoresPrompts(ABC):
    def score(self, tokens: list[int], lora_name: str | None = None, timeout_s: float = 120.0) -> list[float]:
        """log p(token i | tokens before it), i >= 1, at temperature 1, from one prefill, through
        its wire API (wire_api.UnscoredPrompt when it answers none)."""
        return self.wire.score(self.url, tokens, self.served_model, lora_name, timeout_s)


def call(url: str, payload: dict, timeout_s: float, check: bool = True) -> bool:
    """POST ``payload`` to an update endpoint; whether it succeeded (200, and no success false). With
    ``check``: EndpointMissing when it is not served, WeightSyncError when it failed. Unreachable:
    WeightSyncError either way."""
    try:
        response = httpx.post(url, json=payload, timeout=timeout_s, headers=admin_headers())
    except httpx.HTTPError as error:
        raise WeightSyncError(f"{url} failed: {type(error).__name__}: {error}") from error
    if check and response.status_code in (404, 405):
        raise EndpointMissing(f"{url} is not served (HTTP {response.status_code})")
    try:
        body = response.json()
    except ValueError:
        body = {}
    ok = response.status_code == 200 and (body.get("success", True) if isinstance(body, dict) else True)
    if not ok and check:
        raise WeightSyncError(f"{url} answered HTTP {response.status_code}: {response.text[:300]}")
    return ok
