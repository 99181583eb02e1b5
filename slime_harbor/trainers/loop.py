"""The training loop of train-local: GRPO updates on groups of Harbor trials, synchronous
(--max-staleness 0, the default) or asynchronous (K >= 1), one loop either way.

    the event loop                                   a worker thread
    GroupProducer: trials at `concurrency`, group    Learner.train_step(N): the update on top of
    after group of the task stream; a group is  ->  version N-1, then version N is published:
    complete when its n_samples episodes are in      calls in flight finish on N-1, later ones
    (groups complete out of order)                   are sampled by N; trials go on across it

The producer keeps at most K + 1 updates' worth of groups in flight or waiting (more would only be
masked as stale). K = 0 is the synchronous loop: an update's groups are all that run, the next
ones start once its weights are published (so nothing samples while it trains), and nothing
spans an update.

A group holds its trials' Episodes (episode.py) until an update takes it. Update N takes the
first groups to complete (rollout_batch_size of them, or one per task), masks their episodes with
the trajectory filters and, K >= 1, the staleness bound (filters.mask_stale: an episode with a
call sampled by a version older than N-1-K is masked_by stale, out of its group's baseline; a
group gone stale whole is replaced by the next to complete); with --dynamic-sampling it masks the
groups without reward variance and takes more (at most dynamic_sampling_max_rounds more batches'
worth; the producer starts them when none is on its way). The step's figures are read off those
Episodes; their samples are built once, for the update's batch and rollouts/step_N/samples.jsonl
(what it trained); every trial is under rollouts/trials/. With --canary-tasks, impossible
tasks run beside each update's groups (rollouts/step_N/canaries/), counted, never trained on.

Held-out evaluations: K = 0, on the learner's own server between updates, nothing else sampling
(as a synchronous step always did); K >= 1, on a frozen copy of the version they measure from a
second embedded server, beside the training. Each says which version it measured
(eval.weight_version).

On a signal an update in flight finishes with its metrics and scheduled checkpoint; the trials in
flight are not trained, and the groups that completed but no update took are kept in
rollouts/not_consumed.jsonl.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slime_harbor.canaries import run_canaries
from slime_harbor.episode import Episode
from slime_harbor.filters import apply_limit_filters, mask_stale, varying_groups
from slime_harbor.harbor_job import HarborJob
from slime_harbor.retries import RetryBudget
from slime_harbor.policy.renderer import load_tokenizer
from slime_harbor.rollout import run_episode, runner_rollouts
from slime_harbor.run_config import RolloutConfig
from slime_harbor.samples import write_jsonl
from slime_harbor.trainers.evaluate import evaluation
from slime_harbor.trainers.training_run import TaskStream, TrainingRun, step_record, step_sampling


@dataclass
class Group:
    """One task's n_samples episodes, complete."""

    index: int  # the group_index of its episodes: the order groups were started in
    task: str
    episodes: list[Episode]

    @property
    def errors(self) -> int:
        """Episodes the verifier did not score (an infrastructure or permanent failure)."""
        return sum(e.error is not None for e in self.episodes)


class GroupProducer:
    """Starts groups of trials while there is room: a free trial slot, and fewer than
    (K + 1) x `wanted` live groups, started and not yet trained on. A group stays live until the
    update that took it has published its weights, so when nothing is slow a group started under
    version v is trained by update v + K + 1 at the latest, within the bound. A group still
    running when the version has moved more than K past the one it started under (a slow one) can
    only come back stale: it no longer holds room, so the tail does not throttle the fast groups.
    The groups an update takes beyond `wanted` (refills for masked ones) free their room at once,
    so a refill never waits on itself; an update that needs more groups than are on their way
    (K = 0 has none spare) asks for them (`request`). Complete groups go to `completed`."""

    def __init__(self, run: TrainingRun, rollout: RolloutConfig, tasks: dict[str, Path], stream: TaskStream,
                 wanted: int, gateway, tokenizer):
        self.run, self.rollout, self.tasks, self.stream, self.wanted = run, rollout, tasks, stream, wanted
        self.lookahead = (run.cfg.max_staleness + 1) * wanted
        self.gateway, self.tokenizer = gateway, tokenizer
        self.retry_budget = RetryBudget()
        """Reruns of aborted episodes, per task, over the whole run (RolloutConfig.max_retries_per_task)."""
        self.trials_dir = run.out / "rollouts" / "trials"
        self.job = HarborJob(self.trials_dir, self.rollout, list(tasks.values()), n_trials=0)
        self.completed: asyncio.Queue[Group | BaseException] = asyncio.Queue()  # or why production stopped
        self.started = 0  # groups
        self.taken = 0  # groups an update took
        self.requested = 0  # groups an update asked for beyond the room, not started yet
        self.open: dict[int, int] = {}  # groups started, not yet trained on: index -> version when started
        self.held: list[int] = []  # groups the running update took
        self._unstarted_trials = 0  # created, waiting for a trial slot
        self._slots = asyncio.Semaphore(run.cfg.concurrency)
        self._room = asyncio.Event()

    def take(self, group: Group) -> None:
        """The running update took a complete group."""
        self.held.append(group.index)
        self.taken += 1
        self._room.set()

    def request(self, needed: int) -> None:
        """The running update needs `needed` more groups: start those not already on their way."""
        on_their_way = self.started - self.taken + self.requested
        if needed > on_their_way:
            self.requested += needed - on_their_way
            self._room.set()

    def published(self) -> None:
        """The running update has published its weights: its groups are trained on, and later
        trials sample from the adapter it pushed (a server that takes LoRA adapters gets each
        update's under a new name; K = 0 only, so no trial is running)."""
        for index in self.held:
            self.open.pop(index, None)
        self.held = []
        lora_name = self.run.learner.lora_name
        if lora_name != self.rollout.lora_name:
            self.rollout = dataclasses.replace(self.rollout, lora_name=lora_name)
            if self.gateway is not None:
                self.gateway.sample_adapter(lora_name)
        self._room.set()

    def _within_lookahead(self) -> bool:
        version, held = self.run.learner.weight_version, set(self.held)
        # A held group is live until its update publishes (the version moves when the update ends,
        # before it is published: K = 0 starts nothing before that).
        live = sum(index in held or version - started <= self.run.cfg.max_staleness
                   for index, started in self.open.items())
        refills = max(0, len(self.held) - self.wanted)
        return live - refills < self.lookahead

    def _has_room(self) -> bool:
        return self._unstarted_trials == 0 and (self._within_lookahead() or self.requested > 0)

    async def run_forever(self) -> None:
        """Start groups until cancelled; cancelling ends every trial in flight (sandboxes torn down)."""
        try:
            async with asyncio.TaskGroup() as running:
                while True:
                    while not self._has_room():
                        self._room.clear()
                        await self._room.wait()
                    self.requested = max(0, self.requested - 1)  # a group started answers a request
                    name = self.stream.take(1)[0]
                    index, self.started = self.started, self.started + 1
                    self.open[index] = self.run.learner.weight_version
                    self._unstarted_trials += self.run.cfg.n_samples
                    running.create_task(self._group(index, name))
        except Exception as exc:  # a bug, not a trial's failure (those are episodes): the learner must hear of it
            await self.completed.put(exc)
            raise
        finally:
            self.job.finish(interrupted=True)

    async def _group(self, index: int, name: str) -> None:
        n = self.run.cfg.n_samples
        episodes = await asyncio.gather(*(self._trial(index, name, index * n + k) for k in range(n)))
        await self.completed.put(Group(index, name, list(episodes)))

    async def _trial(self, group_index: int, name: str, index: int):
        async with self._slots:
            self._unstarted_trials -= 1
            self._room.set()
            self.job.add_trials(1)
            self.job.trial_started()
            episode = await run_episode(self.tasks[name], self.rollout, group_index=group_index, index=index,
                                        trials_dir=self.trials_dir, tokenizer=self.tokenizer, gateway=self.gateway,
                                        retry_budget=self.retry_budget)
        self.job.trial_finished(episode)
        return episode


async def take_groups(producer: GroupProducer, step: int, wanted: int) -> tuple[list[Group], dict[str, Any], float]:
    """The groups update `step` trains on, masked; returns (groups, the step's sampling figures,
    seconds spent waiting for them). A group whose every episode is stale is replaced by the next
    one to complete, so an update trains as many groups as a synchronous step does (the same
    episodes per update, whatever K); groups masked by the other filters are kept as they are,
    or, with dynamic sampling, replaced up to its limit."""
    cfg = producer.run.cfg
    groups: list[Group] = []
    waited = 0.0
    stale_groups = 0
    limit = wanted * (1 + (cfg.dynamic_sampling_max_rounds if cfg.dynamic_sampling else 0))
    while True:
        if cfg.dynamic_sampling:
            have = len(varying_groups([e for g in groups for e in g.episodes]))
        else:
            have = len(groups) - stale_groups
        if have >= wanted or len(groups) - stale_groups >= limit:
            break
        producer.request(min(wanted - have, limit - (len(groups) - stale_groups)))
        t = time.monotonic()
        group = await producer.completed.get()
        if isinstance(group, BaseException):
            raise RuntimeError(f"the rollouts stopped: {type(group).__name__}: {group}") from group
        producer.take(group)
        waited += time.monotonic() - t
        apply_limit_filters(group.episodes, cfg.filters())
        # Update `step` trains on top of version step - 1. K = 0: no trial spans an update, and a
        # server that takes no weights (--weight-sync none) reports one version all run long.
        if cfg.max_staleness > 0:
            mask_stale(group.episodes, step - 1, cfg.max_staleness)
        stale_groups += all(e.masked_by == "stale" for e in group.episodes)
        groups.append(group)
    episodes = [e for g in groups for e in g.episodes]
    sampling = step_sampling(episodes, sum(g.errors for g in groups), len(groups), cfg.dynamic_sampling)
    return groups, sampling, waited


async def evaluate_frozen(run: TrainingRun, version: int, record: dict) -> None:
    """Held-out evaluation of weight version `version` on a frozen copy of it, served apart by the
    learner, while training goes on; its figures land in record["eval"] (and metrics.json, wandb)
    when done."""
    async with run.learner.serving_frozen(version) as url:
        result = await evaluation(run.cfg, url, run.base_model, run.out / "eval" / f"step_{version}")
    run.record_eval(record, result, version)


async def evaluate_live(run: TrainingRun, version: int, record: dict) -> None:
    """Held-out evaluation of the learner's current weights (version `version`) on its own server,
    K = 0: between updates, nothing else sampling."""
    learner = run.learner
    result = await evaluation(run.cfg, learner.url, run.base_model, run.out / "eval" / f"step_{version}",
                              learner.lora_name)
    run.record_eval(record, result, version)


async def train_loop(run: TrainingRun, tasks: dict[str, Path], stream: TaskStream) -> None:
    """Updates start+1 .. num_rollouts, as the module doc says."""
    cfg, learner = run.cfg, run.learner
    synchronous = cfg.max_staleness == 0
    evaluate = evaluate_live if synchronous else evaluate_frozen
    wanted = cfg.rollout_batch_size or len(tasks)
    evaluations: list[asyncio.Task] = []
    canaries = run.canary_stream()
    # K >= 1: a call the server aborts for a weight update is sampled again; K = 0 has no update
    # under a running trial, so an abort there is the server's failure and ends the episode.
    rollout = dataclasses.replace(cfg.rollout(learner.url, run.base_model, run.out / "rollouts",
                                              lora_name=learner.lora_name), reissue_aborted_calls=not synchronous)
    async with runner_rollouts(list(tasks.values()), rollout) as opened:
        print(opened.twins.line, file=sys.stderr)
        run.twins = opened.twins.table
        producer = GroupProducer(run, opened.cfg, tasks, stream, wanted, opened.gateway,
                                 load_tokenizer(run.base_model))
        producing = None
        try:
            if cfg.eval_tasks is not None and run.start == 0:  # version 0: the policy before any update
                run.metrics.append({"step": 0})
                evaluations.append(asyncio.create_task(evaluate(run, 0, run.metrics[-1])))
                if synchronous:  # before any trial samples
                    await evaluations[-1]
            producing = asyncio.create_task(producer.run_forever())
            for step in range(run.start + 1, cfg.num_rollouts + 1):
                t0 = time.monotonic()
                groups, sampling, waited = await take_groups(producer, step, wanted)
                episodes = [e for g in sorted(groups, key=lambda g: g.index) for e in g.episodes]
                samples = [s for e in episodes for s in e.samples]  # the update's batch: masked, built once
                step_dir = run.out / "rollouts" / f"step_{step}"
                step_dir.mkdir(parents=True, exist_ok=True)
                write_jsonl(step_dir / "samples.jsonl", samples)
                if canaries is not None:
                    # canary_share of the step's groups, at least one: counted, never trained on
                    names = canaries.take(max(1, round(cfg.canary_share * wanted)))
                    sampling.update(await run_canaries(producer.rollout, cfg.canary_tasks, names,
                                                       step_dir / "canaries"))
                t1 = time.monotonic()
                # The update runs in a thread while the trials go on. A signal (the task cancelled)
                # lets it finish and be recorded, then stops the run.
                update = asyncio.ensure_future(asyncio.to_thread(learner.train_step, samples, step))
                cancelled = None
                try:
                    result = await asyncio.shield(update)
                except asyncio.CancelledError as exc:
                    cancelled, result = exc, await update
                t2 = time.monotonic()
                positions = {"task_stream_position": stream.position,
                             **({"canary_stream_position": canaries.position} if canaries else {})}
                record = step_record(step, episodes, result, sampling,
                                     {"weight_version": step, "sampled_weight_versions": _version_counts(episodes)},
                                     positions, {"rollout_s": round(t1 - t0, 3), "train_s": round(t2 - t1, 3),
                                                 "learner_wait_s": round(waited, 3)})
                run.finish_step(record)
                if cancelled is not None:
                    raise cancelled
                due = cfg.eval_tasks is not None and run.eval_due(step)
                if due:  # recorded when its evaluation is in
                    evaluations.append(asyncio.create_task(evaluate(run, step, record)))
                    if synchronous:  # before the next groups start sampling
                        await evaluations[-1]
                else:  # wandb hears of every step
                    run.record_done(record)
                producer.published()
        except BaseException:  # a signal (cancelled) or a failure: the evaluations end too
            for task in evaluations:
                task.cancel()
            raise
        finally:
            if producing is not None:
                producing.cancel()
                await asyncio.gather(producing, return_exceptions=True)  # trials torn down
            _keep_not_consumed(producer, run.out / "rollouts" / "not_consumed.jsonl")
            done = await asyncio.gather(*evaluations, return_exceptions=True)
        for outcome in done:  # the evaluations belong to the run: one that failed fails it
            if isinstance(outcome, BaseException):
                raise outcome


def _version_counts(episodes: list[Episode]) -> dict[str, int]:
    """Model calls per weight version over the episodes an update took (masked ones included)."""
    counts: dict[str, int] = {}
    for e in episodes:
        for v in e.weight_versions:
            counts[v] = counts.get(v, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else -1))


def _keep_not_consumed(producer: GroupProducer, path: Path) -> None:
    """Groups that completed after the last update took its own: kept, never trained."""
    left = []
    while not producer.completed.empty():
        item = producer.completed.get_nowait()
        if isinstance(item, Group):
            left.append(item)
    if left:
        write_jsonl(path, [s for g in left for e in g.episodes for s in e.samples])

