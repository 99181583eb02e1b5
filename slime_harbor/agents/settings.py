"""The settings every agent is held to, declared once: AgentSettings. The native agent takes them as
its options of the same names (agents/native.py, NativeAgentOptions); the gateway holds a gateway
agent's session to them; RolloutConfig (run_config.py) is an AgentSettings with the rest of a
rollout's knobs, so the flags, the plugin's settings and the docs read their docstrings here.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path

from slime_harbor.policy.wire_api import GENERATE_API, WIRE_APIS



@dataclass
class EpisodeLimits:
    """How long an episode may go, whichever agent runs it (a trainer's flags too)."""

    step_limit: int = 30
    """Most agent turns per episode."""
    max_context_len: int | None = None
    """Prompt+completion token limit of an episode (SLiME's --rollout-max-context-len); None = the
    model's max_position_embeddings. A turn gets at most the room left as max_new_tokens; once no
    room is left the episode ends with exit status context_exceeded (truncated, still verified)."""


@dataclass
class AgentSettings(EpisodeLimits):
    """What an agent's episode is held to, whichever agent runs it: its limits, and how it reaches
    the policy (set by the runner)."""

    routing_key: str | None = None
    """X-SMG-Routing-Key sent with every turn (the SLiME hook sends sample.session_id under
    --router-policy consistent_hashing, so one episode stays on one engine); None = no header."""
    policy_api: str = GENERATE_API
    """How agents reach policy_url: sglang (its root; /generate, and /v1 for terminus-2) | openai
    (an OpenAI-compatible base URL ending in /v1, e.g. vLLM's: the native agent sends token ids to
    /v1/completions, naming the agent's model_name as the model)."""
    reissue_aborted_calls: bool = False
    """Ask again for a model call the policy server aborted on its own: on while weights are
    updated under running trials (train-local --max-staleness, SLiME's fully-async rollout), where
    such an abort is SGLang's pause_generation for an update; off, an aborted call ends the episode."""
    keep_interrupted_calls: bool = True
    """Asked again, an interrupted call goes on from the tokens it had sampled, under the new
    weights (each token keeps the version and logprob that sampled it); off, it is sampled again
    whole and those tokens are discarded (counted as weight_sync/discarded_tokens)."""
    lora_name: str | None = None
    """LoRA adapter (by name) loaded on the policy server to sample from (SGLang's /generate
    lora_path; the OpenAI model name for terminus-2); None = the served model itself."""


AGENT_SETTINGS = tuple(f.name for f in dataclasses.fields(AgentSettings))
"""Their names: the native agent's options of the same names are these declarations."""


def check_agent_settings(settings) -> None:
    """The agent settings' checks, for a RolloutConfig and the native agent's options alike
    (ValueError in one line)."""
    if not settings.step_limit >= 1:
        raise ValueError(f"step_limit must be at least 1, got {settings.step_limit}")
    if settings.max_context_len is not None and not settings.max_context_len >= 1:
        raise ValueError(f"max_context_len must be at least 1 (or None: the model's), got {settings.max_context_len}")
    if settings.policy_api not in WIRE_APIS:
        raise ValueError(f"policy_api must be one of {', '.join(WIRE_APIS)}, got {settings.policy_api!r}")


def context_window(cfg) -> int:
    """An episode's context window in tokens, which the native agent and the gateway hold it to:
    cfg.max_context_len, else the max_position_embeddings of the model at cfg.model_dir (cfg: a
    RolloutConfig, or anything with those two fields)."""
    return cfg.max_context_len or model_context_len(cfg.model_dir)


def model_context_len(model_dir: str | None) -> int:
    """The model's max_position_embeddings (its config.json at model_dir), else
    $SLIME_HARBOR_MAX_CONTEXT (32768)."""
    if model_dir and (Path(model_dir) / "config.json").exists():
        return int(json.loads((Path(model_dir) / "config.json").read_text()).get("max_position_embeddings", 4096))
    return int(os.environ.get("SLIME_HARBOR_MAX_CONTEXT", 32768))
