"""Errors: the one table of the exception classes we meet, each with whose it is and what happens
to the episode it ends, and the rule for every class the table does not name.

Whose (the first column):

    task            the task's files or data (a Dockerfile we cannot use, an SWE instance, a verifier
                    that wrote no reward)
    user            a setting, a flag, a model or a host the user chose
    infrastructure  the machine, the sandbox or a service we do not control went wrong
    policy          the policy's server or engine failed or refused, or the policy's agent ran out
                    of its time
    ours            a slime-harbor bug (said loudly, never blamed on a task)

What happens to the episode (the second column; episode.episode_end reads it, and rollout's
set-up path for an error raised before the trial ran):

    retried   ABORTED, never trained: the task runs again while its retry budget lasts
              (retries.py), then FAILED. Raised before, while or after the sandbox started.
    failed    FAILED, never trained and never retried, whatever else happened (not even as a
              start that failed: the same task fails the same way again).
    scored    the verifier's reward stands where it wrote one (VerifierRefused: the 0 that
              tampering scores; AgentTimeoutError: truncated at the agent's time limit); FAILED
              where it wrote none.

The rows are our own exceptions (the module within slime_harbor) and the Harbor and library
exceptions we meet (their full module, as the class's __module__ says: httpx names its own).
Names, not imports: a class is looked up by its module and name, so the table stands below every
module whose classes it names (tests/test_error_kinds.py resolves each row). A subclass follows
its nearest named base. A recorded exception (Harbor keeps only its class's name) is found by that
name: a row's class first (no two rows share a name), else a class of ours by that name that this
process has loaded (the trial raised it here), by its nearest named base.

A class in no row, without a named base (UNNAMED_OUTCOME):

    whose     ours when our own code raised it, whatever its type: the traceback's innermost frame
              (pydantic's validators skipped, since they raise on behalf of the code that called
              them) lies in the slime_harbor package. That is an internal error: FAILED, its
              traceback kept, counted, past a budget the run stops (rollout.internal_error).
              Raised anywhere else (Harbor, a library, a Harbor agent) it is the trial's own
              failure, as Harbor records it (whose: None).
    outcome   failed: never retried, since nothing says running the task again would help (a
              retry budget spent on a deterministic failure only hides it). Two rules of the
              episode come first (episode.episode_end): raised while the environment was starting
              it is a start that failed (retried: env_start_retries, then the retry budget), and
              an episode that ended at a limit is scored as truncated.

A new exception class in the slime_harbor package must have a row or a named base
(tests/test_error_kinds.py fails otherwise), so none of ours ends up here unexamined.

A task's files read by Harbor raise plain FileNotFoundError, NotADirectoryError, TOMLDecodeError or
pydantic's ValidationError: those are the task's mistake only when Harbor raised them
(`task_mistake`); the same types raised by our code are bugs of ours.
"""

from __future__ import annotations

import re
import traceback
from pathlib import Path
from typing import NamedTuple

TASK, USER, INFRASTRUCTURE, POLICY, OURS = "task", "user", "infrastructure", "policy", "ours"
KINDS = (TASK, USER, INFRASTRUCTURE, POLICY, OURS)
RETRIED, FAILED, SCORED = "retried", "failed", "scored"
OUTCOMES = (RETRIED, FAILED, SCORED)
UNNAMED_OUTCOME = FAILED
"""What happens to an episode that an exception of no row (and no named base) ended: see above."""


class Row(NamedTuple):
    whose: str
    """One of KINDS."""
    outcome: str
    """One of OUTCOMES."""


ERRORS: dict[str, Row] = {
    # ours: a setting or input of the user's (mostly refused before any trial starts)
    "exits:ConfigError": Row(USER, FAILED),
    "exits:Interrupted": Row(USER, FAILED),
    "cli:CommandFailed": Row(USER, FAILED),
    "hooks:HookConfigError": Row(USER, FAILED),
    "http_api:BadRequest": Row(USER, FAILED),
    # answered 401 / 403 to the caller, never raised into a trial: an agent given no key is the user's
    "gateway.wire:KeyRefused": Row(USER, FAILED),
    "policy.renderer:RendererError": Row(USER, FAILED),
    "policy.engines.base:EngineMissing": Row(USER, FAILED),
    # ours: the task's
    "tasks.swebench:InstanceError": Row(TASK, FAILED),
    "environments.dockerfile:DockerfileError": Row(TASK, FAILED),
    "environments.common:SandboxFileNotFoundError": Row(TASK, FAILED),
    "grading.isolation:VerifierRefused": Row(TASK, SCORED),
    # ours: the policy's
    "environments.common:ExecTimeoutError": Row(POLICY, FAILED),
    "policy.client:PolicyServerError": Row(POLICY, RETRIED),
    "gateway.session:PolicyUnavailable": Row(POLICY, RETRIED),
    "policy.engines.abilities:WeightSyncError": Row(POLICY, FAILED),
    "policy.engines.abilities:EndpointMissing": Row(POLICY, FAILED),
    "policy.wire_api:UnscoredPrompt": Row(POLICY, FAILED),
    "policy.weight_check:WeightMismatch": Row(POLICY, FAILED),
    # ours: the infrastructure's
    "environments.common:SandboxError": Row(INFRASTRUCTURE, RETRIED),
    "fleet:WorkerLost": Row(INFRASTRUCTURE, RETRIED),
    "environments.docker_images:DockerUnavailableError": Row(INFRASTRUCTURE, RETRIED),
    "environments.docker_exec:ExecServerError": Row(INFRASTRUCTURE, RETRIED),
    "environments.gateway_reach:GatewayReachError": Row(INFRASTRUCTURE, RETRIED),
    "agents.installed.installs:AgentInstallError": Row(INFRASTRUCTURE, RETRIED),
    "tasks.swebench_grade:InfraFailure": Row(INFRASTRUCTURE, RETRIED),
    # ours: bugs of ours
    "rollout:InternalErrorBudgetSpent": Row(OURS, FAILED),
    "rollout:RecordedBug": Row(OURS, FAILED),
    # Harbor's (harbor 0.24), raised by Harbor or on purpose by our sandboxes
    "harbor.environments.base:SandboxBuildFailedError": Row(TASK, FAILED),
    "harbor.environments.base:ServiceOperationsUnsupportedError": Row(USER, FAILED),
    "harbor.environments.base:HealthcheckError": Row(INFRASTRUCTURE, RETRIED),
    "harbor.trial.errors:EnvironmentStartTimeoutError": Row(INFRASTRUCTURE, RETRIED),
    "harbor.trial.errors:AgentSetupTimeoutError": Row(INFRASTRUCTURE, RETRIED),
    "harbor.trial.errors:AgentTimeoutError": Row(POLICY, SCORED),
    "harbor.trial.errors:VerifierTimeoutError": Row(TASK, FAILED),
    "harbor.verifier.verifier:RewardFileNotFoundError": Row(TASK, FAILED),
    "harbor.verifier.verifier:RewardFileEmptyError": Row(TASK, FAILED),
    "harbor.verifier.verifier:VerifierOutputParseError": Row(TASK, FAILED),
    # the libraries' (the trial's hard timeout cancels it; a server that cannot be reached)
    "asyncio.exceptions:CancelledError": Row(INFRASTRUCTURE, RETRIED),
    "httpx:ConnectError": Row(INFRASTRUCTURE, RETRIED),
}
"""Each exception class we meet ("module:Class": the module within slime_harbor for ours, the full
module for another package's) and its row: whose it is and what happens to the episode it ends."""

TASK_FILE_ERRORS = ("FileNotFoundError", "NotADirectoryError", "TOMLDecodeError", "ValidationError")
"""What Harbor raises for a task's malformed or missing files; the task's only when Harbor raised it."""

PACKAGE_DIR = str(Path(__file__).resolve().parent)
_FRAME = re.compile(r'^\s*File "([^"]+)", line \d+', re.M)
_VALIDATOR_PARTS = ("/pydantic/", "/pydantic_core/")
_BY_NAME = {key.rsplit(":", 1)[1]: key for key in ERRORS}
FOREIGN_PACKAGES = ("harbor", "asyncio", "httpx")
"""The other packages whose classes have rows (their keys name the full module)."""


def module_of(key: str) -> str:
    """The importable module a row's key names."""
    module = key.rsplit(":", 1)[0]
    return module if module.split(".")[0] in FOREIGN_PACKAGES else f"slime_harbor.{module}"


def table_name(cls: type) -> str:
    """A class's key in ERRORS ("module:Class", the module within slime_harbor)."""
    return f"{cls.__module__.removeprefix('slime_harbor.')}:{cls.__qualname__}"


def named_base(cls: type) -> str | None:
    """The key of the class's row, or of its nearest base's that has one; None if unnamed."""
    return next((name for base in cls.__mro__ if (name := table_name(base)) in ERRORS), None)


def named_base_of_name(type_name: str) -> str | None:
    """The same for a class known only by its name (an exception Harbor recorded in a trial): the
    row of that class name, else a class of ours by that name among those this process has loaded
    (the trial raised it here), by its nearest named base."""
    if type_name in _BY_NAME:
        return _BY_NAME[type_name]
    todo = [BaseException]
    while todo:
        cls = todo.pop()
        if cls.__name__ == type_name and cls.__module__.startswith("slime_harbor."):
            return named_base(cls)
        todo.extend(cls.__subclasses__())
    return None


def row_of_class(cls: type) -> Row | None:
    """The class's row (its nearest named base's), or None if unnamed."""
    return ERRORS[name] if (name := named_base(cls)) else None


def row_of_name(type_name: str) -> Row | None:
    """The row of a class known only by its name (see named_base_of_name), or None if unnamed."""
    return ERRORS[name] if (name := named_base_of_name(type_name)) else None


def kind_of_class(cls: type) -> str | None:
    """Whose an exception class is by the table (its nearest named base), or None if unnamed."""
    return row.whose if (row := row_of_class(cls)) else None


def kind_of_name(type_name: str) -> str | None:
    """Whose a class known only by its name is by the table, or None if unnamed."""
    return row.whose if (row := row_of_name(type_name)) else None


def outcome_of_name(type_name: str) -> str | None:
    """What the table says happens to an episode a recorded exception ended (one of OUTCOMES); None
    for a class it does not name (UNNAMED_OUTCOME, after episode.episode_end's own rules)."""
    return row.outcome if (row := row_of_name(type_name)) else None


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


def set_up_outcome(exc: BaseException) -> str:
    """What happens to an episode whose trial could not be set up: its row's outcome (retried for
    the infrastructure's); failed for anything else (a task or a setting does not mend itself)."""
    row = row_of_class(type(exc))
    return row.outcome if row is not None and row.outcome == RETRIED else FAILED


def table_markdown() -> str:
    """ERRORS as a markdown table (docs/commands.md holds it; tests/test_error_kinds.py checks it is
    current): one row per class, by outcome, then whose, then name."""
    order = {o: i for i, o in enumerate(OUTCOMES)}
    lines = ["| exception (module:Class) | whose | episode |", "|---|---|---|"]
    for name, row in sorted(ERRORS.items(), key=lambda kv: (order[kv[1].outcome], KINDS.index(kv[1].whose), kv[0])):
        lines.append(f"| `{name.rsplit(':', 1)[1]}` ({module_of(name)}) | {row.whose} | {row.outcome} |")
    lines.append(f"| any other class, raised by our code | ours (an internal error) | {UNNAMED_OUTCOME} |")
    lines.append(f"| any other class, raised elsewhere | the trial's own | {UNNAMED_OUTCOME} (retried while "
                 "the sandbox starts; truncated and scored at a limit) |")
    return "\n".join(lines)
