"""The bundled SWE-bench instances (examples/harbor/tasks-swe): their records, patches against their
base repos, and a real rollout of converted tasks. Everything here feeds swebench-tasks, which needs
swebench: a test that imports this module skips without it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("swebench", reason="swebench (5.0.2) is not installed: swebench-tasks needs it")

ROOT = Path(__file__).resolve().parent.parent.parent
TASKS_SWE = ROOT / "examples" / "harbor" / "tasks-swe"
INSTANCES = TASKS_SWE / "instances.jsonl"
GIT_ENV = {  # the bundled Dockerfiles commit /testbed with these: base_commit must match
    "GIT_AUTHOR_NAME": "slime-harbor", "GIT_AUTHOR_EMAIL": "tasks@slime-harbor.invalid",
    "GIT_AUTHOR_DATE": "2024-01-01T00:00:00+0000", "GIT_COMMITTER_NAME": "slime-harbor",
    "GIT_COMMITTER_EMAIL": "tasks@slime-harbor.invalid", "GIT_COMMITTER_DATE": "2024-01-01T00:00:00+0000",
}
# tinycalc-1's base repo, its parse.py, and that parse.py fixed
BASE = TASKS_SWE / "environments" / "tinycalc-1" / "repo"
PARSE = (BASE / "tinycalc" / "parse.py").read_text()
GOLD_PARSE = PARSE.replace('    if "." in text:', '    text = text.strip()\n    if "." in text:').replace(
    "    if text.isdigit():", '    digits = text[1:] if text.startswith(("+", "-")) else text\n    if digits.isdigit():')


def records() -> list[dict]:
    return [json.loads(line) for line in INSTANCES.read_text().splitlines() if line.strip()]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def absolute_env(row: dict) -> dict:
    """A bundled record usable from another directory (environment_dir made absolute)."""
    return {**row, "environment_dir": str(TASKS_SWE / row["environment_dir"])}


def rollout(tasks_dir: Path, agent: str, out: Path, concurrency: int = 3) -> dict[str, dict]:
    """One real Harbor trial per task (our DockerEnvironment, --reward-mapping pm1): task -> sample."""
    import asyncio

    from slime_harbor.rollout import run_rollouts
    from slime_harbor.run_config import RolloutConfig

    cfg = RolloutConfig(tasks_dir=tasks_dir, agent=agent, n_samples=1, env="docker", concurrency=concurrency,
                        out_dir=out, reward_mapping="pm1", progress=False)
    asyncio.run(run_rollouts(cfg))
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    return {s["metadata"]["task_name"]: s for s in samples}


def verifier_files(sample: dict) -> dict[str, str]:
    """What the trial's verifier left in its trial dir (reward.json, report.json, test_output.txt)."""
    verifier = Path(sample["metadata"]["trial_dir"]) / "verifier"
    return {p.name: p.read_text() for p in verifier.iterdir() if p.is_file()}


def patch_against_base(new_files: dict[str, str], record: dict | None = None) -> str:
    """A git diff of a bundled instance's base repo (tinycalc-1's by default) with files replaced or
    added (new files included)."""
    with tempfile.TemporaryDirectory() as d:
        repo = Path(d) / "repo"
        environment_dir = (record or records()[0])["environment_dir"]
        shutil.copytree(TASKS_SWE / environment_dir / "repo", repo)
        env = {**os.environ, **GIT_ENV}
        for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "base"]):
            subprocess.run(["git", *args], cwd=repo, env=env, check=True)
        for rel, text in new_files.items():
            (repo / rel).parent.mkdir(parents=True, exist_ok=True)
            (repo / rel).write_text(text)
        subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
        return subprocess.run(["git", "diff", "--cached"], cwd=repo, capture_output=True, text=True, check=True).stdout


ALWAYS_EQUAL_SLUG = '''import re


class Slug(str):
    def __eq__(self, other):
        return True

    __hash__ = str.__hash__


def slugify(text):
    return Slug(re.sub(r"[^a-z0-9]", "-", text.lower()))
'''
