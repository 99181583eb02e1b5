"""Harbor task dirs of the tests' own: the fixture tasks, and a plain task's task.toml."""

from pathlib import Path

FIXTURE_TASKS = Path(__file__).resolve().parent.parent / "fixtures" / "tasks"
TASK_TOML = """schema_version = "1.4"
{extra_top}
[verifier]
timeout_sec = 60.0
{extra_verifier}
[agent]
timeout_sec = 60.0

[environment]
workdir = "/app"
build_timeout_sec = 300.0
network_mode = "no-network"
"""
