"""The grading watch of one trial: its verifier runs with the audit hook, and what the hook saw of
the agent's code becomes the hack flag ``reads_grader``.

`GradingWatch` is made per trial by the trial's grading (grade.Grading) and found by the trial's
verifier, `WatchedVerifier` (Harbor's verifier, named in the trial's VerifierConfig), through the
trial's own Task object (watch_of; grade.HARBOR_PATCHES says why).
Right before the task's tests run, the verifier fills the sandbox's watch dir (bound read-only at
watch_dir.WATCH_DIR since the sandbox started: abilities.WatchesGrading) with the hook, its config
and the report socket (grader_watch.report.WatchChannel), and runs the tests with the hook on
PYTHONPATH, the image's or the task's own PYTHONPATH kept behind it. In both verifier modes: the
agent's own sandbox (plain tasks; the agent's processes are gone by then, isolation.py) and a
separate grading container (SWE-bench-format tasks, whose grader passes the hook on to the tests).

Agent code, for the hook, is what the agent added or changed: for a plain task the changes
isolation.py read from the host (AgentLeft), for an SWE-bench-format task the files of the tree
Harbor collected that differ from the task's repo. A verification is **watched** only when the hook
reported from a Python process, every process it started reported its end, and every record was
the hook's own; anything else is **unwatched**, with the reason, and never counts as clean:
an environment that cannot bind the watch (Harbor's own, the cloud ones), a verifier that ran no
Python, a Python without audit hooks, a process cut off. The trial's outcome is in
``episode.metadata["grader_watch"]`` (and the viewer), counted by `episode_counts` (grade.COUNTERS).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from harbor.verifier.verifier import Verifier

from slime_harbor.exits import one_line
from slime_harbor.environments.watch_dir import WATCH_DIR

DETAILS_SHOWN = 5
"""Flagged events named in a flag's details (the rest counted)."""
VIEWER_KEY = "slime-harbor grading watch"
"""The entry of the trial's verifier/reward-details.json that Harbor's viewer shows."""
OPTED_OUT = "off"
"""A task's watch mode where its manifest opts it out (with a reason, counted unwatched)."""
FILES_ONLY = "files"
PROBE = "probe"
"""RunSettings.grader_watch's value for calibrate's empty-answer trials: every file of the task's
workdir counts as the agent's, so an event there means the task's own code (its repo, its test
framework) reaches frames or the grader when graded untouched: such a task is watched for file
reads only (FILES_ONLY), which calibrate records in its manifest with the reason."""
FRAME_CATEGORIES = ("frames", "heap", "tracer")
"""The hook's categories a task's own code may trip (FILES_ONLY drops them)."""
"""A task's watch mode where its own code inspects frames: only reads of the grader's files count."""


@dataclass
class GradingWatch:
    """The grading watch of one trial (see the module docstring). `frames` False: files only."""

    task_dir: Path
    trial_dir: Path
    left: object | None = None  # isolation.AgentLeft for a plain task (None: separate verifier)
    frames: bool = True
    mode_reason: str | None = None
    report: object | None = None  # the WatchReport, once the verifier ran
    unwatched: str | None = None  # why there is no report
    seconds: float = 0.0
    extra_grader_paths: list[str] = field(default_factory=list)
    opted_out: bool = False
    probe: bool = False  # the task's own workdir counts as the agent's (calibrate's empty-answer trials)

    @classmethod
    def create(cls, trial, task_dir: Path, left, mode: str | None = None, reason: str | None = None,
               probe: bool = False) -> GradingWatch:
        """The watch of `trial`. `mode` and `reason`: the task's manifest's
        (tasks/manifest.task_watch_mode); `probe`: see PROBE."""
        return cls(Path(task_dir), Path(trial.paths.trial_dir), left, frames=mode != FILES_ONLY or probe,
                   mode_reason=reason, opted_out=mode == OPTED_OUT and not probe, probe=probe)

    async def agent_files(self) -> list[str]:
        """The sandbox paths of the files the agent added or changed (what counts as its code)."""
        from slime_harbor.verifier_runtime import DELETED

        if self.left is not None and getattr(self.left, "changes", None) is not None:
            return sorted({c.path for c in self.left.changes if c.kind != DELETED and not c.is_dir})
        import asyncio

        from slime_harbor.grading.hack_monitor import swe_view

        view = await asyncio.to_thread(swe_view, self.task_dir, self.trial_dir)
        if view is None:
            return []
        self.extra_grader_paths = list(view.graded_test_paths)
        return sorted(c.path for c in view.changed_files if c.after is not None)

    def outcome(self) -> dict:
        """What the watch saw: watched (bool), why not, processes, events, spawned, seconds."""
        if self.report is None:
            return {"watched": False, "why": self.unwatched or "the verifier did not run"}
        report = self.report
        out = {"watched": bool(report.watched), "processes": report.processes, "seconds": round(self.seconds, 3)}
        if not report.watched:
            out["why"] = report.why
        if not self.frames:
            out["mode"] = f"files only: {self.mode_reason or 'the task inspects frames itself'}"
        if report.events:
            out["events"] = report.flag_details(DETAILS_SHOWN)
            out["categories"] = sorted({e.category for e in report.events})
        if report.spawned:
            out["spawned"] = list(report.spawned)[:DETAILS_SHOWN]
        return out

    def flags(self) -> list:
        """The reads_grader/runtime flag per event the hook reported of the agent's code (capped)."""
        from slime_harbor.grading.hack_monitor import HackFlag
        from slime_harbor.reward import READS_GRADER_RUNTIME

        if self.report is None or not self.report.events or self.probe:
            return []
        lines = [event.line() for event in self.report.events[:DETAILS_SHOWN]]
        if len(self.report.events) > DETAILS_SHOWN:
            lines[-1] += f" (+{len(self.report.events) - DETAILS_SHOWN} more)"
        return [HackFlag(READS_GRADER_RUNTIME, line) for line in lines]

    def record(self) -> dict:
        """The watch's outcome, also in the viewer where it saw something or could not watch."""
        from slime_harbor.grading.hack_monitor import add_viewer_entry

        outcome = self.outcome()
        if outcome.get("events") or not outcome["watched"]:
            add_viewer_entry(self.trial_dir, VIEWER_KEY, outcome)
        return outcome


WATCH_ATTRIBUTE = "slime_harbor_grading_watch"
"""The attribute of a trial's Task object that holds its GradingWatch (set by grade.Grading)."""


def watch_of(task) -> "GradingWatch | None":
    """The grading watch of the trial whose Task object this is, or None (grade.HARBOR_PATCHES)."""
    return getattr(task, WATCH_ATTRIBUTE, None)


class WatchedVerifier(Verifier):
    """Harbor's verifier (harbor.verifier.verifier.Verifier) with the grading watch around it, for a
    trial whose grading has a GradingWatch; any other trial's verifier runs as Harbor's (the impossible
    twin's second grading among them: its Task is another object)."""

    async def verify(self):
        watch = watch_of(self.task)
        if watch is None:
            return await super().verify()
        if watch.opted_out:
            watch.unwatched = f"the task opts out: {watch.mode_reason}"
            return await super().verify()
        from harbor.models.trial.paths import EnvironmentPaths

        from slime_harbor.environments.abilities import WatchesGrading
        from slime_harbor.grading.grader_watch.report import WatchChannel
        from slime_harbor.tasks.task_dir import task_workdir

        environment = self.environment
        if not isinstance(environment, WatchesGrading):
            watch.unwatched = f"the {type(environment).__name__} environment cannot bind the watch"
            return await super().verify()
        started = time.monotonic()
        paths = EnvironmentPaths.for_os(environment.os)
        try:
            agent_files = await watch.agent_files()
            agent_dirs = [task_workdir(watch.task_dir, default=environment.task_env_config.workdir or "/app")] \
                if watch.probe else []
            channel = WatchChannel.open(
                environment.watch_host_dir, agent_files=agent_files, agent_dirs=agent_dirs, frames=watch.frames,
                inside_dir=WATCH_DIR,
                grader_paths=sorted({str(paths.tests_dir), str(paths.verifier_dir), WATCH_DIR, "/solution",
                                     *watch.extra_grader_paths}))
        except Exception as exc:  # the watch's own failure never fails the grading: it is unwatched
            watch.unwatched = f"the watch could not start: {one_line(exc)}"
            return await super().verify()
        existing = next((e["PYTHONPATH"] for e in (self.override_env, self.verifier_env,
                                                     self.task.config.verifier.env, environment.image_env())
                         if e and e.get("PYTHONPATH")), None)
        self.override_env = {**self.override_env, **channel.env(existing)}
        watch.seconds += time.monotonic() - started
        try:
            return await super().verify()
        finally:
            started = time.monotonic()
            watch.report = channel.close()
            watch.seconds += time.monotonic() - started


def episode_counts(metadata: dict) -> dict[str, float]:
    """The watch's counters of one episode (grade.COUNTERS): grader_watch/watched or
    grader_watch/unwatched (and grader_watch/unwatched/<why, its first words>), and time/watch_s.
    None for an episode whose verification the watch did not look at."""
    if "grader_watch" not in metadata:
        return {}
    outcome = metadata["grader_watch"]
    counts: dict[str, float] = {"grader_watch/watched": int(bool(outcome["watched"])),
                                "grader_watch/unwatched": int(not outcome["watched"]),
                                "time/watch_s": outcome.get("seconds", 0.0)}
    if not outcome["watched"]:
        counts[f"grader_watch/unwatched/{why_key(outcome.get('why'))}"] = 1
    return counts


def why_key(why: str | None) -> str:
    """A short metric-safe key for an unwatched reason, its particulars left out ("pid 7 (python3 x.py)
    ended without its report's end" -> pid_ended_without_its_report_s_end)."""
    import re

    why = re.sub(r"\([^)]*\)|'[^']*'|: .*", "", why or "unknown")  # argv, quoted records, details
    words = re.sub(r"[^a-z0-9]+", "_", why.lower()).strip("_").split("_")
    return "_".join(w for w in words if not w.isdigit())[:40] or "unknown"


def watch_tasks(episodes) -> dict[str, str]:
    """Task -> "watched" (every verification of it watched; "watched (files only: why)" in that
    mode) or "unwatched: why" (the first reason one of its verifications gave)."""
    found: dict[str, str] = {}
    for episode in episodes:
        outcome = episode.metadata.get("grader_watch")
        if outcome is None:
            continue
        if not outcome["watched"]:
            if not found.get(episode.task_name, "").startswith("unwatched"):
                found[episode.task_name] = f"unwatched: {outcome.get('why')}"
        elif episode.task_name not in found:
            found[episode.task_name] = "watched" + (f" ({outcome['mode']})" if outcome.get("mode") else "")
    return dict(sorted(found.items()))


def protection(watched: dict[str, str], twins: dict[str, str], tasks) -> dict[str, str]:
    """Task -> what guards it against run-time hacks: "watch and twin", "watch", "twin" or "neither"
    (`watched`: watch_tasks' words; `twins`: task -> what its twin changed)."""
    out = {}
    for task in sorted(tasks):
        sides = [side for side, on in (("watch", watched.get(task, "").startswith("watched")), ("twin", task in twins))
                 if on]
        out[task] = " and ".join(sides) or "neither"
    return out
