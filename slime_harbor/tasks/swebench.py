"""SWE-bench instances as Harbor task dirs, graded offline by swebench's own harness.

`slime-harbor swebench-tasks --instances FILE.jsonl --out DIR` writes DIR/<instance_id>/ per
record of FILE.jsonl (SWE-bench's fields: instance_id, repo, base_commit, problem_statement,
patch, test_patch, FAIL_TO_PASS, PASS_TO_PASS, version; the two lists may be JSON strings, as in
the published datasets):

    task.toml              [environment] workdir /testbed, no network; [metadata] the instance
    instruction.md         the problem statement
    environment/Dockerfile the instance image plus swebench's grader in its own venv
    solution/solve.sh      applies the gold patch in /testbed (Harbor's oracle agent)
    tests/test.sh          runs tests/eval.sh, then grades its log with tests/grade.py
    tests/eval.sh          swebench's eval script: reset the files test_patch touches to
                           base_commit, apply test_patch, run the tests between swebench's markers
    tests/instance.json    the swebench instance row the grader reads (make_test_spec)
    tests/grade.py         swebench_grade.py: swebench's get_eval_report -> reward.txt 1/0 or, on an
                           infrastructure failure, no reward file (Harbor fails the trial)

Optional record fields, each defaulting to what swebench itself would use:
    environment_dir  a folder (relative to the JSONL) whose Dockerfile builds the repo at /testbed
                     at base_commit; default: FROM swebench's published image for the instance
    image            the instance image to build FROM when there is no environment_dir
                     (default: swebench's naming, namespace "swebench")
    eval_script      swebench 5 datasets carry the eval script: used as is when present
    test_cmd         the test command, run with the test files of test_patch appended
                     (default: pytest -rA, as swebench runs pytest repos)
    log_parser       a swebench log parser ("pytest" or "parse_log_pytest"; default: swebench's
                     parser for known repos, pytest otherwise)
    eval_type        pass_and_fail | fail_only (default: swebench's FAIL_ONLY_REPOS)

swebench 5.0.2 no longer ships per-repo test specs (MAP_REPO_VERSION_TO_SPECS): its datasets
carry `eval_script`, `image` and `log_parser` per instance instead, and those fields are honoured.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

from slime_harbor.environments.dockerfile import DockerfileError, last_from_end

GRADER_VENV = "/opt/swebench-grader"
"""Where the task image holds swebench's grader venv, apart from the repo's own environment."""
GRADER_REQUIREMENT = "swebench==5.0.2"
"""The grader's swebench: the version this converter was written against (read its grading.py)."""
DEFAULT_TEST_CMD = "pytest --no-header -rA --tb=no -p no:cacheprovider"
"""swebench's pytest command for Python repos; -rA prints the per-test lines its parsers read."""
HEREDOC = "EOF_114329324912"
"""swebench's heredoc delimiter for patches inside eval scripts."""
REQUIRED_FIELDS = ("instance_id", "repo", "base_commit", "problem_statement", "patch", "test_patch",
                   "FAIL_TO_PASS", "PASS_TO_PASS", "version")
GRADE_SCRIPT = Path(__file__).with_name("swebench_grade.py")
GUARD_SCRIPT = Path(__file__).with_name("swebench_guard.py")
PRISTINE_DIR = "/opt/slime-harbor"
"""Where the task image keeps the pristine /testbed (a tar) that the separate verifier grades in."""


class InstanceError(ValueError):
    """A record that cannot become a task; the message is one line naming instance and field."""


@dataclass
class SwebenchTaskOptions:
    """How instances become tasks. Defaults suit real SWE-bench instances."""

    image_namespace: str = "swebench"
    """Registry namespace of the published instance images (swebench's default)."""
    agent_timeout_sec: float = 3000.0
    """Harbor's [agent] timeout_sec."""
    verifier_timeout_sec: float = 1800.0
    """Harbor's [verifier] timeout_sec; the tests get this less TEST_TIMEOUT_MARGIN_SEC, then count
    as timed out (swebench's timeout marker: an infrastructure failure, no reward)."""
    build_timeout_sec: float = 1800.0
    """Harbor's [environment] build_timeout_sec: the first build installs the grader from PyPI."""


TEST_TIMEOUT_MARGIN_SEC = 120
"""Left for the grader after the tests, so Harbor's verifier timeout never cuts the grading."""


@dataclass
class Instance:
    """One validated SWE-bench record, lists decoded, optional fields resolved."""

    instance_id: str
    repo: str
    base_commit: str
    problem_statement: str
    patch: str
    test_patch: str
    fail_to_pass: list[str]
    pass_to_pass: list[str]
    version: str
    image: str
    log_parser: str
    eval_type: str
    eval_script: str | None
    test_cmd: str
    environment_dir: Path | None


# ---------------------------------------------------------------- reading records


def load_instances(path: Path, options: SwebenchTaskOptions | None = None) -> list[Instance]:
    """Every record of a JSONL file, validated; InstanceError (one line) on the first bad one."""
    options = options or SwebenchTaskOptions()
    path = Path(path)
    if not path.is_file():
        raise InstanceError(f"{path}: no such file")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise InstanceError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    instances, seen = [], set()
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise InstanceError(f"{where}: not a JSON object ({e.msg})") from None
        if not isinstance(record, dict):
            raise InstanceError(f"{where}: not a JSON object")
        inst = parse_record(record, base_dir=path.parent, where=where, options=options)
        if inst.instance_id in seen:
            raise InstanceError(f"{where}: instance {inst.instance_id!r}: field 'instance_id': duplicate")
        seen.add(inst.instance_id)
        instances.append(inst)
    if not instances:
        raise InstanceError(f"{path}: no instance records")
    return instances


def parse_record(record: dict, base_dir: Path, where: str, options: SwebenchTaskOptions) -> Instance:
    iid = record.get("instance_id")
    name = f"instance {iid!r}" if isinstance(iid, str) and iid else "instance ?"

    def bad(field: str, problem: str) -> InstanceError:
        return InstanceError(f"{where}: {name}: field {field!r}: {problem}")

    for field in REQUIRED_FIELDS:
        if field not in record or record[field] is None:
            raise bad(field, "missing")
    text = {}
    for field in ("instance_id", "repo", "base_commit", "problem_statement", "patch", "test_patch"):
        if not isinstance(record[field], str) or not record[field].strip():
            raise bad(field, "must be a non-empty string")
        text[field] = record[field]
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", iid):
        raise bad("instance_id", "must be a plain name (letters, digits, . _ -): it names the task dir")
    if not re.fullmatch(r"[0-9a-f]{7,40}", text["base_commit"]):
        raise bad("base_commit", "must be a git commit hash")
    version = record["version"]
    if not isinstance(version, (str, int, float)) or isinstance(version, bool):
        raise bad("version", "must be a string")
    for field in ("patch", "test_patch"):
        if not patch_files(text[field]):
            raise bad(field, "no 'diff --git' file header: not a git diff")
        if HEREDOC in text[field]:
            raise bad(field, f"contains the heredoc delimiter {HEREDOC}")
    lists = {}
    for field in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        value = record[field]
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                raise bad(field, "a string that is not a JSON list") from None
        if not isinstance(value, list) or not all(isinstance(t, str) and t for t in value):
            raise bad(field, "must be a list of test names (or a JSON string of one)")
        lists[field] = value
    if not lists["FAIL_TO_PASS"]:
        raise bad("FAIL_TO_PASS", "empty: nothing would tell a fix from no change")

    optional = {}
    for field in ("environment_dir", "image", "eval_script", "test_cmd", "log_parser", "eval_type"):
        value = record.get(field)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise bad(field, "must be a non-empty string when given")
        optional[field] = value
    env_dir = None
    if optional["environment_dir"]:
        env_dir = (base_dir / optional["environment_dir"]).resolve()
        if not (env_dir / "Dockerfile").is_file():
            raise bad("environment_dir", f"{env_dir} has no Dockerfile")
        try:
            has_from = last_from_end(env_dir / "Dockerfile") is not None
        except DockerfileError as e:
            raise bad("environment_dir", "; ".join(line.strip() for line in str(e).splitlines())) from None
        if not has_from:
            raise bad("environment_dir", f"{env_dir}/Dockerfile has no FROM line")
    if optional["eval_script"] and not all(m in optional["eval_script"] for m in eval_markers()):
        raise bad("eval_script", "lacks swebench's start/end test output markers")
    try:
        log_parser = resolve_log_parser(text["repo"], optional["log_parser"])
    except KeyError as e:
        raise bad("log_parser", str(e.args[0])) from None
    eval_type = optional["eval_type"] or default_eval_type(text["repo"])
    if eval_type not in ("pass_and_fail", "fail_only"):
        raise bad("eval_type", "must be pass_and_fail or fail_only")
    return Instance(
        instance_id=iid, repo=text["repo"], base_commit=text["base_commit"],
        problem_statement=text["problem_statement"], patch=text["patch"], test_patch=text["test_patch"],
        fail_to_pass=lists["FAIL_TO_PASS"], pass_to_pass=lists["PASS_TO_PASS"], version=str(version),
        # An instance built from its own environment_dir has no published image to name.
        image=optional["image"] or ("" if env_dir else instance_image(iid, options.image_namespace)),
        log_parser=log_parser, eval_type=eval_type, eval_script=optional["eval_script"],
        test_cmd=optional["test_cmd"] or DEFAULT_TEST_CMD, environment_dir=env_dir,
    )


# ---------------------------------------------------------------- swebench's own names and defaults


def instance_image(instance_id: str, namespace: str) -> str:
    """swebench's name for an instance's published image (ImageSpec.name)."""
    from swebench.image_builder.image_spec import ImageSpec

    return ImageSpec(instance_id=instance_id, dockerfile="-", namespace=namespace).name


def repo_parsers() -> dict:
    """swebench's per-language MAP_REPO_TO_PARSER_* tables, merged: repo -> parser function."""
    from swebench.harness.log_parsers import c, go, java, javascript, php, python, ruby, rust

    merged = {}
    for module, table in ((python, "PY"), (javascript, "JS"), (c, "C"), (go, "GO"), (java, "JAVA"),
                          (php, "PHP"), (ruby, "RUBY"), (rust, "RUST")):
        merged.update(getattr(module, f"MAP_REPO_TO_PARSER_{table}", {}))
    return merged


def resolve_log_parser(repo: str, name: str | None) -> str:
    """The PARSER_REGISTRY key to grade with: the record's, else swebench's for the repo, else pytest."""
    from swebench.harness.log_parsers import PARSER_REGISTRY

    if name:
        key = name if name.startswith("parse_log_") else f"parse_log_{name}"
        if key not in PARSER_REGISTRY:
            raise KeyError(f"{name!r} is not a swebench log parser (e.g. pytest, django, sympy, jest)")
        return key
    parser = repo_parsers().get(repo)
    if parser is None:
        return "parse_log_pytest"
    # Aliases share one function: the first registry key for it names it.
    return next(key for key, fn in PARSER_REGISTRY.items() if fn is parser)


def default_eval_type(repo: str) -> str:
    from swebench.harness.constants import FAIL_ONLY_REPOS, EvalType

    return (EvalType.FAIL_ONLY if repo in FAIL_ONLY_REPOS else EvalType.PASS_AND_FAIL).value


def eval_markers() -> tuple[str, str]:
    from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT

    return START_TEST_OUTPUT, END_TEST_OUTPUT


# ---------------------------------------------------------------- patches and scripts


def patch_files(patch: str) -> list[tuple[str, bool]]:
    """(path, is_new) for every file a git diff touches, in order."""
    files = []
    for block in re.split(r"^(?=diff --git )", patch, flags=re.M):
        m = re.match(r"diff --git a/(\S+) b/(\S+)", block)
        if m:
            is_new = bool(re.search(r"^(new file mode|--- /dev/null)", block, flags=re.M))
            files.append((m.group(2), is_new))
    return files


def heredoc_body(patch: str) -> str:
    """The patch as a heredoc body: the heredoc itself ends the last line."""
    return patch[:-1] if patch.endswith("\n") else patch


def test_directives(test_patch: str) -> list[str]:
    """The test files test_patch touches, as swebench picks them (non-test extensions left out)."""
    from swebench.harness.constants import NON_TEST_EXTS

    return [path for path, _ in patch_files(test_patch) if not any(path.endswith(e) for e in NON_TEST_EXTS)]


def generated_eval_script(inst: Instance) -> str:
    """An eval script in swebench's shape for an instance that carries none.

    The files test_patch touches are reset to base_commit (or removed, where test_patch creates
    them) so the tests are a clean copy whatever the agent did to them; a reset or apply failure
    prints swebench's marker and stops, which the grader reads as an infrastructure failure.
    """
    from swebench.harness.constants import APPLY_PATCH_FAIL, END_TEST_OUTPUT, RESET_FAILED, START_TEST_OUTPUT

    files = patch_files(inst.test_patch)
    existing = " ".join(shlex.quote(p) for p, new in files if not new)
    created = " ".join(shlex.quote(p) for p, new in files if new)
    base = shlex.quote(inst.base_commit)
    lines = [
        "cd /testbed",
        # swebench's images keep the repo's environment in conda: activate it where it exists
        "if [ -f /opt/miniconda3/bin/activate ]; then source /opt/miniconda3/bin/activate; conda activate testbed; fi",
    ]
    if existing:
        lines.append(f"git checkout {base} -- {existing} || {{ echo '{RESET_FAILED}'; exit 1; }}")
    if created:
        lines.append(f"rm -rf -- {created}")
    lines += [
        f"git apply -v - <<'{HEREDOC}' || {{ echo '{APPLY_PATCH_FAIL}'; exit 1; }}",
        heredoc_body(inst.test_patch),
        HEREDOC,
        f": '{START_TEST_OUTPUT}'",
        " ".join([inst.test_cmd, *(shlex.quote(d) for d in test_directives(inst.test_patch))]),
        f": '{END_TEST_OUTPUT}'",
    ]
    if existing:
        lines.append(f"git checkout {base} -- {existing}")
    return "\n".join(["#!/bin/bash", "set -uxo pipefail", *lines]) + "\n"


def instance_row(inst: Instance) -> dict:
    """The swebench instance row the grader builds its TestSpec from (make_test_spec's keys)."""
    return {
        "instance_id": inst.instance_id,
        "repo": inst.repo,
        "version": inst.version,
        "base_commit": inst.base_commit,
        "image": inst.image,
        "FAIL_TO_PASS": inst.fail_to_pass,
        "PASS_TO_PASS": inst.pass_to_pass,
        "log_parser": inst.log_parser,
        "eval_type": inst.eval_type,
        "eval_script": inst.eval_script or generated_eval_script(inst),
        # the grader expects its pytest plugin's reports when it wrote the pytest command itself
        "slime_harbor_guarded": inst.eval_script is None and "pytest" in inst.test_cmd.split()[:3],
        "slime_harbor_test_files": [path for path, _ in patch_files(inst.test_patch)],
    }


def eval_script(row: dict) -> str:
    """The script the tests run: swebench's TestSpec.eval_script, which records the test exit code."""
    from swebench.harness.utils import make_test_spec

    return make_test_spec(row).eval_script


def grader_block(options: SwebenchTaskOptions) -> str:
    # One identical RUN right after FROM: every task on one base image shares the cached layer.
    return (
        "# slime-harbor: swebench's grader in its own venv, installed while the image is built (with\n"
        "# the network), so grading needs none; the repo's own Python environment is left alone.\n"
        "RUN PY=python3; if [ -x /opt/miniconda3/bin/python3 ]; then PY=/opt/miniconda3/bin/python3; fi \\\n"
        f'    && "$PY" -m venv {GRADER_VENV} \\\n'
        f"    && {GRADER_VENV}/bin/pip install --no-cache-dir {GRADER_REQUIREMENT} \\\n"
        f'    && {GRADER_VENV}/bin/python -c "import swebench.harness.grading"\n'
    )


def seal_block(inst: Instance) -> str:
    """The Dockerfile's last step: git keeps base_commit and its ancestors only, and the tree is
    packed for the separate verifier (which grades in a pristine copy of it)."""
    base = inst.base_commit
    return (
        "# slime-harbor: /testbed's git keeps base_commit and nothing after it (a fresh repo that\n"
        "# fetched base_commit alone: no other branches, tags, stash, reflog, remotes, replace refs,\n"
        "# notes or unreachable objects); the tree is packed for the separate verifier to grade in.\n"
        f"RUN set -e; cd /testbed; base=$(git rev-parse --verify {base}^{{commit}}) \\\n"
        "    && git update-ref refs/slime-harbor-base \"$base\" && mv .git /tmp/history.git \\\n"
        "    && git -c init.defaultBranch=base init -q \\\n"
        "    && git fetch -q --no-tags /tmp/history.git refs/slime-harbor-base:refs/slime-harbor-base \\\n"
        "    && git update-ref --no-deref HEAD \"$base\" && git update-ref -d refs/slime-harbor-base \\\n"
        "    && git reset -q \"$base\" && rm -rf /tmp/history.git .git/logs .git/FETCH_HEAD \\\n"
        "    && git -c gc.reflogExpire=now -c gc.pruneExpire=now gc -q --prune=now \\\n"
        f"    && mkdir -p {PRISTINE_DIR} && tar -C /testbed -cf {PRISTINE_DIR}/testbed.tar .\n"
    )


def dockerfile(inst: Instance, options: SwebenchTaskOptions) -> str:
    """The task's Dockerfile: the instance's own (or swebench's image), the grader after its FROM."""
    if inst.environment_dir is None:
        return f"FROM {inst.image}\n{grader_block(options)}{seal_block(inst)}"
    # environment_dir wins over image: its Dockerfile builds the repo
    path = inst.environment_dir / "Dockerfile"
    lines = path.read_text().split("\n")  # the parser's lines
    at = last_from_end(path)
    rest = "\n".join(lines[at:])
    rest = rest if not rest or rest.endswith("\n") else rest + "\n"
    return "\n".join(lines[:at]) + "\n" + grader_block(options) + rest + seal_block(inst)


def test_sh(inst: Instance, options: SwebenchTaskOptions) -> str:
    budget = max(10, int(options.verifier_timeout_sec) - TEST_TIMEOUT_MARGIN_SEC)
    return f"""#!/bin/bash
# {inst.instance_id}, generated by `slime-harbor swebench-tasks`. Runs in the separate verifier
# container (a fresh one of the task image). tests/grade.py, in the grader venv, as root: puts the
# agent's /testbed aside, unpacks the pristine one, applies the agent's patch against base_commit
# (test configuration dropped), runs tests/eval.sh (reset the test files, apply the test patch,
# run the tests) as an unprivileged user for at most {budget} s, and grades the log with swebench's
# harness: reward.json 1 resolved / 0 not or tampered; none on an infrastructure failure.
exec {GRADER_VENV}/bin/python /tests/grade.py /tests/instance.json /logs/verifier {budget}
"""


def solve_sh(inst: Instance) -> str:
    return f"""#!/bin/bash
# The gold patch of {inst.instance_id}, applied to the repo at /testbed.
set -euo pipefail
cd /testbed
git apply -v - <<'{HEREDOC}'
{heredoc_body(inst.patch)}
{HEREDOC}
"""


def toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def task_toml(inst: Instance, options: SwebenchTaskOptions) -> str:
    metadata = {
        "category": "swe-bench",
        "source": "slime-harbor swebench-tasks",
        "swebench_instance_id": inst.instance_id,
        "swebench_repo": inst.repo,
        "swebench_version": inst.version,
        "swebench_base_commit": inst.base_commit,
        "swebench_image": inst.image,
    }
    meta = "".join(f"{k} = {toml_str(v)}\n" for k, v in metadata.items() if v)
    # The answer is the agent's /testbed (its .git left out: the grader never reads it), collected
    # by the sandbox's file transfer (our Docker environment filters the Engine API's archive on
    # the host; no command runs in the agent's container) and graded in a separate container.
    return f"""schema_version = "1.4"
artifacts = [{{ source = "/testbed", exclude = [".git"] }}]

[metadata]
{meta}
[verifier]
timeout_sec = {float(options.verifier_timeout_sec)}
environment_mode = "separate"

[agent]
timeout_sec = {float(options.agent_timeout_sec)}

[environment]
workdir = "/testbed"
build_timeout_sec = {float(options.build_timeout_sec)}
network_mode = "no-network"
"""


def instruction_md(inst: Instance) -> str:
    return (inst.problem_statement.rstrip("\n") + "\n\n---\n\n"
            "The repository is checked out at `/testbed` (git, at the commit the issue was reported "
            "against). Change its source so that the issue above is resolved.\n")


# ---------------------------------------------------------------- writing task dirs


def write_task(inst: Instance, out_dir: Path, options: SwebenchTaskOptions) -> Path:
    """Write (or replace) out_dir/<instance_id>/; returns it."""
    task = Path(out_dir) / inst.instance_id
    if task.exists():
        shutil.rmtree(task)
    env = task / "environment"
    if inst.environment_dir is not None:
        shutil.copytree(inst.environment_dir, env, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    env.mkdir(parents=True, exist_ok=True)
    (env / "Dockerfile").write_text(dockerfile(inst, options))
    row = instance_row(inst)
    files = {
        "task.toml": task_toml(inst, options),
        "instruction.md": instruction_md(inst),
        "solution/solve.sh": solve_sh(inst),
        "tests/test.sh": test_sh(inst, options),
        "tests/eval.sh": eval_script(row),
        "tests/instance.json": json.dumps(row, indent=2) + "\n",
        "tests/grade.py": GRADE_SCRIPT.read_text(),
        "tests/guard/slime_harbor_guard.py": GUARD_SCRIPT.read_text(),
    }
    for rel, content in files.items():
        path = task / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        if rel.endswith(".sh"):
            path.chmod(0o755)
    return task


def convert(instances_path: Path, out_dir: Path, options: SwebenchTaskOptions | None = None) -> list[Path]:
    """Every record of instances_path as a Harbor task dir under out_dir (all validated first)."""
    options = options or SwebenchTaskOptions()
    instances = load_instances(instances_path, options)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    return [write_task(inst, out_dir, options) for inst in instances]
