"""SWE-bench instances as Harbor tasks (slime_harbor/tasks/swebench.py, `slime-harbor swebench-tasks`).

Fast tests: the committed examples/harbor/tasks-swe/ dirs regenerate byte for byte, record
validation, swebench's own defaults, the grader's reward (or none) on eval logs.

Docker tests (slow; skipped when no dockerd answers or SLIME_HARBOR_NO_DOCKER is set) run real
Harbor trials on our DockerEnvironment (containers with no network; images cached after the first
build, which pip installs swebench into the grader venv) with --reward-mapping pm1: Harbor's oracle
agent (the gold patch) resolves every bundled instance (reward 1 -> +1), nop resolves none
(0 -> -1), a partial fix and a fix that breaks a PASS_TO_PASS test do not resolve, tests the agent
rewrote are reset before grading, tests that time out score -1, and a test patch that cannot apply
writes no reward: the trial fails and is removed, never scored -1. The attacks on the grading are
in test_reward_integrity.py.
"""

from __future__ import annotations

import filecmp
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("swebench", reason="swebench (5.0.2) is not installed: swebench-tasks needs it")

from slime_harbor.cli import main as cli_main
from slime_harbor.tasks.swebench import TEST_TIMEOUT_MARGIN_SEC, SwebenchTaskOptions, convert, load_instances
from helpers.docker import docker_client
from helpers.swebench import (
    absolute_env, GIT_ENV, INSTANCES, patch_against_base, records, rollout, TASKS_SWE, verifier_files, write_jsonl,
)

ROOT = Path(__file__).resolve().parent.parent
LABEL = {"slime-harbor.test": "swebench"}


def tree(path: Path) -> dict[str, Path]:
    return {str(p.relative_to(path)): p for p in sorted(path.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------- conversion, no Docker


def test_regenerates_committed_tasks_exactly(tmp_path):
    cli_main(["swebench-tasks", "--instances", str(INSTANCES), "--out", str(tmp_path)])
    ids = [r["instance_id"] for r in records()]
    assert len(ids) >= 3
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(ids)
    for iid in ids:
        new, committed = tree(tmp_path / iid), tree(TASKS_SWE / iid)
        assert new.keys() == committed.keys(), iid
        for rel in new:
            assert filecmp.cmp(new[rel], committed[rel], shallow=False), f"{iid}/{rel} differs"
            assert os.access(new[rel], os.X_OK) == os.access(committed[rel], os.X_OK), f"{iid}/{rel} mode"


def test_bundled_base_commits_are_the_environment_repos(tmp_path):
    """Each environment's repo/, committed as its Dockerfile does, hashes to the record's base_commit."""
    for row in records():
        repo = tmp_path / row["instance_id"]
        subprocess.run(["cp", "-r", str(TASKS_SWE / row["environment_dir"] / "repo"), str(repo)], check=True)
        env = {**os.environ, **GIT_ENV}
        for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "base"]):
            subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True)
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout
        assert head.strip() == row["base_commit"], row["instance_id"]
        for field in ("patch", "test_patch"):  # both apply to the base commit
            subprocess.run(["git", "apply", "--check", "-"], cwd=repo, input=row[field], text=True, check=True)


def test_list_fields_as_json_strings_or_lists(tmp_path):
    rows = [absolute_env(r) for r in records()]
    assert all(isinstance(r["FAIL_TO_PASS"], str) for r in rows)  # the committed form: JSON strings
    as_lists = [{**r, "FAIL_TO_PASS": json.loads(r["FAIL_TO_PASS"]),
                 "PASS_TO_PASS": json.loads(r["PASS_TO_PASS"])} for r in rows]
    a = convert(write_jsonl(tmp_path / "strings.jsonl", rows), tmp_path / "a")
    b = convert(write_jsonl(tmp_path / "lists.jsonl", as_lists), tmp_path / "b")
    for ta, tb in zip(a, b):
        ia = json.loads((ta / "tests" / "instance.json").read_text())
        assert ia == json.loads((tb / "tests" / "instance.json").read_text())
        assert isinstance(ia["FAIL_TO_PASS"], list) and ia["FAIL_TO_PASS"]


BAD_RECORDS = [
    ("missing field", lambda r: r.pop("test_patch"), "test_patch"),
    ("F2P not JSON", lambda r: r.update(FAIL_TO_PASS="[tests/x.py::t"), "FAIL_TO_PASS"),
    ("P2P not a list", lambda r: r.update(PASS_TO_PASS={"a": 1}), "PASS_TO_PASS"),
    ("F2P empty", lambda r: r.update(FAIL_TO_PASS="[]"), "FAIL_TO_PASS"),
    ("patch not a diff", lambda r: r.update(patch="just text"), "patch"),
    ("bad commit", lambda r: r.update(base_commit="main"), "base_commit"),
    ("unknown parser", lambda r: r.update(log_parser="nosuchparser"), "log_parser"),
    ("missing env dir", lambda r: r.update(environment_dir="no/such/dir"), "environment_dir"),
    ("path in id", lambda r: r.update(instance_id="../escape"), "instance_id"),
]


@pytest.mark.parametrize("case,mutate,field", BAD_RECORDS, ids=[c[0] for c in BAD_RECORDS])
def test_bad_record_one_line_error(tmp_path, case, mutate, field):
    rows = [absolute_env(r) for r in records()]
    mutate(rows[1])
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(SystemExit) as e:
        cli_main(["swebench-tasks", "--instances", str(path), "--out", str(tmp_path / "out")])
    message = str(e.value.code)
    assert "\n" not in message and message.startswith("slime-harbor swebench-tasks: error:")
    assert f"field {field!r}" in message and f"{path}:2" in message
    if field != "instance_id":
        assert repr(rows[1]["instance_id"]) in message
    assert not (tmp_path / "out").exists()  # every record is checked before anything is written


def test_grader_goes_after_the_last_from_instruction_as_buildkit_parses_it(tmp_path):
    """A FROM continued over two lines, and a heredoc line that reads FROM: the grader follows the
    instruction, not the first line that matches; a Dockerfile BuildKit cannot parse is a one-line
    error naming its line."""
    env = tmp_path / "env"
    env.mkdir()
    (env / "Dockerfile").write_text(
        "FROM python:3.11-slim AS build\nRUN true\nFROM \\\n  python:3.11-slim\n"
        "COPY <<EOF /notes.txt\nFROM here on\nEOF\nWORKDIR /testbed\n"
    )
    row = {**records()[0], "environment_dir": str(env)}
    [task] = convert(write_jsonl(tmp_path / "i.jsonl", [row]), tmp_path / "out")
    text = (task / "environment" / "Dockerfile").read_text()
    head, grader = "FROM python:3.11-slim AS build\nRUN true\nFROM \\\n  python:3.11-slim\n", "# slime-harbor: swebench's grader"
    assert text.startswith(head + grader)
    assert "\nCOPY <<EOF /notes.txt\nFROM here on\nEOF\nWORKDIR /testbed\n# slime-harbor: /testbed's git" in text

    (env / "Dockerfile").write_text("FROM python:3.11-slim\nRUN <<EOF\necho\n")
    with pytest.raises(SystemExit) as e:
        cli_main(["swebench-tasks", "--instances", str(write_jsonl(tmp_path / "j.jsonl", [row])),
                  "--out", str(tmp_path / "out2")])
    message = str(e.value.code)
    assert "\n" not in message and f"{env / 'Dockerfile'}:2: RUN <<EOF; unterminated heredoc" in message


def test_bad_record_from_the_command_line_has_no_traceback(tmp_path):
    rows = [absolute_env(r) for r in records()]
    rows[0]["FAIL_TO_PASS"] = "not json"
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    proc = subprocess.run([sys.executable, "-m", "slime_harbor.cli", "swebench-tasks", "--instances", str(path),
                           "--out", str(tmp_path / "out")], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode != 0
    assert proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "slime-harbor__tinycalc-1" in proc.stderr and "'FAIL_TO_PASS'" in proc.stderr


def test_unreadable_input_and_output_are_one_line_errors(tmp_path):
    binary = tmp_path / "bin.jsonl"
    binary.write_bytes(b"\xff\xfe{}\n")
    blocker = tmp_path / "file"
    blocker.write_text("in the way")
    for instances, out in ((binary, tmp_path / "o"), (tmp_path / "absent.jsonl", tmp_path / "o"),
                           (INSTANCES, blocker / "sub")):
        with pytest.raises(SystemExit) as e:
            cli_main(["swebench-tasks", "--instances", str(instances), "--out", str(out)])
        assert "\n" not in str(e.value.code) and str(e.value.code).startswith("slime-harbor swebench-tasks: error:")


def test_swebench_defaults_for_a_published_instance(tmp_path):
    """No environment_dir, log_parser or eval_script: swebench's own image name and repo parser."""
    from swebench.harness.log_parsers import PARSER_REGISTRY
    from swebench.harness.log_parsers.python import parse_log_requests

    row = {**records()[0], "instance_id": "psf__requests-2317", "repo": "psf/requests", "version": "2.4"}
    for key in ("environment_dir", "log_parser"):
        row.pop(key)
    [task] = convert(write_jsonl(tmp_path / "i.jsonl", [row]), tmp_path / "out")
    dockerfile = (task / "environment" / "Dockerfile").read_text()
    assert dockerfile.startswith("FROM swebench/sweb.eval.x86_64.psf_1776_requests-2317:latest\n")
    inst = json.loads((task / "tests" / "instance.json").read_text())
    assert PARSER_REGISTRY[inst["log_parser"]] is parse_log_requests
    assert inst["eval_type"] == "pass_and_fail"
    assert 'swebench_image = "swebench/sweb.eval.x86_64.psf_1776_requests-2317:latest"' in (task / "task.toml").read_text()

    # A swebench 5 record carries its own eval script: the task runs exactly that (plus swebench's
    # exit-code capture), and the record's parser.
    script = "#!/bin/bash\nset -uxo pipefail\ncd /testbed\n: '>>>>> Start Test Output'\n./tests/runtests.py x\n: '>>>>> End Test Output'\n"
    row.update(instance_id="django__django-1", repo="django/django", eval_script=script, log_parser="django")
    [task] = convert(write_jsonl(tmp_path / "j.jsonl", [row]), tmp_path / "out2")
    eval_sh = (task / "tests" / "eval.sh").read_text()
    assert "./tests/runtests.py x\nSWEBENCH_TEST_EXIT_CODE=$?\n: '>>>>> End Test Output'" in eval_sh
    assert json.loads((task / "tests" / "instance.json").read_text())["log_parser"] == "parse_log_django"


def test_generated_eval_script_resets_test_files_first():
    [tinycalc, _, intervals] = load_instances(INSTANCES)[:3]
    from slime_harbor.tasks.swebench import generated_eval_script

    script = generated_eval_script(tinycalc)
    assert f"git checkout {tinycalc.base_commit} -- tests/test_parse.py || {{ echo '>>>>> Reset Failed'" in script
    assert script.index("git checkout") < script.index("git apply") < script.index("Start Test Output")
    assert "pytest --no-header -rA --tb=no -p no:cacheprovider tests/test_parse.py\n" in script
    assert "rm -rf -- tests/test_merge_order.py" in generated_eval_script(intervals)  # created by test_patch


# ---------------------------------------------------------------- the grader on test logs, no Docker

F2P = ["tests/test_parse.py::test_negative_integer", "tests/test_parse.py::test_surrounding_whitespace"]
P2P = ["tests/test_parse.py::test_integer", "tests/test_parse.py::test_float", "tests/test_parse.py::test_rejects_words"]


def pytest_log(failed: list[str] = (), exit_code: int | None = None, before: str = "") -> str:
    """A log shaped like tests/eval.sh's (set -x trace, pytest -rA summary, exit code line)."""
    lines = [f"{'FAILED' if t in failed else 'PASSED'} {t}" for t in F2P + P2P]
    code = (1 if failed else 0) if exit_code is None else exit_code
    return (f"{before}+ : '>>>>> Start Test Output'\n+ pytest -rA tests/test_parse.py\n" + "\n".join(lines)
            + f"\n+ SWEBENCH_TEST_EXIT_CODE={code}\n+ : '>>>>> End Test Output'\n>>>>> Test Exit Code: {code}\n")


GRADE_CASES = [  # (case, log, reward or None when no reward file may be written)
    ("resolved", pytest_log(), 1),
    ("one FAIL_TO_PASS fails", pytest_log(failed=[F2P[0]]), 0),
    ("a PASS_TO_PASS test fails", pytest_log(failed=[P2P[2]]), 0),
    ("tests ran, nothing parsed", "+ : '>>>>> Start Test Output'\nno tests ran\n+ : '>>>>> End Test Output'\n", 0),
    ("passes printed, exit code 1", pytest_log(exit_code=1), 0),
    # the eval script's own setup, before any tested code runs: outside the policy's reach
    ("test patch did not apply", "error: patch failed\n>>>>> Patch Apply Failed\n", None),
    ("test files not reset", "error: pathspec\n>>>>> Reset Failed\n", None),
    ("no output markers", "bash: /tests/eval.sh: No such file or directory\n", None),
    # printed while the tests ran: the tested code can print anything, so it is scored (issue 15)
    ("timeout marker printed by the tests", "+ : '>>>>> Start Test Output'\n+ pytest\n>>>>> Tests Timed Out\n", 0),
    ("environment fault printed by the tests",
     "+ : '>>>>> Start Test Output'\nCannot allocate memory\n+ : '>>>>> End Test Output'\n", 0),
]


@pytest.mark.parametrize("case,log,expected", GRADE_CASES, ids=[c[0] for c in GRADE_CASES])
def test_grader_reward_from_log(tmp_path, case, log, expected):
    """tests/grade.py's log grading (swebench's get_eval_report): 1 / 0, or no reward for infra failures."""
    from slime_harbor.tasks import swebench_grade

    instance = TASKS_SWE / "slime-harbor__tinycalc-1" / "tests" / "instance.json"
    (tmp_path / "test_output.txt").write_text(log)
    swebench_grade.grade_log(str(instance), str(tmp_path / "test_output.txt"), str(tmp_path / "verifier"))
    reward = tmp_path / "verifier" / "reward.json"
    assert (json.loads(reward.read_text())["reward"] if reward.exists() else None) == expected
    report = json.loads((tmp_path / "verifier" / "report.json").read_text())
    assert (report["slime_harbor_infra_failure"] is None) == (expected is not None)


# ---------------------------------------------------------------- Docker: real Harbor trials


@pytest.fixture(scope="module")
def client():
    return docker_client()


PARSE_PY = '''def parse_number(text):
    """Parse a decimal number written as text."""
{body}'''
# Strips whitespace but still rejects negative integers: one FAIL_TO_PASS test of two passes.
PARTIAL_FIX = PARSE_PY.format(body='''    text = text.strip()
    if "." in text:
        return float(text)
    if text.isdigit():
        return int(text)
    raise ValueError(f"not a number: {text!r}")
''')
# The gold fix, except that words now come back as None instead of raising: test_rejects_words fails.
BREAKS_P2P = PARSE_PY.format(body='''    text = text.strip()
    if "." in text:
        return float(text)
    digits = text[1:] if text.startswith(("+", "-")) else text
    if digits.isdigit():
        return int(text)
    return None
''')


@pytest.fixture(scope="module")
def tinycalc_image(client, tmp_path_factory):
    """The image of the tinycalc-1 task (its environment plus the grader venv), built with the SDK."""
    out = tmp_path_factory.mktemp("tinycalc")
    [task] = convert(write_jsonl(out / "i.jsonl", [absolute_env(records()[0])]), out / "tasks")
    tag = "slime-harbor-test/swebench-grader:latest"
    client.images.build(path=str(task / "environment"), tag=tag, network_mode="host", rm=True, forcerm=True, labels=LABEL,
                        timeout=1800)
    return tag


@pytest.mark.slow
def test_grader_imports_swebench_with_no_network(client, tinycalc_image):
    """The grader venv imports swebench's harness offline; the repo's own Python cannot see it."""
    checks = {
        ("/opt/swebench-grader/bin/python", "-c", "import swebench.harness.grading, swebench.harness.utils"): 0,
        ("python", "-c", "import swebench"): 1,
    }
    for command, expected in checks.items():
        container = client.containers.run(tinycalc_image, list(command), detach=True, network_mode="none",
                                          labels=LABEL)
        try:
            assert container.wait(timeout=120)["StatusCode"] == expected, container.logs().decode()
        finally:
            container.remove(force=True)


@pytest.mark.slow
def test_oracle_resolves_every_bundled_instance_nop_none(client, tmp_path):
    ids = sorted(r["instance_id"] for r in records())
    oracle = rollout(TASKS_SWE, "oracle", tmp_path / "oracle")
    assert sorted(oracle) == ids
    for name, sample in oracle.items():
        files = verifier_files(sample)
        assert sample["metadata"]["raw_rewards"] == {"reward": 1.0}, (name, files.get("test_output.txt", "")[-2000:])
        assert sample["reward"] == 1.0 and sample["status"] == "completed"
        report = json.loads(files["report.json"])
        assert report["resolved"] is True and report["tests_status"]["FAIL_TO_PASS"]["failure"] == []
        assert len(report["tests_status"]["PASS_TO_PASS"]["success"]) >= 2

    nop = rollout(TASKS_SWE, "nop", tmp_path / "nop")
    for name, sample in nop.items():
        files = verifier_files(sample)
        assert sample["metadata"]["raw_rewards"] == {"reward": 0.0}, (name, files.get("test_output.txt", "")[-2000:])
        assert sample["reward"] == -1.0 and sample["status"] == "completed"  # pm1: unresolved is -1
        report = json.loads(files["report.json"])
        assert report["tests_status"]["FAIL_TO_PASS"]["success"] == []
        assert report["tests_status"]["PASS_TO_PASS"]["failure"] == []


@pytest.mark.slow
def test_wrong_fixes_do_not_resolve_timeouts_score_and_infra_failure_is_not_scored(client, tmp_path):
    base = absolute_env(records()[0])
    broken_test_patch = base["test_patch"].replace('         parse_number("forty")', '         parse_number("fifty")')
    assert broken_test_patch != base["test_patch"]
    variants = {
        "partial": {"patch": patch_against_base({"tinycalc/parse.py": PARTIAL_FIX})},
        "breaks-p2p": {"patch": patch_against_base({"tinycalc/parse.py": BREAKS_P2P})},
        "infra": {"test_patch": broken_test_patch},  # the gold fix, but the tests cannot be set up
        # no fix; the FAIL_TO_PASS tests written into the test file as stubs that pass: the verifier
        # resets the file before applying test_patch, so they neither pass nor block the patch
        "tampers-tests": {"patch": patch_against_base({"tests/test_parse.py": (
            TASKS_SWE / base["environment_dir"] / "repo" / "tests" / "test_parse.py").read_text()
            + "\n\ndef test_negative_integer():\n    pass\n\n\ndef test_surrounding_whitespace():\n    pass\n"})},
    }
    rows = [{**base, **change, "instance_id": f"{base['instance_id']}-{name}"} for name, change in variants.items()]
    convert(write_jsonl(tmp_path / "variants.jsonl", rows), tmp_path / "tasks")
    # The gold fix, but the tests hang past their budget (the verifier timeout less the grader's margin)
    hangs = {**base, "instance_id": f"{base['instance_id']}-hangs", "test_cmd": "sleep 600; pytest -rA"}
    convert(write_jsonl(tmp_path / "hangs.jsonl", [hangs]), tmp_path / "tasks",
            SwebenchTaskOptions(verifier_timeout_sec=TEST_TIMEOUT_MARGIN_SEC + 15))
    # Harbor's oracle agent applies each variant's "gold" patch
    got = rollout(tmp_path / "tasks", "oracle", tmp_path / "out", concurrency=len(rows) + 1)
    iid = base["instance_id"]

    partial = got[f"{iid}-partial"]
    assert partial["metadata"]["raw_rewards"] == {"reward": 0.0} and partial["reward"] == -1.0
    f2p = json.loads(verifier_files(partial)["report.json"])["tests_status"]["FAIL_TO_PASS"]
    assert f2p == {"success": ["tests/test_parse.py::test_surrounding_whitespace"],
                   "failure": ["tests/test_parse.py::test_negative_integer"]}

    breaks = got[f"{iid}-breaks-p2p"]
    assert breaks["metadata"]["raw_rewards"] == {"reward": 0.0} and breaks["reward"] == -1.0
    status = json.loads(verifier_files(breaks)["report.json"])["tests_status"]
    assert status["FAIL_TO_PASS"]["failure"] == [] and status["PASS_TO_PASS"]["failure"] == ["tests/test_parse.py::test_rejects_words"]

    tampered = got[f"{iid}-tampers-tests"]
    assert tampered["metadata"]["raw_rewards"] == {"reward": 0.0} and tampered["reward"] == -1.0
    assert json.loads(verifier_files(tampered)["report.json"])["tests_status"]["FAIL_TO_PASS"]["success"] == []

    infra = got[f"{iid}-infra"]
    files = verifier_files(infra)
    assert "reward.json" not in files and ">>>>> Patch Apply Failed" in files["test_output.txt"]
    assert json.loads(files["report.json"])["slime_harbor_infra_failure"] == "Patch Apply Failed"
    # Harbor: RewardFileNotFoundError -> our converter: failed, no reward, removed (never scored -1)
    assert infra["status"] == "failed" and infra["reward"] is None and infra["remove_sample"] is True
    assert infra["metadata"]["exception_type"] == "RewardFileNotFoundError"

    # tests that run past their budget: code under test can hang, so it is scored, not dropped
    hung = got[f"{iid}-hangs"]
    files = verifier_files(hung)
    assert ">>>>> Tests Timed Out" in files["test_output.txt"]
    report = json.loads(files["report.json"])
    assert report["tests_timed_out"] is True and report["slime_harbor_infra_failure"] is None
    assert hung["status"] == "completed" and hung["reward"] == -1.0


@pytest.mark.slow
def test_record_without_environment_dir_builds_from_the_instance_image(client, tinycalc_image, tmp_path):
    """The published-image path: FROM swebench's image name plus the grader. Nothing can be pulled:
    the instance image is a local stand-in under a test namespace, tinycalc-1's task image (its
    grader venv already there, so the task's grader step is satisfied offline and fast)."""
    row = records()[0]
    stand_in = f"slime-harbor-test/sweb.eval.x86_64.{row['instance_id']}:latest".replace("__", "_1776_").lower()
    client.images.get(tinycalc_image).tag(stand_in)
    try:
        published = {k: v for k, v in row.items() if k != "environment_dir"}
        instances = write_jsonl(tmp_path / "published.jsonl", [published])
        cli_main(["swebench-tasks", "--instances", str(instances), "--out", str(tmp_path / "tasks"),
                  "--image-namespace", "slime-harbor-test"])
        task = tmp_path / "tasks" / row["instance_id"]
        assert (task / "environment" / "Dockerfile").read_text().startswith(f"FROM {stand_in}\n")
        assert sorted(p.name for p in (task / "environment").iterdir()) == ["Dockerfile"]
        [sample] = rollout(tmp_path / "tasks", "oracle", tmp_path / "out").values()
        assert sample["metadata"]["raw_rewards"] == {"reward": 1.0}, verifier_files(sample).get("test_output.txt")
    finally:
        client.images.remove(stand_in)  # the tag only: the task image built on it keeps the layers
