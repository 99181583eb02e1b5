"""Trainers over the same rollout core and GRPO maths (SLiME's is hooks.py).

    local.py        `train-local`: one GPU / CPU GRPO trainer (LoRA by default; embedded or
                    external policy server): its command line and its run, start to summary
    local_config.py LocalTrainConfig (every train-local flag), the --test preset, its checks
    loop.py         the training loop: GRPO updates on groups of trials, synchronous or asynchronous
    learner.py      the policy being trained, its update step, checkpoints, and how it is served
    training_run.py what a run records: metrics.json records, checkpoints, a step's figures
    evaluate.py     held-out evaluation: pass@1 / pass@k per task and overall
    tracking.py     wandb logging under SLiME's metric names, the reward curve
    demo.py         `slime-harbor demo`: its config and stages (SFT warm start, GRPO, evaluation),
                    shared with the learning bench (bench/learning.py)
    sft.py          supervised warm start on agent-format trajectories
    agent_sft.py    SFT episodes in a third-party agent's own format (demo --agent mini-swe-agent)
"""
