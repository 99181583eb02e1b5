"""A run's settings and the checks that refuse a bad one in one line before any trial starts:
RunSettings (the knobs every runner takes: the rollout command, train-local and the demo, SLiME's
hook and the verifiers plugin derive theirs from these declarations), RolloutConfig (everything
one rollout needs), check_config, and the policy a run samples from (policy_endpoint, with_engine).

rollout.py runs trials from these; the agent's config is agents/placement.py's, the sandbox's
trial_setup.py's; the SLiME hook (hooks.py) and the local trainer build a RolloutConfig and call
rollout.run_episode.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slime_harbor.agents.placement import agent_class, agent_config, harbor_agent_place, is_native, samples_policy
from slime_harbor.agents.settings import AgentSettings, check_agent_settings, model_context_len
from slime_harbor.exits import ConfigError, one_line
from slime_harbor.fleet import FLEETS
from slime_harbor.policy.sampling import SamplingParams
from slime_harbor.policy.wire_api import COMPLETIONS_API, GENERATE_API
from slime_harbor.tasks.manifest import apply_manifest
from slime_harbor.tasks.task_dir import discover_tasks
from slime_harbor.trial_setup import environment_config

BUNDLED_TASKS = "examples/harbor/tasks"
"""The bundled example tasks, relative to the repository (as the SLiME plugin's YAML and launch
script name them: training runs from the repository)."""
DEFAULT_TASKS = Path(__file__).resolve().parent.parent / BUNDLED_TASKS
"""The bundled example tasks: every runner's default tasks dir."""


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
    fleet: str = "local"
    """local: every trial in this process | ray: on rollout workers of a Ray cluster, one per node
    with the `rollout` resource, each with its own sandboxes, gateway and engine client (fleet.py).
    `concurrency` stays the run's total in flight."""
    ray_address: str | None = None
    """The Ray cluster of fleet ray (ray.init's address); None: the one this process is in, else auto."""
    fleet_node_trials: int = 0
    """fleet ray: trials in flight on one node at most (0: only `concurrency` bounds them)."""
    fleet_node_starts_per_sec: float = 0.0
    """fleet ray: sandbox starts a second on one node at most (0: unbounded)."""
    gateway_keys: str = "auto"
    """auto | on | off: every gateway call must carry its trial's own key (handed to each agent with
    its URL; none is refused 401, another trial's 403). auto: on when gateway_host is beyond loopback."""
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
    renderer: str | None = None
    """The policy's chat format, a PyPI `renderers` name (qwen3, qwen3.6, glm-5, deepseek-v3, gpt-oss,
    llama-3, ...: docs/model-families.md): how turns become tokens and replies become tool calls, for
    the native agent and the gateway alike. None = the checkpoint's own (the name make-model recorded,
    its Hugging Face name, else its config.json model_type where that carries one format)."""
    grader_watch: str = "on"
    """on: every Python process of a verifier in our sandboxes runs with the grading watch's audit
    hook (grader_watch/): agent code that reads the grader's files, its callers' frames, walks the
    heap or installs a tracer while the tests run is the hack flag reads_grader/runtime, acted on by
    hack_action; a verification the hook could not watch is counted unwatched, never clean | off."""


@dataclass
class RolloutConfig(RunSettings, AgentSettings):
    """Everything one rollout needs. Every field has a default that runs on this machine. The
    knobs every runner shares are RunSettings' fields, the agent settings (step_limit,
    max_context_len, routing_key, policy_api, reissue_aborted_calls, keep_interrupted_calls, lora_name) AgentSettings':
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
        from slime_harbor.grading.hack_monitor import BUILTIN_DETECTORS, judge_detector, load_detector

        if bool(self.hack_judge_url) != bool(self.hack_judge_model):
            raise ValueError("a hack judge needs both a URL and a model (--hack-judge-url, --hack-judge-model)")
        judge = [judge_detector(self.hack_judge_url, self.hack_judge_model)] if self.hack_judge_url else []
        return [*BUILTIN_DETECTORS.values(), *(load_detector(spec) for spec in self.hack_detectors), *judge]


from slime_harbor.reward import REWARD_MAPPINGS  # noqa: E402 (declared with the rule that maps)


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
    if cfg.policy_api == GENERATE_API and info.api == COMPLETIONS_API:
        changes.update(policy_url=root + "/v1", policy_api=COMPLETIONS_API)
        if cfg.model_name == RolloutConfig.model_name and info.served_model:
            changes["model_name"] = info.served_model
    if cfg.max_context_len is None and info.context_len:
        model_limit = model_context_len(cfg.model_dir) if cfg.model_dir and Path(cfg.model_dir, "config.json").is_file() else None
        if model_limit is None or info.context_len < model_limit:
            changes["max_context_len"] = info.context_len
    return dataclasses.replace(cfg, **changes) if changes else cfg


WATCH_SWITCH = ("on", "off")
"""RunSettings.grader_watch's values a user sets."""
GATEWAY_KEYS = ("auto", "on", "off")
"""RunSettings.gateway_keys' values."""
WATCH_MODES = (*WATCH_SWITCH, "probe")
"""...and calibrate's "probe" for its empty-answer trials (grader_watch/verifier.py: PROBE)."""


def run_setting_choices() -> dict[str, tuple[str, ...]]:
    """The RunSettings knobs that take one of a fixed set of values, with the set (the flags' choices)."""
    from slime_harbor.reward import HACK_ACTIONS
    from slime_harbor.grading.impossible_twin import TWIN_SWITCH

    return {"reward_mapping": REWARD_MAPPINGS, "hack_action": HACK_ACTIONS, "impossible_twin": TWIN_SWITCH,
            "grader_watch": WATCH_SWITCH, "gateway_keys": GATEWAY_KEYS, "fleet": FLEETS}


def check_run_settings(settings: RunSettings) -> None:
    """RunSettings' checks, for every runner that takes them (ValueError in one line)."""
    from slime_harbor.reward import HACK_ACTIONS
    from slime_harbor.grading.impossible_twin import TWIN_SWITCH

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
        (settings.grader_watch in WATCH_MODES, f"grader_watch must be on or off, got {settings.grader_watch!r}"),
        (settings.gateway_keys in GATEWAY_KEYS, f"gateway_keys must be auto, on or off, got {settings.gateway_keys!r}"),
        (settings.fleet in FLEETS, f"fleet must be local or ray, got {settings.fleet!r}"),
        (settings.fleet_node_trials >= 0, f"fleet_node_trials must be >= 0, got {settings.fleet_node_trials}"),
        (settings.fleet_node_starts_per_sec >= 0,
         f"fleet_node_starts_per_sec must be >= 0, got {settings.fleet_node_starts_per_sec}"),
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
    check_chat_format(cfg)
    _check_environment(cfg.env)
    _check_agent_installs(cfg)
    try:
        cfg.hack_detector_functions()
    except ValueError as exc:
        raise ConfigError(f"hack detector: {one_line(exc)}") from None
    apply_manifest(tasks, cfg.task_manifest)  # a missing or malformed manifest: ConfigError now
    if cfg.fleet == "ray":  # its workers start now: no cluster, or no rollout node, is one line before any trial
        from slime_harbor.fleet import ray_fleet

        ray_fleet(cfg)
    return tasks


def check_chat_format(cfg: RolloutConfig) -> None:
    """The policy's chat format is known and its tokenizer carries the format's tokens (one line
    otherwise: an unknown --renderer, a model_type with several formats or none we know)."""
    from slime_harbor.policy.chat_formats import check_renderer_name, choose_renderer

    if not samples_policy(cfg.agent):
        return
    if not (cfg.model_dir and Path(cfg.model_dir, "config.json").is_file()):  # the embedded default, built later
        if cfg.renderer:
            check_renderer_name(cfg.renderer)
        return
    from slime_harbor.policy.renderer import load_tokenizer, make_renderer

    name = choose_renderer(cfg.model_dir, cfg.renderer)
    try:
        tokenizer = load_tokenizer(cfg.model_dir)
    except Exception as exc:  # whatever transformers raises for files it cannot read: one line
        raise ConfigError(f"cannot load the tokenizer of {cfg.model_dir}: {one_line(exc)}") from None
    make_renderer(cfg.model_dir, tokenizer, name)


def with_chat_format(cfg: RolloutConfig) -> RolloutConfig:
    """cfg with its chat format chosen (chat_formats.choose_renderer), so every agent, the gateway,
    the trial configs and summary.json name the one format the run speaks."""
    if not (samples_policy(cfg.agent) and cfg.model_dir):
        return cfg
    from slime_harbor.policy.chat_formats import choose_renderer

    return dataclasses.replace(cfg, renderer=choose_renderer(cfg.model_dir, cfg.renderer))


def gateway_keys_on(cfg: RunSettings) -> bool:
    """Whether the run's gateway takes only each trial's own key (gateway_keys; auto: beyond loopback)."""
    from slime_harbor.http_api import is_loopback

    return cfg.gateway_keys == "on" or (cfg.gateway_keys == "auto" and not is_loopback(cfg.gateway_host))


def check_agent(cfg: RolloutConfig) -> None:
    """The agent can run here: not refused (UNAVAILABLE), placed if Harbor names it, importable
    (ConfigError in one line otherwise)."""
    from harbor.agents.factory import AgentFactory
    from harbor.models.agent.name import AgentName

    from slime_harbor.agents.installed.catalog import RECIPES, UNAVAILABLE

    if cfg.agent in UNAVAILABLE:
        raise ConfigError(f"agent {cfg.agent!r} cannot train here: {UNAVAILABLE[cfg.agent]}")
    if cfg.agent in RECIPES and not RECIPES[cfg.agent].sends_key and gateway_keys_on(cfg):
        raise ConfigError(f"agent {cfg.agent!r} sends no usable key, and the gateway takes only each trial's own "
                          f"(gateway_keys {cfg.gateway_keys}, gateway_host {cfg.gateway_host}): run it with the "
                          "gateway on loopback and gateway_keys auto or off")
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
