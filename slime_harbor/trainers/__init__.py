"""Trainers over the same rollout core and GRPO maths (SLiME's is hooks.py).

    local.py        one GPU / CPU GRPO trainer (LoRA by default)
    sft.py          supervised warm start on agent-format trajectories
"""
