"""The package maps are true: each package's docstring map names every module of its package and
nothing else, and docs/chain.md (the whole package's map) and docs/index.md name only files that
exist, chain.md every module.

A package's map, in its __init__.py docstring, is every line whose first word is `name.py` or
`name/`: one entry per module (name.py) or folder of Python code (name/: a subpackage, or a folder
of modules such as grader_watch/runtime/), __init__.py aside. A module is mentioned again further
down a line as it likes; only the first word makes an entry.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

import slime_harbor

PACKAGE = Path(slime_harbor.__file__).parent
REPO = PACKAGE.parent
ENTRY = re.compile(r"[A-Za-z_]\w*(?:\.py|/)")


def package_modules(package: Path) -> set[str]:
    """What a package's map must name: name.py for each module, name/ for each folder holding Python."""
    modules = {p.name for p in package.glob("*.py") if p.name != "__init__.py"}
    folders = {p.name + "/" for p in package.iterdir() if p.is_dir() and p.name != "__pycache__" and any(p.rglob("*.py"))}
    return modules | folders


def docstring_map(package: Path) -> list[str]:
    """The entries of the package's docstring map (a line's first word, when it is name.py or name/)."""
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    return [words[0] for words in map(str.split, doc.splitlines()) if words and ENTRY.fullmatch(words[0])]


def map_errors(package: Path) -> list[str]:
    """What is wrong with a package's map: modules it leaves out, entries naming no module, entries twice."""
    entries, modules = docstring_map(package), package_modules(package)
    errors = [f"{package.name}/ map leaves out {name}" for name in sorted(modules - set(entries))]
    errors += [f"{package.name}/ map names {name}, which is not there" for name in sorted(set(entries) - modules)]
    errors += [f"{package.name}/ map names {name} twice" for name in sorted({e for e in entries if entries.count(e) > 1})]
    return errors


PACKAGES = sorted(p.parent for p in PACKAGE.rglob("__init__.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_each_package_map_names_exactly_its_modules(package):
    assert map_errors(package) == []


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_each_package_docstring_names_only_files_that_exist(package):
    """Anywhere in the docstring, not only its map's entries (the root's once named agent.py)."""
    files = tracked_files()
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    assert sorted(n for n in named_paths(doc) if not exists(n, files)) == []


def test_the_map_check_sees_a_missing_an_extra_and_a_repeated_entry(tmp_path):
    (tmp_path / "__init__.py").write_text('"""A package.\n\n    a.py     the first\n    gone.py  moved away\n'
                                          '    sub/     a folder\n    a.py     again\n\nprose that says b.py is here\n"""\n')
    for name in ("a.py", "b.py", "sub/x.py"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("")
    (tmp_path / "data").mkdir()  # a folder with no Python in it is no module
    (tmp_path / "data" / "probe.sh").write_text("")
    name = tmp_path.name
    assert map_errors(tmp_path) == [f"{name}/ map leaves out b.py", f"{name}/ map names gone.py, which is not there",
                                    f"{name}/ map names a.py twice"]


# --- docs/chain.md and docs/index.md ---------------------------------------------------------

def tracked_files() -> list[str]:
    return subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()


def named_paths(text: str) -> set[str]:
    """Every file (x.py, a/b.py) or folder (x/) a text names."""
    words = {w.rstrip(".") for w in re.findall(r"[\w./-]+", text)}
    return {w for w in words if re.fullmatch(r"(?:[\w.-]+/)*\w+\.py|(?:[\w.-]+/)*\w+/", w)}


def exists(name: str, files: list[str]) -> bool:
    """A named file or folder is a tracked one's path, or the end of one (chain.md names a module
    under its package's folder, not by its full path)."""
    folder = name.endswith("/")
    return any(("/" + name) in ("/" + f) if folder else ("/" + f).endswith("/" + name) for f in files)


def chain_map() -> str:
    """docs/chain.md's map: its first code block."""
    return (REPO / "docs" / "chain.md").read_text().split("```")[1]


@pytest.mark.parametrize("doc", ["chain.md", "index.md"])
def test_the_docs_maps_name_only_files_that_exist(doc):
    files = tracked_files()
    text = chain_map() if doc == "chain.md" else (REPO / "docs" / doc).read_text()
    assert sorted(n for n in named_paths(text) if not exists(n, files)) == []


def test_chain_md_names_every_module_of_the_package():
    """Each module (by its name, or its path's end) and each folder of Python code is named in the
    chain (a folder also by a path through it: grader_watch/'s runtime/sitecustomize.py)."""
    named = named_paths(chain_map())
    named |= {n[:i + 1] for n in named for i, c in enumerate(n) if c == "/"}
    every = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" and "__pycache__" not in p.parts}
    every |= {str(p.relative_to(PACKAGE)) + "/" for p in PACKAGE.rglob("*")
              if p.is_dir() and "__pycache__" not in p.parts and any(p.rglob("*.py"))}
    left_out = sorted(m for m in every if not any(("/" + m).endswith("/" + n) for n in named))
    assert left_out == []


def test_the_docs_check_sees_a_file_that_is_not_there():
    files = ["slime_harbor/trainers/demo.py", "bench/learning.py", "slime_harbor/policy/engines/base.py"]
    named = named_paths("trainers/ (demo.py; learning.py), policy/engines/ base.py, agent.py and gone/.")
    assert named == {"trainers/", "demo.py", "learning.py", "policy/engines/", "base.py", "agent.py", "gone/"}
    assert sorted(n for n in named if not exists(n, files)) == ["agent.py", "gone/"]
