"""The grading watch of one trial: its verifier runs with the audit hook, and what the hook saw of
the agent's code becomes the hack flag ``reads_grader``.

`GradingWatch` is made per trial by the runner (rollout.py) and found by the trial's verifier,
`WatchedVerifier` (Harbor's verifier, named in the trial's VerifierConfig), by the trial dir.
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
``episode.metadata["grader_watch"]`` (and the viewer), counted by `watch_counts`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from harbor.verifier.verifier import Verifier

from slime_harbor.exits import one_line
from slime_harbor.environments.watch_dir import WATCH_DIR

WATCHES: dict[Path, "GradingWatch"] = {}
"""Trial dir -> its watch, while the trial runs (the verifier Harbor builds finds it here)."""
DETAILS_SHOWN = 5
"""Flagged events named in a flag's details (the rest counted)."""
VIEWER_KEY = "slime-harbor grading watch"
"""The entry of the trial's verifier/reward-details.json that Harbor's viewer shows."""
OPTED_OUT = "off"
"""A task's watch mode where its manifest opts it out (with a reason, counted unwatched)."""
FILES_ONLY = "files"
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

    @classmethod
    def register(cls, trial, task_dir: Path, left, mode: str | None = None, reason: str | None = None) -> GradingWatch:
        watch = cls(Path(task_dir), Path(trial.paths.trial_dir), left, frames=mode != FILES_ONLY, mode_reason=reason,
                    opted_out=mode == OPTED_OUT)
        WATCHES[watch.trial_dir] = watch
        return watch

    def close(self) -> None:
        if WATCHES.get(self.trial_dir) is self:
            del WATCHES[self.trial_dir]

    async def agent_files(self) -> list[str]:
        """The sandbox paths of the files the agent added or changed (what counts as its code)."""
        from slime_harbor.verifier_runtime import DELETED

        if self.left is not None and getattr(self.left, "changes", None) is not None:
            return sorted({c.path for c in self.left.changes if c.kind != DELETED and not c.is_dir})
        import asyncio

        from slime_harbor.hack_monitor import swe_view

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
        if report.spawned:
            out["spawned"] = list(report.spawned)[:DETAILS_SHOWN]
        return out

    def flags(self) -> list:
        """The reads_grader flag per event the hook reported of the agent's code (capped)."""
        from slime_harbor.grader_watch.report import REPORT_FLAG
        from slime_harbor.hack_monitor import HackFlag

        if self.report is None or not self.report.events:
            return []
        return [HackFlag(REPORT_FLAG, f"run time: {line}") for line in self.report.flag_details(DETAILS_SHOWN)]

    def record(self, episode) -> list:
        """The watch's outcome in the episode's metadata (and the viewer); returns its flags."""
        from slime_harbor.hack_monitor import add_viewer_entry

        outcome = self.outcome()
        episode.metadata["grader_watch"] = outcome
        if outcome.get("events") or not outcome["watched"]:
            add_viewer_entry(episode.trial_dir, VIEWER_KEY, outcome)
        return self.flags()


class WatchedVerifier(Verifier):
    """Harbor's verifier (harbor.verifier.verifier.Verifier) with the grading watch around it, for a
    trial that registered a GradingWatch; any other trial's verifier runs as Harbor's (the impossible
    twin's second grading among them)."""

    async def verify(self):
        watch = WATCHES.get(Path(self.trial_paths.trial_dir))
        if watch is None:
            return await super().verify()
        if watch.opted_out:
            watch.unwatched = f"the task opts out: {watch.mode_reason}"
            return await super().verify()
        from harbor.models.trial.paths import EnvironmentPaths

        from slime_harbor.environments.abilities import WatchesGrading
        from slime_harbor.grader_watch.report import WatchChannel

        environment = self.environment
        if not isinstance(environment, WatchesGrading):
            watch.unwatched = f"the {type(environment).__name__} environment cannot bind the watch"
            return await super().verify()
        started = time.monotonic()
        paths = EnvironmentPaths.for_os(environment.os)
        try:
            agent_files = await watch.agent_files()
            channel = WatchChannel.open(
                environment.watch_host_dir, agent_files=agent_files, frames=watch.frames, inside_dir=WATCH_DIR,
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


def watch_counts(episodes) -> dict:
    """Over the Episodes whose verification the watch looked at: grader_watch/watched,
    grader_watch/unwatched (and grader_watch/unwatched/<why, its first words>), and time/watch_s."""
    outcomes = [e.metadata["grader_watch"] for e in episodes if "grader_watch" in e.metadata]
    if not outcomes:
        return {}
    counts: dict = {"grader_watch/watched": sum(o["watched"] for o in outcomes),
                    "grader_watch/unwatched": sum(not o["watched"] for o in outcomes),
                    "time/watch_s": round(sum(o.get("seconds", 0.0) for o in outcomes), 3)}
    for o in outcomes:
        if not o["watched"]:
            key = f"grader_watch/unwatched/{why_key(o.get('why'))}"
            counts[key] = counts.get(key, 0) + 1
    return counts


def why_key(why: str | None) -> str:
    """A short metric-safe key for an unwatched reason ("no Python process reported" -> no_python_process_reported)."""
    import re

    words = re.sub(r"[^a-z0-9]+", "_", (why or "unknown").lower()).strip("_").split("_")
    return "_".join(w for w in words if not w.isdigit())[:40] or "unknown"
