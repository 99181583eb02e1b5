"""Harbor's agents that run in the trial's own process and sample through the recording gateway
(nothing is installed in the sandbox for them), each with the module that holds all slime-harbor
knows of it: its kwargs, what it needs of the sandbox, how its end is read.

trial_setup and the converter reach an agent's knowledge through this table, never by comparing
its name; a new host agent is a module of the same shape (NAME, ENVIRONMENT_KWARGS,
agent_kwargs, exit_status) and one entry here. Installed agents have their recipes instead
(agents/installed/catalog.py).
"""

from __future__ import annotations

from types import ModuleType

from slime_harbor.agents import terminus2

HOST_GATEWAY_AGENTS: dict[str, ModuleType] = {terminus2.NAME: terminus2}
