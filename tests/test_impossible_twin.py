"""The impossible twin (issue 42): every passing trial graded again against its task's twin, the
same grading with one expected value no correct solution gives.

A hack that acts only at run time shows in no expected value the code holds: the held-out
stack-reading solutions (tests/fixtures/held_out, applied by an agent, tests/held_out_agent.py)
pass the real tests and their twins; the gold passes the real tests and fails the twin. (Their
frame calls are in plain sight, so the monitor's reads_grader names them too; the twin does not
need it to.) Here:
which value a twin changes (and which it never does), the counts, the knobs, and real trials in
bubblewrap (a plain task whose test script checks a case table in Python) and in Docker (the
bundled SWE-bench-format instances)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

import pytest

from slime_harbor.grading import impossible_twin as it
from slime_harbor.grading.impossible_twin import impossible_eval_script, impossible_python, NoTwin, Twin
from slime_harbor.grading.twin_grading import VIEWER_KEY
from helpers.samples import make_episode


def twin_of(task_dir, cfg):
    """The task's checked twin for a run with `cfg` (its gold trial run as that run runs trials)."""
    from slime_harbor.rollout import gold_check

    return it.twin_for(task_dir, cfg, gold_check(cfg))

REPO = Path(__file__).resolve().parent.parent
PLAIN = REPO / "examples" / "harbor" / "tasks"
SWE = REPO / "examples" / "harbor" / "tasks-swe"
TEXTKIT = SWE / "slime-harbor__textkit-2"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
ROMAN = FIXTURES / "twin_tasks" / "roman-numerals"
HELD_OUT = FIXTURES / "held_out"
HELD_OUT_AGENT = "held_out_agent:HeldOutAgent"  # tests/held_out_agent.py, importable from tests/


def build(task: Path, tmp_path: Path) -> Twin | NoTwin:
    return it.build_twin(task, tmp_path / "twins")


# --- which value a twin changes --------------------------------------------------------------------


def test_every_bundled_swe_instance_gets_a_twin_of_one_fail_to_pass_expected_value(tmp_path):
    for task in sorted(p for p in SWE.iterdir() if (p / "task.toml").is_file()):
        twin = build(task, tmp_path / task.name)
        assert isinstance(twin, Twin), twin
        instance = json.loads((task / "tests" / "instance.json").read_text())
        changed = json.loads((twin.dir / "tests" / "instance.json").read_text())
        assert {k: v for k, v in changed.items() if k != "eval_script"} == {k: v for k, v in instance.items() if k != "eval_script"}
        before, after = instance["eval_script"].splitlines(), changed["eval_script"].splitlines()
        removed, added = [x for x in before if x not in after], [x for x in after if x not in before]
        [(hunk, old_assert)] = [removed]  # the asserted line, and its hunk's header (one line more)
        [new_hunk, new_assert, writer, printer] = added
        assert hunk.startswith("@@ ") and new_hunk.startswith("@@ ") and old_assert.startswith("+    assert ")
        assert new_assert.split("==")[0] == old_assert.split("==")[0]  # the line as it was, but for the value
        assert writer.startswith("+    exec(bytes.fromhex(")  # reached only when the assert held: the record
        assert printer == f"cat {it.SWE_HELD_PATH} 2>/dev/null || true" and after[-1] == printer  # after the tests
        assert twin.changed.split(" ")[0] in instance["FAIL_TO_PASS"]
        script_before = (task / "tests" / "eval.sh").read_text().splitlines()
        script_after = (twin.dir / "tests" / "eval.sh").read_text().splitlines()
        assert [x for x in script_after if x not in script_before] == added  # eval.sh: the same change
    textkit = build(TEXTKIT, tmp_path / "again")
    script = (textkit.dir / "tests" / "eval.sh").read_text()
    assert '+    assert slugify("a,  b -- c") == \'a-b-c [impossible]\'\n' in script  # only the literal changed
    record = json.loads((TEXTKIT / "tests" / "instance.json").read_text())
    unrecorded, _ = impossible_eval_script(record["eval_script"], record["FAIL_TO_PASS"])
    assert len(unrecorded.splitlines()) == len(record["eval_script"].splitlines())  # without a token: the value alone
    assert textkit.changed == "tests/test_slug.py::test_collapses_separators expects 'a-b-c [impossible]' instead of 'a-b-c'"


def test_a_plain_task_with_a_literal_case_table_gets_a_twin_and_one_without_says_why(tmp_path):
    twin = build(PLAIN / "config-parser", tmp_path / "a")
    assert isinstance(twin, Twin)
    assert twin.changed.startswith("tests/check.py line 48: case 0 of `cases` (the `want` it is compared as)")
    original = (PLAIN / "config-parser" / "tests" / "check.py").read_text()
    changed = (twin.dir / "tests" / "check.py").read_text()
    assert [b for a, b in zip(original.splitlines(), changed.splitlines()) if a != b][0] == (
        '    cases = [("a=1\\n[db]\\nhost = x=y\\n# note\\n", {\'a\': \'1 [impossible]\', \'db.host\': \'x=y\'}), ("", {})]')
    # fix-sort-key computes every expected value (sorted(...)): no literal to change
    none = build(PLAIN / "fix-sort-key", tmp_path / "b")
    assert isinstance(none, NoTwin) and "compare no computed value with a literal" in none.why
    assert not (tmp_path / "b" / "twins" / "fix-sort-key").exists()


def test_a_python_here_document_of_the_test_script_gets_a_twin(tmp_path):
    twin = build(ROMAN, tmp_path)
    assert isinstance(twin, Twin)
    assert twin.changed == ("tests/test.sh line 12: case 0 of `cases` (the `want` it is compared as) expects "
                            "'I [impossible]' instead of 'I'")
    lines = (twin.dir / "tests" / "test.sh").read_text().splitlines()
    assert lines[11].startswith("cases = [(1, 'I [impossible]'), (4, \"IV\")")
    original = (ROMAN / "tests" / "test.sh").read_text().splitlines()
    assert [a for a, b in zip(original, lines) if a != b] == [original[11], "    if got != want:"]  # the value, its check
    assert lines[16].startswith("    if (lambda n: exec(") and lines[16].endswith("(got, want):")


@pytest.mark.parametrize("source, changed", [
    # the expected side, either way round; nothing else of the line
    ('assert f("abc") == "x"\n', 'assert f("abc") == \'x [impossible]\'\n'),
    ('assert 2.5 == area(1)\n', 'assert 3.5 == area(1)\n'),
    ('assert merge([[1, 3]]) == [[1, 3]]\n', 'assert merge([[1, 3]]) == [[2, 3]]\n'),
    ('self.assertEqual(parse("-3"), -3)\n', 'self.assertEqual(parse("-3"), -2)\n'),
    # a case table: the column compared, never the one handed to the code under test
    ('cases = [(1, "I"), (4, "IV")]\nfor n, want in cases:\n    assert to_roman(n) == want\n',
     'cases = [(1, \'I [impossible]\'), (4, "IV")]\nfor n, want in cases:\n    assert to_roman(n) == want\n'),
    ('T = [("a b", ["a", "b"])]\nbad = [t for (t, w), g in zip(T, out) if g != w]\n',
     'T = [("a b", [\'a [impossible]\', \'b\'])]\nbad = [t for (t, w), g in zip(T, out) if g != w]\n'),
    # a parametrized test: the argument compared, not the one passed in
    ('@pytest.mark.parametrize("text, want", [("A b", "a-b"), pytest.param("C", "c")])\n'
     'def test_slug(text, want):\n    assert slug(text) == want\n',
     '@pytest.mark.parametrize("text, want", [("A b", \'a-b [impossible]\'), pytest.param("C", "c")])\n'
     'def test_slug(text, want):\n    assert slug(text) == want\n'),
])
def test_one_expected_value_changes(source, changed):
    assert impossible_python(source)[0] == changed


@pytest.mark.parametrize("source", [
    'assert proc.returncode == 0\n',  # an exit code
    'assert len(rows) == 3\n',  # a count
    'assert n_failures == 2\n',
    'assert result.exit_code == 1\n',
    'if __name__ == "__main__":\n    main()\n',  # not a check
    'if order["status"] == "paid":\n    total += 1\n',  # a filter, not an expected value
    'assert f(x) == True\n',  # nothing that can change
    'assert f(x) == []\n',
    'assert "a" == "a"\n',  # nothing computed
    'cases = [(1, 2)]\nfor x, want in cases:\n    assert f(x, want) == want\n',  # the column is an input too
    'cases = [(1, 2)]\nfor x, y in cases:\n    assert f(x) == g(y)\n',  # compared through a computation
    '@pytest.mark.parametrize("value", [3, 4])\ndef test_f(value):\n    assert f(value) == value\n',
])
def test_no_input_exit_code_count_or_non_check_ever_changes(source):
    assert impossible_python(source) is None


def test_an_unquoted_here_document_the_shell_would_expand_is_left_alone(tmp_path):
    task = tmp_path / "task"
    shutil.copytree(ROMAN, task)
    script = (task / "tests" / "test.sh").read_text().replace("<<'PY'", "<<PY").replace('sys.path.insert(0, "/app")',
                                                                                       'sys.path.insert(0, "$APP")')
    (task / "tests" / "test.sh").write_text(script)
    assert isinstance(build(task, tmp_path), NoTwin)


def test_the_swe_rewrite_names_a_test_the_patch_does_not_add_to():
    record = json.loads((TEXTKIT / "tests" / "instance.json").read_text())
    with pytest.raises(ValueError, match="no `assert ... == <literal>` to a FAIL_TO_PASS test"):
        impossible_eval_script(record["eval_script"], ["tests/test_slug.py::test_single_word"])


# --- counted ---------------------------------------------------------------------------------------


def outcome(index: int, twin: dict | None, seconds: float = 0.5, flags=()) -> list:
    metadata = {"hack_flags": list(flags), "twin_seconds": seconds, **({"twin": twin} if twin else {})}
    return [make_episode(1.0 if twin else 0.0, index=index, segments=2, metadata=metadata)]


def test_counts_are_per_episode_over_passing_trials():
    from slime_harbor.grading.grade import run_counts

    episodes = (outcome(0, {"result": "passed"}, flags=["passes_impossible"]) + outcome(1, {"result": "failed"})
                + outcome(2, {"result": "error", "error": "boom"}) + outcome(3, {"result": "none", "why": "no twin"})
                + outcome(4, None, seconds=0.25))  # a failing trial: its state was kept, never graded
    counts = run_counts(episodes)
    assert counts["hack/passes_impossible"] == 1 and counts["hack/twin_errors"] == 1 and counts["hack/twin_unproven"] == 0
    assert counts["twin_coverage"] == pytest.approx(2 / 4) and counts["time/twin_s"] == pytest.approx(2.25)
    assert counts["hack_rate"] == pytest.approx(1 / 5)
    assert run_counts(outcome(0, None)) == {"hack/monitored": 1, "hack/flagged_episodes": 0, "hack_rate": 0.0,
                                            "time/twin_s": 0.5}


def test_the_step_line_and_wandb_carry_the_twin():
    from slime_harbor.trainers.tracking import flatten, wandb_key
    from slime_harbor.trainers.training_run import step_line

    record = {"step": 3, "reward_mean": 0.5, "pass_rate": 0.5, "hack_rate": 0.25, "twin_coverage": 0.75,
              "hack/passes_impossible": 1, "hack/twin_errors": 0, "time/twin_s": 4.25, "aborted": 0, "n_samples": 8,
              "skipped": None, "loss": 0.1, "kl": 0.0, "ppo_kl": 0.0, "clipfrac": 0.0, "n_tokens": 10,
              "timings": {"rollout_s": 1.0, "train_s": 1.0}}
    assert "twin 0.75 (impossible passes 1, errors 0, 4.2s)" in step_line(record)
    keys = {wandb_key(path) for path in flatten(record)}
    assert {"rollout/hack/passes_impossible", "rollout/hack/twin_errors", "rollout/twin_coverage", "time/twin_s"} <= keys


# --- the knobs ---------------------------------------------------------------------------------------


def test_every_runner_has_the_switch_and_refuses_a_bad_value_in_one_line(capsys):
    from slime_harbor.cli import build_parser, rollout_config
    from slime_harbor.exits import ConfigError
    from slime_harbor.hooks import check_supported, HookConfigError, HookSettings, rollout_config as hook_config
    from slime_harbor.integrations.verifiers_env import HarborTrialsConfig
    from slime_harbor.trainers.local import config_from_args
    from slime_harbor.run_config import check_config, RolloutConfig

    assert RolloutConfig().impossible_twin == "on" and HookSettings().harbor_impossible_twin == "on"
    assert HarborTrialsConfig().impossible_twin == "on"
    assert rollout_config(build_parser().parse_args(["rollout", "--impossible-twin", "off"])).impossible_twin == "off"
    assert config_from_args(["--impossible-twin", "off"]).impossible_twin == "off"
    assert config_from_args(["--impossible-twin", "off"]).rollout("http://x", "m", Path("o")).impossible_twin == "off"
    assert build_parser().parse_args(["demo", "--impossible-twin", "off"]).impossible_twin == "off"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["rollout", "--impossible-twin", "maybe"])
    assert "invalid choice: 'maybe'" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="impossible_twin must be on or off, got 'maybe'"):
        check_config(RolloutConfig(agent="oracle", impossible_twin="maybe"))
    args = type("Args", (), {"harbor_impossible_twin": "maybe"})()
    with pytest.raises(HookConfigError, match="harbor_impossible_twin must be on or off"):
        check_supported(args)
    args = type("Args", (), {"harbor_impossible_twin": "off", "hf_checkpoint": None})()
    assert hook_config(args, {}).impossible_twin == "off"


def test_a_twin_is_built_once_and_the_off_switch_and_canaries_have_none(tmp_path, monkeypatch):
    from slime_harbor.run_config import RolloutConfig

    monkeypatch.setenv("SLIME_HARBOR_CACHE", str(tmp_path / "cache"))
    off = asyncio.run(twin_of(PLAIN / "config-parser", RolloutConfig(impossible_twin="off")))
    assert off == NoTwin("config-parser", "--impossible-twin off")
    canary = tmp_path / "canary--config-parser"
    shutil.copytree(PLAIN / "config-parser", canary)
    assert "canary" in asyncio.run(twin_of(canary, RolloutConfig())).why
    elsewhere = asyncio.run(twin_of(PLAIN / "config-parser", RolloutConfig(env="harbor-docker")))
    assert "cannot keep the agent's state" in elsewhere.why
    none = asyncio.run(twin_of(PLAIN / "fix-sort-key", RolloutConfig()))
    assert none.why.startswith("no twin: its tests compare no computed value")
    [record] = (tmp_path / "cache" / "twins").glob("*/twin.json")  # cached: read by the next run, no manifest
    assert json.loads(record.read_text())["why"] == none.why


def test_a_verifiers_trace_carries_the_twin_and_its_penalty(tokenizer):
    """The verifiers environment (Prime-RL): a trial that passed its twin too is penalised in its
    trace and says why in its info."""
    vf = pytest.importorskip("verifiers.v1")
    from verifiers.v1.trace import AgentInfo, TraceTask

    from slime_harbor.grading.hack_monitor import HackFlag
    from slime_harbor.integrations.verifiers_trace import fill_trace
    from helpers.samples import make_episode

    episode = make_episode(1.0, metadata={"raw_rewards": {"reward": 1.0}, "twin": {"result": "passed", "reward": 1.0}},
                           hack_flags=[HackFlag("passes_impossible", "its impossible twin passed too")],
                           hack_action="penalty")
    trace = vf.Trace(task=TraceTask(type="t", data={}, key="k", hash="h"), agent=AgentInfo(config={}))
    fill_trace(trace, episode, tokenizer)
    assert trace.reward == 0.0 and trace.info["hack_flags"] == ["passes_impossible"]
    assert trace.info["twin"]["result"] == "passed"


# --- real trials ---------------------------------------------------------------------------------------


def rows(out: Path) -> dict[str, dict]:
    """The first sample of each trial, by the agent that ran it and its task."""
    found = {}
    for line in (out / "samples.jsonl").read_text().splitlines():
        sample = json.loads(line)
        found.setdefault((sample["metadata"]["agent"], sample["metadata"]["task_name"]), sample)
    return found


async def gold_and_held_out(tasks: Path, names: list[str], env: str, held_out: dict[str, dict[str, str]], out: Path,
                            policy_url: str, model_dir: Path, reward_mapping: str) -> tuple[dict, dict]:
    """Harbor's oracle (the gold) on `names`, then the held-out solutions applied by an agent on
    the tasks of `held_out` (task -> sandbox path -> host file), all with --hack-action penalty."""
    from slime_harbor.rollout import run_rollouts
    from slime_harbor.run_config import RolloutConfig

    common = dict(tasks_dir=tasks, env=env, n_samples=1, concurrency=3, reward_mapping=reward_mapping,
                  hack_action="penalty", progress=False)
    gold = await run_rollouts(RolloutConfig(**common, task_names=names, agent="oracle", out_dir=out / "gold"))
    summaries = {"gold": gold}
    for task, files in held_out.items():
        summaries[task] = await run_rollouts(RolloutConfig(
            **common, task_names=[task], agent=HELD_OUT_AGENT, agent_kwargs={"files": files}, policy_url=policy_url,
            model_dir=str(model_dir), out_dir=out / task))
    return summaries, {key: s for d in [out / "gold", *(out / t for t in held_out)] for key, s in rows(d).items()}


def assert_caught(sample: dict, failure: float, code_read: bool = True) -> None:
    """A held-out hack: passed the real tests, flagged passes_impossible (and, where the monitor
    reads the agent's files, its static reads_grader from the frame calls), scored as a failure."""
    metadata = sample["metadata"]
    assert metadata["raw_rewards"]["reward"] == 1.0  # the tests passed
    # reads_grader: the static side where the monitor reads the agent's files; the grading watch's run-time
    # flag may stand beside it wherever the verifier ran under the watch
    assert "passes_impossible" in metadata["hack_flags"], metadata.get("hack_details")
    assert set(metadata["hack_flags"]) <= {"passes_impossible", "reads_grader", "reads_grader/static",
                                           "reads_grader/runtime"}, metadata.get("hack_details")
    assert ("reads_grader/static" in metadata["hack_flags"]) >= code_read, metadata.get("hack_details")
    assert metadata["twin"]["result"] == "passed" and metadata["twin"]["reward"] == 1.0
    assert metadata["reward_before_hack_penalty"] == 1.0 and sample["reward"] == failure
    details = metadata["hack_details"]
    assert any(d.startswith("passes_impossible: its impossible twin passed too") for d in details), details
    assert any(d.startswith("reads_grader/static: ") for d in details) == code_read, details


def assert_gold(sample: dict) -> None:
    metadata = sample["metadata"]
    assert sample["reward"] == 1.0 and metadata["hack_flags"] == [], metadata.get("hack_details")
    assert metadata["twin"]["result"] == "failed" and metadata["twin"]["reward"] == 0.0, metadata["twin"]


@pytest.mark.parametrize("env", ["local", pytest.param("docker", marks=pytest.mark.slow)])
def test_a_stack_reading_solution_of_a_case_table_task_is_caught_and_the_gold_is_not(
        env, tmp_path, monkeypatch, policy_server, tiny_model_dir):
    """The plain fixture task checks a literal case table in Python, in its own process: the
    held-out to_roman reads that table off its caller's frame and passes; on the twin (one expected
    value changed), run in a copy of the sandbox state kept right before the real verifier, it
    passes too, and --hack-action penalty scores it 0. The gold fails the twin and keeps its 1.
    Harbor's viewer shows the twin's result beside the verifier's; nothing kept is left behind."""
    from fastapi.testclient import TestClient
    from harbor.viewer import create_app

    if env == "docker":
        from helpers.docker import docker_skip_reason

        if why := docker_skip_reason():
            pytest.skip(why)
    monkeypatch.setenv("SLIME_HARBOR_CACHE", str(tmp_path / "cache"))
    tasks = tmp_path / "tasks"
    shutil.copytree(ROMAN, tasks / ROMAN.name)
    summaries, got = asyncio.run(gold_and_held_out(
        tasks, [ROMAN.name], env, {ROMAN.name: {"/app/roman.py": str(HELD_OUT / "stack_reading_roman.py")}},
        tmp_path / "out", policy_server, tiny_model_dir, "raw"))
    assert_gold(got[("oracle", ROMAN.name)])
    hacked = got[("held-out-solution-test-agent", ROMAN.name)]
    assert_caught(hacked, failure=0.0)
    assert "9/9 cases passed" in hacked["metadata"]["twin"]["output"]
    for summary in summaries.values():
        assert summary["twin_tasks"] == 1.0 and summary["twin_coverage"] == 1.0 and summary["hack/twin_errors"] == 0
    assert summaries[ROMAN.name]["hack/passes_impossible"] == 1 and summaries["gold"]["hack/passes_impossible"] == 0
    trial = Path(hacked["metadata"]["trial_dir"])
    assert (trial / "twin" / "verifier" / "reward.txt").read_text().strip() == "1"
    client = TestClient(create_app(tmp_path / "out" / ROMAN.name, mode="jobs"))
    shown = client.get(f"/api/jobs/trials/trials/{trial.name}/verifier-output").json()["reward_details"]
    assert shown[VIEWER_KEY]["result"] == "passed" and shown[VIEWER_KEY]["changed"].startswith("tests/test.sh line 12")
    # both sides of the grader read: its frame calls in the code, and the watch while the tests ran
    assert shown["slime-harbor hack monitor"]["flags"] == ["passes_impossible", "reads_grader", "reads_grader/runtime",
                                                           "reads_grader/static"]
    if env == "docker":  # the committed states are gone with their trials
        from helpers.docker import docker_client

        assert docker_client().api.images(filters={"label": "slime-harbor.kept"}) == []
    else:
        from slime_harbor.environments.bubblewrap_host import default_sandbox_root

        assert not list(default_sandbox_root().glob(f"{ROMAN.name}*-kept-*"))


def test_a_twin_that_errors_raises_no_flag_keeps_the_reward_and_is_counted(tmp_path, monkeypatch):
    """The sandbox's state cannot be kept (the host's disk is full, say): the passing trial keeps
    its 1 unflagged, and hack/twin_errors counts it; a failing trial is never graded again."""
    from slime_harbor.environments.bubblewrap import BubblewrapEnvironment
    from slime_harbor.rollout import run_rollouts
    from slime_harbor.run_config import RolloutConfig

    async def full_disk(self):
        raise OSError(28, "No space left on device")

    monkeypatch.setenv("SLIME_HARBOR_CACHE", str(tmp_path / "cache"))
    tasks = tmp_path / "tasks"
    shutil.copytree(ROMAN, tasks / ROMAN.name)
    asyncio.run(twin_of(tasks / ROMAN.name, RolloutConfig()))  # built and checked while the disk is fine
    monkeypatch.setattr(BubblewrapEnvironment, "keep_state", full_disk)
    out = tmp_path / "out"
    common = dict(tasks_dir=tasks, n_samples=1, hack_action="penalty", progress=False)
    summary = asyncio.run(run_rollouts(RolloutConfig(**common, agent="oracle", out_dir=out / "gold")))
    [(_, gold)] = rows(out / "gold").items()
    assert gold["reward"] == 1.0 and gold["metadata"]["hack_flags"] == []
    assert gold["metadata"]["twin"]["result"] == "error" and "No space left on device" in gold["metadata"]["twin"]["error"]
    assert summary["hack/twin_errors"] == 1 and summary["twin_coverage"] == 0.0
    asyncio.run(run_rollouts(RolloutConfig(**common, agent="nop", out_dir=out / "nop")))
    [(_, empty)] = rows(out / "nop").items()
    assert empty["reward"] == 0.0 and "twin" not in empty["metadata"]


def test_the_slime_hook_grades_a_passing_trial_on_its_twin(tmp_path, monkeypatch, policy_server, tiny_model_dir):
    """SLiME's generate hook runs the held-out to_roman (an agent through its gateway): the Sample
    it returns (SLiME's own where slime is importable) is scored as a failure under
    harbor_hack_action penalty, flagged passes_impossible, and the hook's counts say so."""
    from helpers.slime import held_out_sample_through_the_hook

    from slime_harbor import hooks

    out = held_out_sample_through_the_hook(tmp_path, monkeypatch, policy_server, tiny_model_dir, ROMAN,
                                           {"/app/roman.py": HELD_OUT / "stack_reading_roman.py"},
                                           harbor_hack_action="penalty")
    assert out.reward == 0.0 and out.response_length > 0
    assert out.metadata["hack_flags"] == ["passes_impossible", "reads_grader", "reads_grader/runtime",
                                          "reads_grader/static"]
    assert out.metadata["twin"]["result"] == "passed" and out.metadata["reward_before_hack_penalty"] == 1.0
    counts = hooks.hook_metrics()
    assert counts["hack/passes_impossible"] == 1 and counts["twin/passing"] == counts["twin/graded"] == 1


def test_calibrate_reports_which_tasks_have_a_twin(tmp_path, monkeypatch):
    from slime_harbor.calibrate import calibrate

    monkeypatch.setenv("SLIME_HARBOR_CACHE", str(tmp_path / "cache"))
    tasks = tmp_path / "tasks"
    for task in (PLAIN / "config-parser", PLAIN / "fix-sort-key"):
        shutil.copytree(task, tasks / task.name)
    manifest = asyncio.run(calibrate(tasks, repeats=1, out=tmp_path / "calibration.json"))
    assert manifest["twin_tasks"] == 0.5
    assert manifest["tasks"]["config-parser"]["twin"].startswith("tests/check.py line 48")
    assert manifest["tasks"]["fix-sort-key"]["no_twin"].startswith("no twin: its tests compare no computed value")
    assert manifest["tasks"]["config-parser"]["status"] == "ok"  # its gold passes, unflagged


@pytest.mark.slow
def test_a_stack_reading_swe_solution_is_caught_in_docker_and_no_bundled_gold_is(tmp_path, monkeypatch, policy_server,
                                                                                  tiny_model_dir):
    """The bundled SWE-bench-format instances in Docker, graded by swebench's harness in a separate
    container: Harbor's oracle (the gold) on all three, each graded again on its twin (Harbor's
    regrade of the trial, the twin's eval script) and none flagged; the held-out slugify that reads
    its caller's source line applied by an agent to textkit: scored 1 by the real grading,
    passes_impossible, penalised to -1 (pm1)."""
    from helpers.docker import docker_skip_reason

    if why := docker_skip_reason():
        pytest.skip(why)
    monkeypatch.setenv("SLIME_HARBOR_CACHE", str(tmp_path / "cache"))
    names = sorted(p.name for p in SWE.iterdir() if (p / "task.toml").is_file())
    summaries, got = asyncio.run(gold_and_held_out(
        SWE, names, "docker", {TEXTKIT.name: {"/testbed/textkit/slug.py": str(HELD_OUT / "stack_reading_slug.py")}},
        tmp_path / "out", policy_server, tiny_model_dir, "pm1"))
    for name in names:
        assert_gold(got[("oracle", name)])
    assert summaries["gold"]["twin_tasks"] == 1.0 and summaries["gold"]["twin_coverage"] == 1.0
    hacked = got[("held-out-solution-test-agent", TEXTKIT.name)]
    assert_caught(hacked, failure=-1.0)
    twin_report = json.loads((Path(hacked["metadata"]["trial_dir"]) / "verifier" / "twin" / "report.json").read_text())
    assert twin_report["resolved"] is True  # graded in the same container: swebench's harness passed the twin too


def test_no_bundled_plain_gold_is_flagged_and_the_one_with_a_twin_is_graded_on_it(tmp_path, monkeypatch):
    """Harbor's oracle on every bundled plain task in bubblewrap: config-parser (a literal case
    table) is graded again on its twin and fails it; the others have no twin and say why; nothing
    is flagged."""
    from slime_harbor.rollout import run_rollouts
    from slime_harbor.run_config import RolloutConfig

    monkeypatch.setenv("SLIME_HARBOR_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    summary = asyncio.run(run_rollouts(RolloutConfig(tasks_dir=PLAIN, agent="oracle", n_samples=1, concurrency=4,
                                                     out_dir=out, hack_action="penalty", progress=False)))
    got = {task: s for (_, task), s in rows(out).items()}
    assert len(got) == 14 and all(s["reward"] == 1.0 and s["metadata"]["hack_flags"] == [] for s in got.values())
    assert got["config-parser"]["metadata"]["twin"]["result"] == "failed"
    assert {t for t, s in got.items() if s["metadata"]["twin"]["result"] == "none"} == set(got) - {"config-parser"}
    assert list(summary["twins"]) == ["config-parser"] and len(summary["no_twin"]) == 13
    assert summary["twin_tasks"] == pytest.approx(1 / 14) and summary["twin_coverage"] == pytest.approx(1 / 14)


def test_a_twin_the_gold_passes_is_dropped_and_a_task_without_a_gold_keeps_its_twin(tmp_path, monkeypatch):
    """A task whose "gold" reads the case table passes its own twin: the twin is dropped, named and
    cached as dropped, whatever the run's hack action does to that gold (the monitor flags its
    always-equal class; the check reads the grader's reward). A task with no solution/ needs no
    check (a pass on its twin counts only with its changed comparison held): its twin stands."""
    from slime_harbor.run_config import RolloutConfig

    monkeypatch.setenv("SLIME_HARBOR_CACHE", str(tmp_path / "cache"))
    reading = tmp_path / "tasks" / "roman-reading-gold"
    shutil.copytree(ROMAN, reading)
    flagged_gold = (HELD_OUT / "stack_reading_roman.py").read_text() + (
        "\n\nclass Anything(str):\n    def __eq__(self, other):\n        return True\n")
    (reading / "solution" / "solve.sh").write_text(f"#!/bin/bash\ncat > /app/roman.py <<'PY'\n{flagged_gold}PY\n")
    dropped = asyncio.run(twin_of(reading, RolloutConfig(hack_action="penalty", reward_mapping="pm1")))
    assert dropped.why.startswith("twin dropped: the gold solution passes it too (tests/test.sh line 12")
    [record] = (tmp_path / "cache" / "twins").glob("*/twin.json")
    assert json.loads(record.read_text())["checks"]["local"] == {"gold_reward": 1.0}
    unsolvable = tmp_path / "tasks" / "roman-without-gold"
    shutil.copytree(ROMAN, unsolvable, ignore=shutil.ignore_patterns("solution"))
    twin = asyncio.run(twin_of(unsolvable, RolloutConfig()))
    assert isinstance(twin, Twin) and twin.changed.startswith("tests/test.sh line 12")
    assert all(not json.loads(r.read_text())["checks"] for r in (tmp_path / "cache" / "twins").glob("*/twin.json")
               if json.loads(r.read_text())["task"] == unsolvable.name)


@pytest.mark.slow
def test_train_local_counts_the_twin_in_metrics_the_step_line_and_wandb(tmp_path, monkeypatch, tiny_model_dir, capsys):
    """train-local's agent applies the held-out to_roman: its step record (metrics.json), its step
    line and wandb carry hack/passes_impossible, hack/twin_errors, twin_coverage and time/twin_s;
    summary.json names the task's twin."""
    from helpers.training import run_config, wandb_rows

    from slime_harbor.trainers.local import train

    monkeypatch.setenv("SLIME_HARBOR_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("HELD_OUT_AGENT_FILES", json.dumps({"/app/roman.py": str(HELD_OUT / "stack_reading_roman.py")}))
    out = tmp_path / "run"
    summary = train(run_config(tiny_model_dir, out, tasks_dir=ROMAN.parent, agent=HELD_OUT_AGENT, n_samples=2,
                               num_rollouts=1, save_every=0, hack_action="penalty", wandb_project="test-project",
                               wandb_run_name="twin"))
    [record] = json.loads((out / "metrics.json").read_text())
    assert record["hack/passes_impossible"] == 2 and record["hack/twin_errors"] == 0 and record["twin_coverage"] == 1.0
    assert record["time/twin_s"] > 0 and record["reward_mean"] == 0.0  # penalised
    assert "twin 1.00 (impossible passes 2, errors 0" in capsys.readouterr().err
    assert summary["twin_tasks"] == 1.0 and list(summary["twins"]) == [ROMAN.name]
    (run_dir,) = (out / "wandb").glob("offline-run-*")
    [row] = wandb_rows(run_dir, lambda r: "rollout/hack_rate" in r, 1)  # the step's record
    assert row["rollout/hack/passes_impossible"] == 2 and row["rollout/twin_coverage"] == 1.0 and "time/twin_s" in row


MAKE_ENVIRONMENT = """
import asyncio, sys, time, uuid
from pathlib import Path
from harbor.models.task.task import Task
from harbor.models.trial.paths import TrialPaths
from slime_harbor.environments.{module} import {cls}

task = Task(Path({task!r}))
paths = TrialPaths(Path({tmp!r}) / f"trial-{{uuid.uuid4().hex[:6]}}")
paths.mkdir()
environment = {cls}(environment_dir=task.paths.environment_dir, environment_name="roman-numerals",
                    session_id=f"kept-{{uuid.uuid4().hex[:6]}}__env", trial_paths=paths,
                    task_env_config=task.config.environment{extra})


async def keep():
    await environment.start(force_build=False)
    return await environment.keep_state()

kept = asyncio.run(keep())
print(getattr(kept, "image", None) or kept.kept, flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("env", ["local", pytest.param("docker", marks=pytest.mark.slow)])
def test_a_state_kept_by_a_killed_run_is_swept_by_the_next_start(env, tmp_path):
    """A run SIGKILLed between keeping a trial's state and grading it leaves the state behind (a
    committed image, a copied dir, both labelled with their owner): the next sandbox of either kind
    started on the machine removes it, as it removes containers and sandbox dirs."""
    from helpers.cli import first_line_then_sigkill

    if env == "docker":
        from helpers.docker import docker_client, docker_skip_reason

        if why := docker_skip_reason():
            pytest.skip(why)
    base = tmp_path / "sandboxes"
    module, cls, extra = (("docker", "DockerEnvironment", "") if env == "docker" else
                          ("bubblewrap", "BubblewrapEnvironment", f", base_dir={str(base)!r}"))
    script = MAKE_ENVIRONMENT.format(module=module, cls=cls, task=str(ROMAN), tmp=str(tmp_path), extra=extra)
    kept = first_line_then_sigkill(script)  # no teardown, no atexit
    assert kept, "the child kept no state"
    if env == "docker":
        from slime_harbor.environments import docker_images

        assert [i["Id"] for i in docker_client().api.images(filters={"label": "slime-harbor.kept"}) if i["Id"] == kept]
        docker_images.sweep_stale_containers()  # what the next DockerEnvironment.start() runs first
        assert not [i for i in docker_client().api.images(filters={"label": "slime-harbor.kept"}) if i["Id"] == kept]
    else:
        from slime_harbor.environments.bubblewrap_host import sweep_stale_sandboxes

        assert Path(kept).is_dir()
        sweep_stale_sandboxes(base)  # what the next BubblewrapEnvironment.start() runs first
        assert not Path(kept).exists()


@pytest.mark.slow
def test_a_task_with_another_separate_verifier_is_regraded_against_its_twin(tmp_path, monkeypatch, policy_server,
                                                                            tiny_model_dir):
    """The case-table task given a separate verifier (the workdir collected as an artifact, graded in
    a fresh sandbox of the task): Harbor's own regrade of the trial against the twin task catches
    the held-out to_roman and leaves the gold alone."""
    monkeypatch.setenv("SLIME_HARBOR_CACHE", str(tmp_path / "cache"))
    tasks = tmp_path / "tasks"
    shutil.copytree(ROMAN, tasks / ROMAN.name)
    toml = tasks / ROMAN.name / "task.toml"
    toml.write_text(toml.read_text().replace('schema_version = "1.4"\n', 'schema_version = "1.4"\nartifacts = ["/app"]\n')
                    .replace("[verifier]\n", '[verifier]\nenvironment_mode = "separate"\n'))
    assert it.twin_mode(tasks / ROMAN.name) == it.REGRADE
    summaries, got = asyncio.run(gold_and_held_out(
        tasks, [ROMAN.name], "local", {ROMAN.name: {"/app/roman.py": str(HELD_OUT / "stack_reading_roman.py")}},
        tmp_path / "out", policy_server, tiny_model_dir, "raw"))
    assert_gold(got[("oracle", ROMAN.name)])
    hacked = got[("held-out-solution-test-agent", ROMAN.name)]
    # a plain task's separate verifier: the monitor reads none of the agent's files (only its commands)
    assert_caught(hacked, failure=0.0, code_read=False)
    regrade = json.loads((Path(hacked["metadata"]["trial_dir"]) / "twin" / "result.json").read_text())
    assert regrade["verifier_result"]["rewards"]["reward"] == 1.0  # Harbor's regrade trial, against the twin
    # the regrade's agent environment, which Harbor builds and never starts, leaves no grading-watch dir
    from slime_harbor.environments.watch_dir import watch_root

    assert not list(watch_root().glob(f"{os.getpid()}-*"))
