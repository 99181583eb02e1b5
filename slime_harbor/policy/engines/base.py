"""What an engine we start is: the one place its kind's differences live (policy/engine_launcher.py
starts any of them the same way, under the parent guard)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import ClassVar

INITIAL_WEIGHT_VERSION = "0"
"""The label of the weights an engine starts with; each update is labelled with the update count."""


class EngineMissing(RuntimeError):
    """The engine's venv is not installed (one line naming the setup script)."""


class Engine:
    """An engine kind we start from its own venv. Subclasses set the class attributes and build
    the command line; the rest is shared."""

    name: ClassVar[str]
    """Its `--engine` name."""
    wire_api: ClassVar[str]
    """One of WIRE_APIS (policy/wire_api.py): how clients sample from it."""
    setup_script: ClassVar[str]
    """The script that installs its venv (in the repository)."""

    @classmethod
    def venv_name(cls, gpu: bool) -> str:
        """The venv's directory name under the engines cache (keyed by the engine's version)."""
        raise NotImplementedError

    @classmethod
    def python(cls, gpu: bool) -> Path:
        """The Python its command runs with: its venv's, installed by its set-up script under the
        engines cache (EngineMissing, naming the script, when it is not there)."""
        from slime_harbor.cache import cache_dir

        venv = cache_dir() / "engines" / cls.venv_name(gpu)
        python = venv / "bin" / "python"
        if not (venv / ".installed").is_file() or not python.exists():
            raise EngineMissing(f"{cls.name} is not installed (no {venv}): run 'bash {cls.setup_script}' first")
        return python

    @classmethod
    def command(cls, python: Path, model: str, host: str, port: int, gpu: bool,
                env: dict[str, str]) -> list[str]:
        """The argv that serves ``model`` on host:port at weight version INITIAL_WEIGHT_VERSION
        (as far as its flags allow); it may add to ``env``, the engine's environment."""
        raise NotImplementedError

    @classmethod
    def after_start(cls, url: str) -> None:
        """What a healthy engine still needs before it serves (nothing by default)."""


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
