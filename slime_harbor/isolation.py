"""The verifier of a plain Harbor task (shared mode: it runs in the agent's own sandbox) starts clean.

Harbor 0.24's shared mode runs tests/test.sh in the agent's sandbox right after the agent: a
process the agent left behind (a ``setsid`` daemon, terminus-2's tmux server) is still running and
can write ``/logs/verifier/reward.json`` (which wins over reward.txt), and files the agent put in
/logs/verifier are still there. `isolate_shared_verifier(trial)` registers a hook on the trial's
VERIFICATION_START event that, before the verifier runs,

- kills every process in the sandbox (the environment's ``end_agent_processes()``: our
  bubblewrap and Docker environments have one; other environments are left as Harbor runs them),
- empties /logs/verifier.

Tasks in separate mode (the verifier gets a fresh environment; SWE-bench tasks) need neither: the
agent's environment is stopped before the verifier's starts and Harbor empties its /logs/verifier.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


async def end_agent_phase(environment) -> bool:
    """Kill the agent's processes and empty /logs/verifier; False when the environment cannot."""
    from harbor.models.trial.paths import EnvironmentPaths

    end = getattr(environment, "end_agent_processes", None)
    if end is None:
        return False
    await end()
    await environment.empty_dirs([EnvironmentPaths.for_os(environment.os).verifier_dir], chmod=True)
    return True


def isolate_shared_verifier(trial) -> None:
    """Make `trial`'s shared-mode verifier start with no agent process alive and an empty
    /logs/verifier (a no-op for separate-mode and multi-step tasks)."""
    from harbor.models.task.config import VerifierEnvironmentMode
    from harbor.models.task.verifier_mode import resolve_task_verifier_mode
    from harbor.trial.hooks import TrialEvent

    if trial.task.has_steps or resolve_task_verifier_mode(trial.task.config) != VerifierEnvironmentMode.SHARED:
        return

    async def before_verifier(_event) -> None:
        if not await end_agent_phase(trial.agent_environment):
            log.debug("%s: %s cannot end the agent's processes before the verifier", trial.config.trial_name,
                      type(trial.agent_environment).__name__)

    trial.add_hook(TrialEvent.VERIFICATION_START, before_verifier)
