"""A config dataclass's documentation: the docstring under each of its fields, read from its source.

A knob is documented once, where it is declared; the command lines' help (cli.py, train-local), the
native agent's options (agents/native.py), the plugin's settings table and docs/reference.md are derived
from that docstring instead of copying it.
"""

from __future__ import annotations

import ast
import inspect


def field_docs(config_class: type) -> dict[str, str]:
    """{field name: the docstring under it, on one line} of a dataclass, read from its source and
    its bases' (a field declared by a base class is documented there)."""
    docs = {}
    for cls in reversed(config_class.__mro__):
        if cls is object or not hasattr(cls, "__dataclass_fields__"):
            continue
        body = ast.parse(inspect.getsource(cls)).body[0].body
        for node, nxt in zip(body, body[1:]):
            if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
                docs[node.target.id] = " ".join(str(nxt.value.value).split())
    return docs
