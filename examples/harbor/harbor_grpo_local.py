"""GRPO on this machine: Harbor rollouts from the current policy, LoRA updates, checkpoints.

    python examples/harbor/harbor_grpo_local.py --test            # two quick steps on 5 tasks
    python examples/harbor/harbor_grpo_local.py --model QWEN_DIR --num-rollouts 50 --output-dir runs/q
    python examples/harbor/harbor_grpo_local.py --resume runs/q   # continue from the latest checkpoint

Every flag is a field of slime_harbor.trainers.local.LocalTrainConfig (see --help); this file
only forwards to it, as `slime-harbor train-local` does.
"""

import os
import sys

# LiteLLM (used by Harbor's terminus-2) fetches a cost map from the internet unless told not to.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from slime_harbor.trainers.local import main  # noqa: E402

if __name__ == "__main__":
    main(sys.argv[1:])
