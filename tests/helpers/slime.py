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


def held_out_sample_through_the_hook(tmp_path, monkeypatch, policy_server: str, model_dir, task_dir, agent_files: dict,
                                     **settings):
    """One trial of `task_dir` through SLiME's generate hook, by tests/held_out_agent.py writing
    `agent_files` (sandbox path -> host file) through its gateway, against the embedded server at
    `policy_server`: the Sample it returns (SLiME's own where slime is importable). `settings` are
    the hook's harbor_* args; the hook's metrics start from zero."""
    import asyncio
    import collections
    import json

    from slime_harbor import hooks

    sample_type = SampleLike
    if importlib.util.find_spec("slime") is not None:
        from slime.utils.types import Sample as sample_type

    monkeypatch.setenv("SLIME_HARBOR_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HELD_OUT_AGENT_FILES", json.dumps({path: str(file) for path, file in agent_files.items()}))
    monkeypatch.setattr(hooks, "METRICS", collections.Counter())
    host, port = policy_server.removeprefix("http://").split(":")
    args = types.SimpleNamespace(sglang_router_ip=host, sglang_router_port=int(port), hf_checkpoint=str(model_dir),
                                 harbor_agent="held_out_agent:HeldOutAgent", harbor_trials_dir=str(tmp_path / "trials"),
                                 **settings)
    sample = sample_type(index=0, group_index=0, prompt="p", label=task_dir.name, metadata={"task_dir": str(task_dir)})

    async def one_trial():
        try:
            return await hooks.generate(args, sample, {"temperature": 1.0, "max_new_tokens": 8})
        finally:
            await hooks.close_gateway()  # the process gateway the hook started in this loop

    [out] = asyncio.run(one_trial())
    return out
