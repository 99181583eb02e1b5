"""Harbor datasets named from a registry (`--tasks NAME[@VERSION] --registry-path FILE`), offline:
a registry JSON file of our own whose entries point at a git repository in tmp_path, resolved
and downloaded by Harbor's own client (its DatasetConfig, its git sparse checkout) into
$SLIME_HARBOR_CACHE, then run by the real command line (oracle agent, bubblewrap sandbox) and by
the SLiME hook's YAML keys. Nothing here leaves loopback: every registry is a local file."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from slime_harbor import hooks
from slime_harbor.exits import ConfigError
from slime_harbor.samples import read_jsonl
from slime_harbor.tasks.datasets import is_dataset_name, select_tasks
from slime_harbor.run_config import DEFAULT_TASKS
from helpers.cli import assert_one_line_error, command, env
from helpers.rollout import leftovers

TASKS = ["count-errors", "dedupe-lines", "fix-sort-key"]
NEW_LINE = "\n(This line was added after version 1.0 was pinned.)\n"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def registry(tmp_path, monkeypatch) -> Path:
    """registry.json naming `mini`: 1.0 = three tasks pinned at the first commit (a file:// URL);
    2.0 = two of them at the repository's head (a plain path), where dedupe-lines' instruction
    has a line 1.0 does not. Our cache is tmp_path/cache."""
    monkeypatch.setenv("SLIME_HARBOR_CACHE", str(tmp_path / "cache"))
    repo = tmp_path / "tasks-repo"
    for name in TASKS:
        shutil.copytree(DEFAULT_TASKS / name, repo / "tasks" / name)
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "three tasks")
    pinned = git(repo, "rev-parse", "HEAD")
    instruction = repo / "tasks" / "dedupe-lines" / "instruction.md"
    instruction.write_text(instruction.read_text() + NEW_LINE)
    git(repo, "commit", "-qam", "a line more")

    def entry(name: str, url: str, commit: str | None) -> dict:
        return {"name": name, "git_url": url, "git_commit_id": commit, "path": f"tasks/{name}"}

    datasets = [
        {"name": "mini", "version": "1.0", "description": "pinned",
         "tasks": [entry(n, repo.as_uri(), pinned) for n in TASKS]},
        {"name": "mini", "version": "2.0", "description": "head",
         "tasks": [entry(n, str(repo), None) for n in TASKS[1:]]},
    ]
    path = tmp_path / "registry.json"
    path.write_text(json.dumps(datasets))
    return path


def instruction(tasks_dir: Path, name: str) -> str:
    return (tasks_dir / name / "instruction.md").read_text()


def test_a_dataset_is_resolved_and_downloaded_by_harbor_into_our_cache(registry, tmp_path):
    cache = tmp_path / "cache"
    tasks_dir, names = select_tasks("mini@1.0", registry_path=registry)
    assert names is None and tasks_dir.parent == cache / "datasets"
    assert sorted(p.name for p in tasks_dir.iterdir()) == TASKS
    for name in TASKS:  # each a task downloaded by Harbor into its cache layout under ours
        assert (tasks_dir / name).resolve().is_relative_to(cache / "harbor-tasks")
        assert (tasks_dir / name / "task.toml").is_file()
    # 1.0 is pinned to the first commit: Harbor checked that commit out, not the head.
    assert instruction(tasks_dir, "dedupe-lines") == instruction(DEFAULT_TASKS, "dedupe-lines")
    assert select_tasks("mini@1.0", registry_path=registry)[0] == tasks_dir  # the second time: the same dir

    latest, _ = select_tasks("mini", registry_path=registry)  # NAME alone: Harbor picks the highest version
    assert sorted(p.name for p in latest.iterdir()) == TASKS[1:]
    assert instruction(latest, "dedupe-lines").endswith(NEW_LINE)


def test_a_registry_by_url(registry, tmp_path, monkeypatch):
    """--registry-url: Harbor fetches the registry JSON itself (here from a server on loopback)."""
    import functools
    import http.server
    import threading

    for proxy in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):  # loopback only, never through a proxy
        monkeypatch.delenv(proxy, raising=False)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(registry.parent))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/{registry.name}"
        tasks_dir, _ = select_tasks("mini@1.0", include=["dedupe-lines"], registry_url=url)
        assert [p.name for p in tasks_dir.iterdir()] == ["dedupe-lines"]
        with pytest.raises(ConfigError, match=f"mini@1.0 is neither a directory nor a dataset in {url}.missing: 404"):
            select_tasks("mini@1.0", registry_url=url + ".missing")
    finally:
        server.shutdown()
        server.server_close()


def test_task_filters_are_harbors_globs_and_must_each_name_a_task(registry):
    def chosen(**filters) -> list[str]:
        tasks_dir, _ = select_tasks("mini@1.0", registry_path=registry, **filters)
        return sorted(p.name for p in tasks_dir.iterdir())

    assert chosen(include=["*-lines", "count-errors"]) == ["count-errors", "dedupe-lines"]
    assert chosen(exclude=["dedupe*"]) == ["count-errors", "fix-sort-key"]
    assert chosen(include=["*e*"], exclude=["fix-*"]) == ["count-errors", "dedupe-lines"]
    with pytest.raises(ConfigError, match="no task matching dedup-lines"):
        chosen(exclude=["dedup-lines"])  # a typo: Harbor alone would run the task meant to be left out
    with pytest.raises(ConfigError, match="no task matching nope"):
        chosen(include=["dedupe-lines", "nope"])
    with pytest.raises(ConfigError, match="every task is excluded"):
        chosen(exclude=["*"])


def test_a_directory_works_as_before_and_takes_exclusions():
    assert select_tasks(DEFAULT_TASKS) == (DEFAULT_TASKS, None)
    assert select_tasks(str(DEFAULT_TASKS), include=["dedupe-lines"]) == (DEFAULT_TASKS, ["dedupe-lines"])
    tasks_dir, names = select_tasks(DEFAULT_TASKS, include=TASKS, exclude=["fix-sort-key"])
    assert (tasks_dir, names) == (DEFAULT_TASKS, ["count-errors", "dedupe-lines"])
    with pytest.raises(ConfigError, match="tasks not found in .*'no-such-task'"):
        select_tasks(DEFAULT_TASKS, exclude=["no-such-task"])
    with pytest.raises(ConfigError, match="is a path, not a dataset"):
        select_tasks(DEFAULT_TASKS, registry_path=Path("registry.json"))
    assert is_dataset_name("terminal-bench@2.0") and is_dataset_name("mini")
    assert not is_dataset_name("some/dir") and not is_dataset_name(DEFAULT_TASKS) and not is_dataset_name("a b")


def run_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(command(*args), capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**env(), "SLIME_HARBOR_CACHE": str(tmp_path / "cache")})


def test_a_rollout_on_a_dataset_named_from_a_local_registry(registry, tmp_path):
    out = tmp_path / "out"
    proc = run_cli(tmp_path, "rollout", "--tasks", "mini@1.0", "--registry-path", str(registry), "-x", "fix-sort-key",
                   "--agent", "oracle", "--env", "local", "--n-samples", "1", "--out", str(out), "--no-progress")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_trials"] == summary["n_scored"] == 2 and summary["mean_reward"] == 1.0
    assert sorted(s.metadata["task_name"] for s in read_jsonl(out / "samples.jsonl")) == ["count-errors", "dedupe-lines"]
    assert leftovers(out) == ([], [])


def test_prepare_data_writes_the_datasets_tasks(registry, tmp_path):
    out = tmp_path / "prompts.jsonl"
    proc = run_cli(tmp_path, "prepare-data", "--tasks", "mini", "--registry-path", str(registry), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["label"] for row in rows] == TASKS[1:]
    for row in rows:
        task_dir = Path(row["metadata"]["task_dir"])
        assert task_dir.is_relative_to(tmp_path / "cache" / "harbor-tasks")
        assert row["prompt"] == (task_dir / "instruction.md").read_text()


def test_a_name_that_does_not_resolve_is_one_error_line(registry, tmp_path):
    not_json = tmp_path / "not-json.json"
    not_json.write_text("{ this is not a registry")
    cases = {
        "unknown dataset": (dict(tasks="nope@1.0"), "nope@1.0 is neither a directory nor a dataset in .*Dataset nope not found"),
        "unknown version": (dict(tasks="mini@9"), "Version 9 of dataset mini not found"),
        "bad registry file": (dict(tasks="mini@1.0", registry_path=not_json), f"dataset in {not_json}: "),
        "missing registry file": (dict(tasks="mini", registry_path=tmp_path / "nope.json"), "nope.json does not exist"),
        "unknown task filter": (dict(tasks="mini@1.0", include=["nope*"]), r"no task matching nope\* \(its 3 tasks: count-errors"),
    }
    for case, (kwargs, match) in cases.items():
        with pytest.raises(ConfigError, match=match) as caught:
            select_tasks(**{"registry_path": registry, **kwargs})
        assert "\n" not in str(caught.value), case


@pytest.mark.parametrize("command_args, words", [
    (["rollout", "--tasks", "nope", "--agent", "oracle"], ["nope is neither a directory nor a dataset", "Dataset nope not found"]),
    (["train-local", "--tasks", "mini@9"], ["Version 9 of dataset mini not found"]),
    (["prepare-data", "--tasks", "mini@1.0", "-x", "dedup-lines", "--out", "p.jsonl"], ["no task matching dedup-lines"]),
])
def test_the_command_line_says_it_in_one_line(registry, tmp_path, command_args, words):
    proc = run_cli(tmp_path, *command_args, "--registry-path", str(registry))
    line = assert_one_line_error(proc, 2, *words)
    assert line.startswith("slime-harbor: error: ")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "p.jsonl").exists()


def test_the_hooks_harbor_tasks_key_names_a_dataset(registry, tmp_path):
    """harbor_tasks: mini@1.0 with harbor_registry_path: a real oracle trial of the task a
    sample's label names, from the downloaded dataset; bad keys fail the first call in one line."""
    from helpers.slime import SampleLike

    args = SimpleNamespace(harbor_tasks="mini@1.0", harbor_registry_path=str(registry), harbor_agent="oracle",
                           harbor_tasks_dir=hooks.DEFAULTS["harbor_tasks_dir"],  # as the shipped YAML spells it out
                           sglang_router_ip="127.0.0.1", sglang_router_port=9, harbor_trials_dir=str(tmp_path / "trials"))
    task_dir = hooks.resolve_task_dir(args, SampleLike(label="count-errors"))
    assert task_dir.resolve().is_relative_to(tmp_path / "cache" / "harbor-tasks")
    (sample,) = asyncio.run(hooks.generate(args, SampleLike(index=0, group_index=0, label="count-errors"), {}))
    # The oracle samples no tokens, so the hook removes its sample; the trial itself ran and passed.
    assert sample.metadata["status_reason"] == "completed", sample.metadata
    result = json.loads((Path(sample.metadata["trial_dir"]) / "result.json").read_text())
    assert result["verifier_result"]["rewards"]["reward"] == 1.0
    assert Path(result["config"]["task"]["path"]) == task_dir.resolve()
    for bad, match in [
        (dict(harbor_tasks="mini@9", harbor_registry_path=str(registry)), "harbor_tasks: mini@9 is neither"),
        (dict(harbor_tasks="mini", harbor_tasks_dir=str(DEFAULT_TASKS)), "not both"),
        (dict(harbor_registry_path=str(registry)), "need a dataset name in harbor_tasks"),
    ]:
        with pytest.raises(hooks.HookConfigError, match=match):
            asyncio.run(hooks.generate(SimpleNamespace(**bad), SampleLike(index=0, label="count-errors"), {}))
