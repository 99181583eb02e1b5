"""SLiME stand-ins where the real thing is missing: its Sample (slime not installed), and ray and
SGLang's engine (slime installed on a machine without them)."""

from __future__ import annotations

import importlib.util
import sys
import types
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


def install_slime_stubs() -> list[str]:
    """Put stand-ins for ray and SGLang's engine in sys.modules where the real ones are missing,
    so SLiME's rollout modules import on a CPU machine: ray (remote/get, util.scheduling_strategies:
    RolloutManager is a Ray actor class) and sglang.srt.{server_args,utils,constants} (only names
    imported at module load). Returns the names added, for the caller to remove afterwards."""
    added = []

    def module(name, **attrs):
        if name in sys.modules:
            return sys.modules[name]
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        sys.modules[name] = m
        added.append(name)
        return m

    if importlib.util.find_spec("ray") is None:
        ray = module("ray", remote=lambda *a, **k: a[0] if a and callable(a[0]) else (lambda cls: cls), get=lambda x: x)
        ray.util = module("ray.util")
        ray.util.scheduling_strategies = module("ray.util.scheduling_strategies", PlacementGroupSchedulingStrategy=object)
    if importlib.util.find_spec("sglang") is None:
        module("sglang")
        module("sglang.srt")
        module("sglang.srt.server_args", ServerArgs=type("ServerArgs", (), {}))
        module("sglang.srt.utils", kill_process_tree=lambda *a, **k: None)
        module("sglang.srt.constants", GPU_MEMORY_TYPE_CUDA_GRAPH="cuda_graph", GPU_MEMORY_TYPE_KV_CACHE="kv_cache",
               GPU_MEMORY_TYPE_WEIGHTS="weights")
    return added
