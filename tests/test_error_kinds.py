"""The table of whose each deliberate exception is: complete, resolvable, and read by frames."""

from __future__ import annotations

import ast
import traceback
from pathlib import Path

import pydantic
import pytest

import slime_harbor
from slime_harbor import error_kinds
from slime_harbor.error_kinds import INFRASTRUCTURE, KINDS, OURS, POLICY, TASK, USER, kind_of, set_up_kind

PACKAGE = Path(slime_harbor.__file__).parent


def test_every_entry_names_a_real_exception_class_and_a_kind():
    import importlib

    for name, kind in error_kinds.ERROR_KINDS.items():
        module, attr = name.split(":")
        cls = getattr(importlib.import_module(module if module.split(".")[0] == "harbor" else f"slime_harbor.{module}"), attr)
        assert issubclass(cls, BaseException) and kind in KINDS, (name, kind)
        assert error_kinds.table_name(cls) == name, f"{name} is {error_kinds.table_name(cls)}: named where it is defined"


def test_every_exception_class_the_package_declares_is_in_the_table():
    """A new deliberate exception must say whose it is; private control flow (_Name) is exempt."""
    missing = []
    for path in PACKAGE.rglob("*.py"):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                cls = getattr(__import__(module, fromlist=["_"]), node.name, None)
                if isinstance(cls, type) and issubclass(cls, BaseException) and error_kinds.kind_of_class(cls) is None:
                    missing.append(f"{module}:{node.name}")
    assert missing == []


@pytest.mark.parametrize("name, kind", [
    ("PolicyServerError", POLICY), ("ExecTimeoutError", POLICY), ("AgentInstallError", INFRASTRUCTURE),
    ("AgentInstallTimeoutError", INFRASTRUCTURE), ("DockerUnavailableError", INFRASTRUCTURE),
    ("InstanceError", TASK), ("RendererError", USER), ("DockerfileError", TASK), ("ConfigError", USER),
])
def test_the_named_classes_are_classified_by_the_table(name, kind):
    assert error_kinds.kind_of_name(name) == kind


def _raised_in(filename: str, exc: BaseException) -> BaseException:
    scope = {"exc": exc}
    exec(compile("def raising():\n    raise exc\n", filename, "exec"), scope)
    try:
        scope["raising"]()
    except BaseException as caught:
        return caught
    raise AssertionError("did not raise")


def test_an_unnamed_class_is_ours_when_our_code_raised_it_and_not_otherwise(tmp_path):
    ours = str(PACKAGE / "rollout.py")
    assert kind_of(_raised_in(ours, ValueError("x"))) == OURS
    assert kind_of(_raised_in(str(tmp_path / "elsewhere.py"), ValueError("x"))) is None
    from slime_harbor.policy.client import PolicyServerError
    assert kind_of(_raised_in(ours, PolicyServerError("500"))) == POLICY


def test_a_task_file_error_is_the_tasks_only_when_harbor_raised_it(tmp_path):
    import harbor

    harbors = str(Path(harbor.__file__).parent / "models" / "trial" / "config.py")
    assert set_up_kind(_raised_in(harbors, FileNotFoundError("task.toml"))) == TASK
    assert set_up_kind(_raised_in(str(PACKAGE / "trial_setup.py"), FileNotFoundError("ours.json"))) == OURS


def test_a_validation_error_our_code_provokes_is_ours_through_pydantics_frames():
    class Settings(pydantic.BaseModel):
        steps: int

    scope = {"Settings": Settings}
    exec(compile("def build():\n    Settings(steps='many')\n", str(PACKAGE / "run_config.py"), "exec"), scope)
    with pytest.raises(pydantic.ValidationError) as caught:
        scope["build"]()
    assert error_kinds.raised_by_us("".join(traceback.format_exception(caught.value)))
    assert set_up_kind(caught.value) == OURS
