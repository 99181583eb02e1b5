"""Read a task's ``environment/Dockerfile`` into steps that a sandbox without images can replay.

The local sandbox (:mod:`slime_harbor.environments.bubblewrap`) has no image builder: it runs the host's own
tools read-only and gives every trial a private writable root. What a Dockerfile adds on top of
its base image is replayed there, instruction by instruction:

========================  ==========================================================================
Instruction               What happens
========================  ==========================================================================
``FROM image [AS name]``  Ignored: the host's /usr plays the base image (recorded as ``base_image``).
                          A second ``FROM`` (multi-stage build) is an error.
``ARG name[=default]``    Build variable with its default (there is no way to pass build args).
                          ``TARGETOS``/``TARGETARCH``/``TARGETPLATFORM`` (and ``BUILD*``) default to
                          the host's platform, as BuildKit does.
``ENV k=v ...``           Set for later instructions and for every command run in the sandbox.
``WORKDIR path``          Created; the default working directory of commands.
``COPY``/``ADD``          Build-context files copied into the sandbox (``--chmod`` honoured, ``--chown``
                          only to root). ``ADD`` of a local tar archive extracts it.
``RUN``                   Run inside the sandbox during ``start()``; a non-zero exit fails the start
                          with the command's output. Shell form uses ``SHELL`` (default ``/bin/sh -c``).
``SHELL [...]``           Changes the shell of later shell-form ``RUN`` lines.
``USER root`` / ``0``     Accepted (everything runs as root).
``VOLUME path``           The directory is created (it is writable like the rest of the root).
``CMD``, ``ENTRYPOINT``,  Ignored: Harbor replaces the container's command, the task's own
``EXPOSE``, ``LABEL``,    ``[environment].healthcheck`` is what Harbor waits for, and the rest is
``HEALTHCHECK``,          image metadata.
``STOPSIGNAL``,
``MAINTAINER``,
``ONBUILD``
========================  ==========================================================================

Errors (:class:`DockerfileError`, naming file, line and instruction): ``USER`` other than root,
``COPY --from`` and other stage references, ``ADD`` of URLs or git repositories, ``RUN`` flags
(``--mount`` ...), heredocs, a parser ``escape`` other than backslash, sources outside the build
context or missing. ``.dockerignore`` is not read. Note that ``RUN apt-get install ...`` and
anything else needing a package registry fails at start: the host's tools are what there is.
"""

from __future__ import annotations

import fnmatch
import json
import os
import platform
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path

from harbor.environments.base import SandboxBuildFailedError

# What `docker run` puts on PATH when an image sets none; base images set the same value.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

_DEFAULT_SHELL = ("/bin/sh", "-c")
_IGNORED_KEYWORDS = frozenset(
    {"CMD", "ENTRYPOINT", "EXPOSE", "LABEL", "HEALTHCHECK", "STOPSIGNAL", "MAINTAINER", "ONBUILD"}
)
_ROOT_USERS = frozenset({"root", "0"})
_HEREDOC = re.compile(r"(?<!<)<<-?\s*([\"']?)[A-Za-z_][A-Za-z0-9_]*\1")
_URL = re.compile(r"^(https?|git|ssh)://|^git@")


class DockerfileError(SandboxBuildFailedError):
    """A Dockerfile instruction the sandbox cannot honour, or one that failed while building."""


@dataclass(frozen=True)
class Instruction:
    """One logical Dockerfile line (continuations joined)."""

    dockerfile: Path
    line: int
    """1-based line number where the instruction starts."""
    keyword: str
    """Upper-cased instruction name, e.g. ``COPY``."""
    args: str
    """Everything after the keyword, continuations joined."""

    def error(self, reason: str) -> DockerfileError:
        text = f"{self.keyword} {self.args}"
        if len(text) > 200:
            text = text[:200] + " ..."
        return DockerfileError(f"{self.dockerfile}:{self.line}: {text}\n  {reason}")


@dataclass(frozen=True)
class MakeDir:
    """Create a directory (``WORKDIR``, ``VOLUME``)."""

    path: str
    instruction: Instruction


@dataclass(frozen=True)
class CopyEntry:
    """One build-context path copied into the sandbox."""

    source: Path
    """Host path inside the build context (a file or a directory)."""
    dest: str
    """Absolute sandbox path. A directory source's contents go under it."""
    into_dir: bool | None
    """For a file source: True puts it inside ``dest``, False makes it ``dest``, None decides at
    copy time by whether ``dest`` is an existing directory (Docker's rule without a trailing /)."""
    extract: bool = False
    """ADD of a local tar archive: unpack it into ``dest``."""
    mode: int | None = None
    """``--chmod`` bits applied to every copied file and directory."""


@dataclass(frozen=True)
class CopyFiles:
    """``COPY``/``ADD``: entries in order."""

    entries: tuple[CopyEntry, ...]
    instruction: Instruction


@dataclass(frozen=True)
class RunCommand:
    """``RUN``: argv run in the sandbox with this env and working directory."""

    argv: tuple[str, ...]
    env: dict[str, str]
    workdir: str
    instruction: Instruction


Step = MakeDir | CopyFiles | RunCommand


@dataclass(frozen=True)
class BuildRecipe:
    """What a Dockerfile asks for, resolved against its build context."""

    base_image: str | None
    steps: tuple[Step, ...]
    env: dict[str, str]
    """The image's environment (ENV), starting from the default PATH."""
    workdir: str
    """The last WORKDIR, ``/`` if none."""
    ignored: tuple[Instruction, ...] = field(default=())
    """Instructions accepted without effect (CMD, EXPOSE, ...)."""


def parse_dockerfile(dockerfile: Path, context_dir: Path | None = None) -> BuildRecipe:
    """Parse ``dockerfile`` (build context: ``context_dir``, default its folder) into a recipe.

    Raises :class:`DockerfileError` on anything the sandbox cannot honour. Nothing is run here,
    so this is also a cheap way to check which tasks the sandbox can take.
    """
    dockerfile = Path(dockerfile)
    context_dir = (context_dir or dockerfile.parent).resolve()
    return _RecipeBuilder(dockerfile, context_dir).build(_read_instructions(dockerfile))


def _read_instructions(dockerfile: Path) -> list[Instruction]:
    lines = dockerfile.read_text().splitlines()
    index = _check_parser_directives(dockerfile, lines)
    instructions: list[Instruction] = []
    while index < len(lines):
        raw = lines[index]
        index += 1
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        start = index
        text = raw
        # A trailing backslash joins the next line; comment and blank lines inside the
        # instruction are dropped, as Docker does.
        while _continues(text) and index < len(lines):
            nxt = lines[index]
            index += 1
            if not nxt.lstrip().startswith("#") and nxt.strip():
                text = text.rstrip()[:-1] + nxt
        if _continues(text):
            text = text.rstrip()[:-1]
        keyword, *args = text.strip().split(None, 1)
        instructions.append(Instruction(dockerfile, start, keyword.upper(), "".join(args).strip()))
    return instructions


def _continues(text: str) -> bool:
    return text.rstrip().endswith("\\")


def _check_parser_directives(dockerfile: Path, lines: list[str]) -> int:
    """Skip the leading ``# directive=value`` lines; only the default escape is supported."""
    index = 0
    for index, line in enumerate(lines):
        match = re.match(r"^#\s*([a-zA-Z]+)\s*=\s*(\S+)\s*$", line)
        if not match:
            return index
        if match.group(1).lower() == "escape" and match.group(2) != "\\":
            raise DockerfileError(
                f"{dockerfile}:{index + 1}: {line}\n  only the default escape character "
                "(backslash) is supported"
            )
    return len(lines)


class _RecipeBuilder:
    """Walks the instructions once, tracking ARG/ENV/WORKDIR/SHELL as Docker does."""

    def __init__(self, dockerfile: Path, context_dir: Path):
        self.dockerfile = dockerfile
        self.context_dir = context_dir
        self.base_image: str | None = None
        self.global_args: dict[str, str] = {}  # ARGs before FROM: visible to FROM only
        self.args: dict[str, str] = {}
        self.env: dict[str, str] = {"PATH": DEFAULT_PATH}
        self.workdir = "/"
        self.shell: tuple[str, ...] = _DEFAULT_SHELL
        self.steps: list[Step] = []
        self.ignored: list[Instruction] = []

    def build(self, instructions: list[Instruction]) -> BuildRecipe:
        if not any(i.keyword == "FROM" for i in instructions):
            raise DockerfileError(f"{self.dockerfile}: no FROM instruction")
        for instruction in instructions:
            handler = getattr(self, f"_do_{instruction.keyword.lower()}", None)
            if instruction.keyword in _IGNORED_KEYWORDS:
                self.ignored.append(instruction)
            elif handler is None:
                raise instruction.error("unknown or unsupported instruction")
            elif self.base_image is None and instruction.keyword not in ("ARG", "FROM"):
                raise instruction.error("only ARG may come before FROM")
            else:
                handler(instruction)
        return BuildRecipe(
            base_image=self.base_image,
            steps=tuple(self.steps),
            env=dict(self.env),
            workdir=self.workdir,
            ignored=tuple(self.ignored),
        )

    @property
    def variables(self) -> dict[str, str]:
        """What ``$VAR`` expands to in an instruction: build args, overridden by ENV."""
        return {**self.args, **self.env}

    def _words(self, instruction: Instruction, text: str) -> list[str]:
        try:
            return expand_words(text, self.variables)
        except ValueError as e:
            raise instruction.error(str(e)) from None

    def _word(self, instruction: Instruction, text: str) -> str:
        try:
            return expand_word(text, self.variables)
        except ValueError as e:
            raise instruction.error(str(e)) from None

    def _do_from(self, instruction: Instruction) -> None:
        if self.base_image is not None:
            raise instruction.error(
                "multi-stage builds are not supported (the sandbox has no images to build "
                "stages into)"
            )
        try:
            flags, words = _split_flags(expand_words(instruction.args, self.global_args))
        except ValueError as e:
            raise instruction.error(str(e)) from None
        if not words or len(words) not in (1, 3) or (len(words) == 3 and words[1].upper() != "AS"):
            raise instruction.error("expected FROM image [AS name]")
        unknown = set(flags) - {"platform"}
        if unknown:
            raise instruction.error(f"unsupported FROM flag(s): {', '.join(sorted(unknown))}")
        self.base_image = words[0]

    def _do_arg(self, instruction: Instruction) -> None:
        for word in self._words(instruction, instruction.args):
            name, has_default, default = word.partition("=")
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise instruction.error(f"invalid ARG name {name!r}")
            if self.base_image is None:
                self.global_args[name] = default
            elif has_default:
                self.args[name] = default
            elif name in self.global_args:  # re-declared global ARG: takes its default
                self.args[name] = self.global_args[name]
            elif name in _platform_args():
                self.args[name] = _platform_args()[name]
            # else: declared without a value and no build args exist, so it stays unset

    def _do_env(self, instruction: Instruction) -> None:
        first, *rest = instruction.args.split(None, 1) or [""]
        if "=" not in first:
            # Legacy form `ENV KEY value with spaces`.
            if not first or not rest:
                raise instruction.error("expected ENV KEY=VALUE ... or ENV KEY VALUE")
            self.env[first] = self._word(instruction, rest[0])
            return
        # Each pair sees the values set before this instruction, as in Docker.
        pairs = self._words(instruction, instruction.args)
        for pair in pairs:
            name, has_value, value = pair.partition("=")
            if not has_value or not name:
                raise instruction.error(f"expected KEY=VALUE, got {pair!r}")
            self.env[name] = value

    def _do_workdir(self, instruction: Instruction) -> None:
        path = self._word(instruction, instruction.args)
        if not path:
            raise instruction.error("WORKDIR needs a path")
        self.workdir = posixpath.normpath(posixpath.join(self.workdir, path))
        self.steps.append(MakeDir(self.workdir, instruction))

    def _do_volume(self, instruction: Instruction) -> None:
        words = _json_list(instruction.args)
        if words is None:
            words = self._words(instruction, instruction.args)
        for path in words:
            self.steps.append(MakeDir(posixpath.join(self.workdir, path), instruction))

    def _do_user(self, instruction: Instruction) -> None:
        user, _, group = self._word(instruction, instruction.args).partition(":")
        if user not in _ROOT_USERS or (group and group not in _ROOT_USERS):
            raise instruction.error(
                "the sandbox runs every command as root; USER other than root is not supported"
            )

    def _do_shell(self, instruction: Instruction) -> None:
        shell = _json_list(instruction.args)
        if not shell:
            raise instruction.error('SHELL needs the JSON form, e.g. SHELL ["/bin/bash", "-c"]')
        self.shell = tuple(shell)

    def _do_run(self, instruction: Instruction) -> None:
        if _HEREDOC.search(instruction.args):
            raise instruction.error("heredocs are not supported; put the script in a file and COPY it")
        if instruction.args.startswith("--"):
            raise instruction.error("RUN flags (--mount, --network, ...) are not supported")
        exec_form = _json_list(instruction.args)
        argv = tuple(exec_form) if exec_form is not None else (*self.shell, instruction.args)
        if not instruction.args.strip():
            raise instruction.error("RUN needs a command")
        self.steps.append(RunCommand(argv, self.variables, self.workdir, instruction))

    def _do_copy(self, instruction: Instruction) -> None:
        self._copy(instruction, extract=False)

    def _do_add(self, instruction: Instruction) -> None:
        self._copy(instruction, extract=True)

    def _copy(self, instruction: Instruction, *, extract: bool) -> None:
        if _HEREDOC.search(instruction.args):
            raise instruction.error("heredocs are not supported")
        words = _json_list(instruction.args)
        if words is not None:
            words = [self._word(instruction, w) for w in words]
        else:
            words = self._words(instruction, instruction.args)
        flags, words = _split_flags(words)
        mode = self._copy_flags(instruction, flags)
        if len(words) < 2:
            raise instruction.error(f"{instruction.keyword} needs a source and a destination")
        *patterns, dest = words
        dest_is_dir = dest.endswith("/") or dest in (".", "..") or dest.endswith("/.")
        dest = posixpath.normpath(posixpath.join(self.workdir, dest))

        sources: list[Path] = []
        for pattern in patterns:
            if _URL.match(pattern):
                raise instruction.error(
                    f"{instruction.keyword} from a URL or git repository is not supported "
                    "(the sandbox has no network at build time)"
                )
            sources.extend(self._context_paths(instruction, pattern))
        if len(sources) > 1 and not dest_is_dir:
            raise instruction.error(
                "with more than one source the destination must be a directory ending in /"
            )
        entries = []
        for source in sources:
            archive = extract and source.is_file() and _is_tar_archive(source)
            into_dir: bool | None = True if dest_is_dir else None
            entries.append(CopyEntry(source, dest, into_dir, archive, mode))
        self.steps.append(CopyFiles(tuple(entries), instruction))

    def _copy_flags(self, instruction: Instruction, flags: dict[str, str]) -> int | None:
        if "from" in flags:
            raise instruction.error(
                "COPY --from is not supported (no other stages or images exist in the sandbox)"
            )
        chown = flags.pop("chown", None)
        if chown is not None:
            user, _, group = chown.partition(":")
            if user not in _ROOT_USERS or (group and group not in _ROOT_USERS):
                raise instruction.error("--chown to a user other than root is not supported")
        flags.pop("link", None)  # a layer-caching hint; no effect on the result
        chmod = flags.pop("chmod", None)
        if flags:
            raise instruction.error(f"unsupported flag(s): --{', --'.join(sorted(flags))}")
        if chmod is None:
            return None
        if not re.fullmatch(r"[0-7]{3,4}", chmod):
            raise instruction.error(f"--chmod={chmod}: only octal modes are supported")
        return int(chmod, 8)

    def _context_paths(self, instruction: Instruction, pattern: str) -> list[Path]:
        """Build-context paths matching ``pattern`` (Docker's globbing, dotfiles included)."""
        relative = posixpath.normpath(pattern.lstrip("/")) if pattern.strip("/") else "."
        if relative == ".." or relative.startswith("../"):
            raise instruction.error(f"{pattern!r} is outside the build context")
        matches = [self.context_dir]
        if relative != ".":
            for part in relative.split("/"):
                matches = [m / name for m in matches for name in _matching_names(m, part)]
        matches = [m for m in matches if m.exists() or m.is_symlink()]
        for match in matches:
            if not match.resolve().is_relative_to(self.context_dir):
                raise instruction.error(f"{match} is outside the build context")
        if not matches:
            raise instruction.error(
                f"{pattern!r} not found in the build context {self.context_dir}"
            )
        return sorted(matches)


def _matching_names(directory: Path, part: str) -> list[str]:
    if not any(c in part for c in "*?["):
        return [part]
    try:
        names = os.listdir(directory)
    except (NotADirectoryError, FileNotFoundError):
        return []
    return sorted(n for n in names if fnmatch.fnmatchcase(n, part))


def _split_flags(words: list[str]) -> tuple[dict[str, str], list[str]]:
    """Leading ``--name[=value]`` words become flags."""
    flags: dict[str, str] = {}
    while words and words[0].startswith("--"):
        name, _, value = words[0][2:].partition("=")
        flags[name] = value
        words = words[1:]
    return flags, words


def _json_list(text: str) -> list[str] | None:
    """The exec (JSON array) form of an instruction's arguments, if that is what it is."""
    if not text.lstrip().startswith("["):
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    return None


def _is_tar_archive(path: Path) -> bool:
    import tarfile

    try:
        return tarfile.is_tarfile(path)
    except OSError:
        return False


def _platform_args() -> dict[str, str]:
    arch = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(
        platform.machine(), platform.machine()
    )
    values = {"OS": "linux", "ARCH": arch, "PLATFORM": f"linux/{arch}"}
    return {f"{side}{key}": value for side in ("TARGET", "BUILD") for key, value in values.items()}


# --- Docker's word expansion: quotes, backslash escapes and $VAR / ${VAR...} ------------------


def expand_word(text: str, variables: dict[str, str]) -> str:
    """Expand ``text`` as one word (quotes removed, variables substituted, no splitting)."""
    return "".join(_lex(text, variables, split=False)[0])


def expand_words(text: str, variables: dict[str, str]) -> list[str]:
    """Split ``text`` on unquoted whitespace, expanding each word as Docker does."""
    return ["".join(word) for word in _lex(text, variables, split=True)]


def _lex(text: str, variables: dict[str, str], *, split: bool) -> list[list[str]]:
    words: list[list[str]] = []
    current: list[str] = []
    started = False
    i = 0
    quote: str | None = None
    while i < len(text):
        c = text[i]
        if quote == "'":
            if c == "'":
                quote = None
            else:
                current.append(c)
            i += 1
        elif c == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            # Inside double quotes a backslash only escapes these, as in the shell.
            if quote == '"' and nxt not in '"\\$':
                current.append(c)
            current.append(nxt)
            started = True
            i += 2
        elif c == "$":
            value, i = _expand_variable(text, i, variables)
            current.append(value)
            started = True
        elif c in "'\"" and quote is None:
            quote = c
            started = True
            i += 1
        elif c == '"' and quote == '"':
            quote = None
            i += 1
        elif split and quote is None and c.isspace():
            if started:
                words.append(current)
            current, started = [], False
            i += 1
        else:
            current.append(c)
            started = True
            i += 1
    if quote is not None:
        raise ValueError(f"unterminated {quote} quote")
    if started or not split:
        words.append(current)
    return words


def _expand_variable(text: str, i: int, variables: dict[str, str]) -> tuple[str, int]:
    """Expand the ``$`` at ``text[i]``; return the value and the index after it."""
    if i + 1 < len(text) and text[i + 1] == "{":
        end = text.find("}", i + 2)
        if end < 0:
            raise ValueError("unterminated ${")
        body = text[i + 2 : end]
        match = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-+?])(.*))?", body, re.S)
        if not match:
            raise ValueError(f"bad substitution ${{{body}}}")
        name, op, word = match.group(1), match.group(2), match.group(3) or ""
        value = variables.get(name)
        word = expand_word(word, variables) if op else ""
        unset = value is None or (op is not None and op.startswith(":") and value == "")
        if op in ("-", ":-"):
            return (word if unset else value), end + 1
        if op in ("+", ":+"):
            return ("" if unset else word), end + 1
        if op in ("?", ":?"):
            if unset:
                raise ValueError(f"{name}: {word or 'parameter not set'}")
        return value or "", end + 1
    match = re.match(r"[A-Za-z_][A-Za-z0-9_]*", text[i + 1 :])
    if not match:
        return "$", i + 1
    return variables.get(match.group(0), ""), i + 1 + match.end()
