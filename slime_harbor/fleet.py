"""Where a run's trials run (RunSettings.fleet): `local`, every trial in this process as always, or
`ray`, rollout workers on a Ray cluster, the distributed engine SLiME itself runs on.

    fleet local   run_episode runs each attempt of an episode here (nothing below is imported)
    fleet ray     each attempt goes to a RolloutWorker: a Ray actor pinned to one node that carries
                  the `rollout` resource, with its own sandbox backend (cfg.env on that node), its
                  own gateway shard (agents on that node reach it on loopback) and its own engine
                  client (cfg.policy_url). The Episode comes back to the caller, its samples'
                  metadata naming the node (`node_id`).

The caller keeps everything a run decides once: the retry budget (an attempt whose worker or node
was lost ends ABORTED, WorkerLost, and run_episode's rerun loop sends the task again, to a live
worker), the concurrency (`concurrency` / harbor_concurrency is the run's total in flight; a worker
caps its node's share at `fleet_node_trials` and its sandbox starts at `fleet_node_starts_per_sec`),
the impossible twins' gold trials (on the caller's node, before the first trial) and the samples.
Each attempt carries a key of its own: a reply to an attempt the caller already gave up on is
dropped, so no sample is trained twice. Trial dirs are written on the node that ran the trial, at
the run's trials path: `view`, agent SFT and the evaluation trials read them there (a shared
filesystem makes them the caller's too).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
import uuid
from typing import Any

from slime_harbor.episode import Episode, EpisodeEnd
from slime_harbor.exits import ConfigError
from slime_harbor.samples import SampleStatus

FLEETS = ("local", "ray")
ROLLOUT_RESOURCE = "rollout"
"""The custom Ray resource a node offers rollouts with (`ray start --resources '{"rollout": 1}'`)."""


class WorkerLost(RuntimeError):
    """The worker (or its node) running an attempt died or left the cluster: the attempt is aborted
    and run again elsewhere, within the task's retry budget."""


class RolloutWorker:
    """One node's rollout worker (a Ray actor; fleet.RayFleet starts one per node): it runs the
    attempts sent to it with its own gateway, sandboxes and engine client, at most
    cfg.fleet_node_trials at once and cfg.fleet_node_starts_per_sec sandbox starts a second."""

    def __init__(self, node_trials: int, node_starts_per_sec: float):
        import ray

        self.node_id = ray.get_runtime_context().get_node_id()
        self.starts_per_sec = node_starts_per_sec
        self._gate = asyncio.Semaphore(node_trials) if node_trials > 0 else None
        self._next_start = 0.0

    async def _start_slot(self) -> None:
        """Wait for this node's next sandbox start (fleet_node_starts_per_sec)."""
        if self.starts_per_sec <= 0:
            return
        now = time.monotonic()
        start = max(now, self._next_start)
        self._next_start = start + 1.0 / self.starts_per_sec
        await asyncio.sleep(start - now)

    async def run(self, key: str, attempt, cfg, task_path: str, group_index: int, index: int, trials_dir: str):
        """One attempt of an episode under `cfg`: `attempt` is rollout.run_attempt_on_this_node (passed
        by reference, so this module imports no runner), run within this node's caps. (key, Episode)."""
        async with self._gate or contextlib.nullcontext():
            await self._start_slot()
            episode = await attempt(cfg, task_path, group_index, index, trials_dir)
        episode.metadata["node_id"] = self.node_id
        return key, episode


class RayFleet:
    """The workers of one run on a Ray cluster, and where each attempt goes (the live worker with
    the fewest attempts in flight)."""

    def __init__(self, cfg):
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        if ray.is_initialized() and cfg.ray_address and _gcs(cfg.ray_address) != _gcs(
                ray.get_runtime_context().gcs_address):
            raise ConfigError(f"fleet ray: this process is already connected to the Ray cluster at "
                              f"{ray.get_runtime_context().gcs_address}, not {cfg.ray_address}")
        if not ray.is_initialized():
            try:
                ray.init(address=cfg.ray_address or "auto", logging_level=logging.WARNING, log_to_driver=False)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise ConfigError(f"fleet ray: cannot reach the Ray cluster at {cfg.ray_address or 'auto'}: "
                                  f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
        nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get(ROLLOUT_RESOURCE, 0) > 0]
        if not nodes:
            raise ConfigError(f"fleet ray: no live node of the cluster carries the {ROLLOUT_RESOURCE!r} resource "
                              f"(start rollout nodes with: ray start ... --resources '{{\"{ROLLOUT_RESOURCE}\": 1}}')")
        actor = ray.remote(RolloutWorker)
        self.workers: dict[str, Any] = {}
        for node in nodes:
            node_id = node["NodeID"]
            self.workers[node_id] = actor.options(
                num_cpus=0, max_concurrency=100_000,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            ).remote(cfg.fleet_node_trials, cfg.fleet_node_starts_per_sec)
        self.in_flight = dict.fromkeys(self.workers, 0)
        self.lost: set[str] = set()

    def _pick(self) -> str:
        live = [n for n in self.workers if n not in self.lost]
        if not live:
            raise WorkerLost("every rollout worker of the fleet was lost")
        return min(live, key=lambda n: self.in_flight[n])

    async def run(self, slot, cfg, attempt):
        """One attempt of `slot`'s episode on a worker, which runs `attempt` there: its Episode, or an
        ABORTED one (WorkerLost) when the worker or its node was lost on the way."""
        import ray
        from ray.exceptions import ActorDiedError, ActorUnavailableError, NodeDiedError, RayActorError, WorkerCrashedError

        started = time.monotonic()
        try:
            node = self._pick()
        except WorkerLost as exc:
            return _lost_episode(slot, str(exc), started)
        key = uuid.uuid4().hex
        self.in_flight[node] += 1
        ref = self.workers[node].run.remote(key, attempt, cfg, str(slot.task_path), slot.group_index, slot.index,
                                            str(slot.trials_dir))
        try:
            reply_key, episode = await ref
        except (ActorDiedError, ActorUnavailableError, NodeDiedError, RayActorError, WorkerCrashedError) as exc:
            if node not in self.lost:
                self.lost.add(node)
                print(f"fleet ray: rollout node {node} lost ({type(exc).__name__}); its trials run again on the "
                      f"{len(self.workers) - len(self.lost)} left", file=sys.stderr)
            return _lost_episode(slot, f"rollout node {node} lost mid-trial ({type(exc).__name__})", started)
        except asyncio.CancelledError:  # the run stopped (SLiME's abort, Ctrl-C): the remote trial too
            ray.cancel(ref)
            raise
        finally:
            self.in_flight[node] -= 1
        if reply_key != key:  # not this attempt's reply: never trained
            return _lost_episode(slot, "a reply to another attempt", started)
        return episode

    def close(self) -> None:
        import ray

        for node, worker in self.workers.items():  # between runs: no trial in flight; its gateway ends with it
            if node not in self.lost:
                ray.kill(worker)
        self.workers.clear()


def _gcs(address: str) -> str:
    """A cluster address as host:port (ray.init also takes ray://, and localhost for 127.0.0.1)."""
    return address.split("://")[-1].replace("localhost", "127.0.0.1")


def _lost_episode(slot, why: str, started: float) -> Episode:
    return Episode(task_name=slot.task_path.name, group_index=slot.group_index, index=slot.index,
                   end=EpisodeEnd(SampleStatus.ABORTED, None, None, why), reward=None,
                   metadata={"task_name": slot.task_path.name, "exception_type": WorkerLost.__name__},
                   seconds=time.monotonic() - started)


_FLEETS: dict[tuple, RayFleet] = {}
"""The process's Ray fleets, one per (address, per-node caps)."""


def ray_fleet(cfg) -> RayFleet:
    """The process's fleet for cfg (started on first use; close_fleets ends them)."""
    key = (cfg.ray_address, cfg.fleet_node_trials, cfg.fleet_node_starts_per_sec)
    if key not in _FLEETS:
        _FLEETS[key] = RayFleet(cfg)
    return _FLEETS[key]


def live_workers() -> list:
    """Every live rollout worker actor of the process's fleets (to send each a probe or a task)."""
    return [worker for fleet in _FLEETS.values() for node, worker in fleet.workers.items() if node not in fleet.lost]


def close_fleets() -> None:
    """End every fleet's workers (each actor, with its node's gateway)."""
    while _FLEETS:
        _, fleet = _FLEETS.popitem()
        fleet.close()
