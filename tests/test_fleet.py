"""Rollouts on a Ray fleet (slime_harbor/fleet.py), on a local two-node Ray cluster bound to 127.0.0.1
(ray.cluster_utils, no dashboard, small object stores): real trials run on both nodes' workers and
come back as samples naming their node; a gateway agent samples through its node's own gateway; a
node lost mid-trial has its trials run again on the other, none lost or trained twice; and a fleet
that cannot start says why in one line."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import Counter

import pytest
from helpers.rollout import config, leftovers
from helpers.samples import check_trains

from slime_harbor.rollout import run_rollouts
from slime_harbor.samples import read_jsonl

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # read when ray is imported: see start_cluster
ray = pytest.importorskip("ray", reason="fleet ray needs Ray (pip extra 'ray'; in requirements.txt)")

NODE_ARGS = {"num_cpus": 1, "resources": {"rollout": 1}, "object_store_memory": 80 * 1024 * 1024}


def start_cluster(nodes: int = 2):
    """A Ray cluster of `nodes` nodes, each offering the rollout resource, every address on loopback.
    Ray binds the node's routable address unless clustering is off for it (the variable below makes
    it take 127.0.0.1); ray.cluster_utils starts its extra nodes without the CLI's refusal."""
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    from slime_harbor.fleet import close_fleets

    ray_constants.ENABLE_RAY_CLUSTER = False  # also where another test imported ray first
    close_fleets()
    ray.shutdown()  # a process joins one cluster at a time
    cluster = Cluster(initialize_head=True, head_node_args={**NODE_ARGS, "include_dashboard": False})
    added = [cluster.add_node(**NODE_ARGS) for _ in range(nodes - 1)]
    ray.init(address=cluster.address, log_to_driver=False)
    assert {n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]} == {"127.0.0.1"}
    return cluster, added


def stop_cluster(cluster) -> None:
    from slime_harbor.fleet import close_fleets

    close_fleets()
    ray.shutdown()
    cluster.shutdown()


@pytest.fixture(scope="module")
def two_nodes():
    cluster, _ = start_cluster(2)
    yield cluster
    stop_cluster(cluster)


def test_trials_run_on_both_nodes_and_their_samples_name_the_node(two_nodes, tmp_path, policy_server,
                                                                   tiny_model_dir, model):
    cfg = config(tmp_path, policy_server, tiny_model_dir, n_samples=4, fleet="ray", ray_address=two_nodes.address)
    summary = asyncio.run(run_rollouts(cfg))
    assert summary["status_counts"]["aborted"] == 0 and summary["status_counts"]["failed"] == 0, summary["errors"]
    samples = read_jsonl(cfg.out_dir / "samples.jsonl")
    check_trains(samples, model)
    nodes = Counter(s.metadata["node_id"] for s in samples)
    alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert set(nodes) == alive and len(alive) == 2 and sorted(nodes.values()) == [2, 2]  # by load: 2 each
    assert sorted(s.index for s in samples) == [0, 1, 2, 3]
    assert leftovers(cfg.out_dir) == ([], [])


def test_a_gateway_agent_samples_through_its_nodes_own_gateway(two_nodes, tmp_path, responsive_server,
                                                               responsive_model_dir, hf_model):
    cfg = config(tmp_path, responsive_server, responsive_model_dir, agent="terminus-2", n_samples=4, step_limit=2,
                 max_new_tokens=96, fleet="ray", ray_address=two_nodes.address)
    summary = asyncio.run(run_rollouts(cfg))
    assert summary["status_counts"]["aborted"] == 0 and summary["status_counts"]["failed"] == 0, summary["errors"]
    samples = read_jsonl(cfg.out_dir / "samples.jsonl")
    assert len(check_trains(samples, hf_model)) == 4
    assert len({s.metadata["node_id"] for s in samples}) == 2
    # each trial's calls were recorded by the gateway of the node that ran it, in its trial dir
    assert all((cfg.out_dir / "trials" / s.metadata["trial_name"] / "agent" / "gateway" / "calls.jsonl").is_file()
               for s in samples)
    assert leftovers(cfg.out_dir) == ([], [])


def test_a_node_lost_mid_trial_has_its_trials_run_again_on_the_other(tmp_path, policy_server, tiny_model_dir,
                                                                     model, capsys):
    cluster, (second,) = start_cluster(2)
    try:
        cfg = config(tmp_path, policy_server, tiny_model_dir, n_samples=4, step_limit=6, max_new_tokens=96,
                     fleet="ray", ray_address=cluster.address, retry_backoff_sec=0.1)
        second_id = second.node_id
        trials = cfg.out_dir / "trials"

        def remove_second_node_once_it_runs_trials() -> None:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:  # a trial dir with its agent started: trials are in flight
                if trials.is_dir() and sum(1 for d in trials.iterdir() if (d / "agent").is_dir()) >= 4:
                    break
                time.sleep(0.2)
            cluster.remove_node(second)

        killer = threading.Thread(target=remove_second_node_once_it_runs_trials)
        killer.start()
        summary = asyncio.run(run_rollouts(cfg))
        killer.join()
    finally:
        stop_cluster(cluster)
    err = capsys.readouterr().err
    assert err.count(f"fleet ray: rollout node {second_id} lost") == 1, err
    samples = read_jsonl(cfg.out_dir / "samples.jsonl")
    assert summary["status_counts"]["aborted"] == 0 and summary["status_counts"]["failed"] == 0, summary["errors"]
    # none lost, none twice: one scored episode per place in the group, each trained token-exact
    assert sorted((s.group_index, s.index) for s in samples) == [(0, k) for k in range(4)]
    check_trains(samples, model)
    rerun = [s for s in samples if s.metadata["retries"] >= 1]  # the lost node's trials, run again
    assert rerun and all(s.metadata["node_id"] != second_id for s in rerun)
    # No process of the lost node's trials is left. Their sandbox dirs may be (the node died before
    # it could remove them); the next sandbox start on the node sweeps them, their owner being dead.
    procs, dirs = leftovers(cfg.out_dir)
    assert procs == [] and len(dirs) <= 2, dirs
    from slime_harbor.environments.bubblewrap_host import default_sandbox_root, sweep_stale_sandboxes

    sweep_stale_sandboxes(default_sandbox_root())
    assert leftovers(cfg.out_dir) == ([], [])


def test_a_cluster_without_a_rollout_node_is_one_line(tmp_path, tiny_model_dir, policy_server, capsys):
    from slime_harbor.cli import main
    from slime_harbor.fleet import close_fleets

    close_fleets()
    ray.shutdown()  # a process joins one cluster: leave the module's (a later fleet there joins it again)

    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    ray_constants.ENABLE_RAY_CLUSTER = False
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": 80 * 1024 * 1024,
                                                            "include_dashboard": False})
    try:
        with pytest.raises(SystemExit) as exit_:
            main(["rollout", "--fleet", "ray", "--ray-address", cluster.address, "--model", str(tiny_model_dir),
                  "--policy-url", policy_server, "--out", str(tmp_path / "o"), "--n-samples", "1"])
    finally:
        stop_cluster(cluster)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and "no live node of the cluster carries the 'rollout' resource" in err[-1], err


def test_a_cancelled_run_cancels_its_remote_trials(two_nodes, tmp_path, policy_server, tiny_model_dir):
    """SLiME's abort of a round (or Ctrl-C) cancels the caller's tasks: each remote attempt is
    cancelled on its worker too, and its trial tears down there (no sandbox process is left)."""
    from slime_harbor.fleet import close_fleets

    close_fleets()
    cfg = config(tmp_path, policy_server, tiny_model_dir, n_samples=4, step_limit=50, max_new_tokens=200,
                 fleet="ray", ray_address=two_nodes.address)
    trials = cfg.out_dir / "trials"

    async def cancel_once_trials_run() -> None:
        run = asyncio.ensure_future(run_rollouts(cfg))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if trials.is_dir() and sum(1 for d in trials.iterdir() if (d / "agent").is_dir()) >= 4:
                break
            await asyncio.sleep(0.2)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run

    asyncio.run(cancel_once_trials_run())
    deadline = time.monotonic() + 60  # the workers' teardown runs after the caller's cancellation
    while time.monotonic() < deadline and leftovers(cfg.out_dir) != ([], []):
        time.sleep(0.5)
    assert leftovers(cfg.out_dir) == ([], [])
