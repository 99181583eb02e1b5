"""terminus-2, Harbor's agent that runs in the trial's own process: all slime-harbor knows of it.

It is ours to run (nothing is installed in the sandbox for it): it samples through the recording
gateway, given as its `api_base` kwarg, and drives the sandbox through tmux. agents/placement.py
builds its kwargs and trial_setup its environment from here and the converter reads its end from here, all through
agents/host.HOST_GATEWAY_AGENTS; no other module names it.
"""

from __future__ import annotations

from typing import Any

NAME = "terminus-2"

ENVIRONMENT_KWARGS = {"provide_tmux": True}
"""What it needs of the sandbox: tmux (our sandboxes provide it without opening the network)."""


def agent_kwargs(max_context_len: int, max_new_tokens: int, temperature: float, step_limit: int,
                 api_key: str) -> dict[str, Any]:
    """Its AgentConfig kwargs for training through the gateway, with its session's `api_key`."""
    return {
        # The gateway records the tokens; terminus-2's own token-id fields are not needed.
        "collect_rollout_details": False,
        # Summarisation rewrites the history: every summary would start a new sample.
        "enable_summarize": False,
        "proactive_summarization_threshold": 0,
        "temperature": temperature,
        "max_turns": step_limit,
        "record_terminal_session": False,
        "suppress_max_turns_warning": True,
        "model_info": {
            "max_input_tokens": max_context_len,
            "max_output_tokens": max_new_tokens,
            # Every cost named, cache costs too: LiteLLM warns on each run about any it must default.
            "input_cost_per_token": 0.0,
            "output_cost_per_token": 0.0,
            "cache_creation_input_token_cost": 0.0,
            "cache_read_input_token_cost": 0.0,
        },
        "llm_call_kwargs": {"max_tokens": max_new_tokens},
        # It takes no api_key of its own; LiteLLM, which it calls with these, sends it as the bearer
        # token (its env HOSTED_VLLM_API_KEY is not this process's).
        "llm_kwargs": {"api_key": api_key},
    }


def exit_status(result) -> str | None:
    """How its episode ended: it says nothing when it reaches max_turns (its loop just ends), so a
    run of max_turns turns is step_limit (one that confirmed completion on exactly its last turn
    too: scored as well, only labelled truncated)."""
    meta = (result.agent_result.metadata if result.agent_result else None) or {}
    agent = getattr(getattr(result, "config", None), "agent", None)
    max_turns = (getattr(agent, "kwargs", None) or {}).get("max_turns")
    if max_turns and (meta.get("n_episodes") or 0) >= max_turns:
        return "step_limit"
    return None
