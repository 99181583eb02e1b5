"""SLiME's evaluation of our hook, counted per trial, against SLiME's own code.

SLiME's eval entry (`generate_rollout(..., evaluation=True)` in slime.rollout.sglang_rollout: the
loop `--eval-prompt-data` runs, eval_rollout_single_dataset) reads the eval prompts through its own
Dataset, calls `slime_harbor.hooks.generate(..., evaluation=True)` for each of a row's
`--n-samples-per-eval-prompt` copies and extends one flat list with every sample it returns. SLiME's
`log_eval_rollout_data` then logs that list: by default the mean over it (an unscored trial a
failure, a segmented episode once per segment; with --log-passrate a reshape by the group size,
which asserts when a segment is extra), or through `--custom-eval-rollout-log-function-path
slime_harbor.hooks.log_eval_rollout`, per trial. What is logged is read where SLiME sends it,
its `logging_utils.log` (called through; wandb and tensorboard are off).

Stubbed where missing, as in tests/test_slime_integration.py: ray and SGLang's engine (module
load only, helpers.slime.install_slime_stubs).

Run: PYTHONPATH=$PWD:<a THUDM/slime checkout> .venv/bin/python -m pytest tests/test_slime_eval.py
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
from collections import Counter
from pathlib import Path

import pytest

from slime_harbor import hooks
from slime_harbor.cli import prepare_data
from slime_harbor.retries import RetryBudget
from slime_harbor.run_config import DEFAULT_TASKS

try:
    HAVE_SLIME = importlib.util.find_spec("slime") is not None
except ModuleNotFoundError:
    HAVE_SLIME = False

pytestmark = pytest.mark.skipif(not HAVE_SLIME, reason="slime is not importable (PYTHONPATH=<a THUDM/slime checkout>)")

from helpers.rollout import leftovers  # noqa: E402
from helpers.slime import install_slime_stubs  # noqa: E402

N_PER_PROMPT = 2
OUR_LOG_FUNCTION = "slime_harbor.hooks.log_eval_rollout"


@pytest.fixture(scope="module")
def slime_eval():
    """SLiME's eval entry and its eval logging, imported with the stand-ins where needed."""
    added = install_slime_stubs()
    from slime.observability import rollout_metrics
    from slime.rollout import sglang_rollout

    yield sglang_rollout, rollout_metrics
    for name in added:  # SLiME's modules imported with them stay; nothing else sees the stubs
        sys.modules.pop(name, None)


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    """SLiME's GenerateState is a process-wide singleton (its semaphore, its abort flag); each test
    starts without one, and our hook's counters start at zero."""
    monkeypatch.setattr(hooks, "METRICS", Counter())
    monkeypatch.setattr(hooks, "RETRY_BUDGET", RetryBudget())
    yield
    if HAVE_SLIME:
        from slime.utils.misc import SingletonMeta

        for cls in [c for c in SingletonMeta._instances if c.__name__ == "GenerateState"]:
            SingletonMeta._instances.pop(cls)


def eval_prompts(tmp_path: Path, tasks: Path, rows) -> Path:
    """`slime-harbor prepare-data`, then one eval prompt row per (task, agent) of `rows`."""
    prepare_data(tasks, tmp_path / "all.jsonl")
    by_name = {json.loads(line)["label"]: json.loads(line) for line in (tmp_path / "all.jsonl").read_text().splitlines()}
    prompts = tmp_path / "eval.jsonl"
    with open(prompts, "w") as f:
        for label, agent in rows:
            row = json.loads(json.dumps(by_name[label]))
            if agent:
                row["metadata"]["harbor_agent"] = agent
            f.write(json.dumps(row) + "\n")
    return prompts


def eval_args(policy_url: str, model_dir: Path, prompts: Path, tmp_path: Path, *flags: str):
    """SLiME's own parser and defaults for an evaluation with our generate, the eval datasets
    resolved as slime_validate_args does, plus what SGLang's parser / the launcher set."""
    from slime.utils.arguments import _resolve_eval_datasets, get_slime_extra_args_provider

    parser = argparse.ArgumentParser()
    get_slime_extra_args_provider()(parser)
    args = parser.parse_args([
        "--hf-checkpoint", str(model_dir), "--rollout-batch-size", "1",
        "--eval-prompt-data", "heldout", str(prompts), "--n-samples-per-eval-prompt", str(N_PER_PROMPT),
        "--input-key", "prompt", "--label-key", "label", "--metadata-key", "metadata",
        "--eval-max-response-len", "48", "--custom-generate-function-path", "slime_harbor.hooks.generate",
        *flags,
    ])
    args.eval_datasets = _resolve_eval_datasets(args)
    host, port = policy_url.removeprefix("http://").split(":")
    args.sglang_router_ip, args.sglang_router_port = host, int(port)
    args.sglang_server_concurrency, args.rollout_num_engines, args.sglang_dp_size = 8, 1, None
    args.harbor_step_limit, args.harbor_trials_dir = 2, str(tmp_path / "trials")  # the YAML's, in a real run
    return args


def logged(rollout_metrics, monkeypatch, args, output, log_function: str | None) -> dict:
    """What SLiME's log_eval_rollout_data sends to its logging_utils.log for the eval `output`,
    with `log_function` as --custom-eval-rollout-log-function-path (None: SLiME's default)."""
    from slime.observability import logging_utils

    sent = []
    send = logging_utils.log
    monkeypatch.setattr(logging_utils, "log", lambda a, metrics, step_key: (sent.append(dict(metrics)),
                                                                            send(a, metrics, step_key)))
    args.custom_eval_rollout_log_function_path = log_function
    rollout_metrics.log_eval_rollout_data(0, args, output.data, dict(output.metrics or {}))
    (metrics,) = sent
    assert metrics["eval/step"] == 0
    return metrics


def trials_of(samples) -> dict:
    """rollout_id -> the samples of that trial (SLiME's eval copies each get their own index)."""
    trials: dict = {}
    for s in samples:
        trials.setdefault(s.rollout_id, []).append(s)
    return trials


def test_slime_eval_counts_trials_once_on_converted_episodes(slime_eval, tiny_model_dir, tmp_path, monkeypatch):
    """SLiME's eval loop over four prompt rows, two trials each, the episodes built by the real
    converter in place of the trials (helpers.trial_results.EVAL_BATCH): one success in six scored
    trials, one episode in two segments, two unscored trials. Nine samples: SLiME's default mean is
    1/9 and, with --log-passrate, its reshape by two asserts; ours logs 1/6 and pass@k per row."""
    from helpers.trial_results import EVAL_BATCH, episodes_by_index

    sglang_rollout, rollout_metrics = slime_eval
    monkeypatch.setattr(hooks, "run_episode", episodes_by_index(EVAL_BATCH))
    prompts = eval_prompts(tmp_path, DEFAULT_TASKS, [("dedupe-lines", None)] * 4)
    args = eval_args("http://127.0.0.1:9", tiny_model_dir, prompts, tmp_path, "--log-passrate")
    output = sglang_rollout.generate_rollout(args, 0, None, evaluation=True)
    samples = output.data["heldout"]["samples"]
    assert len(samples) == 9 and len(trials_of(samples)) == 8

    with pytest.raises(AssertionError, match="len\\(flat_rewards\\)=9"):  # SLiME's default: reshape(4, 2)
        logged(rollout_metrics, monkeypatch, args, output, None)
    args.log_passrate = False
    assert logged(rollout_metrics, monkeypatch, args, output, None)["eval/heldout"] == pytest.approx(1 / 9)
    args.log_passrate = True
    ours = logged(rollout_metrics, monkeypatch, args, output, OUR_LOG_FUNCTION)
    assert {k: v for k, v in ours.items() if k.startswith("eval/heldout-") or k == "eval/heldout"} == pytest.approx({
        "eval/heldout": 1 / 6, "eval/heldout-scored": 6, "eval/heldout-truncated_ratio": 1 / 6,
        "eval/heldout-unscored": 2, "eval/heldout-unscored/environment_start_failed": 1,
        "eval/heldout-unscored/RewardFileNotFoundError": 1,
        "eval/heldout-pass@1": 0.5 / 3, "eval/heldout-pass@1/groups_left_out": 1,
        "eval/heldout-pass@2": 1 / 3, "eval/heldout-pass@2/groups_left_out": 1,
    })
    # SLiME's own per-sample statistics, over the samples of the scored trials (seven of them)
    assert ours["eval/heldout/response_len/mean"] == pytest.approx(
        sum(s.effective_response_length for s in samples if not s.metadata.get("unscored")) / 7)


# ---- real trials: the bundled task with verifiers that always answer, a gateway agent that compacts


def make_eval_tasks(root: Path) -> Path:
    """solved (its verifier writes 1), unsolved (0) and broken-image (its Dockerfile fails: the
    environment never starts), all from the bundled dedupe-lines task."""
    tasks = root / "tasks"
    base = DEFAULT_TASKS / "dedupe-lines"
    for name, reward in (("solved", 1), ("unsolved", 0), ("broken-image", 0)):
        shutil.copytree(base, tasks / name)
        (tasks / name / "tests" / "test.sh").write_text(
            f"#!/bin/bash\nmkdir -p /logs/verifier\necho {reward} > /logs/verifier/reward.txt\n")
    with open(tasks / "broken-image" / "environment" / "Dockerfile", "a") as f:
        f.write("RUN exit 3\n")
    return tasks


@pytest.mark.slow
def test_slime_eval_of_real_trials_counts_each_scored_trial_once(slime_eval, policy_server, tiny_model_dir, tmp_path,
                                                                 monkeypatch):
    """Eight real trials through SLiME's eval loop, two per row: the native agent on a solved task,
    a gateway agent that compacts its history (chat_tools_agent:CompactingAgent: each episode comes
    back as two segments) and the native agent on an unsolved one, and a task whose image does not
    build (two unscored trials). Ten samples: SLiME's default logs 2/10 = 0.2 (and pass@1 0.2);
    the truth, each scored trial once, is 2/6, and pass@k leaves the unscored row out."""
    from slime.utils import http_utils
    from slime.utils.async_utils import run

    sglang_rollout, rollout_metrics = slime_eval
    tasks = make_eval_tasks(tmp_path)
    prompts = eval_prompts(tmp_path, tasks, [("solved", None), ("unsolved", "chat_tools_agent:CompactingAgent"),
                                             ("unsolved", None), ("broken-image", None)])
    args = eval_args(policy_server, tiny_model_dir, prompts, tmp_path, "--log-passrate")
    args.harbor_tasks_dir, args.harbor_eval_trials_dir = str(tasks), str(tmp_path / "eval" / "trials")
    http_utils.init_http_client(args)
    try:
        output = sglang_rollout.generate_rollout(args, 0, None, evaluation=True)
    finally:  # the gateway lives in SLiME's event loop, with this test's policy server as upstream:
        run(hooks.close_gateway())  # a later test on that loop must start its own

    samples = output.data["heldout"]["samples"]
    trials = trials_of(samples)
    assert len(trials) == 4 * N_PER_PROMPT and all(s.reward is not None for s in samples)
    compacted = [t for t in trials.values() if t[0].metadata.get("harbor_agent") == "chat_tools_agent:CompactingAgent"]
    assert [len(t) for t in compacted] == [2, 2], [t[0].metadata.get("status_reason") for t in compacted]
    assert all(t[0].metadata["n_branches"] == 2 for t in compacted)
    unscored = [t for t in trials.values() if t[0].label == "broken-image"]
    assert [t[0].metadata["unscored"] for t in unscored] == [unscored[0][0].metadata["exception_type"]] * 2
    assert unscored[0][0].metadata["unscored"] in ("SandboxBuildFailedError", "DockerfileError")
    for t in trials.values():  # every other trial scored by its task's verifier
        if t[0].label != "broken-image":
            assert {s.metadata.get("unscored") for s in t} == {None}
            assert {s.reward for s in t} == {1.0 if t[0].label == "solved" else 0.0}
    assert len(samples) == 10

    args.log_passrate = True
    default = logged(rollout_metrics, monkeypatch, args, output, None)
    ours = logged(rollout_metrics, monkeypatch, args, output, OUR_LOG_FUNCTION)
    print("SLiME's default:", {k: default[k] for k in ("eval/heldout", "eval/heldout-pass@1", "eval/heldout-pass@2")})
    print("log_eval_rollout:", {k: v for k, v in ours.items() if k.startswith("eval/heldout") and "/" not in k[5:]})
    assert default["eval/heldout"] == pytest.approx(0.2) and default["eval/heldout-pass@1"] == pytest.approx(0.2)
    unscored_key = f"eval/heldout-unscored/{unscored[0][0].metadata['unscored']}"
    truncated = sum(t[0].status.value == "truncated" for t in trials.values() if t[0].label != "broken-image") / 6
    assert {k: ours[k] for k in ("eval/heldout", "eval/heldout-scored", "eval/heldout-unscored", unscored_key,
                                 "eval/heldout-truncated_ratio", "eval/heldout-pass@1", "eval/heldout-pass@2",
                                 "eval/heldout-pass@1/groups_left_out", "eval/heldout-pass@2/groups_left_out")} \
        == pytest.approx({"eval/heldout": 1 / 3, "eval/heldout-scored": 6, "eval/heldout-unscored": 2, unscored_key: 2,
                          "eval/heldout-truncated_ratio": truncated, "eval/heldout-pass@1": 1 / 3,
                          "eval/heldout-pass@2": 1 / 3, "eval/heldout-pass@1/groups_left_out": 1,
                          "eval/heldout-pass@2/groups_left_out": 1})
    assert leftovers(tmp_path / "eval") == ([], [])  # no sandbox or process of the trials left
