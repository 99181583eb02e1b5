#!/usr/bin/env bash
# GRPO on Harbor tasks with SLiME: the rollout of every sample is one Harbor trial.
#
# Laid out like SLiME's scripts/run-qwen3-4B.sh (run inside the slimerl/slime image, GPUs visible):
#   bash scripts/run_harbor_grpo.sh [--dry-run] [--skip-preflight] [--] [extra train.py args...]
#
#   --dry-run         print the `ray job submit ... train.py ...` command and exit (reads only)
#   --skip-preflight  launch without checking slime, GPUs, sandbox backend and tasks first
#   extra args        appended to train.py's, so they win over the defaults (e.g. --use-wandb)
#
# Every value below comes from an environment variable named after its flag in upper snake case,
# so `EPS_CLIP_HIGH=0.3 KL_LOSS_COEF=0.01 LR=2e-6 bash scripts/run_harbor_grpo.sh` changes
# --eps-clip-high, --kl-loss-coef and --lr. Set a variable to the empty string to drop its flag
# (SAVE_INTERVAL= ). On/off flags take 1 or 0 (USE_KL_LOSS=0 drops --use-kl-loss).
# Not flags: SLIME_DIR (SLiME checkout, /root/slime in the image), MODEL (a file of
# $SLIME_DIR/scripts/models/), MEGATRON_DIR, NUM_GPUS (detected), PYTHON (python3).
#
# The Harbor side (agent, sandbox, tasks dir, concurrency, reward mapping) is the YAML given to
# --custom-config-path (CUSTOM_CONFIG_PATH, default examples/harbor/configs/harbor_grpo.yaml);
# relative paths in it resolve against this repository, where training is started. The
# preflight reads harbor_env and harbor_tasks_dir from it.
# The prompt data is written from the configured tasks dir by `slime-harbor prepare-data` on
# every launch, so it always matches harbor_tasks_dir; a PROMPT_DATA you name is used as it is
# when the file exists (and written from the tasks dir when it does not).
# Held-out evaluation runs through SLiME's own eval loop when EVAL_TASKS_DIR names a dir of
# Harbor tasks: its prompts are written by prepare-data to EVAL_PROMPT_DATA (default
# runs/harbor_eval_prompts.jsonl), the hook runs each as a trial with evaluation=True and the
# eval sampling settings, and slime_harbor.hooks.log_eval_rollout logs eval/heldout (the mean
# reward over scored trials, each once), its unscored trials and its pass@k per task
# (--log-passrate), in place of SLiME's default (which counts samples). Unset or empty: no
# evaluation.
set -euo pipefail

REPO_ROOT="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)"
SLIME_DIR="${SLIME_DIR:-/root/slime}"
MODEL="${MODEL:-qwen3-4B}"
MEGATRON_DIR="${MEGATRON_DIR:-/root/Megatron-LM}"
PYTHON="${PYTHON:-python3}"

DRY_RUN=0
PREFLIGHT=1
EXTRA_ARGS=()
while [ $# -gt 0 ]; do
   case "$1" in
      --dry-run) DRY_RUN=1 ;;
      --skip-preflight) PREFLIGHT=0 ;;
      -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
      --) shift; EXTRA_ARGS+=("$@"); break ;;
      *) EXTRA_ARGS+=("$1") ;;
   esac
   shift
done

die() { echo "run_harbor_grpo.sh: $*" >&2; exit 1; }

# --flag-name -> FLAG_NAME
env_name() { local n="${1#--}"; n="${n//-/_}"; echo "${n^^}"; }

# opt ARRAY --flag DEFAULT: append "--flag value", value from $FLAG (unset -> DEFAULT, empty -> no flag).
opt() {
   local -n _args="$1"
   local flag="$2" default="$3" var
   var="$(env_name "$flag")"
   local value="${!var-$default}"
   if [ -n "$value" ]; then _args+=("$flag" "$value"); fi
}

# switch ARRAY --flag DEFAULT(1|0): append "--flag" when $FLAG (or DEFAULT) is 1.
switch() {
   local -n _args="$1"
   local flag="$2" default="$3" var
   var="$(env_name "$flag")"
   local value="${!var-$default}"
   case "$value" in
      1) _args+=("$flag") ;;
      0|"") ;;
      *) die "$var must be 1 or 0, got '$value'" ;;
   esac
}

# yaml_value KEY FILE: the value of a top-level `key: value` line (comments and quotes stripped).
yaml_value() {
   sed -n "s/^$1:[[:space:]]*//p" "$2" | head -n 1 | sed "s/[[:space:]]*#.*\$//; s/^[\"']//; s/[\"']\$//"
}

# abspath PATH BASE: PATH made absolute against BASE (the caller's directory for paths given in
# the environment, the repository for paths in the plugin config: training runs there).
abspath() { case "$1" in /*) echo "$1" ;; *) echo "$2/$1" ;; esac; }

# The tasks dir the hooks will read: harbor_tasks_dir of the plugin config (the hooks' default
# when the key is absent), relative to the repository.
config_tasks_dir() {
   local dir
   dir="$(yaml_value harbor_tasks_dir "$CUSTOM_CONFIG_PATH")"
   abspath "${dir:-examples/harbor/tasks}" "$REPO_ROOT"
}

if command -v nvidia-smi >/dev/null 2>&1; then
   DETECTED_GPUS="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)"
else
   DETECTED_GPUS=0
fi
NUM_GPUS="${NUM_GPUS:-$DETECTED_GPUS}"
if [ "$NUM_GPUS" -le 0 ]; then NUM_GPUS=8; fi  # as SLiME's script: a dry run on a CPU box shows 8

MODEL_FILE="$SLIME_DIR/scripts/models/$MODEL.sh"
[ -f "$MODEL_FILE" ] || die "no model args file $MODEL_FILE (set SLIME_DIR to a SLiME checkout and MODEL to one of its scripts/models/*.sh)"
MODEL_ARGS=()
set +u  # model files use unset variables with defaults of their own
# shellcheck source=/dev/null
source "$MODEL_FILE"
set -u

CUSTOM_CONFIG_PATH="$(abspath "${CUSTOM_CONFIG_PATH:-$REPO_ROOT/examples/harbor/configs/harbor_grpo.yaml}" "$PWD")"
PROMPT_DATA_GIVEN="${PROMPT_DATA:+1}"
PROMPT_DATA="$(abspath "${PROMPT_DATA:-$REPO_ROOT/runs/harbor_prompts.jsonl}" "$PWD")"

EVAL_TASKS_DIR="${EVAL_TASKS_DIR:+$(abspath "$EVAL_TASKS_DIR" "$PWD")}"
EVAL_PROMPT_DATA="$(abspath "${EVAL_PROMPT_DATA:-$REPO_ROOT/runs/harbor_eval_prompts.jsonl}" "$PWD")"

CKPT_ARGS=()
opt CKPT_ARGS --hf-checkpoint /root/Qwen3-4B
opt CKPT_ARGS --ref-load /root/Qwen3-4B_torch_dist  # the frozen reference policy of the KL loss
opt CKPT_ARGS --load /root/Qwen3-4B_slime_harbor/
opt CKPT_ARGS --save /root/Qwen3-4B_slime_harbor/
opt CKPT_ARGS --save-interval 20

# One prompt row per Harbor task: {"prompt": instruction, "label": task name, "metadata": {...}}.
# No --apply-chat-template: the agent builds its own chat turns inside the trial.
ROLLOUT_ARGS=(--prompt-data "$PROMPT_DATA")
opt ROLLOUT_ARGS --input-key prompt
opt ROLLOUT_ARGS --label-key label
opt ROLLOUT_ARGS --metadata-key metadata
switch ROLLOUT_ARGS --rollout-shuffle 1
opt ROLLOUT_ARGS --num-rollout 200
opt ROLLOUT_ARGS --rollout-batch-size 8        # tasks per rollout step
opt ROLLOUT_ARGS --n-samples-per-prompt 4      # trials per task: the GRPO group
opt ROLLOUT_ARGS --rollout-max-response-len 4096   # tokens per agent turn
opt ROLLOUT_ARGS --rollout-temperature 1.0
opt ROLLOUT_ARGS --num-steps-per-rollout 1     # one optimizer step per rollout: on-policy
opt ROLLOUT_ARGS --custom-generate-function-path slime_harbor.hooks.generate
# Group advantages by group_index over kept samples (SLiME's default assumes full groups).
opt ROLLOUT_ARGS --custom-reward-post-process-path slime_harbor.hooks.reward_post_process
# Drop groups whose kept episodes all got one reward (no GRPO signal); SLiME then fetches more
# prompts in batches of --over-sampling-batch-size, and aborts what is still running at the end.
opt ROLLOUT_ARGS --dynamic-sampling-filter-path slime_harbor.hooks.dynamic_sampling_filter
opt ROLLOUT_ARGS --over-sampling-batch-size 12
ROLLOUT_ARGS+=(--custom-config-path "$CUSTOM_CONFIG_PATH")

# Held-out evaluation (only with EVAL_TASKS_DIR): before training, every EVAL_INTERVAL rollouts.
EVAL_ARGS=()
if [ -n "$EVAL_TASKS_DIR" ]; then
   EVAL_ARGS+=(--eval-prompt-data heldout "$EVAL_PROMPT_DATA")
   opt EVAL_ARGS --eval-interval 20
   opt EVAL_ARGS --n-samples-per-eval-prompt 4    # trials per held-out task: the k of pass@k
   opt EVAL_ARGS --eval-temperature 1.0
   opt EVAL_ARGS --eval-top-p 1.0
   opt EVAL_ARGS --eval-max-response-len 4096     # tokens per agent turn
   switch EVAL_ARGS --log-passrate 1               # eval/heldout-pass@1 .. pass@k (and passrate/ in training)
   # Each trial counted once: SLiME's default eval logging averages the flat list of samples (an
   # unscored trial's placeholder a failure, a segmented episode once per segment) and its pass@k
   # asserts on a segment too many; this logs per trial instead (docs/slime.md).
   opt EVAL_ARGS --custom-eval-rollout-log-function-path slime_harbor.hooks.log_eval_rollout
fi

GRPO_ARGS=()
opt GRPO_ARGS --advantage-estimator grpo
switch GRPO_ARGS --use-kl-loss 1
opt GRPO_ARGS --kl-loss-coef 0.001
opt GRPO_ARGS --kl-loss-type low_var_kl
opt GRPO_ARGS --entropy-coef 0
opt GRPO_ARGS --eps-clip 0.2
opt GRPO_ARGS --eps-clip-high 0.28
opt GRPO_ARGS --eps-clip-c ""                  # dual clip, off unless set (> 1)
# Centre rewards per group without dividing by the group std (Dr. GRPO), as GRPOConfig's
# default normalize_std=False; DISABLE_GRPO_STD_NORMALIZATION=0 restores the std division.
switch GRPO_ARGS --disable-grpo-std-normalization 1

OPTIMIZER_ARGS=()
opt OPTIMIZER_ARGS --optimizer adam
opt OPTIMIZER_ARGS --lr 1e-6
opt OPTIMIZER_ARGS --lr-decay-style constant
opt OPTIMIZER_ARGS --weight-decay 0.1
opt OPTIMIZER_ARGS --adam-beta1 0.9
opt OPTIMIZER_ARGS --adam-beta2 0.98

SGLANG_ARGS=()
opt SGLANG_ARGS --rollout-num-gpus-per-engine 2
opt SGLANG_ARGS --sglang-mem-fraction-static 0.7

PERF_ARGS=()
opt PERF_ARGS --tensor-model-parallel-size 2
switch PERF_ARGS --sequence-parallel 1
opt PERF_ARGS --pipeline-model-parallel-size 1
opt PERF_ARGS --context-parallel-size 1
opt PERF_ARGS --expert-model-parallel-size 1
opt PERF_ARGS --expert-tensor-parallel-size 1
opt PERF_ARGS --recompute-granularity full
opt PERF_ARGS --recompute-method uniform
opt PERF_ARGS --recompute-num-layers 1
switch PERF_ARGS --use-dynamic-batch-size 1
opt PERF_ARGS --max-tokens-per-gpu 9216

MISC_ARGS=()
opt MISC_ARGS --actor-num-nodes 1
opt MISC_ARGS --actor-num-gpus-per-node "$NUM_GPUS"
switch MISC_ARGS --colocate 1                  # SGLang and Megatron take turns on the same GPUs
opt MISC_ARGS --attention-dropout 0.0
opt MISC_ARGS --hidden-dropout 0.0
switch MISC_ARGS --accumulate-allreduce-grads-in-fp32 1
switch MISC_ARGS --attention-softmax-in-fp32 1
opt MISC_ARGS --attention-backend flash

MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"
DASHBOARD_PORT="${DASHBOARD_PORT:-8265}"
HAS_NVLINK=0
if [ "$DRY_RUN" = 0 ] && nvidia-smi topo -m 2>/dev/null | grep -q 'NV[0-9]'; then HAS_NVLINK=1; fi
# The job imports slime_harbor (the hooks) from this repository and Megatron from its checkout.
RUNTIME_ENV_JSON="{\"env_vars\": {\"PYTHONPATH\": \"$MEGATRON_DIR:$REPO_ROOT\", \"CUDA_DEVICE_MAX_CONNECTIONS\": \"1\", \"NCCL_NVLS_ENABLE\": \"$HAS_NVLINK\"}}"

SUBMIT=(
   ray job submit --address="http://127.0.0.1:$DASHBOARD_PORT"
   --runtime-env-json="$RUNTIME_ENV_JSON"
   -- "$PYTHON" "$SLIME_DIR/train.py"
   "${MODEL_ARGS[@]}" "${CKPT_ARGS[@]}" "${ROLLOUT_ARGS[@]}" "${EVAL_ARGS[@]}" "${GRPO_ARGS[@]}" "${OPTIMIZER_ARGS[@]}"
   "${SGLANG_ARGS[@]}" "${PERF_ARGS[@]}" "${MISC_ARGS[@]}" "${EXTRA_ARGS[@]}"
)

if [ "$DRY_RUN" = 1 ]; then
   # Shell-quoted, one flag (with its value) per line: paste it back into a shell as is.
   printf '%q' "${SUBMIT[0]}"
   for arg in "${SUBMIT[@]:1}"; do
      case "$arg" in -*) printf ' \\\n   %q' "$arg" ;; *) printf ' %q' "$arg" ;; esac
   done
   printf '\n'
   exit 0
fi

# ---- preflight: every problem at once, before anything is started --------------------------
preflight() {
   local problems=()
   local tasks_dir harbor_env n_tasks
   "$PYTHON" -c 'import slime' 2>/dev/null \
      || problems+=("slime is not importable by $PYTHON (run inside the slimerl/slime image, or pip install -e a SLiME checkout)")
   # The rollout workers import the hooks, and through them harbor, with this same python.
   PYTHONPATH="$REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -c 'import slime_harbor.hooks' 2>/dev/null \
      || problems+=("slime_harbor.hooks is not importable by $PYTHON (pip install -e $REPO_ROOT into it; harbor needs Python >= 3.12)")
   [ -f "$SLIME_DIR/train.py" ] || problems+=("no $SLIME_DIR/train.py (set SLIME_DIR to a SLiME checkout)")
   command -v ray >/dev/null 2>&1 || problems+=("ray is not on PATH")
   if ! command -v nvidia-smi >/dev/null 2>&1; then
      problems+=("no GPU: nvidia-smi not found")
   elif [ "$DETECTED_GPUS" -le 0 ]; then
      problems+=("no GPU: nvidia-smi -L lists none")
   fi

   if [ ! -f "$CUSTOM_CONFIG_PATH" ]; then
      problems+=("plugin config $CUSTOM_CONFIG_PATH does not exist")
   else
      harbor_env="$(yaml_value harbor_env "$CUSTOM_CONFIG_PATH")"
      case "${harbor_env:-local}" in
         local)
            if ! command -v bwrap >/dev/null 2>&1; then
               problems+=("harbor_env local needs bubblewrap: bwrap not found (apt-get install bubblewrap)")
            elif ! bwrap --ro-bind / / --dev /dev --proc /proc true 2>/dev/null; then
               problems+=("harbor_env local: bwrap is installed but cannot create a sandbox here (user namespaces disabled?)")
            fi ;;
         docker)
            docker info >/dev/null 2>&1 || problems+=("harbor_env docker: 'docker info' failed, the Docker daemon is unreachable") ;;
         *) echo "preflight: sandbox backend '$harbor_env' is not checked here" >&2 ;;
      esac
      tasks_dir="$(config_tasks_dir)"
      if [ ! -d "$tasks_dir" ]; then
         problems+=("tasks dir $tasks_dir (harbor_tasks_dir in $CUSTOM_CONFIG_PATH) does not exist")
      else
         n_tasks="$(find "$tasks_dir" -mindepth 2 -maxdepth 2 -name task.toml | wc -l)"
         [ "$n_tasks" -gt 0 ] || problems+=("tasks dir $tasks_dir has no Harbor task (no */task.toml)")
      fi
   fi

   if [ -n "$EVAL_TASKS_DIR" ] && [ -z "$(find "$EVAL_TASKS_DIR" -mindepth 2 -maxdepth 2 -name task.toml 2>/dev/null)" ]; then
      problems+=("EVAL_TASKS_DIR $EVAL_TASKS_DIR has no Harbor task (no */task.toml)")
   fi

   if [ ${#problems[@]} -gt 0 ]; then
      echo "run_harbor_grpo.sh: preflight failed:" >&2
      printf '  - %s\n' "${problems[@]}" >&2
      echo "(--skip-preflight launches anyway; --dry-run prints the command)" >&2
      exit 1
   fi
}
# Training starts here, so relative paths in the plugin config are the repo's (and the preflight
# imports see what the job will see, not a stray package in the caller's directory).
cd "$REPO_ROOT"
if [ "$PREFLIGHT" = 1 ]; then preflight; fi
export PYTHONUNBUFFERED=1  # keeps ray from buffering the job's stdout/stderr

if [ -z "$PROMPT_DATA_GIVEN" ] || [ ! -f "$PROMPT_DATA" ]; then
   tasks_dir="$(config_tasks_dir)"
   mkdir -p "$(dirname "$PROMPT_DATA")"
   echo "writing $PROMPT_DATA from $tasks_dir"
   PYTHONPATH="$REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m slime_harbor.cli prepare-data \
      --tasks "$tasks_dir" --out "$PROMPT_DATA"
fi
if [ -n "$EVAL_TASKS_DIR" ]; then  # always rewritten: it follows EVAL_TASKS_DIR
   mkdir -p "$(dirname "$EVAL_PROMPT_DATA")"
   echo "writing $EVAL_PROMPT_DATA from $EVAL_TASKS_DIR"
   PYTHONPATH="$REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m slime_harbor.cli prepare-data \
      --tasks "$EVAL_TASKS_DIR" --out "$EVAL_PROMPT_DATA"
fi

# A head node of our own, stopped on any exit (the job dies with it: nothing is left running).
ray start --head --node-ip-address "$MASTER_ADDR" --num-gpus "$NUM_GPUS" --disable-usage-stats \
   --dashboard-host=127.0.0.1 --dashboard-port="$DASHBOARD_PORT"
trap 'ray stop --force >/dev/null 2>&1 || true' EXIT

"${SUBMIT[@]}"
