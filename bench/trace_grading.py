"""How one trial's grading moves between our files: one real graded trial (the oracle agent on a
bundled task, the local sandbox, the impossible twin and the grading watch on), traced with
sys.setprofile on the main thread (the trial's event loop). Only frames of slime_harbor count.

    .venv/bin/python bench/trace_grading.py [--task dedupe-lines] [--env local]

It prints:

- stages: the GradingReport's stages_run, in the order they ran (grading/grade.py's STAGES);
- reading list: the files a newcomer reads to follow how the trial is graded and its reward
  decided, in the order the trial first calls into them: the trial runner (rollout.py), the file
  it hands the grading to (grading/grade.py) and the one it hands the finished trial and the
  report to (converter.py), and what that one decides the reward with (episode.py: scored or not;
  reward.py: the rules);
- stage implementations: the files grade.py's stages call into, read when one stage's detail
  matters (each named by its stage in grade.py's docstring);
- every file entered while grading: all of slime_harbor's files any traced call on the main
  thread ran in, from the trial's grading being made on (helpers included), for comparison.

Before issue 53 (grading spread over hooks registered in turn, a process-global WATCHES dict and
the reward settled twice) a reader followed rollout.py -> isolation.py -> hack_monitor.py ->
twin_grading.py -> grader_watch/verifier.py -> converter.py -> episode.py -> reward.py ->
hack_monitor.py again (apply_hack_action settled the reward a second time) -> filters.py: 9 files,
one of them twice, in an order set by which hook was registered first and a comment in rollout.py.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import slime_harbor  # noqa: E402

PACKAGE = Path(slime_harbor.__file__).resolve().parent
HANDOFFS = {"grading/grade.py", "converter.py"}
"""The files the runner hands the trial to: its grading, then the finished trial and the report."""
DECISION = {"episode.py", "reward.py"}
"""What the converter decides the episode's end and its reward with."""


def package_file(filename: str) -> str | None:
    try:
        return str(Path(filename).resolve().relative_to(PACKAGE))
    except ValueError:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="dedupe-lines")
    parser.add_argument("--env", default="local")
    args = parser.parse_args()

    from slime_harbor.rollout import run_episode
    from slime_harbor.run_config import DEFAULT_TASKS, RolloutConfig

    from slime_harbor.grading import grade as grade_module

    entered: list[str] = []
    edges: list[tuple[str, str]] = []
    window = {"open": False}
    reports = []
    graded = grade_module.Grading.grade

    async def keep_report(self, passed):  # this file is not the package's: the trace does not see it
        report = await graded(self, passed)
        reports.append(report)
        return report

    grade_module.Grading.grade = keep_report

    def profile(frame, event, arg):
        if event != "call":
            return
        callee = package_file(frame.f_code.co_filename)
        if callee is None:
            return
        if frame.f_code.co_name == "__init__" and callee == "grading/grade.py":
            window["open"] = True
        if not window["open"]:
            return
        if callee not in entered:
            entered.append(callee)
        caller = frame.f_back and package_file(frame.f_back.f_code.co_filename)
        if caller is not None and caller != callee and (caller, callee) not in edges:
            edges.append((caller, callee))

    cfg = RolloutConfig(agent="oracle", env=args.env, progress=False, hack_action="penalty")
    with tempfile.TemporaryDirectory() as tmp:
        sys.setprofile(profile)
        try:
            episode = asyncio.run(run_episode(DEFAULT_TASKS / args.task, cfg, group_index=0, index=0,
                                              trials_dir=Path(tmp) / "trials"))
        finally:
            sys.setprofile(None)
    reading = ["rollout.py"]
    for caller, callee in edges:
        if (caller in reading and callee in HANDOFFS) or (caller == "converter.py" and callee in DECISION):
            reading += [callee] if callee not in reading else []
    stages = [callee for caller, callee in edges if caller == "grading/grade.py" and callee not in reading]
    stages = list(dict.fromkeys(stages))
    print(f"trial: {args.task} ({args.env}), status {episode.status.value}, reward {episode.reward}, "
          f"hack flags {episode.metadata.get('hack_flags')}, twin {(episode.metadata.get('twin') or {}).get('result')}, "
          f"watch {'watched' if (episode.metadata.get('grader_watch') or {}).get('watched') else 'unwatched'}")
    print("stages (as run):", ", ".join(reports[0].stages_run) if reports else "none (the trial ended before grading)")
    print(f"reading list ({len(reading)} files):")
    for i, name in enumerate(reading, 1):
        print(f"  {i}. slime_harbor/{name}")
    print(f"stage implementations ({len(stages)}): {', '.join(stages)}")
    print(f"every file entered while grading ({len(entered)}): {', '.join(entered)}")


if __name__ == "__main__":
    main()
