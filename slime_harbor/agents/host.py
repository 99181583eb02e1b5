"""Harbor's agents that run in the trial's own process and sample through the recording gateway
(nothing is installed in the sandbox for them), each with the module that holds all slime-harbor
knows of it: its kwargs, what it needs of the sandbox, how its end is read.

agents/placement.py, trial_setup and the rollout reach an agent's knowledge through this table, never by comparing
its name; a new host agent is a module of the same shape (NAME, ENVIRONMENT_KWARGS,
agent_kwargs, exit_status) and one entry here. Installed agents have their recipes instead
(agents/installed/catalog.py).
"""

from __future__ import annotations

from types import ModuleType

from slime_harbor.agents import terminus2

HOST_GATEWAY_AGENTS: dict[str, ModuleType] = {terminus2.NAME: terminus2}


def report_exit_status(result) -> None:
    """A host agent that says nothing of how its episode ended (terminus-2) has it read by its
    module into ``agent_result.metadata["exit_status"]``, where every other agent reports it (the
    native agent, the installed agents' recipes) and the converter reads it."""
    host_agent = HOST_GATEWAY_AGENTS.get(result.agent_info.name) if result.agent_info is not None else None
    if host_agent is None or result.agent_result is None:
        return
    metadata = result.agent_result.metadata or {}
    if metadata.get("exit_status") is None and (status := host_agent.exit_status(result)) is not None:
        result.agent_result.metadata = {**metadata, "exit_status": status}
