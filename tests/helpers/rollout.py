"""Rollouts of the bundled tasks in tests: the config a test starts from, the tasks it runs, the
replies the responsive model is taught, and what a rollout may leave behind."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

from slime_harbor.policy.sampling import SamplingParams
from slime_harbor.run_config import DEFAULT_TASKS, RolloutConfig

SAMPLING_FIELDS = {f.name for f in dataclasses.fields(SamplingParams)}

EASY_TASKS = ["dedupe-lines", "fix-sort-key"]


def trial_names(out_dir: Path) -> list[str]:
    return [p.name for p in (out_dir / "trials").iterdir() if p.is_dir()]


def leftovers(out_dir: Path) -> tuple[list[str], list[str]]:
    """Processes and sandbox dirs that belong to this rollout's trials (named after them), so
    tests running beside this one cannot confuse the check."""
    from slime_harbor.environments.bubblewrap_host import default_sandbox_root

    names = trial_names(out_dir)
    assert names
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout.splitlines()
    procs = [line for line in ps if any(n in line for n in names)]
    root = Path(default_sandbox_root())
    dirs = [p.name for p in root.iterdir() if any(n in p.name for n in names)] if root.exists() else []
    return procs, dirs


def config(tmp_path, policy_server, tiny_model_dir, **overrides) -> RolloutConfig:
    """A RolloutConfig for tests; SamplingParams' fields may be given flat (max_new_tokens=96), on
    top of 48 tokens a turn."""
    sampling = {k: overrides.pop(k) for k in list(overrides) if k in SAMPLING_FIELDS}
    base = dict(
        tasks_dir=DEFAULT_TASKS, task_names=EASY_TASKS[:1], agent="native", n_samples=2,
        policy_url=policy_server, model_dir=str(tiny_model_dir), concurrency=4, out_dir=tmp_path / "out",
        step_limit=3, sampling=SamplingParams(**{"max_new_tokens": 48, **sampling}), progress=False,
    )
    base.update(overrides)
    return RolloutConfig(**base)


NATIVE_REPLY = "THOUGHT: look around first.\n```bash\nls\n```<|im_end|>"


TERMINUS_REPLY = json.dumps(
    {"analysis": "Look around.", "plan": "List files.", "commands": [{"keystrokes": "ls\n", "duration": 0.1}],
     "task_complete": False}
) + "<|im_end|>"
