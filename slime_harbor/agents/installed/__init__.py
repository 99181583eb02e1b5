"""Harbor's installed agents (they run inside the sandbox) with installs that need only the
package registries (PyPI, Debian, npm).

    recipe.py     what a recipe is (AgentRecipe) and how it becomes Harbor's installed-agent class
    catalog.py    one AgentRecipe per agent (Harbor's class, package, dialect, limits, exits),
                  the class each recipe runs as, and resolve_installs (names -> installs)
    installs.py   what an install is (SandboxInstall, its budget, environment_kwargs) and the
                  two kinds: NpmInstall, PypiInstall (a package and its runtime under
                  /opt/slime-harbor/<name>)

Why the sandbox installs them, not the agent's ``setup()``: Harbor sets an agent up after its
environment started, and a no-network task's sandbox cannot reach a registry then. So the
environment installs the agent before the trial starts, once per base image (Docker) or once per
host (bubblewrap), and every trial reuses it:

- ``DockerEnvironment`` builds a derived image ``FROM`` the task's image (one ``RUN`` of
  :meth:`SandboxInstall.docker_script`, with the host network, at image build time), tagged by the
  base image's id and the script, and starts the trial's container from it.
- ``BubblewrapEnvironment`` builds :meth:`SandboxInstall.host_dir` on the host once (cached under
  ``slime_harbor.cache.cache_dir()``) and binds it read-only at ``sandbox_dir``.

The coupling is one environment kwarg, ``agent_installs`` (``--ek agent_installs=mini-swe-agent``;
a recipe's name (catalog.py) or ``module:attr`` of a :class:`SandboxInstall`), which :func:`environment_kwargs`
derives from an agent config. The agent checks in ``setup()`` that its install is there and says
how to get it when it is not.
"""
