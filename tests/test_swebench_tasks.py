"""SWE-bench instances as Harbor tasks (slime_harbor/tasks/swebench.py, `slime-harbor swebench-tasks`).

Fast tests: the committed examples/harbor/tasks-swe/ dirs regenerate byte for byte, record
validation, swebench's own defaults. Docker tests (slow; skipped when no dockerd answers or
SLIME_HARBOR_NO_DOCKER is set): the task images build (cached after the first build, which pip
installs swebench into the grader venv), and the verifier grades with swebench's harness inside a
container with no network: the gold patch resolves every bundled instance (reward 1), no change
resolves none (0), a partial fix and a fix that breaks a PASS_TO_PASS test do not resolve (0), and a
test patch that cannot apply writes no reward at all.
"""

from __future__ import annotations

import filecmp
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest

from slime_harbor.cli import main as cli_main
from slime_harbor.tasks.swebench import convert, load_instances

ROOT = Path(__file__).resolve().parent.parent
TASKS_SWE = ROOT / "examples" / "harbor" / "tasks-swe"
INSTANCES = TASKS_SWE / "instances.jsonl"
LABEL = {"slime-harbor.test": "swebench"}
GIT_ENV = {  # the bundled Dockerfiles commit /testbed with these: base_commit must match
    "GIT_AUTHOR_NAME": "slime-harbor", "GIT_AUTHOR_EMAIL": "tasks@slime-harbor.invalid",
    "GIT_AUTHOR_DATE": "2024-01-01T00:00:00+0000", "GIT_COMMITTER_NAME": "slime-harbor",
    "GIT_COMMITTER_EMAIL": "tasks@slime-harbor.invalid", "GIT_COMMITTER_DATE": "2024-01-01T00:00:00+0000",
}


def records() -> list[dict]:
    return [json.loads(line) for line in INSTANCES.read_text().splitlines() if line.strip()]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def absolute_env(row: dict) -> dict:
    """A bundled record usable from another directory (environment_dir made absolute)."""
    return {**row, "environment_dir": str(TASKS_SWE / row["environment_dir"])}


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


# ---------------------------------------------------------------- Docker: real images, swebench grading


def docker_client():
    if os.environ.get("SLIME_HARBOR_NO_DOCKER"):
        pytest.skip("SLIME_HARBOR_NO_DOCKER is set")
    try:
        import docker

        client = docker.from_env(timeout=30)
        client.ping()
    except Exception as e:  # no SDK, no socket, no daemon
        pytest.skip(f"no Docker daemon answers ({type(e).__name__}: {e})")
    return client


def build_task_image(client, task: Path) -> str:
    """Build the task's environment/ (host network for pip/apt; layers cached across runs)."""
    tag = f"slime-harbor-test/{task.name.lower()}:swebench"
    client.images.build(path=str(task / "environment"), tag=tag, network_mode="host", rm=True, labels=LABEL,
                        timeout=1800)
    return tag


def tar_dir(src: Path, arcname: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(str(src), arcname=arcname)
    return buf.getvalue()


def run_verifier(client, task: Path, agent: str) -> tuple[str | None, dict | None, str]:
    """What Harbor's oracle / nop agent and its verifier do, in a container with no network.

    Returns (reward.txt contents or None, report.json or None, test_output.txt).
    """
    image = build_task_image(client, task)
    container = client.containers.run(image, ["sleep", "infinity"], detach=True, network_mode="none",
                                      labels=LABEL, working_dir="/testbed")
    try:
        container.put_archive("/", tar_dir(task / "tests", "tests"))
        if agent == "oracle":
            container.put_archive("/", tar_dir(task / "solution", "solution"))
            rc, out = container.exec_run(["bash", "/solution/solve.sh"])
            assert rc == 0, out.decode()
        rc, out = container.exec_run(["bash", "/tests/test.sh"])

        def read(path):
            rc, data = container.exec_run(["cat", path])
            return data.decode() if rc == 0 else None

        report = read("/logs/verifier/report.json")
        return read("/logs/verifier/reward.txt"), json.loads(report) if report else None, read(
            "/logs/verifier/test_output.txt") or out.decode()
    finally:
        container.remove(force=True)


@pytest.fixture(scope="module")
def client():
    return docker_client()


@pytest.fixture(scope="module")
def bundled_tasks(tmp_path_factory):
    return convert(INSTANCES, tmp_path_factory.mktemp("tasks-swe"))


def variant(tmp_path: Path, suffix: str, **changes) -> Path:
    """tinycalc-1 with some fields replaced, converted into its own task dir."""
    row = {**absolute_env(records()[0]), **changes}
    row["instance_id"] = f"{row['instance_id']}-{suffix}"
    [task] = convert(write_jsonl(tmp_path / f"{suffix}.jsonl", [row]), tmp_path / "tasks")
    return task


def patch_against_base(new_files: dict[str, str]) -> str:
    """A git diff of the tinycalc-1 base repo with some files replaced."""
    with tempfile.TemporaryDirectory() as d:
        repo = Path(d) / "repo"
        subprocess.run(["cp", "-r", str(TASKS_SWE / records()[0]["environment_dir"] / "repo"), str(repo)], check=True)
        env = {**os.environ, **GIT_ENV}
        for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "base"]):
            subprocess.run(["git", *args], cwd=repo, env=env, check=True)
        for rel, text in new_files.items():
            (repo / rel).write_text(text)
        return subprocess.run(["git", "diff"], cwd=repo, capture_output=True, text=True, check=True).stdout


PARSE_PY = '''def parse_number(text):
    """Parse a decimal number written as text."""
{body}'''


@pytest.mark.slow
def test_grader_imports_swebench_with_no_network(client, bundled_tasks):
    image = build_task_image(client, bundled_tasks[0])
    out = client.containers.run(image, ["/opt/swebench-grader/bin/python", "-c",
                                        "import swebench, swebench.harness.grading, swebench.harness.utils; "
                                        "print(swebench.__version__)"],
                                network_mode="none", labels=LABEL, remove=True)
    assert out.decode().strip() == "5.0.2"
    # ...and the repo's own Python does not see it
    container = client.containers.run(image, ["python", "-c", "import swebench"], detach=True,
                                      network_mode="none", labels=LABEL)
    try:
        assert container.wait(timeout=60)["StatusCode"] != 0
    finally:
        container.remove(force=True)


@pytest.mark.slow
def test_oracle_resolves_every_bundled_instance(client, bundled_tasks):
    for task in bundled_tasks:
        reward, report, log = run_verifier(client, task, "oracle")
        assert reward == "1\n", f"{task.name}: {report}\n{log[-2000:]}"
        assert report["resolved"] is True
        status = report["tests_status"]
        assert status["FAIL_TO_PASS"]["failure"] == [] and status["PASS_TO_PASS"]["failure"] == []
        assert len(status["FAIL_TO_PASS"]["success"]) >= 2 and len(status["PASS_TO_PASS"]["success"]) >= 2


@pytest.mark.slow
def test_nop_resolves_no_bundled_instance(client, bundled_tasks):
    for task in bundled_tasks:
        reward, report, log = run_verifier(client, task, "nop")
        assert reward == "0\n", f"{task.name}: {report}\n{log[-2000:]}"
        assert report["resolved"] is False and report["tests_status"]["FAIL_TO_PASS"]["success"] == []
        assert report["tests_status"]["PASS_TO_PASS"]["failure"] == []


@pytest.mark.slow
def test_partial_fix_does_not_resolve(client, tmp_path):
    # Strips whitespace but still rejects negative integers: one FAIL_TO_PASS test of two passes.
    partial = PARSE_PY.format(body='''    text = text.strip()
    if "." in text:
        return float(text)
    if text.isdigit():
        return int(text)
    raise ValueError(f"not a number: {text!r}")
''')
    task = variant(tmp_path, "partial", patch=patch_against_base({"tinycalc/parse.py": partial}))
    reward, report, log = run_verifier(client, task, "oracle")
    assert reward == "0\n", log[-2000:]
    f2p = report["tests_status"]["FAIL_TO_PASS"]
    assert f2p["success"] == ["tests/test_parse.py::test_surrounding_whitespace"]
    assert f2p["failure"] == ["tests/test_parse.py::test_negative_integer"]


@pytest.mark.slow
def test_fix_that_breaks_a_pass_to_pass_test_does_not_resolve(client, tmp_path):
    # Parses everything as float: every FAIL_TO_PASS value compares equal, but "42" is no longer an int.
    breaking = PARSE_PY.format(body='''    return float(text.strip())
''')
    task = variant(tmp_path, "breaks-p2p", patch=patch_against_base({"tinycalc/parse.py": breaking}))
    reward, report, log = run_verifier(client, task, "oracle")
    assert reward == "0\n", log[-2000:]
    status = report["tests_status"]
    assert "tests/test_parse.py::test_integer" in status["PASS_TO_PASS"]["failure"]


@pytest.mark.slow
def test_test_patch_that_cannot_apply_writes_no_reward(client, tmp_path):
    row = records()[0]
    broken = row["test_patch"].replace('         parse_number("forty")', '         parse_number("fifty")')
    assert broken != row["test_patch"]
    task = variant(tmp_path, "infra", test_patch=broken)
    reward, report, log = run_verifier(client, task, "oracle")
    assert reward is None, log[-2000:]
    assert ">>>>> Patch Apply Failed" in log
    assert report["slime_harbor_infra_failure"] == "Patch Apply Failed" and report["resolved"] is False
