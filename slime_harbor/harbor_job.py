"""A rollout's trials dir as a Harbor job dir, so Harbor's own tools read it (`harbor view`).

Harbor's job runner (harbor/job.py) keeps two files beside the trial dirs of a job:

    config.json   JobConfig: agents, environment, tasks, concurrency, timeout multiplier
    result.json   JobResult: id, started / updated / finished_at, n_total_trials and JobStats
                  (completed, errored, running, pending, cancelled; per agent-and-dataset rewards,
                  mean reward, pass@k; token totals)

`HarborJob` writes the same files with Harbor's own pydantic models into OUT/trials/: at the
start (every trial pending), as each trial starts and ends (live progress), and at the end (the
stats recomputed from every trial's result.json, so trials cancelled mid-flight count too).
As in Harbor, `finished_at` stays unset when the run was interrupted: the viewer then shows the
job as not finished. result.json leaves the per-trial results out, as Harbor's runner does.

Our verdict on a trial is visible in the viewer too. Harbor shows a trial as "Error" with its
exception type, and its Exception tab shows the trial's exception.txt. Every trial we count
aborted or failed gets our verdict ("slime-harbor: aborted: <reason> (the sample is removed, not
trained)") at the top of its exception.txt; one Harbor recorded no exception for (an agent that
stopped on a SLiME abort) also gets one in its result.json, exception type `SlimeHarborAborted`
/ `SlimeHarborFailed` with the verdict as message. Harbor's own exception info is kept.
"""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import uuid4

from slime_harbor.samples import SampleStatus

if TYPE_CHECKING:
    from harbor.models.trial.result import TrialResult

    from slime_harbor.episode import Episode
    from slime_harbor.run_config import RolloutConfig

CONFIG_FILE = "config.json"
RESULT_FILE = "result.json"
EXCEPTION_FILE = "exception.txt"
VERDICT_EXCEPTION = {SampleStatus.ABORTED: "SlimeHarborAborted", SampleStatus.FAILED: "SlimeHarborFailed"}


def _now() -> datetime:
    return datetime.now(timezone.utc)


class HarborJob:
    """The job files of one rollout; call trial_started / trial_finished / finish as trials run."""

    def __init__(self, job_dir: Path, cfg: RolloutConfig, tasks: list[Path], n_trials: int | None = None):
        """`n_trials`: how many trials the job has (None: n_samples of each task; 0 for one that
        grows by add_trials)."""
        from harbor.models.job.config import JobConfig
        from harbor.models.job.result import JobResult, JobStats
        from harbor.models.trial.config import TaskConfig

        from slime_harbor.agents.placement import agent_config
        from slime_harbor.trial_setup import environment_config

        self.job_dir = Path(job_dir)
        self.job_dir.mkdir(parents=True, exist_ok=True)
        agent = agent_config(cfg)
        self.config = JobConfig(
            job_name=self.job_dir.name, jobs_dir=self.job_dir.parent.resolve(), n_attempts=1,
            n_concurrent_trials=cfg.concurrency, timeout_multiplier=cfg.timeout_multiplier, quiet=True,
            environment=environment_config(cfg.env, agent=agent), agents=[agent],
            tasks=[TaskConfig(path=Path(t).resolve()) for t in tasks],
        )
        n_total = len(tasks) * cfg.n_samples if n_trials is None else n_trials
        started = _now()
        self.result = JobResult(id=uuid4(), started_at=started, updated_at=started, n_total_trials=n_total,
                                stats=JobStats.from_trial_results([], n_total_trials=n_total))
        self.running = 0
        self.trial_results: list[TrialResult] = []
        self._rewards: dict[str, dict[str, Any]] = defaultdict(dict)  # evals key -> trial -> rewards
        # The same file Harbor's runner writes (defaults left out, as Harbor does).
        (self.job_dir / CONFIG_FILE).write_text(self.config.model_dump_json(indent=4, exclude_defaults=True))
        self._write()

    @classmethod
    def backfill(cls, out: Path) -> HarborJob:
        """Write the job files of a rollout output made before rollouts wrote them, from its
        summary.json (the config), its trial dirs and samples.jsonl (our verdicts)."""
        import dataclasses

        from harbor.models.trial.config import TrialConfig

        from slime_harbor.policy.sampling import SamplingParams
        from slime_harbor.samples import read_jsonl
        from slime_harbor.run_config import RolloutConfig

        out = Path(out)
        saved = json.loads((out / "summary.json").read_text())
        known = {f.name for f in dataclasses.fields(RolloutConfig)}
        readers = {"tasks_dir": Path, "out_dir": Path, "sampling": lambda v: SamplingParams(**v)}
        cfg = RolloutConfig(**{k: readers.get(k, lambda v: v)(v) for k, v in saved["config"].items() if k in known})
        trial_dirs = sorted(p for p in (out / "trials").iterdir() if (p / CONFIG_FILE).is_file())
        tasks = sorted({TrialConfig.model_validate_json((p / CONFIG_FILE).read_text()).task.path for p in trial_dirs})
        job = cls(out / "trials", cfg, tasks)
        for sample in read_jsonl(out / "samples.jsonl") if (out / "samples.jsonl").is_file() else []:
            trial_dir = sample.metadata.get("trial_dir")
            if sample.metadata.get("segment", 0) == 0 and trial_dir and Path(trial_dir).is_dir():
                mark_verdict(Path(trial_dir), sample.status, sample.metadata.get("status_reason"))
        job.finish(interrupted=bool(saved.get("interrupted")))
        # The run's own times, not the backfill's: its first trial's start, its last trial's end.
        results = [r for r in job.trial_results_on_disk() if r.started_at]
        if results:
            job.result.started_at = min(r.started_at for r in results)
            if job.result.finished_at is not None:
                job.result.finished_at = max(r.finished_at or r.started_at for r in results)
            job._write()
        return job

    def add_trials(self, n: int) -> None:
        """A job whose trials are not known up front (asynchronous training) grows as they start."""
        self.result.n_total_trials += n

    def trial_started(self) -> None:
        self.running += 1
        self._write()

    def trial_finished(self, episode: Episode) -> None:
        """Count one ended trial (its result.json, with our verdict added where Harbor has none)."""
        self.running -= 1
        result = mark_verdict(Path(episode.trial_dir), episode.status, episode.error) if episode.trial_dir else None
        stats = self.result.stats
        if result is None:  # the trial was never created (the Episode says why)
            stats.n_completed_trials += 1
            stats.n_errored_trials += 1
        else:
            self.trial_results.append(result)
            stats.increment(result)
            key = _evals_key(result)
            self._rewards[key][result.trial_name] = result.verifier_result.rewards if result.verifier_result else None
            stats.evals[key].metrics = [_mean(list(self._rewards[key].values()))]
        self._write()

    def finish(self, interrupted: bool) -> None:
        """Final stats from every trial dir's result.json (trials cut off mid-flight included)."""
        from harbor.models.job.result import JobStats
        from harbor.utils.pass_at_k import compute_pass_at_k_by_evals

        results = self.trial_results_on_disk()
        never_created = self.result.stats.n_completed_trials - len(self.trial_results)
        stats = JobStats.from_trial_results(results, n_total_trials=self.result.n_total_trials)
        stats.n_completed_trials += never_created
        stats.n_errored_trials += never_created
        rewards: dict[str, list] = defaultdict(list)
        for r in results:
            rewards[_evals_key(r)].append(r.verifier_result.rewards if r.verifier_result else None)
        for key, values in rewards.items():
            stats.evals[key].metrics = [_mean(values)]
        for key, pass_at_k in compute_pass_at_k_by_evals(results).items():
            stats.evals[key].pass_at_k = pass_at_k
        self.running = 0
        self.result.stats = stats
        if not interrupted:
            self.result.finished_at = _now()
        self._write()

    def trial_results_on_disk(self) -> list[TrialResult]:
        from harbor.models.trial.result import TrialResult

        results = []
        for path in sorted(self.job_dir.glob(f"*/{RESULT_FILE}")):
            try:
                results.append(TrialResult.model_validate_json(path.read_text()))
            except Exception:  # a trial killed while writing it: counted as neither
                continue
        return results

    def _write(self) -> None:
        self.result.updated_at = _now()
        self.result.stats.update_progress_counts(n_total_trials=self.result.n_total_trials,
                                                 n_running_trials=self.running)
        tmp = self.job_dir / f".{RESULT_FILE}.tmp"  # the viewer may read it at any moment
        tmp.write_text(self.result.model_dump_json(indent=4, exclude={"trial_results"}))
        tmp.replace(self.job_dir / RESULT_FILE)


def mark_verdict(trial_dir: Path, status: SampleStatus, why: str | None) -> TrialResult | None:
    """The trial's TrialResult; an episode that ended aborted / failed (`status`, for the reason
    `why`) without an exception in it gets ours written into its result.json, so the viewer shows
    it as an error with the reason."""
    from harbor.models.trial.result import ExceptionInfo, TrialResult

    path = trial_dir / RESULT_FILE
    if not path.is_file():
        return None
    result = TrialResult.model_validate_json(path.read_text())
    if status not in VERDICT_EXCEPTION:
        return result
    verdict = (f"slime-harbor: {status.value}: {why or 'no reason recorded'} "
               f"(the sample is removed, not trained)")
    if result.exception_info is None:
        result.exception_info = ExceptionInfo(exception_type=VERDICT_EXCEPTION[status],
                                              exception_message=verdict, exception_traceback="", occurred_at=_now())
        path.write_text(result.model_dump_json(indent=4))
    # The viewer's Exception tab shows exception.txt: our verdict first, then Harbor's traceback.
    exception_txt = trial_dir / EXCEPTION_FILE
    previous = exception_txt.read_text() if exception_txt.is_file() else ""
    if not previous.startswith("slime-harbor: "):  # once (view backfills outputs marked already)
        exception_txt.write_text(f"{verdict}\n\n{previous}".rstrip() + "\n")
    return result


def _evals_key(result: TrialResult) -> str:
    from harbor.models.job.result import JobStats

    model = result.agent_info.model_info.name if result.agent_info.model_info else None
    return JobStats.format_agent_evals_key(result.agent_info.name, model, result.source or "adhoc")


def _mean(rewards: list) -> dict:
    from harbor.metrics.mean import Mean

    return Mean().compute(rewards)


def is_job_dir(path: Path) -> bool:
    return (Path(path) / CONFIG_FILE).is_file() and (Path(path) / RESULT_FILE).is_file()
