"""Imports run one way: docs/chain.md's layer map (each line of it stands on the lines below it)
holds for every import in the package, at module level or deferred inside a function, and for
every string that names a module of the package to import (`importlib.import_module("slime_harbor
...")`, an import path "slime_harbor.x:Class" handed to Harbor): none reaches a higher layer, a
folder of the package counting as one node, and the nodes' imports form no circle."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "slime_harbor"
MODULE_NAME = re.compile(r"^slime_harbor(?:\.\w+)+(?::\w+)?$")


def node(module: str) -> str | None:
    """The map's node of a dotted module name: a top-level module, or a folder ("policy/"); None
    for the package itself."""
    parts = module.split(":")[0].split(".")
    if len(parts) < 2:
        return None
    return parts[1] + "/" if (PACKAGE / parts[1]).is_dir() else parts[1]


def layer_map() -> list[list[str]]:
    """docs/chain.md's layers, top first: the fenced block under its "## Layers" heading."""
    text = (REPO / "docs" / "chain.md").read_text()
    block = text.split("## Layers", 1)[1].split("```", 2)[1]
    return [line.split() for line in block.splitlines() if line.strip()]


def imports_of(path: Path) -> list[tuple[str, int]]:
    """(module named, line) for every import of the package in `path`, and every string literal
    that names one of its modules."""
    found = []
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.ImportFrom) and n.module and n.level == 0 and n.module.startswith("slime_harbor"):
            targets = [n.module] if n.module != "slime_harbor" else [f"slime_harbor.{a.name}" for a in n.names]
            found += [(t, n.lineno) for t in targets]
        elif isinstance(n, ast.Import):
            found += [(a.name, n.lineno) for a in n.names if a.name.startswith("slime_harbor")]
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and MODULE_NAME.match(n.value):
            found.append((n.value, n.lineno))
    return found


def package_nodes() -> set[str]:
    return {p.name + "/" if p.is_dir() else p.stem for p in PACKAGE.iterdir()
            if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.name != "__init__.py")}


def edges() -> dict[tuple[str, str], list[str]]:
    """(importing node, imported node) -> where, for every import between two nodes."""
    nodes = package_nodes()
    out: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in PACKAGE.rglob("*.py"):
        if "cpu_shims" in path.parts:  # stands in for another package, on another process's path
            continue
        source = node(".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"))
        for module, line in imports_of(path):
            target = node(module)
            if source in nodes and target in nodes and target != source:
                out[(source, target)].append(f"{path.relative_to(REPO)}:{line}")
    return out


def test_every_import_stands_on_a_lower_or_the_same_layer_and_none_goes_round():
    layers = layer_map()
    level = {name: len(layers) - i for i, line in enumerate(layers) for name in line}
    nodes = package_nodes()
    assert nodes - level.keys() == set(), f"docs/chain.md's layer map does not place: {sorted(nodes - level.keys())}"
    assert level.keys() - nodes == set(), f"docs/chain.md's layer map names what is not there: {sorted(level.keys() - nodes)}"
    found = edges()
    upward = {f"{a} -> {b}": where for (a, b), where in found.items() if level[b] > level[a]}
    assert not upward, f"imports from a lower layer to a higher one: {upward}"
    graph = defaultdict(set)
    for a, b in found:
        graph[a].add(b)
    circle = find_circle(graph)
    assert circle is None, f"imports go round: {' -> '.join(circle)} ({[found[(x, y)][0] for x, y in zip(circle, circle[1:])]})"


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of `graph` as its nodes (the first repeated at the end), or None."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(v: str) -> list[str] | None:
        state[v] = 1
        path.append(v)
        for w in sorted(graph.get(v, ())):
            if state.get(w) == 1:
                return path[path.index(w):] + [w]
            if w not in state and (circle := visit(w)):
                return circle
        state[v] = 2
        path.pop()
        return None

    for v in sorted(graph):
        if v not in state and (circle := visit(v)):
            return circle
    return None


def test_the_layer_check_finds_an_upward_import_and_a_circle():
    """The check itself: a map where a lower node imports a higher one is caught, and so is a circle."""
    level = {"rollout": 2, "converter": 1}
    found = {("converter", "rollout"): ["slime_harbor/converter.py:1"]}
    assert [f"{a} -> {b}" for (a, b) in found if level[b] > level[a]] == ["converter -> rollout"]
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_circle({"a": {"b"}, "b": {"c"}}) is None
    assert node("slime_harbor.agents.native:NativeAgent") == "agents/" and node("slime_harbor.rollout") == "rollout"
