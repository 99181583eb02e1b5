"""scripts/run_harbor_grpo.sh, run for real with bash.

The dry run prints the exact `ray job submit ... train.py ...` command; these tests parse it and
check the flags SLiME will get. A fake SLiME checkout in tmp holds only the model-args file the
script sources. The preflight tests run the real checks on this machine (no slime, no GPU here).
"""

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "run_harbor_grpo.sh"

# The clip / KL / GRPO flags and their documented defaults (SLiME's GRPO recipe).
GRPO_DEFAULTS = {
    "--advantage-estimator": "grpo",
    "--kl-loss-coef": "0.001",
    "--kl-loss-type": "low_var_kl",
    "--entropy-coef": "0",
    "--eps-clip": "0.2",
    "--eps-clip-high": "0.28",
    "--n-samples-per-prompt": "4",
    "--rollout-temperature": "1.0",
    "--lr": "1e-6",
    "--optimizer": "adam",
    "--lr-decay-style": "constant",
    "--weight-decay": "0.1",
    "--adam-beta1": "0.9",
    "--adam-beta2": "0.98",
    "--input-key": "prompt",
    "--label-key": "label",
    "--metadata-key": "metadata",
    "--custom-generate-function-path": "slime_harbor.hooks.generate",
    "--custom-reward-post-process-path": "slime_harbor.hooks.reward_post_process",
    "--dynamic-sampling-filter-path": "slime_harbor.hooks.dynamic_sampling_filter",
    "--over-sampling-batch-size": "12",
}


@pytest.fixture
def fake_slime(tmp_path):
    """A SLiME checkout reduced to one scripts/models/*.sh file."""
    models = tmp_path / "slime" / "scripts" / "models"
    models.mkdir(parents=True)
    (models / "tiny.sh").write_text(
        'MODEL_ARGS=(\n   --num-layers 2\n   --normalization "RMSNorm"\n'
        '   --rotary-base "${MODEL_ARGS_ROTARY_BASE:-1000000}"\n)\n'
    )
    return tmp_path / "slime"


def run_script(args, env_overrides, cwd=None):
    # A clean environment: stray LR / MODEL / SAVE variables of the caller must not leak in.
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")}
    env.update(env_overrides)
    return subprocess.run(
        ["bash", str(SCRIPT), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=300
    )


def dry_run(fake_slime, tmp_path, args=(), **env):
    base = {"SLIME_DIR": str(fake_slime), "MODEL": "tiny", "NUM_GPUS": "2",
            "PROMPT_DATA": str(tmp_path / "prompts.jsonl")}
    proc = run_script(["--dry-run", *args], {**base, **env})
    assert proc.returncode == 0, proc.stderr
    return parse_command(proc.stdout)


def parse_command(stdout):
    """(words before train.py, train.py args) of the printed shell-quoted command."""
    words = shlex.split(stdout.replace("\\\n", " "))
    split = next(i for i, w in enumerate(words) if w.endswith("/train.py"))
    return words[: split + 1], words[split + 1 :]


def flag_values(train_args):
    """{flag: value or True}: a flag followed by another flag is an on/off switch."""
    values = {}
    for i, word in enumerate(train_args):
        if word.startswith("--"):
            nxt = train_args[i + 1] if i + 1 < len(train_args) else None
            values[word] = True if nxt is None or nxt.startswith("--") else nxt
    return values


def test_dry_run_prints_every_grpo_flag_with_defaults(fake_slime, tmp_path):
    head, train_args = dry_run(fake_slime, tmp_path)
    assert head[:3] == ["ray", "job", "submit"]
    assert head[-1] == f"{fake_slime}/train.py"
    flags = flag_values(train_args)
    for flag, value in GRPO_DEFAULTS.items():
        assert flags.get(flag) == value, flag
    for switch in ("--use-kl-loss", "--rollout-shuffle", "--colocate", "--disable-grpo-std-normalization"):
        assert flags.get(switch) is True, switch
    assert "--eps-clip-c" not in flags  # dual clip stays off unless asked for
    assert flags["--ref-load"]  # --use-kl-loss needs the reference model
    assert flags["--custom-config-path"] == str(REPO / "examples/harbor/configs/harbor_grpo.yaml")
    assert flags["--prompt-data"] == str(tmp_path / "prompts.jsonl")
    assert flags["--actor-num-gpus-per-node"] == "2"
    # MODEL_ARGS come from the sourced model file, quoting and defaults intact.
    assert train_args[:6] == ["--num-layers", "2", "--normalization", "RMSNorm", "--rotary-base", "1000000"]
    # A dry run reads only: the prompt data is not written.
    assert not (tmp_path / "prompts.jsonl").exists()


def test_heldout_evaluation_flags_come_with_an_eval_tasks_dir(fake_slime, tmp_path):
    _, plain = dry_run(fake_slime, tmp_path)
    assert not [f for f in plain if f.startswith("--eval") or f in ("--n-samples-per-eval-prompt", "--log-passrate",
                                                                     "--custom-eval-rollout-log-function-path")]

    eval_data = tmp_path / "eval.jsonl"
    _, train_args = dry_run(fake_slime, tmp_path, EVAL_TASKS_DIR=str(REPO / "tests/fixtures/tasks"),
                            EVAL_PROMPT_DATA=str(eval_data))
    i = train_args.index("--eval-prompt-data")
    assert train_args[i + 1:i + 3] == ["heldout", str(eval_data)]  # SLiME's name/path pairs
    flags = flag_values(train_args)
    assert {k: flags[k] for k in ("--eval-interval", "--n-samples-per-eval-prompt", "--eval-temperature",
                                  "--eval-top-p", "--eval-max-response-len", "--log-passrate",
                                  "--custom-eval-rollout-log-function-path")} == {
        "--eval-interval": "20", "--n-samples-per-eval-prompt": "4", "--eval-temperature": "1.0",
        "--eval-top-p": "1.0", "--eval-max-response-len": "4096", "--log-passrate": True,
        # each trial counted once (SLiME's default counts samples): tests/test_slime_eval.py
        "--custom-eval-rollout-log-function-path": "slime_harbor.hooks.log_eval_rollout"}
    from slime_harbor import hooks

    assert callable(hooks.log_eval_rollout)  # the path names a function that is there
    assert not eval_data.exists()  # a dry run reads only

    _, train_args = dry_run(fake_slime, tmp_path, EVAL_TASKS_DIR=str(REPO / "tests/fixtures/tasks"),
                            EVAL_INTERVAL="5", N_SAMPLES_PER_EVAL_PROMPT="8")
    flags = flag_values(train_args)
    assert (flags["--eval-interval"], flags["--n-samples-per-eval-prompt"]) == ("5", "8")


def test_env_vars_override_flags(fake_slime, tmp_path):
    _, train_args = dry_run(
        fake_slime, tmp_path,
        EPS_CLIP_HIGH="0.3", KL_LOSS_COEF="0.01", LR="2e-6", N_SAMPLES_PER_PROMPT="8",
        EPS_CLIP_C="3.0", KL_LOSS_TYPE="k3", USE_KL_LOSS="0", SAVE_INTERVAL="",
        DISABLE_GRPO_STD_NORMALIZATION="0", MODEL_ARGS_ROTARY_BASE="500000",
    )
    flags = flag_values(train_args)
    assert flags["--eps-clip-high"] == "0.3"
    assert flags["--kl-loss-coef"] == "0.01"
    assert flags["--lr"] == "2e-6"
    assert flags["--n-samples-per-prompt"] == "8"
    assert flags["--eps-clip-c"] == "3.0"
    assert flags["--kl-loss-type"] == "k3"
    assert flags["--rotary-base"] == "500000"
    assert flags["--eps-clip"] == "0.2"  # untouched neighbours keep their defaults
    for dropped in ("--use-kl-loss", "--save-interval", "--disable-grpo-std-normalization"):
        assert dropped not in flags


def test_bad_switch_value_is_rejected(fake_slime, tmp_path):
    proc = run_script(["--dry-run"], {"SLIME_DIR": str(fake_slime), "MODEL": "tiny", "USE_KL_LOSS": "yes"})
    assert proc.returncode != 0
    assert "USE_KL_LOSS must be 1 or 0" in proc.stderr


def test_extra_args_pass_through_last(fake_slime, tmp_path):
    _, train_args = dry_run(fake_slime, tmp_path, args=["--use-wandb", "--wandb-group", "a b c"])
    assert train_args[-3:] == ["--use-wandb", "--wandb-group", "a b c"]
    # After `--` everything passes, even our own option names; later flags win in argparse.
    _, train_args = dry_run(fake_slime, tmp_path, args=["--", "--lr", "5e-7", "--dry-run"])
    assert train_args[-3:] == ["--lr", "5e-7", "--dry-run"]


def test_missing_model_file_fails_clearly(fake_slime, tmp_path):
    proc = run_script(["--dry-run"], {"SLIME_DIR": str(fake_slime), "MODEL": "qwen9-1T"})
    assert proc.returncode != 0
    assert "qwen9-1T.sh" in proc.stderr and "SLIME_DIR" in proc.stderr


def test_help_prints_usage():
    proc = run_script(["--help"], {})
    assert proc.returncode == 0
    assert "--dry-run" in proc.stdout and "EPS_CLIP_HIGH" in proc.stdout


def preflight(fake_slime, tmp_path, config_text=None):
    env = {"SLIME_DIR": str(fake_slime), "MODEL": "tiny", "PYTHON": sys.executable,
           "PROMPT_DATA": str(tmp_path / "prompts.jsonl")}
    if config_text is not None:
        config = tmp_path / "plugin.yaml"
        config.write_text(config_text)
        env["CUSTOM_CONFIG_PATH"] = str(config)
    proc = run_script([], env)
    assert proc.returncode != 0
    assert "preflight failed" in proc.stderr
    assert not (tmp_path / "prompts.jsonl").exists()  # nothing ran past the preflight
    return proc.stderr


def test_preflight_fails_when_slime_is_absent(fake_slime, tmp_path):
    has_slime = subprocess.run([sys.executable, "-c", "import slime"], cwd=REPO, capture_output=True,
                               env={"PATH": os.environ["PATH"]}).returncode == 0
    if has_slime:
        pytest.skip("slime is importable by this python: the absent-slime message cannot be seen")
    err = preflight(fake_slime, tmp_path)
    assert f"slime is not importable by {sys.executable}" in err
    assert "train.py" in err  # the fake checkout has no train.py: said too, all problems at once
    # The bundled config and tasks are fine: no complaint about them.
    assert "tasks dir" not in err and "plugin config" not in err


def test_preflight_fails_when_tasks_dir_is_missing_or_empty(fake_slime, tmp_path):
    err = preflight(fake_slime, tmp_path, f"harbor_env: local\nharbor_tasks_dir: {tmp_path}/nope  # gone\n")
    assert f"tasks dir {tmp_path}/nope (harbor_tasks_dir in {tmp_path}/plugin.yaml) does not exist" in err

    (tmp_path / "empty").mkdir()
    err = preflight(fake_slime, tmp_path, f"harbor_env: local\nharbor_tasks_dir: '{tmp_path}/empty'\n")
    assert f"tasks dir {tmp_path}/empty has no Harbor task" in err


def test_preflight_checks_the_sandbox_backend(fake_slime, tmp_path):
    tasks = REPO / "examples" / "harbor" / "tasks"
    docker_up = shutil.which("docker") is not None and subprocess.run(["docker", "info"], capture_output=True).returncode == 0
    err = preflight(fake_slime, tmp_path, f"harbor_env: docker\nharbor_tasks_dir: {tasks}\n")
    assert ("'docker info' failed" in err) == (not docker_up)


def test_launch_writes_prompts_starts_ray_and_always_stops_it(fake_slime, tmp_path):
    """The non-dry path up to SLiME: prompt data from the real tasks, ray start, submit, ray stop.

    ray is not installable here, so a stand-in `ray` on PATH records its calls and fails the
    submit: the head node must be stopped anyway.
    """
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "ray_calls"
    (bin_dir / "ray").write_text(
        f'#!/bin/sh\necho "$@" >> {calls}\ncase "$1" in job) exit 7 ;; esac\nexit 0\n'
    )
    (bin_dir / "ray").chmod(0o755)
    env = {"SLIME_DIR": str(fake_slime), "MODEL": "tiny", "NUM_GPUS": "1", "PYTHON": sys.executable,
           "PROMPT_DATA": str(tmp_path / "data" / "prompts.jsonl"),
           "EVAL_TASKS_DIR": str(REPO / "tests/fixtures/tasks"), "EVAL_PROMPT_DATA": str(tmp_path / "data" / "eval.jsonl"),
           "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    proc = run_script(["--skip-preflight", "--use-wandb"], env, cwd=tmp_path)
    assert proc.returncode == 7, proc.stderr  # the submit's failure is the script's

    rows = (tmp_path / "data" / "prompts.jsonl").read_text().splitlines()
    tasks = sorted(p.name for p in (REPO / "examples/harbor/tasks").iterdir() if (p / "task.toml").is_file())
    assert len(rows) == len(tasks) > 0

    eval_rows = [json.loads(r) for r in (tmp_path / "data" / "eval.jsonl").read_text().splitlines()]
    assert [r["label"] for r in eval_rows] == ["vowel-share"]  # the held-out prompts, from EVAL_TASKS_DIR

    lines = calls.read_text().splitlines()
    assert [line.split()[:2] for line in lines] == [["start", "--head"], ["job", "submit"], ["stop", "--force"]]
    assert f"--eval-prompt-data heldout {tmp_path / 'data' / 'eval.jsonl'}" in lines[1]
    assert "--num-gpus 1" in lines[0]
    assert lines[1].endswith("--use-wandb") and "--eps-clip-high 0.28" in lines[1]


def test_default_prompt_data_follows_the_configured_tasks_and_a_named_file_is_kept(fake_slime, tmp_path):
    """The default prompt file is rewritten from harbor_tasks_dir on every launch (a stale file
    from another tasks dir is never trained on); a PROMPT_DATA the user names is used as it is."""
    repo = tmp_path / "repo"  # a copy of the script, so the default file lands in tmp, not here
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(SCRIPT, repo / "scripts" / SCRIPT.name)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ray").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "ray").chmod(0o755)
    bundled = REPO / "examples" / "harbor" / "tasks"
    env = {"SLIME_DIR": str(fake_slime), "MODEL": "tiny", "NUM_GPUS": "1", "PYTHON": sys.executable,
           "PATH": f"{bin_dir}:{os.environ['PATH']}"}

    def launch(task_names, **extra):
        tasks = tmp_path / "tasks" / "-".join(task_names)
        for name in task_names:
            shutil.copytree(bundled / name, tasks / name)
        config = tmp_path / f"{tasks.name}.yaml"
        config.write_text(f"harbor_tasks_dir: {tasks}\n")
        proc = subprocess.run(["bash", str(repo / "scripts" / SCRIPT.name), "--skip-preflight"],
                              env={**env, "CUSTOM_CONFIG_PATH": str(config), **extra},
                              cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr

    def labels(path):
        return sorted(json.loads(line)["label"] for line in path.read_text().splitlines())

    default = repo / "runs" / "harbor_prompts.jsonl"
    launch(["dedupe-lines", "fix-sort-key"])
    assert labels(default) == ["dedupe-lines", "fix-sort-key"]
    launch(["top-words"])  # another tasks dir: the default file follows it
    assert labels(default) == ["top-words"]

    named = tmp_path / "mine.jsonl"
    named.write_text(json.dumps({"prompt": "p", "label": "fizzbuzz-params", "metadata": {}}) + "\n")
    launch(["config-parser"], PROMPT_DATA=str(named))
    assert labels(named) == ["fizzbuzz-params"]  # kept as the user wrote it


def test_plugin_config_sets_every_hook_setting_and_documents_it():
    import yaml

    from scripts.hook_config import hook_config_yaml
    from slime_harbor.hooks import DEFAULTS

    path = REPO / "examples" / "harbor" / "configs" / "harbor_grpo.yaml"
    # Generated from HookSettings (its defaults, its docstrings as the comments), never edited by hand.
    assert path.read_text() == hook_config_yaml(), "regenerate it: .venv/bin/python scripts/hook_config.py"
    config = yaml.safe_load(path.read_text())
    assert config == DEFAULTS  # the shipped config is the hooks' defaults, spelled out
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        if line.split(":")[0] in config:
            assert lines[i - 1].startswith("#"), f"{line!r} has no comment above it"


def test_every_flag_is_known_to_slime_or_its_own_launch_scripts(tmp_path):
    """Catches a misspelt flag before a cluster does. Needs a SLiME checkout on PYTHONPATH."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("slime")
    except ModuleNotFoundError:
        spec = None
    if spec is None or spec.origin is None:
        pytest.skip("slime is not importable (put a SLiME checkout on PYTHONPATH)")
    checkout = Path(spec.origin).parent.parent
    known_text = (checkout / "slime" / "utils" / "arguments.py").read_text()
    launch_scripts = [checkout / "scripts" / "run-qwen3-4B.sh", *(checkout / "scripts" / "models").glob("*.sh")]
    if not launch_scripts[0].is_file():
        pytest.skip(f"{checkout} is an installed package, not a checkout with scripts/")
    # Megatron's flags are not in SLiME's parser; SLiME's own scripts show which it takes.
    megatron_text = "\n".join(p.read_text() for p in launch_scripts)

    proc = run_script(["--dry-run"], {"SLIME_DIR": str(checkout), "PROMPT_DATA": str(tmp_path / "p.jsonl"),
                                      "EVAL_TASKS_DIR": str(REPO / "examples/harbor/tasks")})  # eval flags too
    assert proc.returncode == 0, proc.stderr
    _, train_args = parse_command(proc.stdout)
    unknown = [
        f for f in train_args
        if f.startswith("--") and f'"{f}"' not in known_text and f"{f} " not in megatron_text + " "
        and f"{f}\n" not in megatron_text
    ]
    assert unknown == []
