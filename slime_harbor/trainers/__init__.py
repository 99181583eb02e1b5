"""Trainers over the same rollout core and GRPO maths (SLiME's is hooks.py).

    local.py        one GPU / CPU GRPO trainer (LoRA by default; embedded or external policy server)
    evaluate.py     held-out evaluation: pass@1 / pass@k per task and overall
    tracking.py     wandb logging under SLiME's metric names, the reward curve
    learning.py     the stages of the demo and the learning bench: SFT warm start, GRPO, evaluation
    sft.py          supervised warm start on agent-format trajectories
"""
