"""The verifiers plugin id `slime-harbor-verifiers`: verifiers imports a taskset by module name
and takes the Taskset / Env it exports (slime_harbor.integrations.verifiers_env)."""

from slime_harbor.integrations.verifiers_env import HarborTrials, HarborTrialsConfig, HarborTrialsEnv

__all__ = ["HarborTrials", "HarborTrialsEnv", "HarborTrialsConfig"]
