"""What each installed agent's recipe costs and sends: its layer's build time and size on the
bundled tasks' base image, and the size of its first prompt in the default tiny model's tokens
(one real trial through the gateway, Docker sandbox, on a no-network bundled task).

    PYTHONPATH=$PWD .venv/bin/python bench/agent_installs.py [--agents NAME ...] [--fresh]

--fresh removes a cached layer first, so its build is timed from scratch (else a cached layer
reports the build time it recorded). One line per agent, and docs/agent_installs.json updated;
docs/gateway.md's agent table is generated from the recipes and that file:

    .venv/bin/python scripts/agent_table.py   # rewrites the table
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

from slime_harbor.environments.docker_images import docker_client, ensure_layer_image, layer_image
from scripts.agent_table import MEASURED, write_agent_table
from slime_harbor.agents.installed.catalog import RECIPES
from slime_harbor.policy.sampling import SamplingParams
from slime_harbor.policy.server import EmbeddedPolicyServer
from slime_harbor.policy.tiny_model import ensure_tiny_model
from slime_harbor.rollout import run_rollouts
from slime_harbor.run_config import DEFAULT_TASKS, RolloutConfig

BASE_IMAGE = "python:3.11-slim"  # the bundled tasks' base image
TASK = "count-errors"


def layer(name: str, fresh: bool) -> tuple[float, float]:
    """(build seconds, layer MB) of the agent's install on BASE_IMAGE."""
    client = docker_client()
    script = RECIPES[name].install.docker_script()
    if fresh:  # remove the layer ensure_layer_image would reuse, so it builds now
        from docker.errors import ImageNotFound

        try:
            client.api.remove_image(layer_image(BASE_IMAGE, name, script)[0], force=True)
        except ImageNotFound:
            pass
    started = time.monotonic()
    tag = asyncio.run(ensure_layer_image(BASE_IMAGE, name, script, 3600))
    seconds = time.monotonic() - started
    size = client.api.inspect_image(tag)["Size"] - client.api.inspect_image(BASE_IMAGE)["Size"]
    return seconds, size / 1e6


def first_prompt_tokens(name: str, server_url: str, model_dir: Path) -> int | None:
    """The prompt tokens of the first call of the agent's conversation (side calls, e.g. a session
    title, skipped) in one trial of the agent."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = RolloutConfig(tasks_dir=DEFAULT_TASKS, task_names=[TASK], agent=name, env="docker", n_samples=1,
                            policy_url=server_url, model_dir=str(model_dir), out_dir=Path(tmp) / "out",
                            step_limit=2, sampling=SamplingParams(max_new_tokens=32), progress=False)  # fmt: skip
        asyncio.run(run_rollouts(cfg))
        for calls in sorted((Path(tmp) / "out" / "trials").glob("*/agent/gateway/calls.jsonl")):
            records = [json.loads(line) for line in calls.read_text().splitlines()]
            side = {r["call"] for r in records if r.get("event") == "side_call"}
            for record in records:
                if "event" not in record and record["call"] not in side:
                    return record["usage"]["prompt_tokens"]
    return None


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--agents", nargs="+", default=[n for n, r in RECIPES.items() if r.verified_by])
    p.add_argument("--fresh", action="store_true")
    a = p.parse_args(argv)
    measured = dict(MEASURED)
    model_dir = ensure_tiny_model()
    with EmbeddedPolicyServer(model_dir) as server:
        for name in a.agents:
            seconds, mb = layer(name, a.fresh)
            row = {"layer_mb": round(mb), "prompt_tokens": first_prompt_tokens(name, server.url, model_dir)}
            # A cached layer keeps the build time measured when it was built (none if never).
            row["build_s"] = round(seconds) if a.fresh else measured.get(name, {}).get("build_s")
            measured[name] = row
            print(f"agent={name} build_s={row['build_s']} layer_mb={row['layer_mb']} first_prompt_tokens={row['prompt_tokens']}",
                  flush=True)
    write_agent_table(measured)


if __name__ == "__main__":
    main()
