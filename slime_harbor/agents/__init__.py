"""Every kind of agent a trial can run, in one place. Each samples the policy token in / token out
and ends its episode in the words episode.py reads (TRUNCATING_EXITS and the rest).

    settings.py     AgentSettings: what every agent's episode is held to (step limit, context, ...)
    placement.py    where each kind of agent runs and what Harbor is told to run it (agent_config),
                    which agents sample the policy and through what, a gateway agent's endpoint
    native.py       slime-harbor's own agent (`--agent native`): one bash command per turn, straight
                    to the policy server (no gateway), rendered in its model family's chat format
    host.py         Harbor's agents that run in the trial's own process and sample through the
                    recording gateway: the table of them, each with the module holding all we know
                    of it
    terminus2.py    Harbor's terminus-2: its kwargs, what it needs of the sandbox, how it ends
    installed/      Harbor's agents that run inside the sandbox, installed from the package
                    registries alone: recipe.py (what a recipe is, and how it becomes Harbor's
                    class), catalog.py (one recipe per agent), installs.py (what an install is)

An agent given as module:Class is a Harbor BaseAgent of the user's, run in the trial's process
through the gateway like the host agents. Harbor's oracle and nop call no model.
"""
