"""A config dataclass's fields as documentation and as command-line flags: the docstring under each
field, read from its source, and `add_field_flags`, the one function every command (cli.py's,
train-local's, the demo's) turns fields into flags with.

A knob is documented once, where it is declared; the command lines' help, the native agent's
options (agents/native.py), the plugin's settings table and docs/reference.md are derived from
that docstring instead of copying it.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import typing
from collections.abc import Iterable, Mapping


def field_docs(config_class: type) -> dict[str, str]:
    """{field name: the docstring under it, on one line} of a dataclass, read from its source and
    its bases' (a field declared by a base class is documented there)."""
    docs = {}
    for cls in reversed(config_class.__mro__):
        if cls is object or not hasattr(cls, "__dataclass_fields__"):
            continue
        try:
            body = ast.parse(inspect.getsource(cls)).body[0].body
        except (OSError, TypeError):  # a class made by derived_fields + make_dataclass: its docs are in metadata
            body = []
        for node, nxt in zip(body, body[1:]):
            if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
                docs[node.target.id] = " ".join(str(nxt.value.value).split())
    for f in dataclasses.fields(config_class):
        if "doc" in f.metadata:
            docs[f.name] = " ".join(f.metadata["doc"].split())
    return docs


def derived_fields(source: type, names: Mapping[str, str], notes: Mapping[str, str] | None = None) -> list[tuple]:
    """Fields for `dataclasses.make_dataclass`, each the `source` dataclass field it is named after
    (names: new name -> source field): its type, its default and its docstring (plus
    `notes[new name]`, said after it), so a knob another config repeats is declared once."""
    hints, docs = typing.get_type_hints(source), field_docs(source)
    fields = {f.name: f for f in dataclasses.fields(source)}
    out = []
    for name, of in names.items():
        f = fields[of]
        doc = " ".join(filter(None, [docs.get(of, ""), (notes or {}).get(name, "")]))
        default = ({"default_factory": f.default_factory} if f.default_factory is not dataclasses.MISSING
                   else {"default": f.default})
        out.append((name, hints[of], dataclasses.field(**default, metadata={"doc": doc, "declared": f"{source.__name__}.{of}"})))
    return out


def add_field_flags(parser: argparse.ArgumentParser, config_class: type, defaults, *,
                    flags: Mapping[str, str] | None = None, skip: Iterable[str] = (),
                    aliases: Mapping[str, list[str]] | None = None, choices: Mapping[str, Iterable] | None = None,
                    metavars: Mapping[str, str] | None = None, shown_defaults: Mapping[str, str] | None = None,
                    repeatable: Iterable[str] = (), bools: str = "switch", given_only: bool = False) -> None:
    """One flag per field of `config_class` (those `flags` names, field -> flag; else every field
    but `skip`, as --field-name), its type, default and help from the field's declaration:

    - a bool field is a switch (`bools="switch"`: --x sets a field that defaults off; one that
      defaults on takes the flag `flags` gives it, e.g. --no-lora) or takes true / false
      (`bools="value"`);
    - a list field takes several values after one flag, or, in `repeatable`, the flag once per value;
    - `choices[field]`: the values it accepts (argparse refuses the others in one line);
    - `aliases[field]`: more names for the flag; `metavars`; `shown_defaults[field]`: the default
      as the help says it (e.g. "the tiny offline model" for None);
    - `given_only`: a flag not given leaves the field out of the parsed namespace (a preset or the
      config's own default applies), else the flag's default is `defaults`' value."""
    hints, docs = typing.get_type_hints(config_class), field_docs(config_class)
    says_defaults = issubclass(parser.formatter_class, argparse.ArgumentDefaultsHelpFormatter)  # argparse adds them
    names = dict(flags) if flags is not None else {
        f.name: "--" + f.name.replace("_", "-") for f in dataclasses.fields(config_class) if f.name not in set(skip)}
    for name, flag in names.items():
        default = getattr(defaults, name)
        doc = docs.get(name, "").replace("%", "%%")
        shown = (shown_defaults or {}).get(name, default)
        help_text = f"{doc} (default: {shown})" if shown not in (None, []) and not says_defaults else doc
        kwargs: dict = {"dest": name, "default": argparse.SUPPRESS if given_only else default}
        if metavars and name in metavars:
            kwargs["metavar"] = metavars[name]
        hint = one_type(hints[name])
        if hint is bool and bools == "switch":
            parser.add_argument(flag, action="store_false" if default else "store_true", help=doc,
                                **kwargs | ({} if given_only else {"default": default}))
        elif hint is bool:
            parser.add_argument(flag, type=lambda v: v.lower() in ("1", "true", "yes"), help=help_text, **kwargs)
        elif typing.get_origin(hint) is list:
            if name in set(repeatable):
                kwargs["default"] = argparse.SUPPRESS if given_only else list(default or [])
                parser.add_argument(flag, action="append", help=f"{help_text} Repeatable.", **kwargs)
            else:
                parser.add_argument(flag, nargs="+", help=help_text, **kwargs)
        else:
            if choices and name in choices:
                kwargs["choices"] = list(choices[name])
            parser.add_argument(flag, *(aliases or {}).get(name, []), type=hint, help=help_text, **kwargs)


def one_type(hint):
    """A field's annotation without None (`int | None` -> int; `Path | str` -> Path: a path is
    what a flag's text becomes); list[...] stays a list."""
    args = [a for a in typing.get_args(hint) if a is not type(None)] if typing.get_origin(hint) in (typing.Union, _UnionType) else None
    return args[0] if args else hint


_UnionType = type(int | str)
