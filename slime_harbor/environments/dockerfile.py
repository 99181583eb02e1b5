"""The package's one Dockerfile reader: a task's ``environment/Dockerfile`` as steps that a sandbox
without images can replay (:func:`parse_dockerfile`), and the FROM line that the Docker side builds
on (:func:`single_base_image`, :func:`rebased_dockerfile`, :func:`last_from_end`).

The syntax (parser directives, comments, continuations, JSON/exec forms, builder flags, heredocs)
and the word expansion (quotes, escapes, ``$VAR``, ``${VAR:-default}`` and BuildKit's other
modifiers) are ``e2b_dockerfile_utils``, a port of BuildKit's parser and shell lexer. Kept here is
what no parser on PyPI does right: which variables each instruction sees (ARG before FROM, ARG
re-declared in the stage, ENV), and what each instruction means for the sandbox.

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
(``--mount`` ...), heredocs, sources outside the build context or missing, and what BuildKit's
parser rejects (an unknown instruction, an unterminated quote or heredoc). ``.dockerignore`` is
not read. Note that ``RUN apt-get install ...`` and anything else needing a package registry fails
at start: the host's tools are what there is.
"""

from __future__ import annotations

import fnmatch
import os
import platform
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path

from e2b_dockerfile_utils import DockerfileInstruction, DockerfileSyntaxError, ShellLex, parse_dockerfile_ast
from harbor.environments.base import SandboxBuildFailedError

from slime_harbor.environments.common import ROOT_USERS

# What `docker run` puts on PATH when an image sets none; base images set the same value.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

_DEFAULT_SHELL = ("/bin/sh", "-c")
_IGNORED_KEYWORDS = frozenset(
    {"CMD", "ENTRYPOINT", "EXPOSE", "LABEL", "HEALTHCHECK", "STOPSIGNAL", "MAINTAINER", "ONBUILD"}
)
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
    """Everything after the keyword (flags included), continuations joined."""
    node: DockerfileInstruction = field(repr=False, compare=False)
    """The parser's view of it: flags, args (the JSON form decoded, ENV as key/value/delimiter
    triples), heredocs."""

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
    instructions, escape = read_instructions(dockerfile)
    return _RecipeBuilder(dockerfile, context_dir, escape).build(instructions)


def read_instructions(dockerfile: Path, text: str | None = None) -> tuple[list[Instruction], str]:
    """The Dockerfile's instructions (continuations joined, comments dropped) and its escape
    character. :class:`DockerfileError` where BuildKit's parser stops, naming the line."""
    dockerfile = Path(dockerfile)
    text = dockerfile.read_text() if text is None else text
    try:
        ast = parse_dockerfile_ast(text)
    except DockerfileSyntaxError as e:
        reason = re.sub(r"^Dockerfile parse error( on line \d+)?: ", "", str(e))
        lines = text.split("\n")
        if e.line is None or not 0 < e.line <= len(lines):
            raise DockerfileError(f"{dockerfile}: {reason}") from None
        raise DockerfileError(f"{dockerfile}:{e.line}: {lines[e.line - 1].strip()}\n  {reason}") from None
    instructions = []
    for node in ast.instructions:
        after_keyword = "".join(node.original.strip().split(None, 1)[1:])
        instructions.append(Instruction(dockerfile, node.start_line, node.name, after_keyword, node))
    return instructions, ast.escape_token


class _RecipeBuilder:
    """Walks the instructions once, tracking ARG/ENV/WORKDIR/SHELL as Docker does."""

    def __init__(self, dockerfile: Path, context_dir: Path, escape: str = "\\"):
        self.dockerfile = dockerfile
        self.context_dir = context_dir
        self.escape = escape
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
        """What ``$VAR`` expands to in an instruction: build args, overridden by ENV (before FROM:
        the ARGs declared so far)."""
        if self.base_image is None:
            return dict(self.global_args)
        return {**self.args, **self.env}

    def _word(self, instruction: Instruction, text: str, variables: dict[str, str] | None = None) -> str:
        """``text`` with quotes and escapes removed and variables substituted (unset: empty)."""
        lexer = ShellLex(self.escape, env=self.variables if variables is None else variables, skip_unset_env=False)
        try:
            return lexer.process_word(text)
        except ValueError as e:
            raise instruction.error(str(e)) from None

    def _flags(self, instruction: Instruction) -> dict[str, str]:
        """The builder flags (``--name[=value]``), values expanded."""
        flags = {}
        for flag in instruction.node.flags:
            name, _, value = flag.removeprefix("--").partition("=")
            flags[name] = self._word(instruction, value)
        return flags

    def _do_from(self, instruction: Instruction) -> None:
        if self.base_image is not None:
            raise instruction.error(
                "multi-stage builds are not supported (the sandbox has no images to build "
                "stages into)"
            )
        words = [self._word(instruction, w, self.global_args) for w in instruction.node.args]
        if not words or len(words) not in (1, 3) or (len(words) == 3 and words[1].upper() != "AS"):
            raise instruction.error("expected FROM image [AS name]")
        unknown = set(self._flags(instruction)) - {"platform"}
        if unknown:
            raise instruction.error(f"unsupported FROM flag(s): {', '.join(sorted(unknown))}")
        self.base_image = words[0]

    def _do_arg(self, instruction: Instruction) -> None:
        for word in instruction.node.args:
            name, has_default, default = word.partition("=")
            name, default = self._word(instruction, name), self._word(instruction, default)
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
        # The parser gives (key, value, delimiter) triples; the legacy form `ENV KEY value with
        # spaces` is one triple with an empty delimiter. Each value sees the variables as they
        # were before this instruction, as in Docker.
        args = instruction.node.args
        if not args:
            raise instruction.error("expected ENV KEY=VALUE ... or ENV KEY VALUE")
        values = {}
        for i in range(0, len(args) - 2, 3):
            name = self._word(instruction, args[i])
            if not name:
                raise instruction.error(f"expected KEY=VALUE, got {args[i] + args[i + 2] + args[i + 1]!r}")
            values[name] = self._word(instruction, args[i + 1])
        self.env.update(values)

    def _do_workdir(self, instruction: Instruction) -> None:
        path = self._word(instruction, instruction.node.args[0]) if instruction.node.args else ""
        if not path:
            raise instruction.error("WORKDIR needs a path")
        self.workdir = posixpath.normpath(posixpath.join(self.workdir, path))
        self.steps.append(MakeDir(self.workdir, instruction))

    def _do_volume(self, instruction: Instruction) -> None:
        words = instruction.node.args
        if not instruction.node.json:
            words = [self._word(instruction, w) for w in words]
        for path in words:
            self.steps.append(MakeDir(posixpath.join(self.workdir, path), instruction))

    def _do_user(self, instruction: Instruction) -> None:
        user, _, group = self._word(instruction, instruction.args).partition(":")
        if user not in ROOT_USERS or (group and group not in ROOT_USERS):
            raise instruction.error(
                "the sandbox runs every command as root; USER other than root is not supported"
            )

    def _do_shell(self, instruction: Instruction) -> None:
        shell = instruction.node.args if instruction.node.json else None
        if not shell:
            raise instruction.error('SHELL needs the JSON form, e.g. SHELL ["/bin/bash", "-c"]')
        self.shell = tuple(shell)

    def _do_run(self, instruction: Instruction) -> None:
        node = instruction.node
        if node.heredocs:
            raise instruction.error("heredocs are not supported; put the script in a file and COPY it")
        if node.flags:
            raise instruction.error("RUN flags (--mount, --network, ...) are not supported")
        if not node.args or not any(a.strip() for a in node.args):
            raise instruction.error("RUN needs a command")
        argv = tuple(node.args) if node.json else (*self.shell, node.args[0])
        self.steps.append(RunCommand(argv, self.variables, self.workdir, instruction))

    def _do_copy(self, instruction: Instruction) -> None:
        self._copy(instruction, extract=False)

    def _do_add(self, instruction: Instruction) -> None:
        self._copy(instruction, extract=True)

    def _copy(self, instruction: Instruction, *, extract: bool) -> None:
        if instruction.node.heredocs:
            raise instruction.error("heredocs are not supported")
        words = [self._word(instruction, w) for w in instruction.node.args]
        mode = self._copy_flags(instruction, self._flags(instruction))
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
            if user not in ROOT_USERS or (group and group not in ROOT_USERS):
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


# --- The FROM line, for the Docker side (docker_images.py, tasks/swebench.py) ---------------------


def _plain_single_from(text: str) -> DockerfileInstruction | None:
    """The FROM of a single-stage Dockerfile naming its image literally, without flags."""
    try:
        froms = [node for node in parse_dockerfile_ast(text).instructions if node.name == "FROM"]
    except DockerfileSyntaxError:
        return None  # the build says what is wrong
    if len(froms) != 1:
        return None
    node = froms[0]
    if node.flags or len(node.args) not in (1, 3) or (len(node.args) == 3 and node.args[1].upper() != "AS"):
        return None
    if any(c in node.args[0] for c in "$\"'\\`") or node.args[0].startswith("-"):
        return None  # a variable, a quote or an escape: the image is not the word as written
    return node


def single_base_image(text: str) -> str | None:
    """The image a single-stage Dockerfile's FROM names; None for several FROMs (a multi-stage
    build), a FROM with flags or variables, or text BuildKit cannot parse: such a Dockerfile
    cannot safely be built on another base."""
    node = _plain_single_from(text)
    return node.args[0] if node else None


def rebased_dockerfile(text: str, base_image: str) -> str:
    """The Dockerfile (one :func:`single_base_image` accepts) with its FROM naming ``base_image``,
    its stage name kept; the other lines are left as they are."""
    node = _plain_single_from(text)
    if node is None:
        raise ValueError("not a single-stage Dockerfile with a plain FROM")
    alias = f" {node.args[1]} {node.args[2]}" if len(node.args) == 3 else ""
    lines = text.split("\n")  # the parser's lines: split at \n only
    lines[node.start_line - 1 : node.end_line] = [f"FROM {base_image}{alias}"]
    return "\n".join(lines)


def last_from_end(dockerfile: Path) -> int | None:
    """How many lines of ``dockerfile`` run up to the end of its last FROM instruction (the last
    stage's instructions follow); None without a FROM. :class:`DockerfileError` where BuildKit's
    parser would stop."""
    froms = [i.node for i in read_instructions(dockerfile)[0] if i.keyword == "FROM"]
    return froms[-1].end_line if froms else None
