#!/usr/bin/env bash
# End-to-end check of local GRPO training on embedded defaults (tiny offline model, bubblewrap
# sandbox, real Harbor trials and verifiers), through the shipped entry point:
#   1. one step on two bundled tasks: rollout, metrics, checkpoint_1, final/
#   2. --resume from that run: step 2 is run and appended, the step counter continues
#   3. two steps on the toy vowel-share task (the tiny random model scores 0 on real tasks, so
#      only this task gives GRPO a signal): optimizer steps happen, then a resume restores the
#      optimizer state (AdamW's step count carries on)
# Exits non-zero on the first failed check. Takes about a minute on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
export LITELLM_LOCAL_MODEL_COST_MAP=True
WORK=$(mktemp -d -t slime-harbor-integration.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
TRAIN=("$PYTHON" examples/harbor/harbor_grpo_local.py --test --n-samples 2 --step-limit 2 --max-new-tokens 32)

check() {  # check "what" python-expression-over-run-dir RUN_DIR
    if "$PYTHON" - "$3" <<PY
import json, sys, torch
from pathlib import Path
out = Path(sys.argv[1])
metrics = json.loads((out / "metrics.json").read_text())
summary = json.loads((out / "summary.json").read_text())
def adam_steps(ckpt):
    state = torch.load(out / ckpt / "optimizer.pt", weights_only=True)["state"]
    return {int(s["step"]) for s in state.values()}
sys.exit(0 if ($2) else 1)
PY
    then echo "ok: $1"; else echo "FAILED: $1 ($3)"; exit 1; fi
}

echo "== 1. one step on two bundled tasks"
"${TRAIN[@]}" --task-names dedupe-lines fix-sort-key --num-rollouts 1 --output-dir "$WORK/real" > "$WORK/real.log" 2>&1 \
    || { tail -30 "$WORK/real.log"; echo "FAILED: run 1"; exit 1; }
R="$WORK/real"
check "rollout ran 2 tasks x 2 samples through Harbor's verifier" \
    "len([l for l in open(out / 'rollouts/step_1/samples.jsonl') if l.strip()]) >= 4 and metrics[0]['n_scored'] + metrics[0]['aborted'] + metrics[0]['failed'] >= 4" "$R"
check "metrics.json has step 1 with reward, timings, sample counts" \
    "[m['step'] for m in metrics] == [1] and metrics[0]['reward_mean'] is not None and metrics[0]['timings']['rollout_s'] > 0" "$R"
check "checkpoint_1 (adapter, optimizer, trainer state) and final/ written" \
    "all((out / p).is_file() for p in ['checkpoint_1/adapter_model.safetensors', 'checkpoint_1/optimizer.pt', 'checkpoint_1/trainer_state.json', 'final/adapter_config.json'])" "$R"

echo "== 2. resume the bundled-task run to step 2"
"${TRAIN[@]}" --task-names dedupe-lines fix-sort-key --resume "$R" > "$WORK/real2.log" 2>&1 \
    || { tail -30 "$WORK/real2.log"; echo "FAILED: run 2"; exit 1; }
check "resume continued at step 2 (step 1 kept, not re-run)" \
    "[m['step'] for m in metrics] == [1, 2] and summary['last_step'] == 2 and (out / 'checkpoint_2/trainer_state.json').is_file()" "$R"
grep -q "resumed from .*checkpoint_1 at step 1" "$WORK/real2.log" && echo "ok: log says it resumed from checkpoint_1" \
    || { echo "FAILED: no resume line in the log"; exit 1; }

echo "== 3. training signal: two optimizer steps on the vowel-share task, then resume"
T="$WORK/toy"
TOY=("$PYTHON" examples/harbor/harbor_grpo_local.py --tasks tests/fixtures/tasks --n-samples 4 --step-limit 1
     --max-new-tokens 24 --lr 1e-2 --save-every 1 --output-dir "$T")
"${TOY[@]}" --num-rollouts 1 > "$WORK/toy.log" 2>&1 || { tail -30 "$WORK/toy.log"; echo "FAILED: toy run"; exit 1; }
check "step 1 took an optimizer step on sampled tokens" \
    "metrics[0]['skipped'] is None and metrics[0]['n_tokens'] > 0 and adam_steps('checkpoint_1') == {1}" "$T"
"${TOY[@]}" --num-rollouts 2 --resume "$T" > "$WORK/toy2.log" 2>&1 || { tail -30 "$WORK/toy2.log"; echo "FAILED: toy resume"; exit 1; }
check "resumed step 2 trained from the restored optimizer state (AdamW step 2)" \
    "[m['step'] for m in metrics] == [1, 2] and metrics[1]['skipped'] is None and adam_steps('checkpoint_2') == {2}" "$T"
check "step 2 sampled from the updated policy (first-update ratio 1, KL to base > 0)" \
    "abs(metrics[1]['ppo_kl']) < 1e-4 and metrics[1]['kl'] > 0" "$T"

echo "integration OK"
