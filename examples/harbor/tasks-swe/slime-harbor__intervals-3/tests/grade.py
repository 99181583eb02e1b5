"""Grade one SWE-bench instance's test log with swebench's own harness; writes reward.txt.

`slime-harbor swebench-tasks` copies this file into every task as tests/grade.py. It runs inside
the task image, in the grader's own venv (swebench from PyPI, installed when the image was built),
never in the repo's environment and never with slime_harbor importable:

    /opt/swebench-grader/bin/python /tests/grade.py INSTANCE_JSON TEST_LOG OUT_DIR

INSTANCE_JSON is the swebench instance row (what swebench.harness.utils.make_test_spec reads).
Writes OUT_DIR/report.json (swebench's per-test report) always, and OUT_DIR/reward.txt — 1 when
swebench resolves the instance, 0 when it does not — unless the log shows an infrastructure
failure (the test patch did not apply, the test files could not be reset, the tests errored or
timed out, no test output at all, or swebench's own environment-tier classification): then no
reward file, so Harbor fails the trial instead of scoring it.
"""

import json
import sys
from pathlib import Path

from swebench.harness.constants import (
    APPLY_PATCH_FAIL,
    END_TEST_OUTPUT,
    RESET_FAILED,
    START_TEST_OUTPUT,
    TESTS_ERROR,
    TESTS_TIMEOUT,
)
from swebench.harness.grading import get_eval_report
from swebench.harness.utils import make_test_spec

# The markers swebench's get_logs_eval treats as "this run produced no test result".
INFRA_MARKERS = (APPLY_PATCH_FAIL, RESET_FAILED, TESTS_ERROR, TESTS_TIMEOUT)


def infra_failure(log: str, report: dict) -> str | None:
    """Why this log is an infrastructure failure rather than a test result, or None."""
    if report["patch_successfully_applied"]:  # swebench parsed a test result from the log
        return None
    for marker in INFRA_MARKERS:
        if marker in log:
            return marker.strip("> ")
    if START_TEST_OUTPUT not in log or END_TEST_OUTPUT not in log:
        return "no test output markers in the log"
    if report.get("infra_failure"):
        return f"swebench infra classification: {report.get('infra_failure_reason')}"
    return None  # the tests ran and told swebench nothing it could credit: unresolved


def main(instance_path: str, log_path: str, out_dir: str) -> int:
    instance = json.loads(Path(instance_path).read_text())
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    log_file = Path(log_path)
    # swebench opens the log with the locale's codec: make undecodable bytes harmless first.
    log = log_file.read_bytes().decode("utf-8", errors="replace")
    log_file.write_text(log, encoding="utf-8")

    spec = make_test_spec(instance)
    # The agent's edits are already in /testbed: there is no patch file to apply, only a log.
    prediction = {"instance_id": spec.instance_id, "model_patch": "", "model_name_or_path": "harbor-agent"}
    report = get_eval_report(spec, prediction, str(log_file), include_tests_status=True)[spec.instance_id]
    why = infra_failure(log, report)
    report["slime_harbor_infra_failure"] = why
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    if why is not None:
        print(f"{spec.instance_id}: infrastructure failure ({why}): no reward written")
        return 0
    reward = 1 if report["resolved"] else 0
    (out / "reward.txt").write_text(f"{reward}\n")
    print(f"{spec.instance_id}: resolved={report['resolved']} reward={reward}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
