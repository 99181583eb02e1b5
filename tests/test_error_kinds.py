"""The errors table (whose each exception is, what happens to its episode): complete, resolvable,
read by frames, and shown in the docs as it is."""

from __future__ import annotations

import importlib
import pkgutil
import traceback
from pathlib import Path

import pydantic
import pytest

import slime_harbor
from slime_harbor import error_kinds
from slime_harbor.error_kinds import INFRASTRUCTURE, KINDS, OURS, OUTCOMES, POLICY, TASK, USER, kind_of, set_up_kind

PACKAGE = Path(slime_harbor.__file__).parent


def test_every_row_names_a_real_exception_class_whose_it_is_and_what_happens():
    for name, row in error_kinds.ERRORS.items():
        cls = getattr(importlib.import_module(error_kinds.module_of(name)), name.rsplit(":", 1)[1])
        assert issubclass(cls, BaseException) and row.whose in KINDS and row.outcome in OUTCOMES, (name, row)
        assert error_kinds.table_name(cls) == name, f"{name} is {error_kinds.table_name(cls)}: named where it is defined"
    names = [name.rsplit(":", 1)[1] for name in error_kinds.ERRORS]
    assert len(names) == len(set(names)), "a recorded exception is found by its class name: no two rows share one"


def package_exception_classes() -> dict[str, type]:
    """Every public Exception subclass the slime_harbor package defines, found by importing each of
    its modules (so a class made at import time counts as well as one written out)."""
    found = {}
    for info in pkgutil.walk_packages(slime_harbor.__path__, "slime_harbor."):
        module = importlib.import_module(info.name)
        for attr, cls in vars(module).items():
            if (isinstance(cls, type) and issubclass(cls, Exception) and cls.__module__ == info.name
                    and not attr.startswith("_")):
                found[error_kinds.table_name(cls)] = cls
    return found


def test_every_exception_class_the_package_declares_has_a_row_or_a_named_base():
    """A new exception class must say whose it is and what happens to the episode it ends (a row,
    or a base that has one), never fall silently into the unnamed rule; private control flow
    (_Name) is exempt."""
    classes = package_exception_classes()
    assert len(classes) > 25 and "environments.docker_exec:ExecServerUnavailable" in classes
    assert {name: cls for name, cls in classes.items() if error_kinds.named_base(cls) is None} == {}
    rows_of_ours = {name for name in error_kinds.ERRORS if error_kinds.module_of(name).startswith("slime_harbor.")}
    assert rows_of_ours <= classes.keys()


def test_a_new_exception_class_without_a_row_fails_the_check(monkeypatch):
    """The check above, shown to catch one: a class added to a module of ours, in no row."""
    import slime_harbor.environments.common as common

    class StrangeSandboxState(Exception):
        pass

    StrangeSandboxState.__module__ = common.__name__
    monkeypatch.setattr(common, "StrangeSandboxState", StrangeSandboxState, raising=False)
    with pytest.raises(AssertionError, match="StrangeSandboxState"):
        test_every_exception_class_the_package_declares_has_a_row_or_a_named_base()


def test_the_docs_show_the_table_as_it_is():
    page = (PACKAGE.parent / "docs" / "commands.md").read_text()
    assert error_kinds.table_markdown() in page, "paste in: python -c \"from slime_harbor.error_kinds import table_markdown; print(table_markdown())\""


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
