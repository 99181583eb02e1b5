"""Where each kind of agent runs and what Harbor is told to run it: a trial's AgentConfig
(agent_config) for the native agent (in the trial's process, straight to the policy), Harbor's
oracle and nop (no model), the host-side agents (host.py: in the trial's process, through the
gateway, given as `api_base`) and the installed agents (installed/: in the sandbox, given the
gateway's address as the variables they read). Also which agents sample the policy and through
what (uses_gateway, samples_policy), and the endpoint a gateway agent is handed (ModelEndpoint).

A run's settings (run_config.RolloutConfig) come in as `cfg`; nothing here imports them, so an
agent loaded inside a trial loads no run setup.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from slime_harbor.agents.host import HOST_GATEWAY_AGENTS
from slime_harbor.agents.settings import AGENT_SETTINGS, context_window

NATIVE_AGENT = "slime_harbor.agents.native:NativeAgent"
NO_MODEL_AGENTS = frozenset({"oracle", "nop"})
"""Harbor agents that never call a model: they need no policy and no gateway."""
SANDBOX_LOOPBACK = "127.0.0.1"
"""The gateway's address inside a sandbox: our sandboxes forward <loopback>:<gateway port> to it."""


def is_native(agent: str) -> bool:
    return agent in ("native", NATIVE_AGENT)


def harbor_agent_place(name: str) -> str | None:
    """Where one of Harbor's agent names (``harbor.models.agent.name.AgentName``) goes here: ``recipe``
    (installed by the sandbox from the registries, trains through the gateway), ``ours`` (runs as
    slime-harbor runs it: oracle, nop, terminus-2), ``refused`` (UNAVAILABLE says why); None for a
    name placed nowhere, which would fall through to Harbor's own install in the sandbox."""
    from slime_harbor.agents.installed.catalog import RECIPES, UNAVAILABLE

    if name in RECIPES:
        return "recipe"
    if name in NO_MODEL_AGENTS or name in HOST_GATEWAY_AGENTS:
        return "ours"
    if name in UNAVAILABLE:
        return "refused"
    return None


def uses_gateway(agent: str) -> bool:
    """Whether `agent` samples through the recording gateway: every agent but native / oracle / nop."""
    return not is_native(agent) and agent not in NO_MODEL_AGENTS


def samples_policy(agent: str) -> bool:
    """Whether `agent` calls the policy at all (oracle and nop do not)."""
    return agent not in NO_MODEL_AGENTS


@dataclass(frozen=True)
class ModelEndpoint:
    """Where a gateway agent reaches its trial's gateway session."""

    host_url: str
    """The session's OpenAI base URL (ending /v1) as seen from this process: host-side agents."""
    sandbox_url: str
    """The same inside the trial's sandbox (http://127.0.0.1:<gateway port>/s/<session>/v1)."""
    api_key: str
    """The session's own key (GatewaySession.api_key, a random secret): the gateway accepts any key on
    a session path and finds the session by it where the path names none. Never the session's
    name: Harbor scrubs every sensitive agent variable's value from the trial's files."""

    @classmethod
    def of(cls, gateway, session) -> ModelEndpoint:
        """The endpoint of an open GatewaySession of `gateway`."""
        port_and_path = f"{gateway.port}/s/{session.session_id}/v1"
        return cls(host_url=f"http://{connect_host(gateway)}:{port_and_path}",
                   sandbox_url=f"http://{SANDBOX_LOOPBACK}:{port_and_path}", api_key=session.api_key)


def connect_host(gateway) -> str:
    """The address this host reaches the gateway at (a gateway bound to every address: loopback)."""
    return gateway.host if gateway.host not in ("0.0.0.0", "::", "") else SANDBOX_LOOPBACK


UNBOUND_ENDPOINT = ModelEndpoint("http://127.0.0.1:0/s/unbound/v1", "http://127.0.0.1:0/s/unbound/v1", "unbound")
"""What agent_config puts in a config built only to be checked (no gateway running)."""


def installed_agent_env(endpoint: ModelEndpoint) -> dict[str, str]:
    """The variables Harbor's installed agents read for their endpoint and key (LiteLLM's, OpenAI's,
    mini-swe-agent's, Anthropic's base URL without /v1), all naming the trial's session. Only the
    keys are sensitive to Harbor (harbor.utils.env.is_sensitive_env_key): the URLs, which hold the
    trial's name, must stay under names it does not scrub."""
    url = endpoint.sandbox_url
    return {
        "OPENAI_BASE_URL": url, "OPENAI_API_BASE": url, "HOSTED_VLLM_API_BASE": url,
        "OPENAI_API_KEY": endpoint.api_key, "MSWEA_API_KEY": endpoint.api_key, "HOSTED_VLLM_API_KEY": endpoint.api_key,
        "ANTHROPIC_BASE_URL": url.removesuffix("/v1"), "ANTHROPIC_API_KEY": endpoint.api_key,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # else LiteLLM fetches its cost map from the internet
    }


def agent_class(config):
    """The Harbor agent class an AgentConfig names (raises when it does not resolve)."""
    from harbor.agents.factory import AgentFactory

    return AgentFactory.get_agent_class_from_config(config)


def is_installed_agent(config) -> bool:
    """Whether the agent runs inside the sandbox (a Harbor BaseInstalledAgent), not in this process."""
    from harbor.agents.installed.base import BaseInstalledAgent

    return issubclass(agent_class(config), BaseInstalledAgent)


def agent_config(cfg, endpoint: ModelEndpoint | None = None):
    """The trial's AgentConfig for a run's settings `cfg` (a RolloutConfig). Gateway agents get `endpoint` (their session; a placeholder when
    the config is only checked) as Harbor's conventions pass it: `api_base` + `model_name` kwargs
    to host-side agents, environment variables to installed agents."""
    config = _agent_config(cfg, endpoint)
    config.override_setup_timeout_sec = cfg.agent_setup_timeout_sec
    return config


def agent_model_name(served: str) -> str:
    """The name a gateway agent calls the policy by (the gateway answers to any): the served name
    where Harbor's hosted_vllm rules take it (letters, digits, '.', '-', '_', under 64 characters),
    else one made of its last path part. vLLM serves a checkpoint under its path, which LiteLLM's
    `hosted_vllm/<path>` refused: every terminus-2 trial on vLLM failed."""
    if re.fullmatch(r"[A-Za-z0-9._-]{1,63}", served):
        return served
    return (re.sub(r"[^A-Za-z0-9._-]+", "-", served.rstrip("/").rsplit("/", 1)[-1]).strip("-.") or "policy")[:63]


def _agent_config(cfg, endpoint: ModelEndpoint | None):
    from harbor.models.trial.config import AgentConfig

    if is_native(cfg.agent):
        return AgentConfig(
            import_path=NATIVE_AGENT,
            model_name=cfg.model_name,
            kwargs={
                "policy_url": cfg.policy_url,
                "tokenizer_path": str(cfg.model_dir),
                "renderer": cfg.renderer,
                "sampling": dataclasses.asdict(cfg.sampling),  # plain JSON in the trial's config.json
                **{name: getattr(cfg, name) for name in AGENT_SETTINGS},
                **cfg.agent_kwargs,
            },
        )
    if cfg.agent in NO_MODEL_AGENTS:
        return AgentConfig(name=cfg.agent, kwargs=dict(cfg.agent_kwargs))
    from slime_harbor.agents.installed.catalog import RECIPES

    endpoint = endpoint or UNBOUND_ENDPOINT
    # A Harbor agent with a recipe runs as the recipe's class (installed by the sandbox from the
    # registries only); every other name resolves as Harbor resolves it.
    recipe = RECIPES.get(cfg.agent)
    import_path = recipe.import_path if recipe else (cfg.agent if ":" in cfg.agent else None)
    # The gateway serves the policy (and its LoRA adapter) under one name and accepts any model
    # string; agents get it in the provider/model form LiteLLM-based agents need.
    name = agent_model_name(cfg.model_name)
    config = AgentConfig(name=None if import_path else cfg.agent, import_path=import_path,
                         model_name=f"hosted_vllm/{name}")
    provider = recipe.provider if recipe is not None else None  # claude-code: anthropic/<name>
    if provider:
        config.model_name = f"{provider}/{name}"
    if is_installed_agent(config):
        config.env = installed_agent_env(endpoint)
        if recipe is not None:
            fill = {"url": endpoint.sandbox_url, "root": endpoint.sandbox_url.removesuffix("/v1"),
                    "key": endpoint.api_key, "model": name}
            config.env.update({k: v.format(**fill) for k, v in recipe.env.items()})
            config.kwargs["step_limit"] = cfg.step_limit
    else:
        config.kwargs["api_base"] = endpoint.host_url
        # The key is also a sensitive variable's value: Harbor scrubs it from every file of the trial
        # dir (the kwargs in its config.json too).
        config.env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "HOSTED_VLLM_API_KEY": endpoint.api_key}
        cls = agent_class(config)
        if takes_kwarg(cls, "api_key"):  # a user's agent: the key beside api_base
            config.kwargs["api_key"] = endpoint.api_key
        if takes_step_limit(cls):  # a user's agent with a limit of its own
            config.kwargs["step_limit"] = cfg.step_limit
    if host_agent := HOST_GATEWAY_AGENTS.get(cfg.agent):
        config.kwargs.update(host_agent.agent_kwargs(context_window(cfg),
                                                     cfg.sampling.max_new_tokens, cfg.sampling.temperature,
                                                     cfg.step_limit, endpoint.api_key))
    for key, value in cfg.agent_kwargs.items():
        merge = isinstance(config.kwargs.get(key), dict) and isinstance(value, dict)
        config.kwargs[key] = {**config.kwargs[key], **value} if merge else value
    return config


def takes_step_limit(cls) -> bool:
    """Whether a host-side agent class limits its own steps: its constructor takes ``step_limit``
    and it does not ask the gateway to (``GATEWAY_STEP_LIMIT``)."""
    return not getattr(cls, "GATEWAY_STEP_LIMIT", False) and takes_kwarg(cls, "step_limit")


def takes_kwarg(cls, name: str) -> bool:
    """Whether an agent class's constructor names the keyword `name` (not just **kwargs)."""
    import inspect

    try:
        return name in inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        return False


def gateway_step_limit(agent, step_limit: int) -> int | None:
    """The number of model calls the gateway allows the trial's agent (its session's max_calls):
    the run's step_limit when the agent's class has no turn limit of its own and says so with
    ``GATEWAY_STEP_LIMIT = True`` (Codex, a user's ``module:Class`` agent), else None."""
    if agent is None or not getattr(agent_class(agent), "GATEWAY_STEP_LIMIT", False):
        return None
    return step_limit
