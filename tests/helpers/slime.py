"""SLiME's Sample as a stand-in, where slime is not installed."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


@dataclass
class SampleLike:
    """The fields of SLiME's Sample (slime/utils/types.py) the hooks read and write, so every path
    of `generate`, the filter and the post-process run where slime is not installed."""

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    prompt: str = ""
    tokens: list = field(default_factory=list)
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | dict | None = None
    loss_mask: list | None = None
    rollout_log_probs: list | None = None
    rollout_top_p_token_ids: list | None = None
    rollout_top_p_token_offsets: list | None = None
    remove_sample: bool = False
    status: Status = Status.PENDING
    metadata: dict = field(default_factory=dict)
    session_id: str | None = None
