"""The transient-failure retry budget: how many times an ABORTED episode (a sandbox that did not
start, a policy server that did not answer, a trial cut off) may run again, per task.

`rollout.run_episode` spends it, for every runner that hands it one (the SLiME hook, `rollout`,
train-local, the verifiers environment); the limits are RolloutConfig's
max_retries_per_task / retry_window_sec / retry_backoff_sec.
"""

from __future__ import annotations

import collections
import time
from collections import Counter
from collections.abc import Callable


class RetryBudget:
    """Transient-failure reruns per task: at most ``budget`` in any ``window_sec`` (a sliding
    window), so a few blips early in a multi-day run do not disable a task's retries for good,
    while a task that keeps failing stops being rerun until its window clears."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, window_sec: float = 3600.0):
        self.clock = clock
        self.window_sec = window_sec
        """The window reruns were last budgeted in (max_retries_per_task's window), for metrics()."""
        self.spent: dict[str, collections.deque] = {}
        self.counts: Counter = Counter()
        """Reruns granted (`retries`) and refused (`retry_budget_exhausted`) over the budget's life."""

    def recent(self, task: str) -> int:
        """Reruns of `task` within the window (older ones forgotten)."""
        times = self.spent.setdefault(task, collections.deque())
        while times and times[0] <= self.clock() - self.window_sec:
            times.popleft()
        return len(times)

    def try_spend(self, task: str, budget: int, window_sec: float) -> bool:
        """Spend one rerun of `task` if the window (now `window_sec`) has room; False when it has none."""
        self.window_sec = window_sec
        if self.recent(task) >= budget:
            self.counts["retry_budget_exhausted"] += 1
            return False
        self.spent[task].append(self.clock())
        self.counts["retries"] += 1
        return True

    def metrics(self) -> dict[str, int]:
        """Each task's reruns in the window."""
        return {f"retries/{task}": self.recent(task) for task in list(self.spent)}
