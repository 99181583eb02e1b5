"""What a plain task's verifier runs to grade is the image's: a change the agent made to it is found.

A plain Harbor task (shared mode) runs ``tests/test.sh`` in the agent's own sandbox, with the shell,
interpreters and test tools the agent had root over. Replacing ``/bin/bash`` or ``timeout`` with a
script that writes reward 1, a ``.pth`` file that turns every exit status into 0, a ``conftest.py``
that marks every test passed: each would score without solving. Before the verifier runs, the
sandbox reports what the agent changed relative to its image (Docker: the container's diff, from
the daemon; bubblewrap: its overlay's upper directories and root, walked on the host), never by
running anything the agent could have replaced, and `tampering` judges it:

- ``modified_runtime``: a file the image shipped that the verifier's runtime loads was changed or
  deleted: any file of an installed package (dpkg's lists, a Python distribution's RECORD, a
  global npm package), an interpreter's standard library, an interpreter binary. A package upgrade
  of a shipped library is one too.
- ``startup_hook``: code that runs when an interpreter or program starts, added or changed anywhere:
  ``*.pth`` files in a site dir, ``sitecustomize`` / ``usercustomize``, ``/etc/ld.so.preload`` and
  the loader's config, a pytest plugin registered by a new distribution (``pytest11`` entry point),
  an extension module that shadows a shipped module.
- ``shadowed_runtime``: a new file that is found before one the image shipped, so it runs instead:
  a program on PATH before a shipped one of that name (``/usr/local/bin/timeout``), a library of a
  shipped library's name in the loader's path, a Python module or package of a shipped module's
  name in an earlier site dir or at the top of the workdir (``python -m pytest`` imports from there).
- ``modified_test_config``: test-runner configuration where the runner picks it up from outside
  ``/tests``: ``conftest.py``, ``pytest.ini``, ``tox.ini``, ``setup.cfg`` / ``pyproject.toml`` with a
  pytest section, in ``/``, the workdir or a directory between them.
- ``environment_file``: files a shell reads at start (``/etc/environment``, ``/etc/profile``,
  ``/etc/profile.d``, ``/etc/bash.bashrc``, root's ``.bashrc`` / ``.profile`` / ``.bash_profile``).

The rule: new files are allowed; changing or deleting what the image shipped for the runtime is
not. Files the task itself installed that no package owns (a script its Dockerfile copied to
``/usr/local/bin``, a module it put in site-packages) and new modules are the agent's to change.
Compiled bytecode is not judged: the agent's ``.pyc`` files under system dirs are removed before
the verifier (Python recompiles from the checked sources), see `bytecode_to_remove`.

`slime_harbor.grading.isolation` calls this before the verifier and scores a tampered trial 0 without
running it; ``docs/grading.md`` has what each sandbox guarantees.
"""

from __future__ import annotations

import bisect
import functools
import posixpath
import re
from dataclasses import dataclass, field

ADDED, MODIFIED, DELETED = "added", "modified", "deleted"
MOUNTED = "mounted"  # a mount point that appeared or vanished (bubblewrap, whose agent can mount)

MODIFIED_RUNTIME = "modified_runtime"
STARTUP_HOOK = "startup_hook"
SHADOWED_RUNTIME = "shadowed_runtime"
MODIFIED_TEST_CONFIG = "modified_test_config"
ENVIRONMENT_FILE = "environment_file"
MOUNTS = "mounts"  # bubblewrap: a mount the agent made in the sandbox (it could hide a replaced file)
BROKEN_PLUMBING = "broken_plumbing"  # /logs/verifier, /tests, the workdir or the shell made unusable


@dataclass(frozen=True)
class Change:
    """One path the agent's phase changed, relative to the image (``kind``: added/modified/deleted).
    ``is_dir`` when known (Docker's diff does not say; a directory is "modified" when its entries
    change)."""

    path: str
    kind: str
    is_dir: bool | None = None


@dataclass
class RuntimeIndex:
    """The files of the pristine image that belong to its runtime: those an installed package owns
    (never directories), as absolute paths with /bin, /lib ... folded into /usr on merged-usr
    images."""

    owned: set[str] = field(default_factory=set)
    dirs: set[str] = field(default_factory=set)  # the image's directories (Docker's diff does not say)
    merged_usr: dict[str, str] = field(default_factory=dict)  # "/bin" -> "/usr/bin"

    def normalize(self, path: str) -> str:
        path = posixpath.normpath("/" + path.lstrip("/"))
        for link, target in self.merged_usr.items():
            if path == link or path.startswith(link + "/"):
                return target + path[len(link):]
        return path

    def owns(self, path: str) -> bool:
        return path in self.owned

    @functools.cached_property
    def owned_names(self) -> dict[str, set[str]]:
        """Basename -> the owned paths with it (a program on PATH, a library)."""
        names: dict[str, set[str]] = {}
        for path in self.owned:
            names.setdefault(posixpath.basename(path), set()).add(path)
        return names

    @functools.cached_property
    def owned_modules(self) -> dict[str, set[str]]:
        """Top-level Python module name -> the site dirs that ship it (the standard library comes
        before every site dir on sys.path: nothing added there can shadow it)."""
        modules: dict[str, set[str]] = {}
        for path in self.owned:
            m = _MODULE_IN_DIR.match(path)
            if m and _SITE_DIR.search(m["dir"] + "/"):
                modules.setdefault(m["module"], set()).add(m["dir"])
        return modules

    @functools.cached_property
    def owned_sorted(self) -> list[str]:
        return sorted(self.owned)

    def owns_under(self, directory: str) -> str | None:
        """A shipped runtime file inside `directory` (which was deleted whole), or None."""
        prefix = directory.rstrip("/") + "/"
        i = bisect.bisect_left(self.owned_sorted, prefix)
        found = self.owned_sorted[i] if i < len(self.owned_sorted) else None
        return found if found is not None and found.startswith(prefix) else None


# The listing a pristine image prints of itself (run once per image, before any agent): dpkg's file
# lists without directories, each Python distribution's RECORD, global npm packages' files, and
# which top-level dirs are links into /usr. Parsed by `parse_listing`.
LISTING_SCRIPT = r"""
for d in /bin /sbin /lib /lib32 /lib64 /libx32; do [ -L "$d" ] && echo "@link $d $(readlink "$d")"; done
echo "@dpkg"
cat /var/lib/dpkg/info/*.list 2>/dev/null | while IFS= read -r p; do [ -d "$p" ] || echo "$p"; done
for r in $(find / -xdev \( -path /proc -o -path /sys -o -path /dev \) -prune -o -path '*.dist-info/RECORD' -print 2>/dev/null); do
  echo "@record $r"; cat "$r"
done
for m in /usr/lib/node_modules /usr/local/lib/node_modules; do
  [ -d "$m" ] && { echo "@files"; find "$m" -xdev ! -type d 2>/dev/null; }
done
echo "@dirs"
find / -xdev \( -path /proc -o -path /sys -o -path /dev -o -path /tmp \) -prune -o -type d -print 2>/dev/null
echo "@end"
"""


def parse_listing(text: str) -> RuntimeIndex:
    """A RuntimeIndex from what LISTING_SCRIPT printed."""
    index = RuntimeIndex()
    raw: list[str] = []
    dirs: list[str] = []
    section, site_dir = None, ""
    for line in text.splitlines():
        if line.startswith("@link "):
            _, link, target = line.split(" ", 2)
            index.merged_usr[link] = posixpath.normpath(posixpath.join(posixpath.dirname(link), target))
        elif line.startswith("@record "):
            section, site_dir = "record", posixpath.dirname(posixpath.dirname(line[len("@record "):]))
        elif line in ("@dpkg", "@files", "@dirs", "@end"):
            section = line[1:]
        elif not line.strip():
            continue
        elif section in ("dpkg", "files"):
            raw.append(line)
        elif section == "dirs":
            dirs.append(line)
        elif section == "record":
            path = line.rsplit(",", 2)[0] if line.count(",") >= 2 else line.split(",", 1)[0]
            raw.append(posixpath.join(site_dir, path))
    index.dirs = {index.normalize(d) for d in dirs}
    index.owned = {p for p in map(index.normalize, raw) if p not in index.dirs}
    return index


# An interpreter's standard library (not its site dirs), and interpreter binaries: the image's, even
# where no package owns them (python:3.x images build Python from source into /usr/local).
_PREFIX = r"(?:/usr|/usr/local|/opt/[^/]+(?:/[^/]+)?)"
_STDLIB = re.compile(_PREFIX + r"/lib/python\d(?:\.\d+)?/(?!(?:site|dist)-packages/)")
_INTERPRETER = re.compile(_PREFIX + r"/bin/(?:python|pypy|node|perl|ruby|bash|sh|dash)[\d.]*$")
_SITE_DIR = re.compile(r"/(?:site|dist)-packages/")
_PYC = re.compile(r"/__pycache__/[^/]+\.pyc$")
_SHADOWING_SUFFIX = re.compile(r"^(?P<module>[A-Za-z_][A-Za-z0-9_]*)(?:\.[A-Za-z0-9_-]+)?\.(?:so|pyd)$")

# A top-level module in a site dir or a stdlib dir: X.py, X/..., X.<abi tag>.so
_MODULE_IN_DIR = re.compile(r"^(?P<dir>.*/(?:(?:site|dist)-packages|lib/python\d(?:\.\d+)?))/"
                            r"(?P<module>[A-Za-z_][A-Za-z0-9_]*)(?:/|\.py$|(?:\.[A-Za-z0-9_-]+)?\.so$)")
# PATH as images set it (dockerfile.DEFAULT_PATH), /sbin and /bin folded into /usr on merged-usr images
_PATH_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
_LIB_DIRS = re.compile(r"^(?:/usr/local/lib|/usr/lib|/lib|/lib64|/usr/lib64)(?:/[^/]+)?/lib[^/]*\.so[.\d]*$")
# Standard-library modules a test runner imports after the workdir is on sys.path (python -m ...)
_RUNNER_STDLIB = frozenset({"unittest", "doctest", "subprocess", "json", "inspect", "traceback", "argparse"})
_HOOK_NAMES = ("sitecustomize.py", "usercustomize.py")
_LOADER_FILES = re.compile(r"^/etc/ld\.so\.(?:preload|conf|conf\.d/.*)$")
_ENV_FILES = re.compile(r"^(?:/etc/environment|/etc/profile|/etc/profile\.d/.*|/etc/bash\.bashrc|/etc/bashrc"
                        r"|/root/\.(?:bashrc|profile|bash_profile|bash_login|bash_logout))$")
_PYTEST_CONFIG = ("pytest.ini", ".pytest.ini", "tox.ini", "conftest.py")
_PYTEST_SECTION = ("setup.cfg", "pyproject.toml")


def _ancestors(path: str) -> set[str]:
    """`path` and every directory above it ("/" included)."""
    out = {"/"}
    while path not in ("/", ""):
        out.add(path)
        path = posixpath.dirname(path)
    return out


def tampering(changes: list[Change], index: RuntimeIndex, *, workdir: str | None, tests_dir: str = "/tests",
              verifier_dir: str = "/logs/verifier", texts: dict[str, str | None] | None = None) -> dict[str, list[str]]:
    """Kind -> the paths that show it (empty: the verifier's runtime is the image's).

    `texts`: the text of the changed files `texts_needed` names (to tell a pyproject.toml with a
    pytest section, or a dist-info's entry points); one that is missing or None counts as found."""
    found: dict[str, list[str]] = {}
    config_dirs = _ancestors(posixpath.normpath(workdir)) if workdir else {"/"}
    config_dirs |= _ancestors(tests_dir) - {tests_dir}

    def flag(kind: str, path: str) -> None:
        if path not in found.setdefault(kind, []):
            found[kind].append(path)

    def mentions(path: str, *needles: str) -> bool:
        text = (texts or {}).get(path)
        return text is None or any(n in text for n in needles)

    above_logs = _ancestors(posixpath.dirname(verifier_dir)) - {"/"}
    above_workdir = _ancestors(posixpath.normpath(workdir)) - {"/"} if workdir else set()

    for change in changes:
        path = index.normalize(change.path)
        name = posixpath.basename(path)
        if (path == verifier_dir  # Harbor's mount: the agent cannot change it without breaking it
                or path in above_logs and (change.kind == DELETED or change.is_dir is False)
                or path in above_workdir and change.kind == DELETED
                or path == tests_dir and change.kind != DELETED and change.is_dir is False):
            flag(BROKEN_PLUMBING, path)
            continue
        if path == tests_dir or path.startswith(tests_dir + "/") or _PYC.search(path):
            continue  # /tests is emptied before Harbor uploads the tests; bytecode is removed, not judged
        is_dir = change.is_dir if change.is_dir is not None else path in index.dirs
        shipped = index.owns(path) or _STDLIB.match(path) or _INTERPRETER.match(path)
        if change.kind == MOUNTED:
            flag(MOUNTS, path)
            continue
        if change.kind == DELETED:  # a deletion of unknown type may be a whole directory
            maybe_dir = change.is_dir if change.is_dir is not None else True
            if shipped or maybe_dir and (index.owns_under(path) is not None or _STDLIB.match(path + "/")):
                flag(MODIFIED_RUNTIME, path)
            continue
        if is_dir:
            continue  # a directory is "modified" when an entry in it changes; the entries are judged
        if change.kind == MODIFIED and shipped:
            flag(MODIFIED_RUNTIME, path)
            continue
        # added or modified files from here on
        if name.endswith(".pth") and _SITE_DIR.search(path) or name in _HOOK_NAMES or _LOADER_FILES.match(path):
            flag(STARTUP_HOOK, path)
        elif name == "entry_points.txt" and ".dist-info/" in path and mentions(path, "pytest11"):
            flag(STARTUP_HOOK, path)
        elif (m := _SHADOWING_SUFFIX.match(name)) and change.kind == ADDED and (
                _STDLIB.match(path) or _SITE_DIR.search(path)) and _shadows(path, m["module"], index):
            flag(STARTUP_HOOK, path)
        elif change.kind == ADDED and _shadowing(path, index, workdir):
            flag(SHADOWED_RUNTIME, path)
        elif _ENV_FILES.match(path):
            flag(ENVIRONMENT_FILE, path)
        elif posixpath.dirname(path) in config_dirs and (
                name in _PYTEST_CONFIG
                or name in _PYTEST_SECTION and mentions(path, "[tool.pytest", "[pytest]", "[tool:pytest]")):
            flag(MODIFIED_TEST_CONFIG, path)
    return found


_READ_TO_JUDGE = ("pyproject.toml", "setup.cfg", "entry_points.txt")


def texts_needed(changes: list[Change], index: RuntimeIndex) -> list[str]:
    """The changed files whose text `tampering` needs (see its `texts`)."""
    return sorted({index.normalize(c.path) for c in changes
                   if c.kind in (ADDED, MODIFIED) and not c.is_dir and posixpath.basename(c.path) in _READ_TO_JUDGE})


def _shadowing(path: str, index: RuntimeIndex, workdir: str | None) -> bool:
    """Whether a new file at `path` is found before a shipped one of its name (see the docstring)."""
    directory, name = posixpath.split(path)
    path_dirs = [index.normalize(d) for d in _PATH_DIRS]
    if directory in path_dirs:
        later = path_dirs[path_dirs.index(directory) + 1:]
        return any(posixpath.dirname(p) in later for p in index.owned_names.get(name, ()))
    if _LIB_DIRS.match(path):
        return any(p != path for p in index.owned_names.get(name, ()))
    m = _MODULE_IN_DIR.match(path)
    top = m["dir"] if m else None
    if m is None and workdir and (directory == posixpath.normpath(workdir) or
                                  posixpath.dirname(directory) == posixpath.normpath(workdir)):
        m = re.match(r"^(?P<module>[A-Za-z_][A-Za-z0-9_]*)(?:\.py|(?:\.[A-Za-z0-9_-]+)?\.so)?$",
                     name if directory == posixpath.normpath(workdir) else posixpath.basename(directory))
        top = posixpath.normpath(workdir)
        if m and directory != top and name != "__init__.py":
            return False  # only the package's own __init__ makes a directory a module
    if m is None:
        return False
    if top == (posixpath.normpath(workdir) if workdir else None) and m["module"] in _RUNNER_STDLIB:
        return True  # `python -m unittest` / `-m pytest` from the workdir imports these from there
    return any(d != top for d in index.owned_modules.get(m["module"], ()))


def _shadows(path: str, module: str, index: RuntimeIndex) -> bool:
    """An extension module added beside a shipped ``module.py`` or package wins the import."""
    directory = posixpath.dirname(path)
    return (index.owns(f"{directory}/{module}.py") or index.owns_under(f"{directory}/{module}") is not None
            or bool(_STDLIB.match(path)))


def bytecode_to_remove(changes: list[Change], index: RuntimeIndex) -> list[str]:
    """The agent's new or changed ``.pyc`` files under system dirs: a planted cache of a shipped
    module would run instead of its (checked) source, so they are removed before the verifier."""
    paths = (index.normalize(c.path) for c in changes if c.kind != DELETED)
    return sorted({p for p in paths if _PYC.search(p) and p.startswith(("/usr/", "/opt/", "/root/.local/"))})


def describe(found: dict[str, list[str]], limit: int = 3) -> str:
    """One line: 'modified_runtime: /usr/bin/bash, /usr/bin/timeout; startup_hook: ...'."""
    parts = []
    for kind, paths in sorted(found.items()):
        shown = ", ".join(paths[:limit]) + (f" (+{len(paths) - limit} more)" if len(paths) > limit else "")
        parts.append(f"{kind}: {shown}")
    return "; ".join(parts)
