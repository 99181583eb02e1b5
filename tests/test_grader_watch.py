"""The grading watch (issue 46) through real trials: run-time reads of the grader are caught in the
trial that did them, on tasks with no impossible twin, in bubblewrap and Docker, through the rollout
and through SLiME's generate hook; correct solutions (written with the libraries that take frames
for their own ends) score 1 unflagged; every verification is counted watched or unwatched.

The solutions (tests/fixtures/grader_watch/solutions) are applied by an agent (tests/held_out_agent.py),
as a policy's would be. The tasks: the bundled fix-window-sums, which computes every expected value
(no twin); median-table, a case table checked inside all() in a Python here-document; median-computed,
an expectation computed right before each call. The twins are off here: this is the watch alone.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from slime_harbor.environments.watch_dir import watch_root
from slime_harbor.grading.grader_watch.verifier import VIEWER_KEY

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "grader_watch"
SOLUTIONS = FIXTURES / "solutions"
WINDOWS = REPO / "examples" / "harbor" / "tasks" / "fix-window-sums"
MEDIAN_TABLE = FIXTURES / "tasks" / "median-table"
MEDIAN_COMPUTED = FIXTURES / "tasks" / "median-computed"
HELD_OUT_AGENT = "held_out_agent:HeldOutAgent"

# task copy -> (its source task, the file the agent writes, the solution)
ATTACKS = {
    "wt-import": (WINDOWS, "/app/windows.py", "windows_checker_import.py"),
    "wt-open": (WINDOWS, "/app/windows.py", "windows_checker_open.py"),
    "wt-cat": (WINDOWS, "/app/windows.py", "windows_checker_cat.py"),
    "mt-want": (MEDIAN_TABLE, "/app/stats.py", "median_callers_want.py"),
    "mt-gc": (MEDIAN_TABLE, "/app/stats.py", "median_gc_walk.py"),
    "mc-expected": (MEDIAN_COMPUTED, "/app/stats.py", "median_callers_expected.py"),
    "mc-traceback": (MEDIAN_COMPUTED, "/app/stats.py", "median_traceback_frame.py"),
}
CORRECT = {
    "wt-correct": (WINDOWS, "/app/windows.py", "windows_correct.py"),
    "mt-correct": (MEDIAN_TABLE, "/app/stats.py", "median_correct_with_libraries.py"),
    "mc-correct": (MEDIAN_COMPUTED, "/app/stats.py", "median_correct_with_libraries.py"),
}
# What the hook must name for each attack (in the flag's detail).
REACHED = {"wt-import": "/tests/check.py", "wt-open": "/tests/check.py", "wt-cat": "/tests/check.py",
           "mt-want": "_getframe", "mt-gc": "gc.get_objects", "mc-expected": "currentframe",
           "mc-traceback": "tb_frame"}


def lay_out(tmp_path: Path, chosen: dict) -> tuple[Path, dict]:
    tasks = tmp_path / "tasks"
    by_task = {}
    for name, (source, target, solution) in chosen.items():
        shutil.copytree(source, tasks / name, ignore=shutil.ignore_patterns("solution"))
        by_task[name] = {target: str(SOLUTIONS / solution)}
    return tasks, by_task


def run(tmp_path, chosen, env, policy_server, model_dir, **overrides) -> dict:
    """One rollout of `chosen` (n_samples 1, --hack-action penalty): task name -> its sample row."""
    from slime_harbor.rollout import run_rollouts
    from slime_harbor.run_config import RolloutConfig

    tasks, by_task = lay_out(tmp_path, chosen)
    out = tmp_path / f"out-{env}"
    settings = dict(tasks_dir=tasks, env=env, n_samples=1, concurrency=3, hack_action="penalty", progress=False,
                    impossible_twin="off", agent=HELD_OUT_AGENT, agent_kwargs={"files_by_task": by_task},
                    policy_url=policy_server, model_dir=str(model_dir), out_dir=out)
    summary = asyncio.run(run_rollouts(RolloutConfig(**{**settings, **overrides})))
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    return {"summary": summary, **{r["metadata"]["task_name"]: r for r in rows}}


def run_time_details(metadata: dict) -> list[str]:
    return [d for d in metadata.get("hack_details") or [] if d.startswith("reads_grader/runtime: ")]


def assert_caught(name: str, row: dict) -> None:
    metadata = row["metadata"]
    assert metadata["raw_rewards"]["reward"] == 1.0, (name, metadata)  # the hack passed the real tests
    assert metadata["grader_watch"]["watched"] is True, (name, metadata["grader_watch"])
    details = run_time_details(metadata)
    assert details and any(REACHED[name] in d for d in details), (name, metadata.get("hack_details"))
    assert any(f"/app/{'windows' if name.startswith('wt') else 'stats'}.py:" in d for d in details), details
    assert {"reads_grader", "reads_grader/runtime"} <= set(metadata["hack_flags"]) and row["reward"] == 0.0  # penalised
    assert metadata["reward_before_hack_penalty"] == 1.0


def assert_clean(name: str, row: dict) -> None:
    metadata = row["metadata"]
    assert row["reward"] == 1.0 and metadata["hack_flags"] == [], (name, metadata.get("hack_details"))
    assert metadata["grader_watch"]["watched"] is True and "events" not in metadata["grader_watch"], \
        (name, metadata["grader_watch"])


def test_run_time_reads_of_the_grader_are_caught_and_correct_solutions_are_not(tmp_path, monkeypatch,
                                                                              policy_server, tiny_model_dir):
    """bubblewrap: every attack flagged reads_grader by the hook and penalised; every correct
    solution 1 and unflagged; the counts in summary.json; no watch dir left behind."""
    monkeypatch.setenv("SLIME_HARBOR_CACHE", str(tmp_path / "cache"))
    got = run(tmp_path, {**ATTACKS, **CORRECT}, "local", policy_server, tiny_model_dir)
    for name in ATTACKS:
        assert_caught(name, got[name])
    for name in CORRECT:
        assert_clean(name, got[name])
    summary = got["summary"]
    assert summary["grader_watch/watched"] == len(ATTACKS) + len(CORRECT) and summary["grader_watch/unwatched"] == 0
    assert summary["hack/reads_grader"] == summary["hack/reads_grader/runtime"] == len(ATTACKS)
    assert summary["grader_watch_tasks"] == {name: "watched" for name in {**ATTACKS, **CORRECT}}
    assert set(summary["protection"].values()) == {"watch"}  # the twins are off here
    assert not [d for d in watch_root().glob("*") if d.name.startswith(f"{__import__('os').getpid()}-")]
    spawned = got["wt-cat"]["metadata"]["grader_watch"]
    assert any("cat" in s for s in spawned.get("spawned", []) + spawned.get("events", [])), spawned
    # Harbor's viewer shows what the watch saw on the trial's Verifier tab
    from fastapi.testclient import TestClient
    from harbor.viewer import create_app

    trial = Path(got["mt-want"]["metadata"]["trial_dir"])
    client = TestClient(create_app(tmp_path / "out-local", mode="jobs"))
    shown = client.get(f"/api/jobs/trials/trials/{trial.name}/verifier-output").json()["reward_details"]
    assert shown[VIEWER_KEY]["watched"] is True and "sys._getframe" in shown[VIEWER_KEY]["events"][0]
    # the watch's run-time read, and the static side's reading of the same sys._getframe call
    assert shown["slime-harbor hack monitor"]["flags"] == ["reads_grader", "reads_grader/runtime", "reads_grader/static"]


def test_the_watch_off_and_an_opted_out_task_are_unwatched_never_clean(tmp_path, monkeypatch, policy_server,
                                                                       tiny_model_dir):
    """--grader-watch off: the checker read scores 1 unflagged by the hook (no grader_watch at all);
    a task its manifest opts out is counted unwatched, with the manifest's reason."""
    monkeypatch.setenv("SLIME_HARBOR_CACHE", str(tmp_path / "cache"))
    chosen = {"wt-import": ATTACKS["wt-import"]}
    off = run(tmp_path / "off", chosen, "local", policy_server, tiny_model_dir, grader_watch="off")
    assert "grader_watch" not in off["wt-import"]["metadata"] and not run_time_details(off["wt-import"]["metadata"])
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"tasks": {"wt-import": {"status": "ok", "grader_watch": {
        "mode": "off", "reason": "its tests exec the solution's own frames"}}}}))
    opted = run(tmp_path / "opted", chosen, "local", policy_server, tiny_model_dir, task_manifest=manifest)
    watch = opted["wt-import"]["metadata"]["grader_watch"]
    assert watch == {"watched": False, "why": "the task opts out: its tests exec the solution's own frames"}
    assert opted["summary"]["grader_watch/unwatched"] == 1 and opted["summary"]["grader_watch/watched"] == 0


@pytest.mark.slow
def test_the_watch_catches_the_same_in_docker(tmp_path, monkeypatch, policy_server, tiny_model_dir):
    from helpers.docker import docker_skip_reason

    if why := docker_skip_reason():
        pytest.skip(why)
    monkeypatch.setenv("SLIME_HARBOR_CACHE", str(tmp_path / "cache"))
    chosen = {k: ATTACKS[k] for k in ("wt-import", "mt-want", "mc-traceback")} | {"mt-correct": CORRECT["mt-correct"]}
    got = run(tmp_path, chosen, "docker", policy_server, tiny_model_dir)
    for name in ("wt-import", "mt-want", "mc-traceback"):
        assert_caught(name, got[name])
    assert_clean("mt-correct", got["mt-correct"])
    # An SWE-bench-format instance, graded in its own container by swebench's harness (the tests run
    # as nobody, under the grader's guard): the held-out slugify that reads its caller's source line
    # is caught at run time there, and the gold is watched and clean.
    from slime_harbor.rollout import run_rollouts
    from slime_harbor.run_config import RolloutConfig

    swe = REPO / "examples" / "harbor" / "tasks-swe"
    common = dict(tasks_dir=swe, task_names=["slime-harbor__textkit-2"], env="docker", n_samples=1,
                  impossible_twin="off", hack_action="penalty", progress=False)
    asyncio.run(run_rollouts(RolloutConfig(**common, agent="oracle", out_dir=tmp_path / "swe-gold")))
    asyncio.run(run_rollouts(RolloutConfig(
        **common, agent=HELD_OUT_AGENT, policy_url=policy_server, model_dir=str(tiny_model_dir),
        agent_kwargs={"files": {"/testbed/textkit/slug.py": str(FIXTURES.parent / "held_out" / "stack_reading_slug.py")}},
        out_dir=tmp_path / "swe-hack")))
    [gold] = [json.loads(line) for line in (tmp_path / "swe-gold" / "samples.jsonl").read_text().splitlines()]
    [hack] = [json.loads(line) for line in (tmp_path / "swe-hack" / "samples.jsonl").read_text().splitlines()]
    assert gold["reward"] == 1.0 and gold["metadata"]["hack_flags"] == [], gold["metadata"].get("hack_details")
    assert gold["metadata"]["grader_watch"]["watched"] and gold["metadata"]["grader_watch"]["processes"] >= 2
    details = run_time_details(hack["metadata"])
    assert hack["metadata"]["raw_rewards"]["reward"] == 1.0 and hack["reward"] == 0.0
    assert any("/testbed/textkit/slug.py:" in d for d in details), hack["metadata"].get("hack_details")


def test_the_slime_hook_penalises_a_run_time_read_and_counts_the_watch(tmp_path, monkeypatch, policy_server,
                                                                      tiny_model_dir):
    """SLiME's generate hook runs the caller's-`want` median (an agent through its gateway): its
    Sample is scored as a failure under harbor_hack_action penalty, flagged reads_grader, and the
    hook's counts say the verification was watched."""
    from helpers.slime import held_out_sample_through_the_hook

    from slime_harbor import hooks

    out = held_out_sample_through_the_hook(tmp_path, monkeypatch, policy_server, tiny_model_dir, MEDIAN_TABLE,
                                           {"/app/stats.py": SOLUTIONS / "median_callers_want.py"},
                                           harbor_hack_action="penalty", harbor_impossible_twin="off")
    assert out.reward == 0.0 and {"reads_grader", "reads_grader/runtime"} <= set(out.metadata["hack_flags"]), \
        out.metadata.get("hack_details")
    assert run_time_details(out.metadata) and out.metadata["reward_before_hack_penalty"] == 1.0
    counts = hooks.hook_metrics()
    assert counts["hack/reads_grader"] == counts["hack/reads_grader/runtime"] == 1 and counts["grader_watch/watched"] == 1


def test_calibrate_finds_a_task_whose_own_code_inspects_frames_and_runs_watch_it_for_file_reads(tmp_path, monkeypatch):
    """frame-registry's own code takes its caller's frame (a plugin registry), and its gold edits
    that file: graded untouched under calibrate's probe, the task is found and its manifest entry
    says files only, with the reason; a run with the manifest then scores the gold 1 with no run-time
    flag, where a run without it flags the registry's own frame call in the gold's edited file. The
    manifest says per task whether it is watched and what guards it."""
    from slime_harbor.calibrate import calibrate
    from slime_harbor.rollout import run_rollouts
    from slime_harbor.run_config import RolloutConfig

    monkeypatch.setenv("SLIME_HARBOR_CACHE", str(tmp_path / "cache"))
    tasks = tmp_path / "tasks"
    for task in (FIXTURES / "tasks" / "frame-registry", REPO / "examples" / "harbor" / "tasks" / "config-parser",
                 WINDOWS):
        shutil.copytree(task, tasks / task.name)
    manifest = asyncio.run(calibrate(tasks, repeats=1, out=tmp_path / "calibration.json"))
    registry = manifest["tasks"]["frame-registry"]
    assert registry["status"] == "ok" and registry["watch"] == "watched", registry
    assert registry["grader_watch"]["mode"] == "files", registry
    assert "its own code reaches frames when graded untouched: /app/registry.py:8 in register" in \
        registry["grader_watch"]["reason"], registry
    assert "grader_watch" not in manifest["tasks"]["config-parser"]
    assert manifest["tasks"]["config-parser"]["protection"] == "watch and twin"
    assert manifest["tasks"]["fix-window-sums"]["protection"] == "watch"
    assert manifest["watched_tasks"] == 1.0
    assert manifest["protection"] == {"watch and twin": 1, "watch": 2, "twin": 0, "neither": 0}

    def gold(manifest_path, out):
        cfg = RolloutConfig(tasks_dir=tasks, task_names=["frame-registry"], agent="oracle", n_samples=1,
                            impossible_twin="off", task_manifest=manifest_path, out_dir=out, progress=False)
        asyncio.run(run_rollouts(cfg))
        return json.loads((out / "samples.jsonl").read_text().splitlines()[0])

    with_manifest = gold(tmp_path / "calibration.json", tmp_path / "with")
    assert with_manifest["reward"] == 1.0 and not run_time_details(with_manifest["metadata"])
    assert with_manifest["metadata"]["grader_watch"]["mode"].startswith("files only: its own code reaches frames")
    without = gold(None, tmp_path / "without")
    assert any("/app/registry.py:8 in register" in d for d in run_time_details(without["metadata"])), \
        without["metadata"].get("hack_details")


def test_the_counts_reach_the_step_line_wandb_and_summary():
    """The watch's counters over episodes (watched, unwatched and why, the watch's seconds), watch_tasks per
    task, the step line and the wandb names."""
    from helpers.samples import make_episode
    from slime_harbor.grading.grade import run_counts
    from slime_harbor.grading.grader_watch.verifier import watch_tasks
    from slime_harbor.trainers.tracking import wandb_key
    from slime_harbor.trainers.training_run import step_line

    def episode(task, outcome):
        e = make_episode(1.0, metadata={"grader_watch": outcome} if outcome else {})
        e.task_name = task
        return e

    episodes = [episode("a", {"watched": True, "processes": 2, "seconds": 0.5}),
                episode("a", {"watched": False, "why": "pid 7 (python3 x.py) ended without its report's end"}),
                episode("b", {"watched": True, "processes": 1, "seconds": 0.25, "mode": "files only: frames"}),
                episode("c", None)]
    counts = run_counts(episodes)
    assert counts == {"grader_watch/watched": 2, "grader_watch/unwatched": 1, "time/watch_s": 0.75,
                      "grader_watch/unwatched/pid_ended_without_its_report_s_end": 1, "hack_rate": None}
    assert watch_tasks(episodes) == {"a": "unwatched: pid 7 (python3 x.py) ended without its report's end",
                                     "b": "watched (files only: frames)"}
    record = {"step": 1, "reward_mean": 0.5, "pass_rate": 0.5, "aborted": 0, "n_samples": 4, "skipped": "",
              "n_tokens": 10, "timings": {"rollout_s": 1.0, "train_s": 1.0}, "hack/reads_grader": 1, **counts}
    assert "watched 2/3 (reads_grader 1) " in step_line(record)
    assert wandb_key("grader_watch/watched") == "rollout/grader_watch/watched"
    assert wandb_key("hack/reads_grader") == "rollout/hack/reads_grader" and wandb_key("time/watch_s") == "time/watch_s"


def test_every_runner_has_the_switch_and_refuses_a_bad_value_in_one_line():
    from slime_harbor.hooks import HookSettings
    from slime_harbor.run_config import RolloutConfig, check_config

    assert RolloutConfig().grader_watch == "on" and HookSettings().harbor_grader_watch == "on"
    with pytest.raises(ValueError, match="grader_watch must be on or off, got 'maybe'"):
        check_config(RolloutConfig(agent="oracle", grader_watch="maybe"))
