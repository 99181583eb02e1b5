"""The verifier of a plain Harbor task (shared mode: it runs in the agent's own sandbox) starts clean
and runs the image's runtime, or does not run at all.

Harbor 0.24's shared mode runs tests/test.sh in the agent's sandbox right after the agent: a
process the agent left behind (a ``setsid`` daemon, terminus-2's tmux server) is still running and
can write ``/logs/verifier/reward.json`` (which wins over reward.txt), files the agent put in
/logs/verifier are still there, and the shell, interpreters and test tools are whatever the agent
left. Before the verifier runs (grade.Grading's stages, on Harbor's VERIFICATION_START event;
`shared_sandbox(trial)` says whether a trial's verifier shares the agent's sandbox):

1. kills every process in the sandbox (the environment's ``end_agent_processes()``);
2. asks the sandbox, from the host, what the agent changed relative to its image, and judges it
   (:mod:`slime_harbor.verifier_runtime`): a changed shell, interpreter, standard library, shipped
   package, startup hook, test configuration or shell environment file is tampering;
3. checks the verifier's plumbing with the (now checked) runtime: ``/logs/verifier`` is the
   directory Harbor reads, ``/tests`` is absent or a directory, the workdir exists, a shell starts;
4. removes the agent's ``.pyc`` files under system dirs and anything the agent put in ``/tests``
   (Harbor uploads the tests there next), and empties /logs/verifier.

A trial that fails 2 or 3 is not verified: its reward is 0 with ``tampering_<kind>: 1`` beside it
(the SWE-bench grader's field, so samples carry ``metadata.tampering`` and summaries count it) and
`VerifierRefused` ends the trial, which the converter scores as completed (pm1: -1). Only the
environment failing on its own (the sandbox gone, the daemon down) stays an infrastructure failure.

Step 1 needs an environment that declares abilities.EndsAgentProcesses, steps 2-3 one that
declares abilities.ReportsAgentChanges (our bubblewrap and Docker sandboxes, both answered from the
host); Harbor's other environments declare neither and are verified as Harbor runs them. Tasks in
separate mode (the verifier gets a fresh environment; SWE-bench tasks) need none of this: the
agent's environment is stopped before the verifier's starts.

What the agent changed is read once per trial (`AgentLeft`), after step 1 (`end_agent`): steps
2-4 (`check_runtime`) judge that reading, and the hack monitor reads the same one before anything
is judged or removed.
"""

from __future__ import annotations

import shlex
import uuid

from slime_harbor.environments.abilities import EndsAgentProcesses, ReportsAgentChanges
from slime_harbor.verifier_reward import TAMPERING_PREFIX
from slime_harbor.verifier_runtime import (
    BROKEN_PLUMBING, Change, bytecode_to_remove, describe, tampering, texts_needed,
)


class AgentLeft:
    """What the agent of one trial left in its sandbox, read once from the host right before the
    verifier, after its processes ended: its changes against the image (`changes`; None where the
    environment does not declare abilities.ReportsAgentChanges) and a changed file's text
    (`text`, each path read once). The runtime check judges it; the hack monitor reads the same
    reading (grade.Grading's read_changes stage, before anything is judged or removed)."""

    def __init__(self, environment):
        self.environment = environment
        self.changes: list[Change] | None = None
        self._texts: dict[str, str | None] = {}

    @property
    def judged(self) -> bool:
        """The sandbox reports the agent's changes from the host (abilities.ReportsAgentChanges)."""
        return isinstance(self.environment, ReportsAgentChanges)

    async def read(self) -> list[Change]:
        """The agent's changes (read once)."""
        if self.changes is None:
            self.changes = await self.environment.agent_changes()
        return self.changes

    async def text(self, path: str) -> str | None:
        """A changed file's text as the agent left it (None: gone, not a regular file, too large)."""
        if path not in self._texts:
            self._texts[path] = await self.environment.changed_file_text(path)
        return self._texts[path]


class VerifierRefused(Exception):
    """The agent tampered with what the verifier runs, or broke its plumbing: the trial is scored 0
    (its verifier_result says so) without running the verifier."""


async def end_agent(left: AgentLeft) -> Exception | None:
    """Step 1: kill every process the agent left (abilities.EndsAgentProcesses). A failure is
    returned, not raised: a shell the agent broke can fail a restart, and the runtime is judged
    first (check_runtime raises it where the runtime is clean)."""
    if not isinstance(left.environment, EndsAgentProcesses):
        return None
    try:
        await left.environment.end_agent_processes()
    except Exception as exc:
        return exc
    return None


async def check_runtime(left: AgentLeft, trial_paths, workdir: str | None,
                        ended: Exception | None = None) -> dict[str, list[str]]:
    """Steps 2-4 of the module docstring, on what `left` read. Returns tampering kind -> paths
    (empty: clean, and the verifier may run); raises when the environment itself failed (`ended`:
    end_agent's failure, raised once the runtime is found clean)."""
    from harbor.models.trial.paths import EnvironmentPaths

    environment = left.environment
    paths = EnvironmentPaths.for_os(environment.os)
    ends = isinstance(environment, EndsAgentProcesses)
    if not ends and not left.judged:
        return {}
    if left.judged:
        changes = await left.read()
        index = await environment.runtime_index()
        texts = {path: await left.text(path) for path in texts_needed(changes, index)}
        found = tampering(changes, index, workdir=workdir, tests_dir=str(paths.tests_dir),
                          verifier_dir=str(paths.verifier_dir), texts=texts)
        if found:
            return found
    if ended is not None:
        raise ended
    if left.judged:
        broken = await _plumbing(environment, trial_paths, paths, workdir)
        if broken:
            return {BROKEN_PLUMBING: broken}
        stale = bytecode_to_remove(changes, index)
        if stale:
            await environment.exec("rm -f -- " + " ".join(shlex.quote(p) for p in stale), user="root")
        tests = str(paths.tests_dir)
        if any(c.path == tests or c.path.startswith(tests + "/") for c in changes):  # the agent's, not Harbor's
            await environment.exec(f"rm -rf -- {shlex.quote(tests)}", user="root")
    await environment.empty_dirs([paths.verifier_dir], chmod=True)
    return {}


async def _plumbing(environment, trial_paths, paths, workdir: str | None) -> list[str]:
    """What of the verifier's plumbing the agent broke (run with the checked runtime)."""
    probe = f".slime-harbor-probe-{uuid.uuid4().hex[:12]}"
    host_probe = trial_paths.verifier_dir / probe if environment.capabilities.mounted else None
    if host_probe is not None:
        host_probe.write_text("")  # seen inside only if /logs/verifier is still Harbor's directory
    verifier_dir, tests_dir = shlex.quote(str(paths.verifier_dir)), shlex.quote(str(paths.tests_dir))
    script = (
        f"[ -d {verifier_dir} ] && [ ! -L {verifier_dir} ]"
        + (f" && [ -e {verifier_dir}/{probe} ]" if host_probe is not None else "")
        + f" || echo '{paths.verifier_dir} is not the verifier log directory';"
        f" [ ! -e {tests_dir} ] && [ ! -L {tests_dir} ] || [ -d {tests_dir} ] && [ ! -L {tests_dir} ]"
        f" || echo '{paths.tests_dir} is not a directory';"
        + (f" [ -d {shlex.quote(workdir)} ] || echo 'the workdir {workdir} is gone';" if workdir else "")
        + " echo ok"
    )
    try:  # an exec that cannot even be made is the environment's failure (raised), not the policy's
        done = await environment.exec(script, cwd="/", user="root", timeout_sec=60)
    finally:
        if host_probe is not None:
            host_probe.unlink(missing_ok=True)
    lines = (done.stdout or "").split("\n")
    if done.return_code != 0 or "ok" not in lines:  # the checked runtime's shell did not run the script
        return [f"a shell cannot start (exit {done.return_code})"]
    return [line for line in lines if line.strip() and line != "ok"]


def refuse(result, found: dict[str, list[str]]) -> VerifierRefused:
    """Score the trial 0 for `found` (its verifier_result) and the exception that ends it."""
    from harbor.models.verifier.result import VerifierResult

    result.verifier_result = VerifierResult(rewards={"reward": 0.0, **{TAMPERING_PREFIX + k: 1.0 for k in found}})
    return VerifierRefused(f"not verified: {describe(found)}")


def shared_sandbox(trial) -> AgentLeft | None:
    """What the agent of `trial` will leave, to be read before a shared-mode verifier (None for
    separate-mode and multi-step tasks: nothing is read or checked in their sandbox)."""
    from harbor.models.task.config import VerifierEnvironmentMode
    from harbor.models.task.verifier_mode import resolve_task_verifier_mode

    if trial.task.has_steps or resolve_task_verifier_mode(trial.task.config) != VerifierEnvironmentMode.SHARED:
        return None
    return AgentLeft(trial.agent_environment)
