"""The package's shape: no import circle between its modules, and no module importing another's
private (underscore) names. The tests' shape: each shared piece has one owner (fixtures in
tests/conftest.py, helpers in tests/helpers/), never a test module.

It reads the source (ast), so an import inside a function counts as much as one at the top: a
circle is a circle however late it closes. (Modules are laid out by the concept they own, not by
line count: see docs/chain.md's module map.)
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("slime_harbor", "slime_harbor_verifiers")


def modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of our packages."""
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ours that `name` imports (relative imports resolved; `from pkg import mod`
    counts as importing pkg.mod when that is a module)."""
    is_package = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [module] + [f"{module}.{alias.name}" for alias in node.names]
        for target in targets:
            while target and target not in known:  # a name inside a module: the module
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def test_no_import_circle():
    mods = modules()
    graph = {name: imports_of(name, path, set(mods)) for name, path in mods.items()}
    # A package's __init__ re-exporting its own modules is not a circle through the package.
    for name in graph:
        graph[name] = {t for t in graph[name] if not (name.startswith(t + ".") and (mods[t].name == "__init__.py"))}
    circles, state, stack = [], {}, []

    def visit(node: str) -> None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                circles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert circles == [], "import circles:\n" + "\n".join(" -> ".join(c) for c in circles)


# Our code outside the packages that imports from them: tests, scripts, examples, benchmarks.
IMPORTERS = ("tests", "scripts", "examples", "bench")


def test_no_module_imports_another_modules_private_names():
    """A name another module uses is part of its owner's interface: public (no underscore), or
    moved to the module that uses it. Counts ``from MODULE import _name`` for our modules and the
    test modules (which import each other's helpers); dunders are not private."""
    mods = modules()
    tests = {path.stem for path in (REPO / "tests").glob("*.py")}
    files = [*mods.values(), *(p for d in IMPORTERS for p in sorted((REPO / d).rglob("*.py")))]
    found = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.ImportFrom) or not node.module:
                continue
            ours = node.level or node.module in tests or node.module.split(".")[0] in PACKAGES
            private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
            if ours and private:
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: from {node.module} import {', '.join(private)}")
    assert found == [], "private names imported from another module:\n" + "\n".join(found)


def test_no_test_module_imports_another_or_a_fixture():
    """Tests and helpers import what they share from tests/helpers/, and pytest hands them the
    fixtures of conftest.py: none imports a test module (or conftest), and no fixture comes in by an
    import kept alive with `noqa: F401`."""
    offences = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        where = path.relative_to(REPO)
        text = path.read_text()
        for node in ast.walk(ast.parse(text, filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                targets = [node.module or ""]
            else:
                continue
            for target in targets:
                first = target.removeprefix("tests.").split(".")[0]
                if first.startswith("test_") or first == "conftest":
                    offences.append(f"{where}:{node.lineno} imports {target}")
        comments = [t for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type == tokenize.COMMENT]
        offences += [f"{where}:{t.start[0]} keeps an unused import: {t.string}"
                     for t in comments if "noqa" in t.string and "F401" in t.string]
    assert offences == [], "\n".join(offences)
