"""The bundled example tasks: each loads as a Harbor task, and in a real Harbor Trial
on the bubblewrap sandbox its oracle solution scores 1 and doing nothing scores 0."""

import asyncio
import shlex
import traceback
from pathlib import Path

import pytest
from harbor.models.task.config import NetworkMode
from harbor.models.task.task import Task
from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig
from harbor.trial.trial import Trial

TASKS_DIR = Path(__file__).resolve().parents[1] / "examples" / "harbor" / "tasks"
TASK_DIRS = sorted(path for path in TASKS_DIR.iterdir() if path.is_dir())
SANDBOX_IMPORT_PATH = "slime_harbor.environments.bubblewrap:BubblewrapEnvironment"
# The local sandbox replays only these Dockerfile instructions.
ALLOWED_DOCKERFILE_INSTRUCTIONS = {"FROM", "WORKDIR", "COPY", "ENV", "RUN"}
CONCURRENT_TRIALS = 4


def test_there_are_at_least_twelve_tasks():
    assert len(TASK_DIRS) >= 12, [path.name for path in TASK_DIRS]


@pytest.mark.parametrize("task_dir", TASK_DIRS, ids=lambda path: path.name)
def test_task_loads_with_harbor_and_has_every_part(task_dir: Path):
    task = Task(task_dir)
    assert task.instruction.strip(), "instruction.md is empty"
    for part in ("environment/Dockerfile", "solution/solve.sh", "tests/test.sh", "tests/check.py"):
        assert (task_dir / part).is_file(), f"missing {part}"

    config = task.config
    assert config.environment.workdir == "/app"
    assert config.environment.network_mode == NetworkMode.NO_NETWORK
    assert config.agent.timeout_sec is not None and config.agent.timeout_sec <= 300
    assert config.verifier.timeout_sec <= 300
    assert config.metadata.get("difficulty") in {"easy", "medium", "hard"}
    assert config.metadata.get("category")
    assert config.metadata.get("tags")

    test_script = (task_dir / "tests" / "test.sh").read_text()
    assert "/logs/verifier/reward.txt" in test_script


@pytest.mark.parametrize("task_dir", TASK_DIRS, ids=lambda path: path.name)
def test_dockerfile_uses_only_what_the_sandbox_replays(task_dir: Path):
    environment_dir = task_dir / "environment"
    lines = [line.strip() for line in (environment_dir / "Dockerfile").read_text().splitlines()]
    instructions = [line for line in lines if line and not line.startswith("#")]
    assert instructions[0].split()[0].upper() == "FROM"
    for line in instructions:
        keyword, *arguments = shlex.split(line)
        assert keyword.upper() in ALLOWED_DOCKERFILE_INSTRUCTIONS, line
        if keyword.upper() == "COPY":
            *sources, _destination = arguments
            for source in sources:
                assert (environment_dir / source).exists(), f"COPY source {source} not in environment/"


async def _run_trial(task_dir: Path, agent_name: str, trials_dir: Path) -> tuple[float | None, str | None]:
    """One real Harbor Trial; returns (reward, problem), problem None when it ran cleanly."""
    config = TrialConfig(
        task=TaskConfig(path=task_dir),
        trials_dir=trials_dir,
        agent=AgentConfig(name=agent_name),
        environment=EnvironmentConfig(import_path=SANDBOX_IMPORT_PATH, delete=True),
    )
    try:
        trial = await Trial.create(config)
        result = await trial.run()
    except Exception as error:
        return None, "".join(traceback.format_exception_only(error)).strip()
    if result.exception_info is not None:
        info = result.exception_info
        return None, f"{info.exception_type}: {info.exception_message}"
    rewards = result.verifier_result.rewards if result.verifier_result else None
    if not rewards or "reward" not in rewards:
        return None, f"no reward in verifier result: {rewards!r}"
    return float(rewards["reward"]), None


@pytest.mark.slow
def test_oracle_scores_one_and_nop_scores_zero_in_real_trials(tmp_path: Path):
    expected_reward = {"oracle": 1.0, "nop": 0.0}
    semaphore = asyncio.Semaphore(CONCURRENT_TRIALS)

    async def run_one(task_dir: Path, agent_name: str):
        async with semaphore:
            trials_dir = tmp_path / f"{task_dir.name}-{agent_name}"
            return task_dir.name, agent_name, *await _run_trial(task_dir, agent_name, trials_dir)

    async def run_all():
        return await asyncio.gather(
            *(run_one(task_dir, agent) for task_dir in TASK_DIRS for agent in expected_reward)
        )

    failures = [
        f"{task}/{agent}: reward {reward}, expected {expected_reward[agent]}"
        + (f"\n    {problem}" if problem else "")
        for task, agent, reward, problem in asyncio.run(run_all())
        if problem is not None or reward != expected_reward[agent]
    ]
    assert not failures, "\n".join(failures)
