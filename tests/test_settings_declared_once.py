"""Each trajectory filter switch is declared once, as a TrajectoryFilters field (filters.py), and
both runners still take it under the name users write in launch scripts: train-local's
--mask-* flags and the SLiME plugin's harbor_mask_* YAML keys."""

from __future__ import annotations

import ast
import dataclasses
import itertools
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

import slime_harbor
from slime_harbor.filters import TrajectoryFilters

PACKAGE = Path(slime_harbor.__file__).parent
MASK_FIELDS = [f.name for f in dataclasses.fields(TrajectoryFilters)]


def class_field_definitions(package: Path) -> dict[str, list[str]]:
    """field name -> "module.py:Class" of every annotated assignment in a class body, in every
    module of the package: where a dataclass field (or a pydantic one) is written out."""
    found: dict[str, list[str]] = {}
    for path in sorted(package.rglob("*.py")):
        for cls in (n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef)):
            for node in cls.body:
                if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    found.setdefault(node.target.id, []).append(f"{path.relative_to(package)}:{cls.name}")
    return found


def test_each_mask_setting_is_written_out_once_in_the_package():
    """A mask switch's name, default and docstring live in TrajectoryFilters alone: no other class
    declares it again, under its own name or as the plugin's harbor_<name>."""
    defined = class_field_definitions(PACKAGE)
    for name in MASK_FIELDS:
        places = defined.get(name, []) + defined.get(f"harbor_{name}", [])
        assert places == ["filters.py:TrajectoryFilters"], f"{name} declared in {places}"


def test_the_check_sees_a_second_declaration(tmp_path):
    """The scan above finds a mask switch declared again (as a plain field or a harbor_ key)."""
    (tmp_path / "filters.py").write_text("class TrajectoryFilters:\n    mask_timeouts: bool = False\n")
    (tmp_path / "again.py").write_text("class Knobs:\n    x: int = 0\n    harbor_mask_timeouts: bool = False\n")
    assert class_field_definitions(tmp_path)["harbor_mask_timeouts"] == ["again.py:Knobs"]


@pytest.mark.parametrize("chosen", [c for n in range(len(MASK_FIELDS) + 1) for c in itertools.combinations(MASK_FIELDS, n)])
def test_train_local_flags_and_plugin_keys_give_the_same_filters(chosen):
    """--mask-timeouts / --mask-step-limit / --mask-length-limit (train-local) and harbor_mask_*:
    true in the plugin's YAML (SLiME sets each key onto its args) give one TrajectoryFilters."""
    from slime_harbor.hooks import trajectory_filters
    from slime_harbor.trainers.local import config_from_args

    expected = TrajectoryFilters(**{name: True for name in chosen})
    flags = ["--" + name.replace("_", "-") for name in chosen]
    assert config_from_args(flags).filters() == expected
    given_yaml = yaml.safe_load("".join(f"harbor_{name}: true\n" for name in chosen)) or {}
    assert trajectory_filters(SimpleNamespace(**given_yaml)) == expected


def test_the_plugin_declares_a_key_per_mask_setting_with_its_docs():
    """HookSettings has harbor_<name> for every TrajectoryFilters field, its default and its docstring
    (the shipped YAML's comment) taken from there; nothing else named harbor_mask_*."""
    from slime_harbor.config_docs import field_docs
    from slime_harbor.hooks import DEFAULTS, HookSettings

    hook_docs, filter_docs = field_docs(HookSettings), field_docs(TrajectoryFilters)
    assert sorted(k for k in DEFAULTS if k.startswith("harbor_mask_")) == sorted(f"harbor_{n}" for n in MASK_FIELDS)
    for name in MASK_FIELDS:
        assert DEFAULTS[f"harbor_{name}"] is getattr(TrajectoryFilters(), name)
        assert hook_docs[f"harbor_{name}"].startswith(filter_docs[name])
