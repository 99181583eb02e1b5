"""Whose an error is: the one table of the exception classes we raise on purpose, and the rule for
everything else.

Each class we raise on purpose is named once in ERROR_KINDS with whose mistake it reports:

    task            the task's files or data (a Dockerfile we cannot use, an SWE instance)
    user            a setting, a flag, a model or a host the user chose
    infrastructure  the machine, the sandbox or a service we do not control went wrong
    policy          the policy's server or engine failed or refused
    ours            a slime-harbor bug (said loudly, never blamed on a task)

A subclass is classified as its nearest named base. An exception of a class the table does not
name is ours when our own code raised it, whatever its type: the traceback's innermost frame
(pydantic's validators skipped, since they raise on behalf of the code that called them) lies in
the slime_harbor package. Raised anywhere else (Harbor reading a task, a library, a Harbor agent)
it is the trial's own failure, as Harbor records it.

A task's files read by Harbor raise plain FileNotFoundError, NotADirectoryError, TOMLDecodeError or
pydantic's ValidationError: those are the task's mistake only when Harbor raised them
(`task_mistake`); the same types raised by our code are bugs of ours.
"""

from __future__ import annotations

import re
import traceback
from pathlib import Path

TASK, USER, INFRASTRUCTURE, POLICY, OURS = "task", "user", "infrastructure", "policy", "ours"
KINDS = (TASK, USER, INFRASTRUCTURE, POLICY, OURS)

ERROR_KINDS: dict[str, str] = {
    "exits:ConfigError": USER,
    "exits:Interrupted": USER,
    "cli:CommandFailed": USER,
    "hooks:HookConfigError": USER,
    "http_api:BadRequest": USER,
    "policy.renderer:RendererError": USER,
    "policy.engines.base:EngineMissing": USER,
    "tasks.swebench:InstanceError": TASK,
    "environments.dockerfile:DockerfileError": TASK,
    "environments.common:SandboxFileNotFoundError": TASK,
    "grading.isolation:VerifierRefused": TASK,
    "environments.common:ExecTimeoutError": POLICY,
    "policy.client:PolicyServerError": POLICY,
    "gateway.session:PolicyUnavailable": POLICY,
    "policy.engines.abilities:WeightSyncError": POLICY,
    "policy.engines.abilities:EndpointMissing": POLICY,
    "policy.wire_api:UnscoredPrompt": POLICY,
    "policy.weight_check:WeightMismatch": POLICY,
    "environments.common:SandboxError": INFRASTRUCTURE,
    "environments.docker_images:DockerUnavailableError": INFRASTRUCTURE,
    "environments.docker_exec:ExecServerError": INFRASTRUCTURE,
    "environments.gateway_reach:GatewayReachError": INFRASTRUCTURE,
    "agents.installed.installs:AgentInstallError": INFRASTRUCTURE,
    "tasks.swebench_grade:InfraFailure": INFRASTRUCTURE,
    # Harbor's own classes that our sandboxes raise on purpose (named by their full module)
    "harbor.environments.base:SandboxBuildFailedError": TASK,
    "harbor.environments.base:ServiceOperationsUnsupportedError": USER,
    "rollout:InternalErrorBudgetSpent": OURS,
    "rollout:RecordedBug": OURS,
}
"""Each exception class raised on purpose ("module:Class", the module within slime_harbor) and whose
mistake it reports (a class of another package, raised by our code on purpose: its full module).
Names, not imports: a class is looked up by its module and name, so the table
stands below every module whose classes it names (tests/test_error_kinds.py resolves each)."""

TASK_FILE_ERRORS = ("FileNotFoundError", "NotADirectoryError", "TOMLDecodeError", "ValidationError")
"""What Harbor raises for a task's malformed or missing files; the task's only when Harbor raised it."""

PACKAGE_DIR = str(Path(__file__).resolve().parent)
_FRAME = re.compile(r'^\s*File "([^"]+)", line \d+', re.M)
_VALIDATOR_PARTS = ("/pydantic/", "/pydantic_core/")


def table_name(cls: type) -> str:
    """A class's key in ERROR_KINDS ("module:Class", the module within slime_harbor)."""
    return f"{cls.__module__.removeprefix('slime_harbor.')}:{cls.__qualname__}"


def kind_of_class(cls: type) -> str | None:
    """Whose an exception class is by the table (its nearest named base), or None if unnamed."""
    for base in cls.__mro__:
        if (kind := ERROR_KINDS.get(table_name(base))) is not None:
            return kind
    return None


def kind_of_name(type_name: str) -> str | None:
    """The same for a class known only by its name (an exception Harbor recorded in a trial): a
    class of ours (or one the table names) by that name among those this process has loaded (the
    trial raised it here)."""
    todo = [BaseException]
    while todo:
        cls = todo.pop()
        if cls.__name__ == type_name and (cls.__module__.startswith("slime_harbor.") or table_name(cls) in ERROR_KINDS):
            return kind_of_class(cls)
        todo.extend(cls.__subclasses__())
    return None


def raised_by_us(traceback_text: str) -> bool:
    """True when the traceback's innermost frame, pydantic's validators skipped, is in our package."""
    frames = [f for f in _FRAME.findall(traceback_text or "") if not any(p in f for p in _VALIDATOR_PARTS)]
    return bool(frames) and frames[-1].startswith(PACKAGE_DIR)


def _traceback_text(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))


def kind_of(exc: BaseException) -> str | None:
    """Whose `exc` is: the table's kind; OURS for an unnamed class raised by our code; None for an
    unnamed class raised elsewhere (the trial's own failure as Harbor records it)."""
    if (kind := kind_of_class(type(exc))) is not None:
        return kind
    return OURS if raised_by_us(_traceback_text(exc)) else None


def kind_of_recorded(type_name: str, traceback_text: str) -> str | None:
    """kind_of for an exception Harbor recorded (its type's name and its traceback's text)."""
    if (kind := kind_of_name(type_name)) is not None:
        return kind
    return OURS if raised_by_us(traceback_text) else None


def set_up_kind(exc: BaseException) -> str:
    """Whose a failure to set a trial up is: the table's kind; TASK for a task file error
    (TASK_FILE_ERRORS) that Harbor, not our code, raised; OURS for anything else (set-up runs our
    code and Harbor's, and Harbor's own surprises are ours to look at too)."""
    if (kind := kind_of_class(type(exc))) is not None:
        return kind
    if type(exc).__name__ in TASK_FILE_ERRORS and not raised_by_us(_traceback_text(exc)):
        return TASK
    return OURS
