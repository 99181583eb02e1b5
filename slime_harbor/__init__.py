"""slime-harbor: Harbor tasks, agents and sandboxes as the rollout of SLiME GRPO training.

The chain, one module per arrow:
    tasks (Harbor task dirs)
      -> rollout.py     runs Harbor Trials: agent.py (policy) in sandbox.py (bubblewrap), verifier
      -> converter.py   trajectory (Harbor RolloutDetail) -> samples.py TrainingSample
      -> grpo.py        group advantages and the clipped policy loss
      -> trainers       hooks.py (SLiME), examples/harbor/harbor_grpo_local.py (local)
The policy is served by SGLang in production and by policy_server.py (tiny_model.py) here.
"""

__version__ = "0.1.0"
