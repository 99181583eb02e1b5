"""What a trial is made of, before it runs: the rollout's config, the tasks, the agent (native,
Harbor's, or one through the model gateway) and the sandbox, and the checks that refuse a bad
config in one line before any trial starts.

rollout.py runs trials from these; harbor_job.py records the job's config with them; the SLiME
hook (hooks.py) and the local trainer build a RolloutConfig and call rollout.run_episode.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slime_harbor.exits import ConfigError, one_line
from slime_harbor.agents.host import HOST_GATEWAY_AGENTS
from slime_harbor.agents.settings import AGENT_SETTINGS, AgentSettings, check_agent_settings
from slime_harbor.policy.sampling import SamplingParams
from slime_harbor.tasks.manifest import apply_manifest
from slime_harbor.tasks.task_dir import discover_tasks

BUNDLED_TASKS = "examples/harbor/tasks"
"""The bundled example tasks, relative to the repository (as the SLiME plugin's YAML and launch
script name them: training runs from the repository)."""
DEFAULT_TASKS = Path(__file__).resolve().parent.parent / BUNDLED_TASKS
"""The bundled example tasks: every runner's default tasks dir."""
LOCAL_SANDBOX = "slime_harbor.environments.bubblewrap:BubblewrapEnvironment"
DOCKER_SANDBOX = "slime_harbor.environments.docker:DockerEnvironment"
NATIVE_AGENT = "slime_harbor.agents.native:NativeAgent"
NO_MODEL_AGENTS = frozenset({"oracle", "nop"})
"""Harbor agents that never call a model: they need no policy and no gateway."""
"""Harbor agents that run in the trial's process (nothing to install in the sandbox) and sample
through the gateway, which they get as their ``api_base`` kwarg."""
SANDBOX_LOOPBACK = "127.0.0.1"
"""The gateway's address inside a sandbox: our sandboxes forward <loopback>:<gateway port> to it."""
# Slack on top of the task's own agent + verifier + build timeouts before we cancel a trial that
# Harbor's own timeouts failed to end (a hung container teardown, a stuck verifier upload).
HARD_TIMEOUT_SLACK_SEC = 120.0

log = logging.getLogger(__name__)


@dataclass
class RunSettings:
    """The knobs every runner takes as they are: the rollout command, train-local and the demo
    (LocalTrainConfig extends this), SLiME's hook (each as harbor_<name>) and the verifiers plugin
    derive theirs from these declarations; check_run_settings is their one check."""

    tasks_dir: Path | str = DEFAULT_TASKS
    """Directory of Harbor task dirs (each with task.toml), or, where the runner resolves it first,
    a dataset NAME[@VERSION] in a Harbor registry, downloaded into $SLIME_HARBOR_CACHE; default:
    the bundled tasks."""
    task_names: list[str] | None = None
    """Only these tasks (dir names); None = all tasks in tasks_dir."""
    task_manifest: Path | None = None
    """A `slime-harbor calibrate` manifest: tasks it marks broken, hackable or flaky are skipped
    (and named in summary.json); tasks it does not list run."""
    agent: str = "native"
    """native | terminus-2 | mini-swe-agent | oracle | nop | any Harbor agent name | module:Class import
    path. Every one but native / oracle / nop samples through the recording gateway."""
    env: str = "local"
    """local (bubblewrap) | docker (ours, Engine API) | harbor-docker (Harbor's, docker compose) |
    daytona | modal | ... (Harbor's environment types) | module:Class import path."""
    n_samples: int = 4
    """Episodes per task: the GRPO group size."""
    concurrency: int = 4
    """Trials running at once."""
    reward_mapping: str = "raw"
    """raw: verifier reward as is; pm1: reward r in [0,1] -> 2r-1."""
    verifier_timeout_sec: float | None = None
    """The verifier's time limit in seconds, instead of the task's [verifier] timeout_sec."""
    gateway_host: str = "127.0.0.1"
    """Address the model gateway binds (gateway agents). Loopback: our sandboxes reach it through
    their forward; a sandbox elsewhere (Modal, Daytona, E2B) needs an address it can reach."""
    hack_action: str = "flag"
    """What a hack monitor flag does (hack_monitor.py): flag (recorded in metadata.hack_flags and
    counted) | penalty (scored as a failure) | screen (out of training and its group's baseline)."""
    hack_detectors: list[str] = field(default_factory=list)
    """Detectors run besides the builtin ones: module:function, a function of a TrialView returning HackFlags."""
    hack_judge_url: str | None = None
    """A judge model's OpenAI-compatible base URL (…/v1): asked about every trial besides the detectors."""
    hack_judge_model: str | None = None
    """The judge's model name, as that server serves it."""
    impossible_twin: str = "on"
    """on: every trial that passes is graded again against its task's impossible twin (the same
    grading with one expected value no correct solution gives: impossible_twin.py), where the task
    has one; a pass on the twin too is the hack flag passes_impossible, acted on by hack_action |
    off."""


@dataclass
class RolloutConfig(RunSettings, AgentSettings):
    """Everything one rollout needs. Every field has a default that runs on this machine. The
    knobs every runner shares are RunSettings' fields, the agent settings (step_limit,
    max_context_len, routing_key, policy_api, reissue_aborted_calls, lora_name) AgentSettings':
    declared there once."""

    policy_url: str | None = None
    """SGLang router / policy server base URL (the native agent's, and the gateway's upstream)."""
    model_dir: str | None = None
    """HF dir of the policy: tokenizer for the native agent and for decoding samples."""
    model_name: str = "policy"
    """Name the gateway serves the policy under (agents get `hosted_vllm/<model_name>`)."""
    out_dir: Path = Path("runs/rollout")
    """Where samples.jsonl, summary.json and trials/ go."""
    sampling: SamplingParams = field(default_factory=SamplingParams)
    """How every model call of an episode samples (policy/sampling.py: temperature, top_p, top_k,
    max_new_tokens per turn, stop, stop_token_ids, return_top_p_token_ids, ...): the native agent's
    options, and each gateway session's, which replaces a gateway agent's own. Its sampling_seed
    seeds each episode run with this config (the SLiME hook builds one config per sample); None =
    random. Every episode of one config gets the same seed: leave it None for run_rollouts."""
    timeout_multiplier: float = 1.0
    """Scales the task.toml agent/verifier/build timeouts and the agent's setup budget."""
    agent_setup_timeout_sec: float | None = None
    """The agent's setup budget in seconds (Harbor's override_setup_timeout_sec): it bounds the
    agent's install (a Docker layer, a host venv) and Harbor's agent setup. None = Harbor's
    default for the agent (BaseAgent's 360 s, some agents more), times timeout_multiplier."""
    progress: bool = True
    """Show a progress bar on stderr."""
    agent_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra AgentConfig kwargs on top of the ones built here (the SLiME hook passes terminus-2
    SLiME's stop strings, routing header and context size this way). For terminus-2,
    `llm_call_kwargs` and `model_info` are merged key by key into the defaults."""
    env_start_retries: int = 2
    """Extra attempts when a trial's environment fails to start (a transient infra failure: the
    sandbox or container did not come up, its healthcheck failed). Each attempt is a new trial;
    after the last one the episode is ABORTED (removed, counted, never scored)."""
    env_start_backoff_sec: float = 1.0
    """Wait before the first retry of an environment start; doubled for each further retry."""
    max_retries_per_task: int = 3
    """Reruns of an ABORTED episode (a transient infra failure: the sandbox did not start after its
    env_start_retries, the policy server was unreachable, the trial was cut off) per task within
    retry_window_sec; once spent, the episode is FAILED (never rerun, never scored)."""
    retry_window_sec: float = 3600.0
    """The retry budget's sliding window: older reruns are forgotten."""
    retry_backoff_sec: float = 2.0
    """Wait before a rerun."""

    def hack_detector_functions(self) -> list:
        """The builtin detectors, hack_detectors and the judge, loaded (ValueError in one line for a bad one)."""
        from slime_harbor.hack_monitor import BUILTIN_DETECTORS, judge_detector, load_detector

        if bool(self.hack_judge_url) != bool(self.hack_judge_model):
            raise ValueError("a hack judge needs both a URL and a model (--hack-judge-url, --hack-judge-model)")
        judge = [judge_detector(self.hack_judge_url, self.hack_judge_model)] if self.hack_judge_url else []
        return [*BUILTIN_DETECTORS.values(), *(load_detector(spec) for spec in self.hack_detectors), *judge]


REWARD_MAPPINGS = ("raw", "pm1")


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


def with_engine(cfg: RolloutConfig) -> RolloutConfig:
    """cfg as the engine at cfg.policy_url needs it, found out from the server itself
    (policy/probe.py), so `--policy-url` takes any engine's root with no other flag:

    - a vLLM (or other OpenAI-compatible) root: sampled through its /v1/completions with token ids
      (policy_api openai), under the name it serves (the gateway accepts any model string);
    - SGLang, its router or our engine: /generate, as before;
    - max_context_len, when unset: the server's limit (vLLM's --max-model-len, SGLang's KV pool)
      where it is below the model's, so no call is sent that the engine would refuse.
    A URL that already names the OpenAI base (ends in /v1, policy_api openai) is taken as given."""
    if not cfg.policy_url or cfg.policy_url == "embedded":
        return cfg
    from slime_harbor.policy.probe import probe

    root = cfg.policy_url.rstrip("/").removesuffix("/v1")
    info = probe(root)
    changes: dict[str, Any] = {}
    if cfg.policy_api == "sglang" and info.api == "openai":
        changes.update(policy_url=root + "/v1", policy_api="openai")
        if cfg.model_name == RolloutConfig.model_name and info.served_model:
            changes["model_name"] = info.served_model
    if cfg.max_context_len is None and info.context_len:
        model_limit = _max_context(cfg.model_dir) if cfg.model_dir and Path(cfg.model_dir, "config.json").is_file() else None
        if model_limit is None or info.context_len < model_limit:
            changes["max_context_len"] = info.context_len
    return dataclasses.replace(cfg, **changes) if changes else cfg


def agent_config(cfg: RolloutConfig, endpoint: ModelEndpoint | None = None):
    """The trial's AgentConfig. Gateway agents get `endpoint` (their session; a placeholder when
    the config is only checked) as Harbor's conventions pass it: `api_base` + `model_name` kwargs
    to host-side agents, environment variables to installed agents."""
    config = _agent_config(cfg, endpoint)
    config.override_setup_timeout_sec = cfg.agent_setup_timeout_sec
    return config


def _agent_config(cfg: RolloutConfig, endpoint: ModelEndpoint | None):
    from harbor.models.trial.config import AgentConfig

    if is_native(cfg.agent):
        return AgentConfig(
            import_path=NATIVE_AGENT,
            model_name=cfg.model_name,
            kwargs={
                "policy_url": cfg.policy_url,
                "tokenizer_path": str(cfg.model_dir),
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
    config = AgentConfig(name=None if import_path else cfg.agent, import_path=import_path,
                         model_name=f"hosted_vllm/{cfg.model_name}")
    provider = recipe.provider if recipe is not None else None  # claude-code: anthropic/<name>
    if provider:
        config.model_name = f"{provider}/{cfg.model_name}"
    if is_installed_agent(config):
        config.env = installed_agent_env(endpoint)
        if recipe is not None:
            fill = {"url": endpoint.sandbox_url, "root": endpoint.sandbox_url.removesuffix("/v1"),
                    "key": endpoint.api_key, "model": cfg.model_name}
            config.env.update({k: v.format(**fill) for k, v in recipe.env.items()})
            config.kwargs["step_limit"] = cfg.step_limit
    else:
        config.kwargs["api_base"] = endpoint.host_url
        config.env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "HOSTED_VLLM_API_KEY": endpoint.api_key}
        if takes_step_limit(agent_class(config)):  # a user's agent with a limit of its own
            config.kwargs["step_limit"] = cfg.step_limit
    if host_agent := HOST_GATEWAY_AGENTS.get(cfg.agent):
        config.kwargs.update(host_agent.agent_kwargs(context_window(cfg),
                                                     cfg.sampling.max_new_tokens, cfg.sampling.temperature,
                                                     cfg.step_limit))
    for key, value in cfg.agent_kwargs.items():
        merge = isinstance(config.kwargs.get(key), dict) and isinstance(value, dict)
        config.kwargs[key] = {**config.kwargs[key], **value} if merge else value
    return config


def takes_step_limit(cls) -> bool:
    """Whether a host-side agent class limits its own steps: its constructor takes ``step_limit``
    and it does not ask the gateway to (``GATEWAY_STEP_LIMIT``)."""
    import inspect

    if getattr(cls, "GATEWAY_STEP_LIMIT", False):
        return False
    try:
        return "step_limit" in inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        return False


def gateway_step_limit(agent, step_limit: int) -> int | None:
    """The number of model calls the gateway allows the trial's agent (its session's max_calls):
    the run's step_limit when the agent's class has no turn limit of its own and says so with
    ``GATEWAY_STEP_LIMIT = True`` (Codex, a user's ``module:Class`` agent), else None."""
    if agent is None or not getattr(agent_class(agent), "GATEWAY_STEP_LIMIT", False):
        return None
    return step_limit


def environment_config(env: str, gateway=None, agent=None):
    """The trial's EnvironmentConfig. With a gateway, our sandboxes (local, docker) are told where
    it listens: a no-network sandbox then reaches it, and nothing else, at 127.0.0.1:<its port>.
    Given the trial's AgentConfig, they provide what the agent needs without opening the task's
    network: tmux for terminus-2, and what the agent installs from the registries before the trial
    starts (`agent_installs`, e.g. mini-swe-agent's venv; slime_harbor.agents.installed)."""
    from harbor.models.trial.config import EnvironmentConfig

    from slime_harbor.agents.installed.installs import environment_kwargs

    ours = {"gateway_port": gateway.port, "gateway_host": connect_host(gateway)} if gateway is not None else {}
    if agent is not None and (host_agent := HOST_GATEWAY_AGENTS.get(agent.name)):
        ours.update(host_agent.ENVIRONMENT_KWARGS)
    ours.update(environment_kwargs(agent) if agent is not None else {})
    if env == "local":
        return EnvironmentConfig(import_path=LOCAL_SANDBOX, delete=True, kwargs=ours)
    if env == "docker":
        return EnvironmentConfig(import_path=DOCKER_SANDBOX, delete=True, kwargs=ours)
    if env == "harbor-docker":  # Harbor's own, one `docker compose` process per call
        return EnvironmentConfig(type="docker", delete=True)
    if ":" in env:
        return EnvironmentConfig(import_path=env, delete=True)
    return EnvironmentConfig(type=env, delete=True)


def environment_keeps_state(env: str) -> bool:
    """Whether the run's environment can keep the agent's state for a second verifier
    (keep_state(): our docker and local sandboxes)."""
    config = environment_config(env)
    if not config.import_path:
        return False
    from harbor.utils.import_path import import_class

    try:
        return hasattr(import_class(config.import_path, label="environment"), "keep_state")
    except Exception:  # an environment that does not import: check_config says so; it keeps nothing
        return False


def preflight_environment(env: str) -> None:
    """One clear error before any trial starts when the environment cannot run here."""
    if env == "docker":
        from slime_harbor.environments.docker_images import check_docker

        check_docker()  # DockerUnavailableError: no daemon answers


def check_environment_runs(env: str) -> None:
    """preflight_environment as a ConfigError, which the command line prints as one line."""
    try:
        preflight_environment(env)
    except RuntimeError as exc:  # DockerUnavailableError: no daemon answers
        raise ConfigError(f"env {env!r} cannot run here: {one_line(exc)}") from None


def hard_timeout_sec(task_path: Path, multiplier: float, verifier_timeout_sec: float | None = None,
                     agent_setup_sec: float = 0.0) -> float:
    """Upper bound on one trial's wall time, from the task's own timeouts (Harbor's defaults if unset)
    and the agent's setup budget (`agent_setup_sec`, Harbor's resolved one: it bounds the agent's
    install before the environment starts and Harbor's agent setup after)."""
    config = tomllib.loads((Path(task_path) / "task.toml").read_text())
    agent = config.get("agent", {}).get("timeout_sec", 600.0)
    verifier = verifier_timeout_sec or config.get("verifier", {}).get("timeout_sec", 600.0)
    build = config.get("environment", {}).get("build_timeout_sec", 600.0)
    verifier_config = config.get("verifier", {})
    if verifier_config.get("environment_mode") == "separate" or (
        "environment" in verifier_config and verifier_config.get("environment_mode") != "shared"
    ):  # a separate verifier starts an environment of its own, under the same build timeout
        build *= 2
    return multiplier * (agent + verifier + build) + 2 * agent_setup_sec + HARD_TIMEOUT_SLACK_SEC


def install_agents_first(trial) -> None:
    """Install the trial's agent (the tool layers or host venvs our sandboxes build from the
    registries) before Harbor starts its environment, within the agent's setup budget: Harbor's
    ``trial.agent_setup_timeout_sec`` (the agent class's default, ``override_setup_timeout_sec``
    and the multipliers), not the task's build timeout, which Harbor puts around the start. A hook
    on the trial's ENVIRONMENT_START event, which Harbor awaits before that bound; an install that
    fails or runs out of budget ends the trial with AgentInstallError (an infrastructure failure,
    retried like an environment that did not start). Environments without installs: nothing."""
    from harbor.trial.hooks import TrialEvent

    environment = trial.agent_environment
    if not hasattr(environment, "install_agents"):
        return
    environment.agent_setup_timeout_sec = trial.agent_setup_timeout_sec

    async def install(event) -> None:
        await environment.install_agents(trial.config.environment.force_build)

    trial.add_hook(TrialEvent.ENVIRONMENT_START, install)


def run_setting_choices() -> dict[str, tuple[str, ...]]:
    """The RunSettings knobs that take one of a fixed set of values, with the set (the flags' choices)."""
    from slime_harbor.hack_monitor import HACK_ACTIONS
    from slime_harbor.impossible_twin import TWIN_SWITCH

    return {"reward_mapping": REWARD_MAPPINGS, "hack_action": HACK_ACTIONS, "impossible_twin": TWIN_SWITCH}


def check_run_settings(settings: RunSettings) -> None:
    """RunSettings' checks, for every runner that takes them (ValueError in one line)."""
    from slime_harbor.hack_monitor import HACK_ACTIONS
    from slime_harbor.impossible_twin import TWIN_SWITCH

    checks = [
        (settings.n_samples >= 1, f"n_samples must be at least 1, got {settings.n_samples}"),
        (settings.concurrency >= 1, f"concurrency must be at least 1, got {settings.concurrency}"),
        (settings.reward_mapping in REWARD_MAPPINGS, f"reward_mapping must be raw or pm1, got {settings.reward_mapping!r}"),
        (settings.verifier_timeout_sec is None or settings.verifier_timeout_sec > 0,
         f"verifier_timeout_sec (the verifier's time limit) must be > 0 seconds, got {settings.verifier_timeout_sec}"),
        (settings.hack_action in HACK_ACTIONS,
         f"hack_action must be one of {', '.join(HACK_ACTIONS)}, got {settings.hack_action!r}"),
        (bool(settings.hack_judge_url) == bool(settings.hack_judge_model),
         "a hack judge needs both a URL and a model (hack_judge_url, hack_judge_model)"),
        (settings.impossible_twin in TWIN_SWITCH, f"impossible_twin must be on or off, got {settings.impossible_twin!r}"),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)


def check_config(cfg: RolloutConfig) -> list[Path]:
    """Refuse, before any trial starts, what would otherwise hang, fail every trial or die in a
    traceback mid-run: bad numbers, a missing or empty tasks dir, a task Harbor cannot load
    (named by its task.toml), an agent or environment that does not resolve. Returns the tasks."""
    checks = [
        # temperature and top_p: SamplingParams refuses them when built; an episode's turns need more.
        (cfg.sampling.max_new_tokens >= 1, f"max_new_tokens must be at least 1, got {cfg.sampling.max_new_tokens}"),
        (cfg.sampling.top_k == -1 or cfg.sampling.top_k >= 1,
         f"top_k must be -1 (off) or at least 1, got {cfg.sampling.top_k}"),
        (cfg.timeout_multiplier > 0, f"timeout_multiplier must be > 0, got {cfg.timeout_multiplier}"),
        (cfg.agent_setup_timeout_sec is None or cfg.agent_setup_timeout_sec > 0,
         f"agent_setup_timeout_sec must be > 0, got {cfg.agent_setup_timeout_sec}"),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)
    try:
        check_run_settings(cfg)
        check_agent_settings(cfg)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if samples_policy(cfg.agent) and not (cfg.policy_url and cfg.model_dir):
        raise ConfigError(f"agent {cfg.agent} needs policy_url and model_dir")
    try:
        tasks = discover_tasks(cfg.tasks_dir, cfg.task_names)
    except FileNotFoundError as exc:
        raise ConfigError(str(exc)) from None
    from harbor.models.task.task import Task

    for task in tasks:
        try:
            Task(task)
        except Exception as exc:  # TOML syntax, schema (pydantic), missing tests/instruction
            raise ConfigError(f"task {task / 'task.toml'} cannot be loaded: {one_line(exc)}") from None
    check_agent(cfg)
    _check_environment(cfg.env)
    _check_agent_installs(cfg)
    try:
        cfg.hack_detector_functions()
    except ValueError as exc:
        raise ConfigError(f"hack detector: {one_line(exc)}") from None
    apply_manifest(tasks, cfg.task_manifest)  # a missing or malformed manifest: ConfigError now
    return tasks


def check_agent(cfg: RolloutConfig) -> None:
    """The agent can run here: not refused (UNAVAILABLE), placed if Harbor names it, importable
    (ConfigError in one line otherwise)."""
    from harbor.agents.factory import AgentFactory
    from harbor.models.agent.name import AgentName

    from slime_harbor.agents.installed.catalog import RECIPES, UNAVAILABLE

    if cfg.agent in UNAVAILABLE:
        raise ConfigError(f"agent {cfg.agent!r} cannot train here: {UNAVAILABLE[cfg.agent]}")
    if cfg.agent in AgentName.values() and harbor_agent_place(cfg.agent) is None:
        raise ConfigError(f"agent {cfg.agent!r} is Harbor's but has no place in slime-harbor (no recipe in "
                          "agents/installed/catalog.py, no reason in its UNAVAILABLE): it would run Harbor's own "
                          "install in the sandbox")
    try:
        agent_class(agent_config(cfg))
    except Exception as exc:  # whatever importing a user's module:Class or Harbor's agent raises: one line
        if ":" not in cfg.agent and cfg.agent not in RECIPES:
            examples = ", ".join(AgentFactory.registered_names()[:4])
            raise ConfigError(f"unknown agent {cfg.agent!r}: use native, terminus-2, mini-swe-agent, oracle, nop, another Harbor "
                              f"agent name ({examples}, ...) or module:Class") from None
        raise ConfigError(f"agent {cfg.agent!r} cannot be imported: {one_line(exc)}") from None


def _check_agent_installs(cfg: RolloutConfig) -> None:
    """What the agent needs installed in the sandbox can be built here (the bubblewrap sandbox's
    host-side installs; a Docker layer's build fails its trials with the build log instead)."""
    from slime_harbor.agents.installed.installs import ENVIRONMENT_KWARG, environment_kwargs
    from slime_harbor.agents.installed.catalog import resolve_installs

    if cfg.env != "local" or not samples_policy(cfg.agent) or is_native(cfg.agent):
        return
    for install in resolve_installs(environment_kwargs(agent_config(cfg)).get(ENVIRONMENT_KWARG)):
        try:
            install.check_host()
        except RuntimeError as exc:
            raise ConfigError(f"agent {cfg.agent!r} cannot run with env 'local': {one_line(exc)}") from None


def _check_environment(env: str) -> None:
    try:
        config = environment_config(env)
    except Exception:  # a name environment_config cannot place: one line naming the choices
        raise ConfigError(f"unknown env {env!r}: use local, docker, another Harbor environment type "
                          f"(daytona, modal, ...) or module:Class") from None
    try:
        if config.import_path:
            from harbor.utils.import_path import import_class

            import_class(config.import_path, label="environment")
        else:
            from harbor.environments.factory import _load_environment_class

            _load_environment_class(config.type)
    except Exception as exc:  # an import path that does not import, an extra not installed
        raise ConfigError(f"env {env!r} cannot be loaded: {one_line(exc)}") from None


def context_window(cfg: RolloutConfig) -> int:
    """An episode's context window in tokens, which the native agent and the gateway hold it to:
    cfg.max_context_len, else the model's max_position_embeddings."""
    return cfg.max_context_len or _max_context(cfg.model_dir)


def _max_context(model_dir: str | None) -> int:
    if model_dir and (Path(model_dir) / "config.json").exists():
        return int(json.loads((Path(model_dir) / "config.json").read_text()).get("max_position_embeddings", 4096))
    return int(os.environ.get("SLIME_HARBOR_MAX_CONTEXT", 32768))


@contextlib.contextmanager
def policy_endpoint(cfg):
    """Yield a RolloutConfig with policy_url/model_dir set: the given server, or an embedded one
    on loopback serving cfg.model_dir (default: the tiny offline model)."""
    if not samples_policy(cfg.agent) or cfg.policy_url:
        if samples_policy(cfg.agent) and not cfg.model_dir:
            raise SystemExit("--model (the policy's HF dir, for its tokenizer) is required with --policy-url")
        yield cfg
        return
    from slime_harbor.policy.server import EmbeddedPolicyServer  # torch: only when one is embedded
    from slime_harbor.policy.tiny_model import ensure_tiny_model

    model_dir = cfg.model_dir or str(ensure_tiny_model())
    with EmbeddedPolicyServer(model_dir, model_name=cfg.model_name) as server:
        print(f"embedded policy server for {model_dir} at {server.url}", file=sys.stderr)
        yield dataclasses.replace(cfg, policy_url=server.url, model_dir=model_dir)
