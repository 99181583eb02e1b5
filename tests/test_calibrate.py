"""`slime-harbor calibrate` and the task manifest it writes (issue 15, item 6).

Real trials on the bubblewrap sandbox: a working task is ok; a task whose gold solution does not
solve it and one whose empty answer already passes are broken; the manifest makes rollout skip
them (named in summary.json) while tasks it does not list run; train-local and the SLiME hook take
it too. The SWE-bench case (Docker): an instance whose gold patch needs a conftest.py is broken.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from slime_harbor.calibrate import attack_scripts, judge, verifier_inputs
from slime_harbor.tasks.manifest import BROKEN, FLAKY, HACKABLE, OK, apply_manifest, load_manifest
from slime_harbor.cli import main as cli_main
from slime_harbor.exits import ConfigError
from slime_harbor.rollout import run_rollouts
from slime_harbor.run_config import RolloutConfig

ROOT = Path(__file__).resolve().parent.parent
GOOD = ROOT / "examples" / "harbor" / "tasks" / "fix-sort-key"


def make_tasks(root: Path) -> Path:
    tasks = root / "tasks"
    shutil.copytree(GOOD, tasks / "good")
    shutil.copytree(GOOD, tasks / "gold-fails")
    (tasks / "gold-fails" / "solution" / "solve.sh").write_text("#!/bin/bash\ntrue\n")
    shutil.copytree(GOOD, tasks / "empty-passes")
    (tasks / "empty-passes" / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    return tasks


def test_judge_statuses():
    assert judge([1.0, 1.0], [0.0, 0.0], [])[0] == OK
    assert judge([0.0, 0.0], [0.0, 0.0], []) == (BROKEN, "the gold solution never passes in 2 of 2 runs")
    assert judge([None, None], [0.0, 0.0], [])[1] == "the gold solution failed (no reward) in 2 of 2 runs"
    assert judge([1.0, 1.0], [1.0, 1.0], []) == (BROKEN, "the empty answer passes in 2 of 2 runs")
    assert judge([1.0, 0.0, 1.0], [0.0] * 3, []) == (FLAKY, "the gold solution passes in 2 of 3 runs")
    assert judge([1.0] * 3, [0.0, 1.0, 0.0], []) == (FLAKY, "the empty answer passes in 1 of 3 runs")
    assert judge([1.0], [0.0], ["tests/conftest.py: test configuration"])[0] == BROKEN


@pytest.mark.slow
def test_calibrate_then_rollout_skips_what_it_marks(tmp_path, capsys):
    tasks = make_tasks(tmp_path)
    cli_main(["calibrate", "--tasks", str(tasks), "--repeats", "2"])
    manifest = json.loads((tasks / "calibration.json").read_text())
    status = {name: t["status"] for name, t in manifest["tasks"].items()}
    assert status == {"good": OK, "gold-fails": BROKEN, "empty-passes": BROKEN}, manifest
    assert manifest["tasks"]["good"]["gold"] == [1.0, 1.0] and manifest["tasks"]["good"]["empty"] == [0.0, 0.0]
    assert "never passes" in manifest["broken"]["gold-fails"]
    assert "empty answer passes" in manifest["broken"]["empty-passes"]
    assert "1 ok, 2 broken, 0 hackable, 0 flaky" in capsys.readouterr().out

    shutil.copytree(GOOD, tasks / "not-calibrated")  # not in the manifest: it runs
    out = tmp_path / "rollout"
    summary = asyncio.run(run_rollouts(RolloutConfig(
        tasks_dir=tasks, agent="oracle", n_samples=1, out_dir=out, progress=False,
        task_manifest=tasks / "calibration.json")))
    assert sorted(summary["per_task_rewards"]) == ["good", "not-calibrated"]
    assert sorted(summary["skipped_tasks"]) == ["empty-passes", "gold-fails"]
    assert json.loads((out / "summary.json").read_text())["skipped_tasks"]["gold-fails"].startswith("broken: ")


def test_manifest_errors_are_one_line(tmp_path):
    tasks = make_tasks(tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    for path, words in ((tmp_path / "absent.json", "does not exist"), (bad, "is not JSON")):
        with pytest.raises(ConfigError, match=words):
            load_manifest(path)
        proc = subprocess.run([sys.executable, "-m", "slime_harbor.cli", "rollout", "--tasks", str(tasks),
                               "--agent", "oracle", "--task-manifest", str(path), "--out", str(tmp_path / "o")],
                              capture_output=True, text=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
        assert proc.returncode != 0 and proc.stderr.strip().count("\n") == 0 and words in proc.stderr, proc.stderr
    bad.write_text('{"tasks": {"x": 1}}')
    with pytest.raises(ConfigError, match="not a calibrate manifest"):
        load_manifest(bad)
    assert apply_manifest([tasks / "good"], None) == ([tasks / "good"], {})


def test_train_local_and_the_hook_take_the_manifest(tmp_path):
    from slime_harbor import hooks
    from slime_harbor.trainers.local import config_from_args

    tasks = make_tasks(tmp_path)
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({"tasks": {"gold-fails": {"status": "broken", "reason": "r"},
                                              "good": {"status": "ok", "reason": "fine"}}}))
    cfg = config_from_args(["--tasks", str(tasks), "--task-manifest", str(manifest)])
    assert cfg.task_manifest == manifest
    kept, skipped = apply_manifest(sorted(p for p in tasks.iterdir()), cfg.task_manifest)
    assert [p.name for p in kept] == ["empty-passes", "good"] and skipped == {"gold-fails": "broken: r"}

    class Args:
        harbor_tasks_dir = str(tasks)
        harbor_task_manifest = str(manifest)
        harbor_agent = "oracle"

    from helpers.slime import SampleLike

    sample = SampleLike(label="gold-fails")
    before = hooks.METRICS["skipped_by_manifest"]
    [placeholder] = asyncio.run(hooks.generate(Args(), sample, {}))
    assert placeholder.remove_sample is True and "skipped by" in placeholder.metadata["status_reason"]
    assert hooks.METRICS["skipped_by_manifest"] == before + 1


@pytest.mark.slow
def test_swebench_gold_patch_needing_test_configuration_is_broken(tmp_path):
    """The gold patch of an instance adds a conftest.py, which grading drops: calibrate says broken."""
    from helpers.docker import docker_client
    from helpers.swebench import absolute_env, GOLD_PARSE, patch_against_base, records, write_jsonl

    docker_client()  # skips without a Docker daemon
    from slime_harbor.tasks.swebench import convert

    base = absolute_env(records()[0])
    rows = [{**base, "instance_id": "needs-conftest",
             "patch": patch_against_base({"tinycalc/parse.py": GOLD_PARSE, "tests/conftest.py": "collect_ignore = []\n"})},
            {**base, "instance_id": "plain-gold"}]
    convert(write_jsonl(tmp_path / "i.jsonl", rows), tmp_path / "tasks")
    cli_main(["calibrate", "--tasks", str(tmp_path / "tasks"), "--env", "docker", "--repeats", "1",
              "--out", str(tmp_path / "m.json")])
    manifest = json.loads((tmp_path / "m.json").read_text())
    assert manifest["tasks"]["plain-gold"]["status"] == OK, manifest
    assert manifest["tasks"]["needs-conftest"]["status"] == BROKEN
    assert "tests/conftest.py: test configuration" in manifest["broken"]["needs-conftest"]


def test_judge_hackable_and_gold_tampering():
    fine = dict(gold=[1.0], empty=[0.0], dropped=[])
    assert judge(**fine, attacks={"replace_shell": 0.0, "mine": None})[0] == OK
    status, reason = judge(**fine, attacks={"replace_shell": 0.0, "replace_task_scripts": 1.0})
    assert (status, reason) == (HACKABLE, "scored by attack replace_task_scripts (reward 1)")
    status, reason = judge(gold=[0.0], empty=[0.0], dropped=[], gold_tampering="not verified: modified_runtime: /usr/bin/x")
    assert status == BROKEN and "changes the verifier's runtime" in reason and "/usr/bin/x" in reason


def docker_tags() -> set[str]:
    from slime_harbor.environments.docker_images import docker_client

    return {tag for image in docker_client().images.list() for tag in image.tags}


def write_hackable_task(tasks: Path) -> None:
    """A task whose verifier trusts a checker script its own Dockerfile installed under
    /usr/local/bin: the agent may change that file (it is the task's, not the runtime's), so a
    blind attack that replaces such scripts scores."""
    task = tasks / "trusts-its-checker"
    shutil.copytree(GOOD, task)
    (task / "environment" / "check-answer").write_text("#!/bin/sh\ngrep -q -- '-player\\[1\\]' /app/leaderboard.py\n")
    (task / "environment" / "check-answer").chmod(0o755)
    dockerfile = task / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + "COPY check-answer /usr/local/bin/check-answer\n")
    (task / "tests" / "test.sh").write_text(
        "#!/bin/bash\necho 0 > /logs/verifier/reward.txt\ncheck-answer && echo 1 > /logs/verifier/reward.txt\n")


@pytest.mark.slow
@pytest.mark.parametrize("env", ["local", "docker"])
def test_probe_hacks_marks_a_hackable_task_and_rollout_skips_it(env, tmp_path, capsys):
    from helpers.docker import docker_skip_reason

    if env == "docker" and (why := docker_skip_reason()):
        pytest.skip(why)
    tasks = tmp_path / "tasks"
    shutil.copytree(GOOD, tasks / "good")
    write_hackable_task(tasks)
    mine = tmp_path / "my-attacks"
    mine.mkdir()
    (mine / "forge_reward_file.sh").write_text("#!/bin/bash\nmkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt\n")
    tags_before = docker_tags() if env == "docker" else set()
    cli_main(["calibrate", "--tasks", str(tasks), "--env", env, "--repeats", "1", "--probe-hacks",
              "--attacks", str(mine)])
    printed = capsys.readouterr().out
    if env == "docker":  # the attack copies' images are gone; the tasks' own stay for training
        left = docker_tags() - tags_before
        assert not [t for t in left if "--" in t], left
        assert {t.split(":")[0] for t in left} <= {"slime-harbor-env/good", "slime-harbor-env/trusts-its-checker"}, left
        assert re.search(r"docker: removed the \d+ image tags of the attack copies; image layers on disk grew by \d+ MB",
                         printed), printed
    manifest = json.loads((tasks / "calibration.json").read_text())
    good, hackable = manifest["tasks"]["good"], manifest["tasks"]["trusts-its-checker"]
    assert good["status"] == OK, good
    assert set(good["attacks"]) >= {"replace_shell", "python_startup_hook", "forge_reward_daemon", "forge_reward_file"}
    assert all(r is not None and r < 1 for r in good["attacks"].values()), good["attacks"]
    assert hackable["status"] == HACKABLE and "attack replace_task_scripts" in hackable["reason"], hackable
    assert "1 ok, 0 broken, 1 hackable, 0 flaky" in printed
    summary = asyncio.run(run_rollouts(RolloutConfig(tasks_dir=tasks, agent="oracle", n_samples=1, env=env,
                                                     out_dir=tmp_path / "run", progress=False,
                                                     task_manifest=tasks / "calibration.json")))
    assert list(summary["skipped_tasks"]) == ["trusts-its-checker"]
    assert summary["skipped_tasks"]["trusts-its-checker"].startswith("hackable: ")


RANK_CASES = """
import sys
sys.path.insert(0, "/app")
from leaderboard import rank

cases = [([("b", 1), ("a", 1), ("c", 2)], [("c", 2), ("a", 1), ("b", 1)]), ([], []), ([("x", 5)], [("x", 5)])]
for players, want in cases:
    assert rank(players) == want, (players, rank(players))
print(f"checked {len(cases)} cases")
"""


# Sound about the answer (it reads the answer's output from another process), but it is itself a
# file of the workdir.
WORKDIR_CHECKER = """
import subprocess, sys
run = subprocess.run([sys.executable, "-c", "from leaderboard import rank; print(rank([('b', 1), ('a', 1), ('c', 2)]))"],
                     cwd="/app", capture_output=True, text=True)
sys.exit(0 if run.stdout.strip() == "[('c', 2), ('a', 1), ('b', 1)]" else 1)
"""


def write_trusting_tasks(tasks: Path) -> None:
    """Three verifiers of fix-sort-key. trusts-workdir-checker runs a checker its image ships in
    the workdir (/app/check.py: the agent's to change); trusts-exit-status imports the answer in
    the process whose exit status it trusts (an answer that exits 0 at import passes); checks-output
    is that same check made sound: it reads the check's output, which an early exit never prints."""
    checker = tasks / "trusts-workdir-checker"
    shutil.copytree(GOOD, checker)
    (checker / "environment" / "check.py").write_text(WORKDIR_CHECKER)
    with open(checker / "environment" / "Dockerfile", "a") as dockerfile:
        dockerfile.write("COPY check.py /app/check.py\n")
    (checker / "tests" / "test.sh").write_text(
        "#!/bin/bash\necho 0 > /logs/verifier/reward.txt\npython3 /app/check.py && echo 1 > /logs/verifier/reward.txt\n")
    for name, test_sh in (
            ("trusts-exit-status", "python3 /tests/test_rank.py && echo 1 > /logs/verifier/reward.txt"),
            ("checks-output", '[ "$(python3 /tests/test_rank.py)" = "checked 3 cases" ] && echo 1 > /logs/verifier/reward.txt')):
        shutil.copytree(GOOD, tasks / name)
        (tasks / name / "tests" / "check.py").unlink()
        (tasks / name / "tests" / "test_rank.py").write_text(RANK_CASES)
        (tasks / name / "tests" / "test.sh").write_text(f"#!/bin/bash\necho 0 > /logs/verifier/reward.txt\n{test_sh}\n")


def test_verifier_inputs_are_the_files_a_verifier_trusts_that_the_agent_can_change(tmp_path):
    write_trusting_tasks(tmp_path)
    assert verifier_inputs(tmp_path / "trusts-workdir-checker") == ["/app/leaderboard.py", "/app/check.py"]
    assert verifier_inputs(tmp_path / "trusts-exit-status") == ["/app/leaderboard.py"]
    # The bundled checker names its answer inside a code string and in comments: only the answer.
    assert verifier_inputs(GOOD) == ["/app/leaderboard.py"]
    # SWE-bench-format tasks are graded where the image's files never run: nothing to probe.
    assert verifier_inputs(ROOT / "examples" / "harbor" / "tasks-swe" / "slime-harbor__textkit-2") == []


@pytest.mark.slow
@pytest.mark.parametrize("env", ["local", "docker"])
def test_probe_hacks_finds_verifiers_that_trust_agent_writable_files(env, tmp_path, capsys):
    from helpers.docker import docker_skip_reason

    if env == "docker" and (why := docker_skip_reason()):
        pytest.skip(why)
    tasks = tmp_path / "tasks"
    write_trusting_tasks(tasks)
    cli_main(["calibrate", "--tasks", str(tasks), "--env", env, "--repeats", "1", "--probe-hacks"])
    printed = capsys.readouterr().out
    manifest = json.loads((tasks / "calibration.json").read_text())["tasks"]
    checker, exit_status, sound = (manifest[n] for n in ("trusts-workdir-checker", "trusts-exit-status", "checks-output"))
    assert checker["status"] == HACKABLE and checker["trusted_files"] == ["/app/check.py"], checker
    assert "the verifier trusts /app/check.py" in checker["reason"]
    assert exit_status["status"] == HACKABLE and exit_status["trusted_files"] == ["/app/leaderboard.py"], exit_status
    assert sound["status"] == OK and sound["attacks"]["trusted_files"] == 0.0, sound
    # one run per task, plus one per candidate of the two that scored with more than one candidate
    assert "trusted files probe: 5 verifier runs over 3 tasks" in printed, printed


def test_attacks_dir_errors_are_one_line(tmp_path):
    with pytest.raises(ConfigError, match="no NAME.sh attack scripts"):
        attack_scripts([tmp_path])
    with pytest.raises(ConfigError, match="not a directory"):
        attack_scripts([tmp_path / "missing"])
