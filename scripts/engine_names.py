"""Which modules of slime_harbor name a real engine, by issue 48's rule: string literals that are not
docstrings, and identifiers (names, attributes, definitions, arguments, keywords, imports), matching
sglang or vllm in any case, in modules whose file is not named after an engine (sglang.py, vllm.py,
vllm_worker.py are the engines' own). The target: at most 6 such modules.

    python scripts/engine_names.py        one line per module: its count of names, the module
    python scripts/engine_names.py -v     with each name's line
    python scripts/engine_names.py DIR    another copy of the package (an older commit's)
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ENGINE_NAME = re.compile(r"sglang|vllm", re.IGNORECASE)
PACKAGE = Path(sys.argv[-1] if sys.argv[-1:] and Path(sys.argv[-1]).is_dir() else
               Path(__file__).resolve().parent.parent / "slime_harbor")
"""The package looked at: slime_harbor here, or a directory given as the last argument."""


def docstring_nodes(tree: ast.AST) -> set[int]:
    """The ids of string constants that stand alone as statements: docstrings, of modules, classes,
    functions and attributes (the string after an assignment)."""
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        for statement in body if isinstance(body, list) else ():  # a lambda's body is one expression
            if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant) \
                    and isinstance(statement.value.value, str):
                found.add(id(statement.value))
    return found


def engine_names(source: str) -> list[tuple[int, str]]:
    """(line, text) of each name of an engine in ``source``, by the rule above."""
    tree = ast.parse(source)
    docstrings = docstring_nodes(tree)
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = None if id(node) in docstrings else node.value
        else:
            text = (getattr(node, "id", None) if isinstance(node, ast.Name) else
                    node.attr if isinstance(node, ast.Attribute) else
                    node.name if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else
                    node.arg if isinstance(node, (ast.arg, ast.keyword)) else
                    f"{node.name} {node.asname or ''}" if isinstance(node, ast.alias) else None)
        if text and ENGINE_NAME.search(text):
            hits.append((getattr(node, "lineno", 0), text.strip()[:70]))
    return sorted(hits)


def main(verbose: bool) -> int:
    modules = 0
    for path in sorted(PACKAGE.rglob("*.py")):
        if ENGINE_NAME.search(path.stem):
            continue
        hits = engine_names(path.read_text())
        if hits:
            modules += 1
            print(f"{len(hits):3d} {path.relative_to(PACKAGE.parent)}")
            for line, text in hits if verbose else ():
                print(f"      {line}: {text!r}")
    print(f"{modules} modules name sglang or vllm outside the engines' own")
    return 0


if __name__ == "__main__":
    sys.exit(main("-v" in sys.argv[1:]))
