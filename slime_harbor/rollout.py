"""Rollouts: run Harbor Trials as GRPO groups and write training samples.

One episode = one real Harbor Trial (agent + sandbox + verifier) = `run_episode`. A rollout runs
`n_samples` episodes of every task (a GRPO group per task) with bounded concurrency, and writes

    OUT/samples.jsonl   one TrainingSample per line, appended as each trial finishes
    OUT/summary.json    counts by status, rewards, drift, timings (also after Ctrl-C)
    OUT/trials/         a Harbor job dir: Harbor's own trial dirs (config, result, agent logs,
                        verifier output) with the job's config.json and result.json beside them
                        (harbor_job.py), so `harbor view OUT` / `slime-harbor view OUT` show the run

`run_episode` is the unit the SLiME hook (hooks.py) and the local trainer call too.

Every agent but native / oracle / nop samples through the recording gateway (slime_harbor/gateway):
`run_rollouts` starts one in front of cfg.policy_url, `run_episode` opens one session per trial
(its id is the trial name, its calls recorded under the trial's agent/gateway dir), hands the agent
the session's URL, closes the session when the trial ends and builds the samples from what the
gateway recorded. Host-side agents (terminus-2, a `module:Class` BaseAgent) get it as `api_base`;
installed agents (run inside the sandbox) as OPENAI_BASE_URL & co., through the sandbox's forward of
127.0.0.1:<gateway port> (EnvironmentConfig kwarg `gateway_port`, our `local` and `docker` sandboxes).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
import tomllib
import uuid
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from slime_harbor.converter import environment_start_failed, trial_to_samples
from slime_harbor.exits import ConfigError, one_line
from slime_harbor.harbor_job import HarborJob
from slime_harbor.isolation import isolate_shared_verifier
from slime_harbor.samples import SampleStatus, TrainingSample
from slime_harbor.tasks.manifest import apply_manifest

DEFAULT_TASKS = Path(__file__).resolve().parent.parent / "examples" / "harbor" / "tasks"
"""The bundled example tasks."""
LOCAL_SANDBOX = "slime_harbor.environments.bubblewrap:BubblewrapEnvironment"
DOCKER_SANDBOX = "slime_harbor.environments.docker:DockerEnvironment"
NATIVE_AGENT = "slime_harbor.agent:NativeAgent"
NO_MODEL_AGENTS = frozenset({"oracle", "nop"})
"""Harbor agents that never call a model: they need no policy and no gateway."""
AGENT_IMPORT_PATHS = {"mini-swe-agent": "slime_harbor.installed_agents.mini_swe_agent:MiniSweAgent"}
"""Harbor agent names we run through our own class (mini-swe-agent: installed from the registries
only); every other name resolves as Harbor resolves it."""
SANDBOX_LOOPBACK = "127.0.0.1"
"""The gateway's address inside a sandbox: our sandboxes forward <loopback>:<gateway port> to it."""
# Slack on top of the task's own agent + verifier + build timeouts before we cancel a trial that
# Harbor's own timeouts failed to end (a hung container teardown, a stuck verifier upload).
HARD_TIMEOUT_SLACK_SEC = 120.0

log = logging.getLogger(__name__)


@dataclass
class RolloutConfig:
    """Everything one rollout needs. Every field has a default that runs on this machine."""

    tasks_dir: Path = Path("examples/harbor/tasks")
    """Directory of Harbor task dirs (each with task.toml)."""
    task_names: list[str] | None = None
    """Only these tasks (dir names); None = all tasks in tasks_dir."""
    task_manifest: Path | None = None
    """A `slime-harbor calibrate` manifest: tasks it marks broken or flaky are skipped (and named in
    summary.json); tasks it does not list run."""
    agent: str = "native"
    """native | terminus-2 | mini-swe-agent | oracle | nop | any Harbor agent name | module:Class import
    path. Every one but native / oracle / nop samples through the recording gateway."""
    n_samples: int = 4
    """Episodes per task: the GRPO group size."""
    policy_url: str | None = None
    """SGLang router / policy server base URL (the native agent's, and the gateway's upstream)."""
    model_dir: str | None = None
    """HF dir of the policy: tokenizer for the native agent and for decoding samples."""
    model_name: str = "policy"
    """Name the gateway serves the policy under (agents get `hosted_vllm/<model_name>`)."""
    env: str = "local"
    """local (bubblewrap) | docker (ours, Engine API) | harbor-docker (Harbor's, docker compose) |
    daytona | modal | ... (Harbor's environment types) | module:Class import path."""
    concurrency: int = 4
    """Trials running at once."""
    out_dir: Path = Path("runs/rollout")
    """Where samples.jsonl, summary.json and trials/ go."""
    temperature: float = 1.0
    """Sampling temperature (1.0: sample the policy itself)."""
    top_p: float = 1.0
    top_k: int = -1
    step_limit: int = 30
    """Most agent turns per episode."""
    max_new_tokens: int = 512
    """Most tokens sampled per turn."""
    # Native agent only (forwarded as its options of the same names; see agent.NativeAgentOptions).
    max_context_len: int | None = None
    """Prompt+completion token limit of an episode; None = the model's. Past it: context_limit."""
    stop: list[str] = field(default_factory=list)
    """Extra stop strings."""
    stop_token_ids: list[int] = field(default_factory=list)
    """Extra stop token ids."""
    return_top_p_token_ids: bool = False
    """Record the top-p kept ids per sampled token (SLiME's top-p replay, needed when top_p != 1)."""
    sampling_seed: int | None = None
    """Seed of each episode run with this config (the SLiME hook builds one config per sample);
    None = random. Every episode of one config gets the same seed: leave it None for run_rollouts."""
    routing_key: str | None = None
    """X-SMG-Routing-Key sent with every turn (the SLiME hook: sample.session_id); None = none."""
    timeout_multiplier: float = 1.0
    """Scales the task.toml agent/verifier/build timeouts."""
    policy_api: str = "sglang"
    """How agents reach policy_url: sglang (its root; /generate, and /v1 for terminus-2) | openai
    (an OpenAI-compatible base URL ending in /v1, e.g. vLLM's: the native agent sends token ids to
    /v1/completions)."""
    lora_name: str | None = None
    """LoRA adapter loaded on the policy server to sample from (SGLang's /generate lora_path; the
    OpenAI model name for terminus-2); None = the served model itself."""
    verifier_timeout_sec: float | None = None
    """The verifier's time limit in seconds, instead of the task's [verifier] timeout_sec."""
    reward_mapping: str = "raw"
    """raw: verifier reward as is; pm1: reward r in [0,1] -> 2r-1."""
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
    gateway_host: str = "127.0.0.1"
    """Address the model gateway binds (gateway agents). Loopback: our sandboxes reach it through
    their forward; a sandbox elsewhere (Modal, Daytona, E2B) needs an address it can reach."""


@dataclass
class Episode:
    """What one trial produced."""

    task_name: str
    group_index: int
    index: int
    status: SampleStatus
    reward: float | None
    samples: list[TrainingSample]
    seconds: float
    trial_dir: str | None = None
    error: str | None = None


def discover_tasks(tasks_dir: Path, names: list[str] | None = None) -> list[Path]:
    tasks_dir = Path(tasks_dir)
    if not tasks_dir.is_dir():
        raise FileNotFoundError(f"tasks dir {tasks_dir} does not exist")
    tasks = sorted(p for p in tasks_dir.iterdir() if (p / "task.toml").is_file())
    if names:
        missing = set(names) - {p.name for p in tasks}
        if missing:
            raise FileNotFoundError(f"tasks not found in {tasks_dir}: {sorted(missing)}")
        tasks = [p for p in tasks if p.name in names]
    if not tasks:
        raise FileNotFoundError(f"no Harbor tasks (dirs with task.toml) in {tasks_dir}")
    return tasks


def is_native(agent: str) -> bool:
    return agent in ("native", NATIVE_AGENT)


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
    """The session id: the gateway accepts any key on a session path, and reads it where none is."""

    @classmethod
    def of(cls, gateway, session_id: str) -> ModelEndpoint:
        return cls(host_url=f"http://{connect_host(gateway)}:{gateway.port}/s/{session_id}/v1",
                   sandbox_url=f"http://{SANDBOX_LOOPBACK}:{gateway.port}/s/{session_id}/v1", api_key=session_id)


def connect_host(gateway) -> str:
    """The address this host reaches the gateway at (a gateway bound to every address: loopback)."""
    return gateway.host if gateway.host not in ("0.0.0.0", "::", "") else SANDBOX_LOOPBACK


UNBOUND_ENDPOINT = ModelEndpoint("http://127.0.0.1:0/s/unbound/v1", "http://127.0.0.1:0/s/unbound/v1", "unbound")
"""What agent_config puts in a config built only to be checked (no gateway running)."""


def installed_agent_env(endpoint: ModelEndpoint) -> dict[str, str]:
    """The variables Harbor's installed agents read for their endpoint and key (LiteLLM's, OpenAI's,
    mini-swe-agent's, Anthropic's base URL without /v1), all naming the trial's session."""
    url = endpoint.sandbox_url
    return {
        "OPENAI_BASE_URL": url, "OPENAI_API_BASE": url, "HOSTED_VLLM_API_BASE": url,
        "OPENAI_API_KEY": endpoint.api_key, "MSWEA_API_KEY": endpoint.api_key, "HOSTED_VLLM_API_KEY": endpoint.api_key,
        "ANTHROPIC_BASE_URL": url.removesuffix("/v1"),
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


def agent_config(cfg: RolloutConfig, endpoint: ModelEndpoint | None = None):
    """The trial's AgentConfig. Gateway agents get `endpoint` (their session; a placeholder when
    the config is only checked) as Harbor's conventions pass it: `api_base` + `model_name` kwargs
    to host-side agents, environment variables to installed agents."""
    from harbor.models.trial.config import AgentConfig

    if is_native(cfg.agent):
        return AgentConfig(
            import_path=NATIVE_AGENT,
            model_name=cfg.model_name,
            kwargs={
                "policy_url": cfg.policy_url,
                "tokenizer_path": str(cfg.model_dir),
                "step_limit": cfg.step_limit,
                "temperature": cfg.temperature,
                "top_p": cfg.top_p,
                "top_k": cfg.top_k,
                "max_new_tokens": cfg.max_new_tokens,
                "lora_path": cfg.lora_name,
                "policy_api": cfg.policy_api,
                "max_context_len": cfg.max_context_len,
                "stop": list(cfg.stop),
                "stop_token_ids": list(cfg.stop_token_ids),
                "return_top_p_token_ids": cfg.return_top_p_token_ids,
                "sampling_seed": cfg.sampling_seed,
                "routing_key": cfg.routing_key,
                **cfg.agent_kwargs,
            },
        )
    if cfg.agent in NO_MODEL_AGENTS:
        return AgentConfig(name=cfg.agent, kwargs=dict(cfg.agent_kwargs))
    endpoint = endpoint or UNBOUND_ENDPOINT
    import_path = AGENT_IMPORT_PATHS.get(cfg.agent, cfg.agent if ":" in cfg.agent else None)
    # The gateway serves the policy (and its LoRA adapter) under one name and accepts any model
    # string; agents get it in the provider/model form LiteLLM-based agents need.
    config = AgentConfig(name=None if import_path else cfg.agent, import_path=import_path,
                         model_name=f"hosted_vllm/{cfg.model_name}")
    if is_installed_agent(config):
        config.env = installed_agent_env(endpoint)
        if cfg.agent == "mini-swe-agent":
            config.kwargs["step_limit"] = cfg.step_limit
    else:
        config.kwargs["api_base"] = endpoint.host_url
        config.env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "HOSTED_VLLM_API_KEY": endpoint.api_key}
    if cfg.agent == "terminus-2":
        config.kwargs.update({
            # The gateway records the tokens; terminus-2's own token-id fields are not needed.
            "collect_rollout_details": False,
            # Summarisation rewrites the history: every summary would start a new sample.
            "enable_summarize": False,
            "proactive_summarization_threshold": 0,
            "temperature": cfg.temperature,
            "max_turns": cfg.step_limit,
            "record_terminal_session": False,
            "suppress_max_turns_warning": True,
            "model_info": {
                "max_input_tokens": cfg.max_context_len or _max_context(cfg.model_dir),
                "max_output_tokens": cfg.max_new_tokens,
                "input_cost_per_token": 0.0,
                "output_cost_per_token": 0.0,
            },
            "llm_call_kwargs": {"max_tokens": cfg.max_new_tokens},
        })
    for key, value in cfg.agent_kwargs.items():
        merge = isinstance(config.kwargs.get(key), dict) and isinstance(value, dict)
        config.kwargs[key] = {**config.kwargs[key], **value} if merge else value
    return config


def environment_config(env: str, gateway=None, agent=None):
    """The trial's EnvironmentConfig. With a gateway, our sandboxes (local, docker) are told where
    it listens: a no-network sandbox then reaches it, and nothing else, at 127.0.0.1:<its port>.
    Given the trial's AgentConfig, they provide what the agent needs without opening the task's
    network: tmux for terminus-2, and what the agent installs from the registries before the trial
    starts (`agent_installs`, e.g. mini-swe-agent's venv; slime_harbor.installed_agents)."""
    from harbor.models.trial.config import EnvironmentConfig

    from slime_harbor.installed_agents import environment_kwargs

    ours = {"gateway_port": gateway.port, "gateway_host": connect_host(gateway)} if gateway is not None else {}
    if agent is not None and agent.name == "terminus-2":
        ours["provide_tmux"] = True
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


def preflight_environment(env: str) -> None:
    """One clear error before any trial starts when the environment cannot run here."""
    if env == "docker":
        from slime_harbor.environments.docker import check_docker

        check_docker()  # DockerUnavailableError: no daemon answers


def check_environment_runs(env: str) -> None:
    """preflight_environment as a ConfigError, which the command line prints as one line."""
    try:
        preflight_environment(env)
    except RuntimeError as exc:  # DockerUnavailableError: no daemon answers
        raise ConfigError(f"env {env!r} cannot run here: {one_line(exc)}") from None


def hard_timeout_sec(task_path: Path, multiplier: float, verifier_timeout_sec: float | None = None) -> float:
    """Upper bound on one trial's wall time, from the task's own timeouts (Harbor's defaults if unset)."""
    config = tomllib.loads((Path(task_path) / "task.toml").read_text())
    agent = config.get("agent", {}).get("timeout_sec", 600.0)
    verifier = verifier_timeout_sec or config.get("verifier", {}).get("timeout_sec", 600.0)
    build = config.get("environment", {}).get("build_timeout_sec", 600.0)
    verifier_config = config.get("verifier", {})
    if verifier_config.get("environment_mode") == "separate" or (
        "environment" in verifier_config and verifier_config.get("environment_mode") != "shared"
    ):  # a separate verifier starts an environment of its own, under the same build timeout
        build *= 2
    return multiplier * (agent + verifier + build) + HARD_TIMEOUT_SLACK_SEC


async def run_episode(
    task_path: Path,
    cfg: RolloutConfig,
    *,
    group_index: int,
    index: int,
    trials_dir: Path,
    tokenizer=None,
    gateway=None,
) -> Episode:
    """Run one Harbor Trial of `task_path` and convert it. Never raises for trial failures:
    they come back as an Episode with status aborted (transient) / failed (permanent);
    cancellation still propagates. An environment that fails to start is retried
    cfg.env_start_retries times with backoff; `metadata["env_start_attempts"]` says how often.

    A gateway agent samples through `gateway` (a started slime_harbor.gateway.Gateway), one session
    per trial; without one, the episode starts its own and closes it when it ends."""
    if gateway is None and uses_gateway(cfg.agent):
        async with serving_gateway(cfg) as gateway:
            return await run_episode(task_path, cfg, group_index=group_index, index=index, trials_dir=trials_dir,
                                     tokenizer=tokenizer, gateway=gateway)
    started = time.monotonic()
    attempts = 0
    while True:
        attempts += 1
        episode = await _run_trial_once(task_path, cfg, group_index=group_index, index=index,
                                        trials_dir=trials_dir, tokenizer=tokenizer, started=started, gateway=gateway)
        retry = episode.samples[0].metadata.get("environment_start_failed") and attempts <= cfg.env_start_retries
        if not retry:
            break
        delay = cfg.env_start_backoff_sec * 2 ** (attempts - 1)
        log.warning("environment of %s failed to start (attempt %d): %s; retrying in %.1fs",
                    Path(task_path).name, attempts, episode.error, delay)
        await asyncio.sleep(delay)
    for s in episode.samples:
        s.metadata["env_start_attempts"] = attempts
    return episode


@contextlib.asynccontextmanager
async def serving_gateway(cfg: RolloutConfig):
    """A started gateway in front of cfg.policy_url for cfg's agent (None for agents that need
    none), closed with its sessions and its port freed however the block ends (Ctrl-C included)."""
    if not uses_gateway(cfg.agent):
        yield None
        return
    gateway = await start_gateway(cfg)
    try:
        yield gateway
    finally:
        await gateway.aclose()


async def start_gateway(cfg: RolloutConfig):
    """A started gateway in front of cfg.policy_url (SGLang's /generate, or an OpenAI-compatible
    /v1 with policy_api openai), serving cfg.model_dir's policy (and cfg.lora_name) as cfg.model_name."""
    from slime_harbor.gateway import Gateway

    try:
        gateway = Gateway(cfg.policy_url, cfg.model_dir, host=cfg.gateway_host, port=0,
                          served_model_name=cfg.model_name, upstream_api=cfg.policy_api, lora_name=cfg.lora_name)
        await gateway.start()
    except (ValueError, OSError) as exc:  # a model family without a reply parser, an address we cannot bind
        raise ConfigError(f"the model gateway for agent {cfg.agent!r} cannot start: {one_line(exc)}") from None
    return gateway


def session_sampling(cfg: RolloutConfig):
    """The run's sampling, which the gateway applies to every call of a session (the request's
    own temperature / top-p / top-k are replaced, its max_tokens capped, its stop strings added)."""
    from slime_harbor.policy.client import SamplingParams

    return SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
                          max_new_tokens=cfg.max_new_tokens, stop=list(cfg.stop),
                          stop_token_ids=list(cfg.stop_token_ids), return_top_p_token_ids=cfg.return_top_p_token_ids)


async def _run_trial_once(task_path, cfg: RolloutConfig, *, group_index, index, trials_dir, tokenizer, started,
                          gateway=None) -> Episode:
    from harbor.models.trial.config import TaskConfig, TrialConfig, VerifierConfig
    from harbor.trial.hooks import TrialEvent
    from harbor.trial.trial import Trial

    task_path = Path(task_path)
    trials_dir = Path(trials_dir).resolve()
    trial_name = f"{task_path.name}__g{group_index}_{index}__{uuid.uuid4().hex[:6]}"
    session = endpoint = None
    if gateway is not None:  # one session per trial, named after it, recorded in its agent dir
        session = gateway.open_session(trial_name, record_dir=trials_dir / trial_name / "agent" / "gateway",
                                       sampling=session_sampling(cfg), routing_key=cfg.routing_key,
                                       sampling_seed=cfg.sampling_seed, max_context_len=cfg.max_context_len)
        endpoint = ModelEndpoint.of(gateway, trial_name)
    trial = None
    try:
        try:
            config = TrialConfig(
                task=TaskConfig(path=task_path.resolve()),
                trial_name=trial_name,
                trials_dir=trials_dir,
                agent=(agent := agent_config(cfg, endpoint)),
                environment=environment_config(cfg.env, gateway, agent),
                verifier=VerifierConfig(override_timeout_sec=cfg.verifier_timeout_sec),
                timeout_multiplier=cfg.timeout_multiplier,
            )
            trial = await Trial.create(config)
            isolate_shared_verifier(trial)  # no agent process or reward file survives into the verifier
            if session is not None:  # the agent is done: its session's files (the ATIF trajectory of
                # an agent that writes none) must be there before the verifier and the log upload
                trial.add_hook(TrialEvent.AGENT_END, lambda event: _close_session(gateway, trial_name))
            result = await asyncio.wait_for(trial.run(), hard_timeout_sec(task_path, cfg.timeout_multiplier, cfg.verifier_timeout_sec))
        except asyncio.CancelledError:
            await _finish_environment_stop(trial)
            raise
        except TimeoutError:
            # wait_for cancelled the trial, which recorded a CancelledError (classified aborted).
            await _finish_environment_stop(trial)
            result = trial.result
        except Exception as exc:  # the trial could not even be created (malformed task dir, bad config): permanent
            log.warning("trial for %s failed before running: %s", task_path.name, exc)
            return Episode(
                task_name=task_path.name, group_index=group_index, index=index, status=SampleStatus.FAILED,
                reward=None, samples=[_failed_sample(task_path.name, group_index, index, exc)],
                seconds=time.monotonic() - started, error=f"{type(exc).__name__}: {exc}",
            )
    finally:  # ended, failed or cancelled: in-flight calls are aborted and the recording flushed
        if session is not None:
            await _close_session(gateway, trial_name)
    samples = trial_to_samples(
        result, group_index=group_index, index=index, tokenizer=tokenizer, reward_mapping=cfg.reward_mapping,
        **({"recorded": session} if session is not None else {}),
    )
    first = samples[0]
    if environment_start_failed(result):
        first.metadata["environment_start_failed"] = True
    return Episode(
        task_name=task_path.name, group_index=group_index, index=index, status=first.status,
        reward=first.reward if first.status in (SampleStatus.COMPLETED, SampleStatus.TRUNCATED) else None,
        samples=samples, seconds=time.monotonic() - started, trial_dir=first.metadata.get("trial_dir"),
        error=None if first.status in (SampleStatus.COMPLETED, SampleStatus.TRUNCATED) else first.metadata.get("status_reason"),
    )


async def _close_session(gateway, session_id: str) -> None:
    """Close a trial's gateway session unless it is closed already (at the agent's end)."""
    if session_id in gateway.sessions:
        await gateway.close_session(session_id)


async def _finish_environment_stop(trial) -> None:
    """Wait until the trial's environment is really stopped.

    Harbor stops the environment in a shielded task, and a trial cancelled a second time returns
    before that task ends; when the event loop then closes, the teardown dies half done (a
    sandbox dir or container left behind). Calling stop() again joins the teardown (our sandbox
    shares one stop task; Harbor's other environments tolerate a second stop).
    """
    environment = getattr(trial, "agent_environment", None)
    if environment is None:
        return
    stop = asyncio.ensure_future(environment.stop(delete=trial.config.environment.delete))
    cancelled = None
    while not stop.done():
        try:
            await asyncio.shield(stop)
        except asyncio.CancelledError as exc:  # keep waiting, then pass the cancellation on
            cancelled = exc
    if not stop.cancelled() and stop.exception() is not None:
        log.warning("stopping the environment of %s failed: %s", trial.config.trial_name, stop.exception())
    if cancelled is not None:
        raise cancelled


def _failed_sample(task_name: str, group_index: int, index: int, exc: BaseException) -> TrainingSample:
    return TrainingSample(
        tokens=[], response_length=0, loss_mask=[], rollout_log_probs=[], reward=None,
        status=SampleStatus.FAILED, group_index=group_index, index=index, rollout_id=index, remove_sample=True,
        metadata={"task_name": task_name, "exception_type": type(exc).__name__, "status_reason": str(exc), "no_tokens": True},
    )


def check_config(cfg: RolloutConfig) -> list[Path]:
    """Refuse, before any trial starts, what would otherwise hang, fail every trial or die in a
    traceback mid-run: bad numbers, a missing or empty tasks dir, a task Harbor cannot load
    (named by its task.toml), an agent or environment that does not resolve. Returns the tasks."""
    checks = [
        (cfg.n_samples >= 1, f"n_samples must be at least 1, got {cfg.n_samples}"),
        (cfg.concurrency >= 1, f"concurrency must be at least 1, got {cfg.concurrency}"),
        (cfg.step_limit >= 1, f"step_limit must be at least 1, got {cfg.step_limit}"),
        (cfg.max_new_tokens >= 1, f"max_new_tokens must be at least 1, got {cfg.max_new_tokens}"),
        (cfg.temperature >= 0, f"temperature must be >= 0, got {cfg.temperature}"),
        (0 < cfg.top_p <= 1, f"top_p must be in (0, 1], got {cfg.top_p}"),
        (cfg.top_k == -1 or cfg.top_k >= 1, f"top_k must be -1 (off) or at least 1, got {cfg.top_k}"),
        (cfg.timeout_multiplier > 0, f"timeout_multiplier must be > 0, got {cfg.timeout_multiplier}"),
        (cfg.reward_mapping in ("raw", "pm1"), f"reward_mapping must be raw or pm1, got {cfg.reward_mapping!r}"),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)
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
    _check_agent(cfg)
    _check_environment(cfg.env)
    _check_agent_installs(cfg)
    apply_manifest(tasks, cfg.task_manifest)  # a missing or malformed manifest: ConfigError now
    return tasks


def _check_agent(cfg: RolloutConfig) -> None:
    from harbor.agents.factory import AgentFactory

    try:
        agent_class(agent_config(cfg))
    except Exception as exc:
        if ":" not in cfg.agent and cfg.agent not in AGENT_IMPORT_PATHS:
            examples = ", ".join(AgentFactory.registered_names()[:4])
            raise ConfigError(f"unknown agent {cfg.agent!r}: use native, terminus-2, mini-swe-agent, oracle, nop, another Harbor "
                              f"agent name ({examples}, ...) or module:Class") from None
        raise ConfigError(f"agent {cfg.agent!r} cannot be imported: {one_line(exc)}") from None


def _check_agent_installs(cfg: RolloutConfig) -> None:
    """What the agent needs installed in the sandbox can be built here (the bubblewrap sandbox's
    host-side installs; a Docker layer's build fails its trials with the build log instead)."""
    from slime_harbor.installed_agents import ENVIRONMENT_KWARG, environment_kwargs, resolve_installs

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
    except Exception:
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


def load_tokenizer(model_dir: str | None):
    if not model_dir:
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


async def run_rollouts(cfg: RolloutConfig) -> dict[str, Any]:
    """Run n_samples trials per task; stream samples to OUT/samples.jsonl; return the summary."""
    tasks = check_config(cfg)
    tasks, skipped_tasks = apply_manifest(tasks, cfg.task_manifest)
    preflight_environment(cfg.env)
    async with serving_gateway(cfg) as gateway:  # closed, port freed, also on Ctrl-C
        out = Path(cfg.out_dir)
        (out / "trials").mkdir(parents=True, exist_ok=True)
        job = HarborJob(out / "trials", cfg, tasks)
        return await _run_all(cfg, tasks, out, job, load_tokenizer(cfg.model_dir), gateway, skipped_tasks)


async def _run_all(cfg: RolloutConfig, tasks: list[Path], out: Path, job: HarborJob, tokenizer, gateway,
                   skipped_tasks: dict[str, str]) -> dict[str, Any]:
    semaphore = asyncio.Semaphore(cfg.concurrency)
    episodes: list[Episode] = []
    bar = _Progress(len(tasks) * cfg.n_samples, enabled=cfg.progress)
    started = time.monotonic()
    interrupted = False

    with open(out / "samples.jsonl", "w") as sink:

        async def one(task_path: Path, group_index: int, index: int) -> None:
            async with semaphore:
                job.trial_started()
                episode = await run_episode(task_path, cfg, group_index=group_index, index=index,
                                            trials_dir=out / "trials", tokenizer=tokenizer, gateway=gateway)
            episodes.append(episode)
            job.trial_finished(episode)
            for s in episode.samples:  # written as soon as the trial ends: Ctrl-C loses nothing finished
                sink.write(s.to_json() + "\n")
            sink.flush()
            bar.update(episode)

        try:
            # A TaskGroup, not gather: on Ctrl-C / cancellation it cancels every trial and waits
            # for all of them to finish tearing down. gather returns at the first cancelled
            # child, and the event loop's shutdown would then cut the others' sandbox teardown.
            async with asyncio.TaskGroup() as group:
                for group_index, task_path in enumerate(tasks):
                    for k in range(cfg.n_samples):
                        group.create_task(one(task_path, group_index, group_index * cfg.n_samples + k))
        except (asyncio.CancelledError, KeyboardInterrupt):
            interrupted = True
            raise
        finally:
            bar.close()
            summary = summarize(episodes, cfg, time.monotonic() - started, interrupted)
            summary["skipped_tasks"] = skipped_tasks  # broken or flaky in cfg.task_manifest
            (out / "summary.json").write_text(json.dumps(summary, indent=2))
            job.finish(interrupted)
    return summary


def summarize(episodes: list[Episode], cfg: RolloutConfig, seconds: float, interrupted: bool = False) -> dict[str, Any]:
    statuses = Counter(e.status.value for e in episodes)
    scored = [e for e in episodes if e.reward is not None]
    per_task: dict[str, list[float | None]] = defaultdict(list)
    for e in sorted(episodes, key=lambda e: e.index):
        per_task[e.task_name].append(e.reward)
    samples = [s for e in episodes for s in e.samples]
    return {
        "n_trials": len(episodes),
        "status_counts": {s.value: statuses.get(s.value, 0) for s in SampleStatus},
        "n_scored": len(scored),
        "mean_reward": sum(e.reward for e in scored) / len(scored) if scored else None,
        "pass_rate": sum(e.reward >= 1.0 for e in scored) / len(scored) if scored else None,
        "per_task_rewards": dict(per_task),
        "n_samples": len(samples),
        "n_trainable_samples": sum(not s.remove_sample for s in samples),
        "drift_count": sum(s.metadata.get("drift_count", 0) for e in episodes for s in e.samples[:1]),
        # episodes whose grader detected tampering (scored 0), by kind
        "tampering_counts": dict(Counter(k for e in episodes for k in (e.samples[0].metadata.get("tampering") or []))),
        "errors": {f"{e.task_name}#{e.index}": e.error for e in episodes if e.error},
        "wall_seconds": round(seconds, 2),
        "interrupted": interrupted,
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()},
    }


class _Progress:
    """tqdm bar: trials done, failures, mean reward so far."""

    def __init__(self, total: int, enabled: bool):
        self.bar = None
        self.done = self.failed = 0
        self.rewards: list[float] = []
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc="trials", unit="trial", dynamic_ncols=True)

    def update(self, episode: Episode) -> None:
        self.done += 1
        if episode.reward is None:
            self.failed += 1
        else:
            self.rewards.append(episode.reward)
        if self.bar is not None:
            mean = sum(self.rewards) / len(self.rewards) if self.rewards else float("nan")
            self.bar.set_postfix(failed=self.failed, mean_reward=f"{mean:.3f}")
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _max_context(model_dir: str | None) -> int:
    if model_dir and (Path(model_dir) / "config.json").exists():
        return int(json.loads((Path(model_dir) / "config.json").read_text()).get("max_position_embeddings", 4096))
    return int(os.environ.get("SLIME_HARBOR_MAX_CONTEXT", 32768))
