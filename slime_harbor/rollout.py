"""Rollouts: run Harbor Trials as GRPO groups and write training samples.

One episode = one real Harbor Trial (agent + sandbox + verifier) = `run_episode`. A rollout runs
`n_samples` episodes of every task (a GRPO group per task) with bounded concurrency, and writes

    OUT/samples.jsonl   one TrainingSample per line, appended as each trial finishes
    OUT/summary.json    counts by status, rewards, drift, timings (also after Ctrl-C)
    OUT/trials/         a Harbor job dir: Harbor's own trial dirs (config, result, agent logs,
                        verifier output) with the job's config.json and result.json beside them
                        (harbor_job.py), so `harbor view OUT` / `slime-harbor view OUT` show the run

and returns the summary (`run_rollouts`), or the summary and the episodes (`run_rollout_episodes`:
what an evaluation and the canaries read, never samples.jsonl read back).

`run_episode` is the unit the SLiME hook (hooks.py) and the local trainer call too; it reruns an
aborted episode (a transient failure) within the task's RetryBudget (retries.py). What a trial is
made of: the run's settings and their checks (run_config.py), the agent's Harbor config
(agents/placement.py), the sandbox's (trial_setup.py).

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
import atexit
import contextlib
import dataclasses
import json
import logging
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from slime_harbor.agents.host import report_exit_status
from slime_harbor.converter import trial_passed, trial_to_episode
from slime_harbor.episode import CONTEXT_EXCEEDED, Episode, EpisodeEnd, TRUNCATING_EXITS
from slime_harbor.error_kinds import OURS, RETRIED, kind_of_recorded, set_up_kind, set_up_outcome
from slime_harbor.exits import ConfigError, one_line
from slime_harbor.filters import mask_counts
from slime_harbor.grading.grade import Grading, run_counts
from slime_harbor.grading.hack_monitor import show_in_viewer
from slime_harbor.harbor_job import HarborJob
from slime_harbor.grading.impossible_twin import GoldCheck, prepare_twins, twin_for, twin_line, twin_table
from slime_harbor.grading.twin_grading import verifier_config
from slime_harbor.grading.grader_watch.verifier import protection, watch_tasks
from slime_harbor.tasks.manifest import task_watch_mode
from slime_harbor.policy.renderer import load_tokenizer
from slime_harbor.retries import RetryBudget
from slime_harbor.samples import SampleStatus, is_success
from slime_harbor.tasks.manifest import apply_manifest
from slime_harbor.agents.placement import (
    agent_config,
    gateway_step_limit,
    ModelEndpoint,
    samples_policy,
    uses_gateway,
)
from slime_harbor.agents.settings import context_window
from slime_harbor.run_config import check_config, gateway_keys_on, RolloutConfig, with_chat_format, with_engine
from slime_harbor.trial_setup import (
    environment_config,
    environment_keeps_state,
    hard_timeout_sec,
    install_agents_first,
    preflight_environment,
)

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class EpisodeSlot:
    """One episode's place in a run, and what the run lends its trials: handed whole down
    run_episode's reruns and environment restarts to the trial."""

    task_path: Path
    group_index: int
    index: int
    """Its place in its task's group."""
    trials_dir: Path
    """Where its trial dirs go (Harbor's trials_dir)."""
    tokenizer: Any = None
    """The policy's tokenizer, to decode its samples (None: loaded from cfg.model_dir)."""
    gateway: Any = None
    """The started gateway a gateway agent samples through (one session per trial)."""


async def run_episode(
    task_path: Path,
    cfg: RolloutConfig,
    *,
    group_index: int,
    index: int,
    trials_dir: Path,
    tokenizer=None,
    gateway=None,
    retry_budget: RetryBudget | None = None,
    stop_retrying: Callable[[], bool] = lambda: False,
) -> Episode:
    """Run one Harbor Trial of `task_path` and convert it. Never raises for trial failures:
    they come back as an Episode with status aborted (transient) / failed (permanent);
    cancellation still propagates. An environment that fails to start is retried
    cfg.env_start_retries times with backoff; the episode's `metadata["env_start_attempts"]` says how often.

    With a `retry_budget`, an aborted episode runs again (a new trial, cfg.retry_backoff_sec
    later) while the budget has room for its task (cfg.max_retries_per_task per
    cfg.retry_window_sec) and `stop_retrying()` is false; once the budget is spent it is FAILED
    (Episode.retries_spent). `metadata["retries"]` says how many reruns it took.

    A gateway agent samples through `gateway` (a started gateway.server.Gateway), one session
    per trial; without one, the episode starts its own and closes it when it ends."""
    slot = EpisodeSlot(Path(task_path), group_index, index, Path(trials_dir).resolve(), tokenizer, gateway)
    if gateway is None and uses_gateway(cfg.agent) and cfg.fleet == "local":  # a fleet's workers have their own
        async with serving_gateway(cfg) as gateway:
            return await _run_with_reruns(dataclasses.replace(slot, gateway=gateway), cfg, retry_budget, stop_retrying)
    return await _run_with_reruns(slot, cfg, retry_budget, stop_retrying)


async def _run_with_reruns(slot: EpisodeSlot, cfg: RolloutConfig, retry_budget: RetryBudget | None,
                           stop_retrying: Callable[[], bool]) -> Episode:
    """The episode, run again after a transient failure while the task's retry budget lasts."""
    task = slot.task_path.name
    retries = 0
    while True:
        episode = await _attempt(slot, cfg)
        if retry_budget is None or episode.status != SampleStatus.ABORTED or stop_retrying():
            break
        # A transient infra failure: run the task again while its budget lasts.
        if not retry_budget.try_spend(task, cfg.max_retries_per_task, cfg.retry_window_sec):
            episode.retries_spent(f"retry budget of {cfg.max_retries_per_task} per {cfg.retry_window_sec:g} s "
                                  f"for {task} spent")
            break
        retries += 1
        # info, not a warning: the reruns are counted (summary.json, hook_metrics) and a failing
        # run's stderr stays its one-line error
        log.info("task %s: transient failure (%s); rerun %d", task, episode.error, retries)
        await asyncio.sleep(cfg.retry_backoff_sec)
        if stop_retrying():
            break
    episode.metadata["retries"] = retries
    return episode


async def _attempt(slot: EpisodeSlot, cfg: RolloutConfig) -> Episode:
    """One attempt of the episode, where cfg.fleet runs it: here, or on a Ray worker (fleet.py)."""
    if cfg.fleet == "ray":
        from slime_harbor.fleet import ray_fleet

        return await ray_fleet(cfg).run(slot, cfg, run_attempt_on_this_node)
    return await run_attempt(slot, cfg)


async def run_attempt_on_this_node(cfg: RolloutConfig, task_path: str, group_index: int, index: int,
                                   trials_dir: str) -> Episode:
    """What a fleet worker runs for one attempt: run_attempt with this node's own gateway (one per
    worker and policy, shared_gateway) and the policy's tokenizer."""
    gateway = await shared_gateway(cfg) if uses_gateway(cfg.agent) else None
    slot = EpisodeSlot(Path(task_path), group_index, index, Path(trials_dir), load_tokenizer(cfg.model_dir), gateway)
    return await run_attempt(slot, cfg)


async def run_attempt(slot: EpisodeSlot, cfg: RolloutConfig) -> Episode:
    """One attempt of an episode in this process (a fleet worker runs the same): its trial, run
    again while its environment fails to start (cfg.env_start_retries)."""
    started = time.monotonic()
    attempts = 0
    while True:
        attempts += 1
        episode = await _run_trial_once(slot, cfg, started)
        retry = episode.end.environment_start_failed and attempts <= cfg.env_start_retries
        if not retry:
            break
        delay = cfg.env_start_backoff_sec * 2 ** (attempts - 1)
        log.warning("environment of %s failed to start (attempt %d): %s; retrying in %.1fs",
                    slot.task_path.name, attempts, episode.error, delay)
        await asyncio.sleep(delay)
    episode.metadata["env_start_attempts"] = attempts
    return episode


@contextlib.asynccontextmanager
async def serving_gateway(cfg: RolloutConfig):
    """A started gateway in front of cfg.policy_url for cfg's agent (None for agents that need
    none), closed with its sessions and its port freed however the block ends (Ctrl-C included)."""
    if not uses_gateway(cfg.agent) or cfg.fleet != "local":  # a fleet's workers start their own
        yield None
        return
    gateway = await start_gateway(cfg)
    try:
        yield gateway
    finally:
        await gateway.aclose()


_SHARED_GATEWAYS: dict[asyncio.AbstractEventLoop, dict[tuple, Any]] = {}
"""Per event loop (a gateway's server runs in the loop that started it), per upstream: the gateway
runners that outlive one trial share (the SLiME hook's process, the verifiers env)."""
_SHARED_LOCKS: dict[asyncio.AbstractEventLoop, asyncio.Lock] = {}


async def shared_gateway(cfg: RolloutConfig):
    """The running event loop's gateway in front of cfg's policy (its URL, API, served name, model
    dir and adapter), started on first use and reused by every later trial of that loop;
    close_shared_gateways closes them. A runner whose trials end with it uses serving_gateway."""
    loop = asyncio.get_running_loop()
    key = (cfg.policy_url, cfg.policy_api, cfg.model_name, cfg.model_dir, cfg.lora_name)
    async with _SHARED_LOCKS.setdefault(loop, asyncio.Lock()):
        gateways = _SHARED_GATEWAYS.setdefault(loop, {})
        if key not in gateways:
            if loop not in _LOOP_ENDS:
                await _close_gateways_when_loop_ends(loop)
            gateways[key] = await start_gateway(cfg)
            log.info("model gateway for Harbor agents at %s (upstream %s)", gateways[key].base_url, cfg.policy_url)
        return gateways[key]


_LOOP_ENDS: dict[asyncio.AbstractEventLoop, Any] = {}
"""Per event loop with shared gateways: the async generator whose closing closes them (held here:
the loop tracks it weakly, and a collected one would close them early)."""


async def _close_gateways_when_loop_ends(loop) -> None:
    # asyncio.run (and asyncio.Runner) closes every started async generator while its loop still
    # runs (shutdown_asyncgens): the only moment the gateway's client session can still be closed in
    # its own loop. Left open, it is collected at interpreter exit and its "Unclosed client session"
    # goes through litellm's logging filter, which fails there with a traceback.
    async def until_the_loop_ends():
        try:
            yield
        finally:
            _LOOP_ENDS.pop(loop, None)
            await close_shared_gateways()
            if "litellm" in sys.modules:  # a host-side agent's (terminus-2's) cached clients, same story
                await sys.modules["litellm"].close_litellm_async_clients()

    _LOOP_ENDS[loop] = until_the_loop_ends()
    await _LOOP_ENDS[loop].__anext__()  # started, so the loop knows it


async def close_shared_gateways() -> None:
    """Close the running event loop's shared gateways (their sessions, servers and ports)."""
    loop = asyncio.get_running_loop()
    _SHARED_LOCKS.pop(loop, None)
    for gateway in _SHARED_GATEWAYS.pop(loop, {}).values():
        await gateway.aclose()


@atexit.register
def _close_shared_gateways_at_exit() -> None:
    """At interpreter exit: close each loop's gateways in that loop, where it can still run them
    (SLiME runs its rollout loop in a background thread; a closed loop took its sockets with it)."""
    for loop, gateways in list(_SHARED_GATEWAYS.items()):
        _SHARED_GATEWAYS.pop(loop, None)
        for gateway in gateways.values():
            try:
                if loop.is_running():
                    asyncio.run_coroutine_threadsafe(gateway.aclose(), loop).result(timeout=30)
                elif not loop.is_closed():
                    loop.run_until_complete(gateway.aclose())
            except Exception as exc:  # exiting anyway: say so, never raise from atexit
                log.warning("closing the model gateway at exit failed: %s", exc)


async def start_gateway(cfg: RolloutConfig):
    """A started gateway in front of cfg.policy_url (SGLang's /generate, or an OpenAI-compatible
    /v1 with policy_api openai), serving cfg.model_dir's policy (and cfg.lora_name) as cfg.model_name."""
    from slime_harbor.gateway.server import Gateway

    try:
        gateway = Gateway(cfg.policy_url, cfg.model_dir, host=cfg.gateway_host, port=0, renderer=cfg.renderer,
                          served_model_name=cfg.model_name, upstream_api=cfg.policy_api, lora_name=cfg.lora_name,
                          reissue_aborted=cfg.reissue_aborted_calls, keep_interrupted=cfg.keep_interrupted_calls,
                          require_keys=gateway_keys_on(cfg))
        await gateway.start()
    except (ValueError, OSError) as exc:  # a model family without a reply parser, an address we cannot bind
        raise ConfigError(f"the model gateway for agent {cfg.agent!r} cannot start: {one_line(exc)}") from None
    if gateway.require_keys:
        print(f"model gateway on {gateway.host}:{gateway.port}: every call needs its trial's own key, which each "
              "agent is handed with its URL (nothing to set)", file=sys.stderr)
    return gateway


async def _run_trial_once(slot: EpisodeSlot, cfg: RolloutConfig, started: float) -> Episode:
    from harbor.models.trial.config import TaskConfig, TrialConfig
    from harbor.trial.hooks import TrialEvent
    from harbor.trial.trial import Trial

    task_path, trials_dir, gateway = slot.task_path, slot.trials_dir, slot.gateway
    group_index, index = slot.group_index, slot.index
    trial_name = f"{task_path.name}__g{group_index}_{index}__{uuid.uuid4().hex[:6]}"
    twin = await twin_for(task_path, cfg, gold_check(cfg))  # built and checked once per task (the run's start did)
    session = endpoint = None
    if gateway is not None:  # one session per trial, named after it, recorded in its agent dir
        # The run's sampling replaces the agent's own on every call (its max_tokens capped, its stop
        # strings added); each call's seed derives from the episode's.
        session = gateway.open_session(trial_name, record_dir=trials_dir / trial_name / "agent" / "gateway",
                                       sampling=cfg.sampling, routing_key=cfg.routing_key,
                                       sampling_seed=cfg.sampling.sampling_seed, max_context_len=cfg.max_context_len)
        endpoint = ModelEndpoint.of(gateway, session)
    trial = grading = None
    try:
        try:
            try:
                config = TrialConfig(
                    task=TaskConfig(path=task_path.resolve()),
                    trial_name=trial_name,
                    trials_dir=trials_dir,
                    agent=(agent := agent_config(cfg, endpoint)),
                    environment=environment_config(cfg.env, gateway, agent),
                    verifier=verifier_config(twin, cfg.verifier_timeout_sec),  # an SWE twin goes to the grader too
                    timeout_multiplier=cfg.timeout_multiplier,
                )
                if session is not None:
                    session.max_calls = gateway_step_limit(agent, cfg.step_limit)
                trial = await Trial.create(config)
                install_agents_first(trial)  # within the agent's setup budget, not the task's build timeout
                # The trial's grading, its stages in order (grading/grade.py): before the verifier, during it, after.
                grading = Grading(trial, task_path, twin, cfg, task_watch_mode(cfg.task_manifest, task_path.name))
                if session is not None:
                    end_run_at_gateway_limits(trial, session)
                    # The agent is done: its session's files (the ATIF trajectory of an agent that
                    # writes none) must be there before the verifier and the log upload.
                    trial.add_hook(TrialEvent.AGENT_END, lambda event: _close_session(gateway, trial_name))
                hard_timeout = hard_timeout_sec(task_path, cfg.timeout_multiplier, cfg.verifier_timeout_sec,
                                                trial.agent_setup_timeout_sec)
                result = await asyncio.wait_for(trial.run(), hard_timeout)
            except asyncio.CancelledError:
                await _finish_environment_stop(trial)
                raise
            except TimeoutError:
                # wait_for cancelled the trial, which recorded a CancelledError (classified aborted).
                await _finish_environment_stop(trial)
                result = trial.result
            except Exception as exc:  # ours is loud; else the table's outcome: retried is ABORTED, the rest FAILED
                if set_up_kind(exc) == OURS:
                    return internal_error(exc, slot, trial_name, started)
                log.warning("trial for %s failed before running: %s", task_path.name, one_line(exc))
                status = SampleStatus.ABORTED if set_up_outcome(exc) == RETRIED else SampleStatus.FAILED
                return Episode(
                    task_name=task_path.name, group_index=group_index, index=index,
                    end=EpisodeEnd(status, None, None, f"{type(exc).__name__}: {one_line(exc)}"),
                    reward=None, metadata={"task_name": task_path.name, "exception_type": type(exc).__name__},
                    seconds=time.monotonic() - started,
                )
        finally:  # ended, failed or cancelled: in-flight calls are aborted and the recording flushed
            if session is not None:
                await _close_session(gateway, trial_name)
        if bug := bug_of_ours(result):  # Harbor caught it and would have made it the trial's failure
            return internal_error(bug, slot, trial_name, started)
        try:
            report_exit_status(result)  # terminus-2 says nothing of its end: its module reads it
            report = await grading.grade(passed=trial_passed(result, session))  # the twin, the detectors
            episode = trial_to_episode(  # scored-or-not and the reward, decided once (reward.py's rules)
                result, group_index=group_index, index=index, tokenizer=slot.tokenizer, reward_mapping=cfg.reward_mapping,
                grading=report, hack_action=cfg.hack_action, **({"recorded": session} if session is not None else {}),
            )
            episode.task_name = task_path.name  # the task dir's name, which Harbor's own task name need not be
            show_in_viewer(episode.trial_dir, list(report.flags), cfg.hack_action)
        except Exception as exc:  # reading the finished trial: only our code runs here, so a bug of ours
            return internal_error(exc, slot, trial_name, started)
    finally:  # whatever ended the trial: the state kept for the twin goes (an image, a copied dir)
        if grading is not None:
            await grading.close()
    episode.seconds = time.monotonic() - started
    return episode


INTERNAL_ERROR_BUDGET = 3
"""Bugs of ours a process lives through (each an episode FAILED, its traceback in its trial dir);
the next one stops the run (InternalErrorBudgetSpent)."""
INTERNAL_ERRORS: list[str] = []
"""This process's internal errors so far: each trial dir whose slime-harbor-error.txt holds one."""


class InternalErrorBudgetSpent(RuntimeError):
    """More bugs of ours than INTERNAL_ERROR_BUDGET: the run stops rather than train around them."""


class RecordedBug(Exception):
    """A bug of ours that Harbor caught during the trial and recorded (its exception.txt)."""


def bug_of_ours(result) -> RecordedBug | None:
    """The trial's recorded exception when it is ours (error_kinds: a class the table gives to us,
    or one it does not name raised by our code: the native agent, our sandboxes, the isolation and
    monitor hooks); None for any other end, the task's, the policy's or an agent's of Harbor's."""
    info = result.exception_info
    if info is None or kind_of_recorded(info.exception_type, info.exception_traceback or "") != OURS:
        return None
    return RecordedBug(f"{info.exception_type}: {one_line(info.exception_message or '')}\n{info.exception_traceback}")


def internal_error(exc: Exception, slot: EpisodeSlot, trial_name: str, started: float) -> Episode:
    """A bug of ours while a trial was set up or run (agent_config, the hack monitor, the isolation
    hooks, the twin's grading...): its traceback goes to the trial dir's slime-harbor-error.txt and
    to the log at ERROR, the episode is FAILED (an infrastructure failure: removed, never scored,
    never a bad task) with that said in its reason, and the process counts it; past
    INTERNAL_ERROR_BUDGET it raises InternalErrorBudgetSpent, which stops the run."""
    import traceback

    task_path, trial_dir = slot.task_path, slot.trials_dir / trial_name
    trial_dir.mkdir(parents=True, exist_ok=True)
    record = trial_dir / "slime-harbor-error.txt"
    record.write_text(str(exc) if isinstance(exc, RecordedBug) else "".join(traceback.format_exception(exc)))
    INTERNAL_ERRORS.append(str(trial_dir))
    what = one_line(str(exc).split("\n")[0]) if isinstance(exc, RecordedBug) else f"{type(exc).__name__}: {one_line(exc)}"
    why = f"internal error (a slime-harbor bug, not the task's): {what} (traceback: {record})"
    log.error("trial of %s: %s", task_path.name, why)
    if len(INTERNAL_ERRORS) > INTERNAL_ERROR_BUDGET:
        raise InternalErrorBudgetSpent(f"{len(INTERNAL_ERRORS)} internal errors (slime-harbor bugs) in this process, "
                                       f"more than {INTERNAL_ERROR_BUDGET}: stopping; the last: {why}") from exc
    return Episode(task_name=task_path.name, group_index=slot.group_index, index=slot.index,
                   end=EpisodeEnd(SampleStatus.FAILED, None, None, why), reward=None,
                   metadata={"task_name": task_path.name, "exception_type": type(exc).__name__, "internal_error": True,
                             "trial_dir": str(trial_dir)}, seconds=time.monotonic() - started)


def gold_check(cfg: RolloutConfig) -> GoldCheck:
    """How this run checks a task's impossible twin: the gold solution (Harbor's oracle) in one
    real trial of cfg.env, its raw reward read as the grader gave it."""
    return GoldCheck(gold_reward=_gold_reward, keeps_state=environment_keeps_state(cfg.env))


async def _gold_reward(task_dir: Path, cfg: RolloutConfig) -> tuple[float | None, str | None]:
    # The grader's own reward: no mapping, and no hack action (a flagged gold keeps what it scored).
    check = dataclasses.replace(cfg, agent="oracle", impossible_twin="off", reward_mapping="raw", hack_action="flag",
                                hack_detectors=[], hack_judge_url=None, hack_judge_model=None, agent_kwargs={},
                                progress=False)
    with tempfile.TemporaryDirectory(prefix="slime-harbor-twin-check-") as trials:
        episode = await run_episode(task_dir, check, group_index=0, index=0, trials_dir=Path(trials))
    return (episode.reward, None) if episode.scored else (None, episode.error)


def end_run_at_gateway_limits(trial, session) -> None:
    """An agent's run that raises once its gateway session ended at a limit (the gateway refused a
    prompt over the context window, or a call past the step limit, with a 400) ends there instead:
    the episode is verified and the converter ends it from the session's exit_reason, TRUNCATED.

    Harbor runs the verifier after an agent's timeout or an installed agent's non-zero exit, and
    skips it after any other exception; what an agent does with the 400 is its own (terminus-2
    raises ContextLengthExceededError, an SDK its BadRequestError), so without this the same limit
    would be a scored truncation for one agent and a FAILED trial for another. The exception is
    kept in the agent's metadata (`agent_error`); one raised while the session is not at a limit
    propagates as before."""
    agent = trial.agent
    run = agent.run

    async def run_until_a_gateway_limit(instruction, environment, context):
        try:
            await run(instruction=instruction, environment=environment, context=context)
        except Exception as exc:  # whatever the agent raises on the gateway's 400; anything else is raised again
            # A reply the policy ran to max_new_tokens ends some agents too (claude-code: "response
            # exceeded ... output token maximum"): the policy's own limit, scored as a truncation
            # as vibe reports it itself, not a FAILED trial.
            calls = getattr(session, "calls", None) or []
            cut = bool(calls) and calls[-1].finish_reason == "length"
            if session.exit_reason not in TRUNCATING_EXITS and not cut:
                raise
            kind, message = type(exc).__name__, one_line(exc)
            context.metadata = {**(context.metadata or {}),
                                "agent_error": kind if message == kind else f"{kind}: {message}",
                                **({} if session.exit_reason in TRUNCATING_EXITS else {"exit_status": CONTEXT_EXCEEDED})}

    agent.run = run_until_a_gateway_limit


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
    if trial is None:  # never created: nothing started
        return
    stop = asyncio.ensure_future(trial.agent_environment.stop(delete=trial.config.environment.delete))
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




@dataclass
class Rollouts:
    """What a rollout returns: its summary (summary.json's) and its episodes, in the order they
    ended, for a caller that reads them further (an evaluation, the canaries) instead of reading
    samples.jsonl back."""

    summary: dict[str, Any]
    episodes: list[Episode]


async def run_rollouts(cfg: RolloutConfig) -> dict[str, Any]:
    """Run n_samples trials per task; stream samples to OUT/samples.jsonl; return the summary."""
    return (await run_rollout_episodes(cfg)).summary


async def run_rollout_episodes(cfg: RolloutConfig) -> Rollouts:
    """run_rollouts, returning the episodes with the summary."""
    tasks = check_config(cfg)
    tasks, skipped_tasks = apply_manifest(tasks, cfg.task_manifest)
    preflight_environment(cfg.env)
    async with runner_rollouts(tasks, cfg) as opened:
        if cfg.progress:
            print(opened.twins.line, file=sys.stderr)
        out = Path(cfg.out_dir)
        (out / "trials").mkdir(parents=True, exist_ok=True)
        job = HarborJob(out / "trials", opened.cfg, tasks)
        return await _run_all(opened.cfg, tasks, out, job, load_tokenizer(cfg.model_dir), opened.gateway,
                              skipped_tasks, opened.twins.table)


@dataclass
class RunnerRollouts:
    """What every trial of one runner (a rollout, the local loop) shares, opened once before the first."""

    cfg: RolloutConfig
    """The runner's config as the engine at its policy_url needs it (run_config.with_engine)."""
    twins: RunTwins
    gateway: Any
    """The started gateway its agents sample through (None for agents that need none)."""


@contextlib.asynccontextmanager
async def runner_rollouts(tasks: list[Path], cfg: RolloutConfig):
    """Open a runner's rollouts: cfg as the engine serving it needs it (asked of the server, in a
    thread), the tasks' impossible twins (run_twins), and the gateway (serving_gateway: closed, its
    port freed, however the block ends, Ctrl-C included)."""
    cfg = with_chat_format(await asyncio.to_thread(with_engine, cfg))
    twins = await run_twins(tasks, cfg)
    async with serving_gateway(cfg) as gateway:
        yield RunnerRollouts(cfg, twins, gateway)


@dataclass
class RunTwins:
    """A run's impossible twins, built and checked once before its first trial."""

    line: str
    """How many of the tasks have one, in a line."""
    table: dict[str, Any]
    """impossible_twin.twin_table: per task what its twin changed, or why it has none."""


async def run_twins(tasks: list[Path], cfg: RolloutConfig) -> RunTwins:
    """Each task's impossible twin, built and checked by a gold trial of cfg.env (gold_check):
    what every runner (a rollout, the local loop) calls before its trials."""
    twins = await prepare_twins(tasks, cfg, gold_check(cfg))
    return RunTwins(twin_line(twins), twin_table(twins))


async def _run_all(cfg: RolloutConfig, tasks: list[Path], out: Path, job: HarborJob, tokenizer, gateway,
                   skipped_tasks: dict[str, str], twins: dict[str, Any]) -> Rollouts:
    semaphore = asyncio.Semaphore(cfg.concurrency)
    retry_budget = RetryBudget()
    episodes: list[Episode] = []
    bar = _Progress(len(tasks) * cfg.n_samples, enabled=cfg.progress)
    started = time.monotonic()
    interrupted = False

    with open(out / "samples.jsonl", "w") as sink:

        async def one(task_path: Path, group_index: int, index: int) -> None:
            async with semaphore:
                job.trial_started()
                episode = await run_episode(task_path, cfg, group_index=group_index, index=index,
                                            trials_dir=out / "trials", tokenizer=tokenizer, gateway=gateway,
                                            retry_budget=retry_budget)
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
            try:
                async with asyncio.TaskGroup() as group:
                    for group_index, task_path in enumerate(tasks):
                        for k in range(cfg.n_samples):
                            group.create_task(one(task_path, group_index, group_index * cfg.n_samples + k))
            except* InternalErrorBudgetSpent as stopped:  # the run stops on it: raised as itself, not in a group
                raise stopped.exceptions[0] from None
        except (asyncio.CancelledError, KeyboardInterrupt):
            interrupted = True
            raise
        finally:
            bar.close()
            summary = summarize(episodes, cfg, time.monotonic() - started, interrupted)
            summary["skipped_tasks"] = skipped_tasks  # broken or flaky in cfg.task_manifest
            summary.update(twins)  # twin_tasks, and per task what its impossible twin changed or why it has none
            if "grader_watch_tasks" in summary:  # per task: what guards it against run-time hacks
                summary["protection"] = protection(summary["grader_watch_tasks"], twins.get("twins", {}),
                                                   {*twins.get("twins", {}), *twins.get("no_twin", {}),
                                                    *summary["grader_watch_tasks"]})
            (out / "summary.json").write_text(json.dumps(summary, indent=2))
            job.finish(interrupted)
    return Rollouts(summary, episodes)


def summarize(episodes: list[Episode], cfg: RolloutConfig, seconds: float, interrupted: bool = False) -> dict[str, Any]:
    statuses = Counter(e.status.value for e in episodes)
    scored = [e for e in episodes if e.scored]
    per_task: dict[str, list[float | None]] = defaultdict(list)
    for e in sorted(episodes, key=lambda e: e.index):
        per_task[e.task_name].append(e.reward)
    samples = [s for e in episodes for s in e.samples]  # as samples.jsonl holds them
    grading = run_counts(episodes)  # every defence's counters (grade.COUNTERS), hack_rate, twin_coverage
    return {
        "n_trials": len(episodes),
        "status_counts": {s.value: statuses.get(s.value, 0) for s in SampleStatus},
        "n_scored": len(scored),
        "mean_reward": sum(e.reward for e in scored) / len(scored) if scored else None,
        "pass_rate": sum(is_success(e.reward) for e in scored) / len(scored) if scored else None,
        "per_task_rewards": dict(per_task),
        "n_samples": len(samples),
        "n_trainable_samples": sum(not s.remove_sample for s in samples),
        # episodes masked out of training per reason (a rollout masks only the hack monitor's screen)
        "masked_episodes": mask_counts(episodes),
        # how the episodes ended, in the agents' and the gateway's words (episode.EpisodeEnd.exit_status)
        "exit_status_counts": dict(Counter(e.end.exit_status for e in episodes if e.end.exit_status)),
        "context_window": context_window(cfg) if samples_policy(cfg.agent) else None,
        # episodes that became several segments (samples sharing a rollout_id): a gateway agent's
        # branches (its history re-sent differently) or the native agent's token drift
        "split_episodes": sum(len([s for s in e.segments if s.response_ids]) > 1 for e in episodes),
        "drift_count": sum(e.metadata.get("drift_count", 0) for e in episodes),
        # reruns of aborted episodes (transient failures), within each task's retry budget
        "retries": sum(e.metadata.get("retries", 0) for e in episodes),
        # episodes whose grader detected tampering (scored 0), by kind
        "tampering_counts": {name.removeprefix("tampering/"): n for name, n in grading.items()
                             if name.startswith("tampering/")},
        **grading,
        # per task: whether its verifications were watched (and why not), the grading watch's coverage
        **({"grader_watch_tasks": tasks} if (tasks := watch_tasks(episodes)) else {}),
        "errors": {f"{e.task_name}#{e.index}": e.error for e in episodes if e.error},
        # bugs of ours (never the task's): each trial dir holds its traceback in slime-harbor-error.txt
        "internal_errors": [e.metadata["trial_dir"] for e in episodes if e.metadata.get("internal_error")],
        "wall_seconds": round(seconds, 2),
        "interrupted": interrupted,
        "renderer": cfg.renderer,  # the chat format the run spoke (run_config.with_chat_format)
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
        if not episode.scored:
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
