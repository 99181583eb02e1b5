"""slime-harbor: Harbor tasks, agents and sandboxes as the rollout of SLiME GRPO training.

The chain, one module per arrow:
    tasks (Harbor task dirs; tasks/ writes procedural ones)
      -> rollout.py     runs Harbor Trials: agent.py (policy/client.py) in environments/, verifier
      -> converter.py   trajectory (Harbor RolloutDetail) -> episode.py Episode, whose
                        samples.py TrainingSamples are built where it leaves
      -> grpo.py        group advantages and the clipped policy loss
      -> trainers       hooks.py (SLiME), trainers/local.py (one GPU / CPU)
The policy is served by SGLang in production and by policy/server.py (policy/tiny_model.py) here.
"""

import os

# LiteLLM (used by Harbor's terminus-2) downloads its model-cost map on import unless told to use
# the copy it ships; rollouts must not reach the internet for that.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

__version__ = "0.1.0"
