"""One trial's grading: every defence between the agent's last command and the reward, as stages
in the order they run, and one report out.

The trial runner (rollout.py) makes one `Grading` per trial, right after Harbor's Trial, and calls
`grade()` once the trial ended. The stages, in the order they run (`STAGES`):

  before the verifier (the one hook Grading puts on Harbor's VERIFICATION_START event)
    1. end_agent       every process the agent left is killed, from the host (isolation.end_agent;
                       a plain task in the agent's sandbox only)
    2. read_changes    what the agent changed, read once from the host (isolation.AgentLeft); the
                       hack monitor's view of it is taken now, before anything is judged or removed
    3. check_runtime   the changes judged, the verifier's plumbing checked, the agent's leftovers
                       removed (isolation.check_runtime); tampering ends the trial unverified, 0
    4. keep_state      the sandbox's state, as the checks left it, kept for a KEPT twin
  Harbor runs the verifier
    5. watched_tests   the task's tests, every Python process with the grading watch's audit hook
                       (grader_watch.verifier.WatchedVerifier, found through the trial's Task)
  after the trial (`grade`)
    6. twin            a passing trial graded again on its impossible twin (twin_grading)
    7. detectors       the hack monitor's detectors over what the agent changed and ran, and the
                       grading watch's run-time reads of the grader
  -> GradingReport (frozen): tampering found, the watch's and the twin's outcomes, every hack flag

What each stage can see: 1-4 the agent's sandbox (from the host; nothing of the agent's runs);
5 the verifier's environment (the agent's sandbox, or a fresh container for a separate verifier)
and nothing of the reward; 6 the kept state or the collected tree and the twin task, only for a
trial whose verifier passed; 7 the files the agent changed (stage 2's view, or the tree Harbor
collected for a separate verifier), its commands, the hidden tests and the watch's report. None
decides the reward: reward.REWARD_RULES decide it once, from the trial's result and this report.

Where Harbor gives no extension point, the stage patches a Harbor object at run time; each is
listed in `HARBOR_PATCHES` with its reason.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path

from slime_harbor.grading import hack_monitor, impossible_twin
from slime_harbor.grading.grader_watch import verifier as grader_watch
from slime_harbor.grading.grader_watch.verifier import PROBE, WATCH_ATTRIBUTE, GradingWatch
from slime_harbor.grading.hack_monitor import HackFlag, HackWatch
from slime_harbor.grading.isolation import AgentLeft, check_runtime, end_agent, refuse, shared_sandbox
from slime_harbor.grading.twin_grading import TwinWatch
from slime_harbor.verifier_runtime import describe

log = logging.getLogger(__name__)

STAGES = ("end_agent", "read_changes", "check_runtime", "keep_state", "watched_tests", "twin", "detectors")
"""The grading's stages, in the order they run (the module docstring says what each sees)."""

HARBOR_PATCHES = {
    f"harbor.models.task.task.Task.{WATCH_ATTRIBUTE}":
        "The verifier Harbor builds (VerifierFactory, from the trial's VerifierConfig: an import path "
        "and JSON kwargs) gets no handle on the trial but its Task object, the trial's own in both "
        "verifier modes (shared, and separate: SWE-bench tasks). The trial's grading watch is set on it "
        "so that WatchedVerifier finds it (grader_watch.verifier.watch_of); a twin's grading builds its own Task and "
        "so runs unwatched, as before.",
    "harbor.trial.hooks.TrialHookEvent.result.verifier_result":
        "A VERIFICATION_START hook cannot skip the verifier and score the trial: check_runtime's "
        "refusal writes the 0 reward (with tampering_<kind>) into the trial's result, then raises "
        "VerifierRefused, which ends the trial before its verifier runs.",
}
"""Each run-time patch of a Harbor object that grading makes, and why it is unavoidable."""


@dataclass(frozen=True)
class GradingReport:
    """What one trial's grading found; the reward rules (reward.py) read it, nothing changes it."""

    tampering: tuple[str, ...] = ()
    """The kinds check_runtime found (the verifier was refused: the trial's result says 0); () clean
    or not checked (a separate verifier's grader reports its own in the trial's rewards)."""
    watch: dict | None = None
    """The grading watch's outcome (metadata grader_watch); None: the watch was off."""
    twin: dict | None = None
    """The impossible twin's outcome (metadata twin); None: not graded again (did not pass)."""
    twin_seconds: float = 0.0
    flags: tuple[HackFlag, ...] = ()
    """Every hack flag: the detectors', the twin's (passes_impossible), the watch's."""
    stages_run: tuple[str, ...] = field(default=())
    """The STAGES that ran, in order (a trial ended early runs fewer)."""

    def metadata(self) -> dict:
        """What the episode's metadata records of the grading (its keys as trial dirs have them)."""
        out: dict = {}
        if self.watch is not None:
            out["grader_watch"] = self.watch
        if self.twin is not None:
            out["twin"] = self.twin
        if self.twin_seconds:
            out["twin_seconds"] = round(self.twin_seconds, 3)
        return out


def tampering_counts(metadata: dict) -> dict[str, float]:
    """tampering/<kind> per kind the grading found (the reward rules scored it 0)."""
    return {f"tampering/{kind}": 1 for kind in metadata.get("tampering") or []}


COUNTERS = (tampering_counts, hack_monitor.episode_counts, impossible_twin.episode_counts, grader_watch.episode_counts)
"""Each defence's counters of one episode, in one shape: its metadata -> {name: count or seconds},
every value additive over episodes, so the SLiME hook adds them up batch by batch and a run's
summary over all its episodes (run_counts), with the same names."""


def episode_counts(metadata: dict) -> dict[str, float]:
    """Every defence's counters of one episode (COUNTERS)."""
    return {name: value for counter in COUNTERS for name, value in counter(metadata).items()}


def run_counts(episodes) -> dict:
    """The counters summed over the Episodes, seconds rounded to ms, and the two rates read from
    them: hack_rate (flagged / monitored; None when none was) and twin_coverage (passing trials
    graded on a twin / passing trials the twin looked at; only where it looked at one)."""
    totals: dict = {}
    for episode in episodes:
        for name, value in episode_counts(episode.metadata).items():
            totals[name] = totals.get(name, 0) + value
    totals = {name: round(value, 3) if name.startswith("time/") else value for name, value in totals.items()}
    monitored = totals.get("hack/monitored", 0)
    totals["hack_rate"] = totals.get("hack/flagged_episodes", 0) / monitored if monitored else None
    if totals.get("twin/passing"):
        totals["twin_coverage"] = totals["twin/graded"] / totals["twin/passing"]
    return totals


class Grading:
    """The grading of one Harbor trial (the module docstring): made once per trial before it runs,
    `grade(passed)` after it ended, `close()` however it ended."""

    def __init__(self, trial, task_dir: Path, twin, cfg, watch_mode: tuple[str | None, str | None] = (None, None)):
        from harbor.trial.hooks import TrialEvent

        self.trial, self.task_dir = trial, Path(task_dir)
        self.left: AgentLeft | None = shared_sandbox(trial)  # None: the verifier does not share the agent's sandbox
        self.monitor = HackWatch(trial, task_dir, cfg.hack_detector_functions())
        self.twin = TwinWatch(trial, twin, cfg)
        self.watch = GradingWatch.create(trial, task_dir, self.left, *watch_mode, probe=cfg.grader_watch == PROBE) \
            if cfg.grader_watch != "off" else None
        self.tampering: dict[str, list[str]] = {}
        self.stages_run: list[str] = []
        setattr(trial.task, WATCH_ATTRIBUTE, self.watch)  # HARBOR_PATCHES
        trial.add_hook(TrialEvent.VERIFICATION_START, self.before_verifier)

    async def before_verifier(self, event) -> None:
        """Stages 1-4, in order; tampering ends the trial here, unverified (scored 0)."""
        if self.left is not None:
            ended = await self._stage("end_agent", end_agent(self.left))
            if self.left.judged:
                await self._stage("read_changes", self.read_changes())
            workdir = self.left.environment.task_env_config.workdir or None
            found = await self._stage("check_runtime", check_runtime(self.left, self.trial.paths, workdir, ended))
            if found:
                self.tampering = found
                log.info("%s: %s", self.trial.config.trial_name, describe(found))
                raise refuse(event.result, found)
        await self._stage("keep_state", self.twin.keep())
        self.stages_run.append("watched_tests")  # Harbor runs the verifier next (WatchedVerifier)

    async def read_changes(self) -> None:
        await self.left.read()
        await self.monitor.read_sandbox(self.left)

    async def grade(self, passed: bool) -> GradingReport:
        """Stages 6-7 once the trial ended (`passed`: its verifier scored it a success, tampering
        aside); the report of the whole grading."""
        twin = await self._stage("twin", self.twin.grade(passed))
        self.stages_run.append("detectors")
        flags = await asyncio.to_thread(self.monitor.flags)
        flags += self.twin.flags(twin)
        watch = None
        if self.watch is not None:
            watch = self.watch.record()
            flags += self.watch.flags()
        return GradingReport(tampering=tuple(self.tampering), watch=watch, twin=twin, twin_seconds=self.twin.seconds,
                             flags=tuple(flags), stages_run=tuple(self.stages_run))

    async def close(self) -> None:
        """Drop what was kept for the twin (an image, a copied dir), however the trial ended."""
        await self.twin.discard()

    async def _stage(self, name: str, step):
        self.stages_run.append(name)
        return await step
