"""`slime-harbor` command line: make-model, serve, rollout, demo, train-local, prepare-data, swebench-tasks,
calibrate, impossible-tasks, view.

Every rollout flag maps to a documented `RolloutConfig` field; with no --policy-url the command
builds the tiny offline model (cached) and serves it on an embedded server, so it runs anywhere.

Exit codes: 0 done; 1 every trial failed or was aborted (the reason is printed); 2 bad flags,
tasks or settings (one line, before anything runs); 130 / 143 stopped by SIGINT / SIGTERM after
an orderly shutdown (finished samples kept, summary.json written, sandboxes torn down).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections import Counter
from pathlib import Path

from slime_harbor.config_docs import add_field_flags
from slime_harbor.episode import CONTEXT_EXCEEDED
from slime_harbor.exits import EXIT_USAGE, ConfigError, Interrupted, OneLineArgumentParser, SignalGuard
from slime_harbor.policy.engine_launcher import ENGINES
from slime_harbor.policy.engines import ENGINE_TYPES
from slime_harbor.policy.engines.embedded import Embedded
from slime_harbor.policy.sampling import SamplingParams
from slime_harbor.policy.tiny_model import TinyModelConfig, build_tiny_model, ensure_tiny_model
from slime_harbor.policy.weight_check import WeightMismatch
from slime_harbor.run_config import DEFAULT_TASKS, RolloutConfig, run_setting_choices

PROG = "slime-harbor"
EXIT_ALL_FAILED = 1

def add_task_source_args(p: argparse.ArgumentParser, required: bool = False, filters: bool = True) -> None:
    """--tasks (a directory of Harbor task dirs, or a Harbor dataset NAME[@VERSION]), the registry
    a dataset is found in, and the task filters, named as `harbor run` names them."""
    p.add_argument("--tasks", required=required, default=None if required else str(DEFAULT_TASKS),
                   metavar="DIR | NAME[@VERSION]",
                   help="a directory of Harbor task dirs, or a dataset in a Harbor registry (e.g. terminal-bench@2.0), "
                   "downloaded by Harbor into $SLIME_HARBOR_CACHE" + ("" if required else " (default: bundled tasks)"))
    p.add_argument("--registry-path", type=Path, default=None, metavar="FILE",
                   help="with a dataset name: a registry JSON file to find it in (default: Harbor's registry)")
    p.add_argument("--registry-url", default=None, metavar="URL",
                   help="with a dataset name: the URL of a registry JSON to find it in (default: Harbor's registry)")
    if not filters:
        return
    p.add_argument("--task-names", nargs="*", default=None, metavar="NAME", help="only these tasks")
    p.add_argument("-i", "--include-task-name", action="append", dest="task_names", metavar="NAME",
                   help="only this task (repeatable; a glob pattern for a dataset, as harbor run -i)")
    p.add_argument("-x", "--exclude-task-name", action="append", dest="exclude_task_names", default=None, metavar="NAME",
                   help="not this task (repeatable; a glob pattern for a dataset, as harbor run -x)")


def selected_tasks(a: argparse.Namespace) -> tuple[Path, list[str] | None]:
    """The tasks dir and task names the flags choose (a dataset named: resolved and downloaded now)."""
    from slime_harbor.tasks.datasets import select_tasks

    return select_tasks(a.tasks, getattr(a, "task_names", None), getattr(a, "exclude_task_names", None),
                        a.registry_path, a.registry_url)


# The rollout command's flags, each one RolloutConfig field (or SamplingParams field of its
# sampling) under the name users type: its type, default and help are the field's declaration.
ROLLOUT_FLAGS = {
    "agent": "--agent", "n_samples": "--n-samples", "policy_url": "--policy-url", "model_dir": "--model",
    "env": "--env", "concurrency": "--concurrency", "out_dir": "--out", "step_limit": "--step-limit",
    "timeout_multiplier": "--timeout-multiplier", "agent_setup_timeout_sec": "--agent-setup-timeout",
    "gateway_host": "--gateway-host", "gateway_keys": "--gateway-keys", "fleet": "--fleet", "ray_address": "--ray-address",
    "fleet_node_trials": "--fleet-node-trials", "fleet_node_starts_per_sec": "--fleet-node-starts-per-sec",
    "reward_mapping": "--reward-mapping", "task_manifest": "--task-manifest",
    "renderer": "--renderer",
}
HACK_FLAGS = {"hack_action": "--hack-action", "hack_detectors": "--hack-detector",
              "hack_judge_url": "--hack-judge-url", "hack_judge_model": "--hack-judge-model",
              "impossible_twin": "--impossible-twin", "grader_watch": "--grader-watch"}
DEMO_RUN_FLAGS = {"reward_mapping": "--reward-mapping", "hack_action": "--hack-action", "impossible_twin": "--impossible-twin",
                  "grader_watch": "--grader-watch", "renderer": "--renderer"}
"""The demo's flags that are RunSettings knobs (its other flags are LearningConfig's)."""
SAMPLING_FLAGS = {"temperature": "--temperature", "top_p": "--top-p", "top_k": "--top-k",
                  "max_new_tokens": "--max-new-tokens"}
# What the command line adds to a field's own help.
FLAG_METAVARS = {"agent_setup_timeout_sec": "SEC", "hack_detectors": "MODULE:FUNCTION", "hack_judge_url": "URL",
                 "hack_judge_model": "NAME", "out_dir": "DIR", "model_dir": "DIR", "task_manifest": "FILE",
                 "renderer": "NAME"}
FLAG_DEFAULTS = {"policy_url": "an embedded policy server of --model", "model_dir": "the tiny offline model"}


def field_flags(p: argparse.ArgumentParser, config_class: type, flags: dict[str, str], defaults) -> None:
    """The rollout-side commands' flags: config_docs.add_field_flags with this command line's
    choices, metavars and shown defaults; a list field's flag is given once per item."""
    add_field_flags(p, config_class, defaults, flags=flags, choices=run_setting_choices(), metavars=FLAG_METAVARS,
                    shown_defaults=FLAG_DEFAULTS, repeatable=flags)


def add_rollout_args(p: argparse.ArgumentParser, defaults: RolloutConfig) -> None:
    add_task_source_args(p)
    field_flags(p, RolloutConfig, ROLLOUT_FLAGS, defaults)
    field_flags(p, SamplingParams, SAMPLING_FLAGS, defaults.sampling)
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    add_hack_args(p, defaults)


def add_hack_args(p: argparse.ArgumentParser, defaults: RolloutConfig) -> None:
    field_flags(p, RolloutConfig, HACK_FLAGS, defaults)


def rollout_config(a: argparse.Namespace) -> RolloutConfig:
    """The flags' RolloutConfig; a dataset named with --tasks is downloaded first (ConfigError if it cannot be)."""
    tasks_dir, task_names = selected_tasks(a)
    return RolloutConfig(tasks_dir=tasks_dir, task_names=task_names, sampling=sampling_from_flags(a),
                         progress=not a.no_progress, **{name: getattr(a, name) for name in {**ROLLOUT_FLAGS, **HACK_FLAGS}})


def sampling_from_flags(a: argparse.Namespace) -> SamplingParams:
    """--temperature, --top-p, --top-k, --max-new-tokens as the episodes' sampling (ConfigError in
    one line for a value SamplingParams refuses)."""
    try:
        return SamplingParams(temperature=a.temperature, top_p=a.top_p, top_k=a.top_k, max_new_tokens=a.max_new_tokens)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def run_rollout_command(cfg: RolloutConfig, guard: SignalGuard) -> dict:
    """Check everything that can be checked before a trial starts, run, print the summary; a run
    in which no trial was scored ends with EXIT_ALL_FAILED and the most common reason, and so does
    one in which every prompt was over the context window and nothing can be trained."""
    from slime_harbor.rollout import run_rollouts
    from slime_harbor.agents.placement import samples_policy
    from slime_harbor.run_config import check_config
    from slime_harbor.trial_setup import check_environment_runs

    if cfg.policy_url:
        if samples_policy(cfg.agent) and not cfg.model_dir:
            raise ConfigError("--model (the policy's HF dir, for its tokenizer) is required with --policy-url")
        check_policy_server(cfg.policy_url)
    check_config(dataclasses.replace(cfg, policy_url=cfg.policy_url or "embedded",
                                     model_dir=cfg.model_dir or "embedded"))  # before building a model
    check_environment_runs(cfg.env)
    from slime_harbor.run_config import policy_endpoint

    with policy_endpoint(cfg) as cfg:
        try:
            summary = guard.run(run_rollouts(cfg))
        except Interrupted:
            print(f"interrupted: finished trials are in {cfg.out_dir}/samples.jsonl, counts in "
                  f"{cfg.out_dir}/summary.json", file=sys.stderr)
            raise
    print_summary(summary, cfg.out_dir)
    n_trials = summary["n_trials"]
    over_window = n_trials and summary["exit_status_counts"].get(CONTEXT_EXCEEDED) == n_trials
    if over_window and not summary["n_trainable_samples"]:
        # Scored (truncated), but the prompts left no room to sample: nothing to train.
        raise CommandFailed(f"all {n_trials} trials ended {CONTEXT_EXCEEDED}: the prompt is over the context window "
                            f"({summary['context_window']} tokens) and no sample can be trained "
                            f"(per trial: {cfg.out_dir}/summary.json)", EXIT_ALL_FAILED)
    unscored = n_trials - summary["n_scored"]
    if unscored:
        reason = most_common_error(summary)
        if not summary["n_scored"]:
            raise CommandFailed(f"all {unscored} trials failed or were aborted, none was scored: {reason} "
                                f"(per trial: {cfg.out_dir}/summary.json)", EXIT_ALL_FAILED)
        print(f"{unscored} of {summary['n_trials']} trials failed or were aborted: {reason}", file=sys.stderr)
    return summary


class CommandFailed(Exception):
    """Ends the command with `exit_code` and the message as one line on stderr."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def most_common_error(summary: dict) -> str:
    """The most common kind of error (the text before its first colon, e.g. the exception type),
    shown by its first message, with how many trials had it."""
    errors = [" ".join(e.split()) for e in (summary.get("errors") or {}).values() if e]
    if not errors:
        return "no reason recorded"
    kinds = Counter(e.split(":", 1)[0] for e in errors)
    kind, count = kinds.most_common(1)[0]
    reason = next(e for e in errors if e.split(":", 1)[0] == kind)
    reason = reason if len(reason) <= 300 else reason[:300] + "..."
    return reason + (f" ({count} trials)" if count > 1 else "")


def check_policy_server(url: str, timeout: float = 10.0) -> None:
    """Fail fast when nothing listens at --policy-url (each trial would otherwise come back
    aborted). Only a connection failure counts: servers without /health still pass."""
    import httpx

    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"--policy-url must start with http:// or https://, got {url!r}")
    try:
        httpx.get(url.rstrip("/") + "/health", timeout=timeout)
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        raise ConfigError(f"policy server at {url} is unreachable: {exc}") from None
    except httpx.HTTPError:
        pass  # it answered something, or is slow: the trials will tell


def print_summary(summary: dict, out: Path) -> None:
    counts = ", ".join(f"{k} {v}" for k, v in summary["status_counts"].items())
    mean = summary["mean_reward"]
    print(f"trials: {summary['n_trials']} ({counts})")
    print(f"mean reward: {'n/a' if mean is None else f'{mean:.3f}'}   pass rate: {summary['pass_rate']}")
    print(f"samples: {summary['n_samples']} written, {summary['n_trainable_samples']} trainable, "
          f"episodes split into segments: {summary['split_episodes']} (token drift points: {summary['drift_count']})")
    if summary.get("twin_tasks") is not None:
        print(impossible_twin_text(summary))
    if "grader_watch/watched" in summary:
        tasks = summary.get("grader_watch_tasks") or {}
        print(f"grading watch: {summary['grader_watch/watched']} verifications watched, "
              f"{summary['grader_watch/unwatched']} unwatched; {sum(v.startswith('watched') for v in tasks.values())} "
              f"of {len(tasks)} tasks watched; reads_grader flagged {summary.get('hack/reads_grader', 0)} "
              f"(per task: summary.json grader_watch_tasks; per trial: its metadata grader_watch)")
        guards = list((summary.get("protection") or {}).values())
        if guards:
            print("run-time guard per task: " + ", ".join(f"{kind} {guards.count(kind)}" for kind in
                                                          ("watch and twin", "watch", "twin", "neither")))
    print(f"wall time: {summary['wall_seconds']}s   output: {out}/samples.jsonl, {out}/summary.json, {out}/trials/")
    print(f"browse the trials: slime-harbor view {out}")
    if summary.get("internal_errors"):  # bugs of ours: said on stderr, where a failing run looks
        print(f"{len(summary['internal_errors'])} internal errors (slime-harbor bugs, not the tasks'): tracebacks in "
              f"each trial dir's slime-harbor-error.txt, e.g. {summary['internal_errors'][0]}", file=sys.stderr)


def impossible_twin_text(summary: dict) -> str:
    """The impossible twins of a rollout's summary, in one line."""
    n, total = len(summary["twins"]), len(summary["twins"]) + len(summary["no_twin"])
    line = f"impossible twins: {n} of {total} tasks"
    if summary.get("twin_coverage") is not None:
        line += (f"; passing trials graded again: {summary['twin_coverage']:.0%}, passes_impossible "
                 f"{summary['hack/passes_impossible']}, twin errors {summary['hack/twin_errors']}")
    return line + f" (twin time {summary.get('time/twin_s', 0.0):.1f}s; per task: summary.json twins / no_twin)"


def view(out: Path, host: str = "127.0.0.1", port: int = 0) -> None:
    """Serve Harbor's own viewer (its prebuilt page and API) over OUT, in jobs mode: OUT/trials is
    a Harbor job dir (harbor_job.py), listed as the job "trials". Blocks until SIGINT / SIGTERM."""
    import socket

    import uvicorn
    from harbor.cli.view import STATIC_DIR
    from harbor.viewer import create_app

    from slime_harbor.harbor_job import HarborJob, is_job_dir

    out = Path(out)
    if is_job_dir(out) and not is_job_dir(out / "trials"):  # given OUT/trials itself
        out = out.parent
    if not is_job_dir(out / "trials") and (out / "trials").is_dir() and (out / "summary.json").is_file():
        HarborJob.backfill(out)  # an output made before rollouts wrote Harbor's job files
        print(f"wrote Harbor's job files into {out / 'trials'}", file=sys.stderr)
    if not is_job_dir(out / "trials"):
        raise ConfigError(f"{out} is not a rollout output: no Harbor job dir at {out / 'trials'}")
    if port == 0:
        with socket.socket() as probe:
            probe.bind((host, 0))
            port = probe.getsockname()[1]
    app = create_app(out.resolve(), mode="jobs", static_dir=STATIC_DIR if STATIC_DIR.exists() else None)
    print(f"Harbor viewer for {out}: http://{host}:{port}/  (Ctrl-C stops it)", flush=True)
    uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning")).run()


def prepare_data(tasks_dir: Path, out: Path, task_names: list[str] | None = None) -> int:
    """Rows for SLiME's --prompt-data: {"prompt", "label", "metadata"} per Harbor task."""
    from slime_harbor.tasks.task_dir import discover_tasks

    tasks = discover_tasks(tasks_dir, task_names)
    with open(out, "w") as f:
        for task in tasks:
            row = {
                "prompt": (task / "instruction.md").read_text(),
                "label": task.name,
                "metadata": {"task_name": task.name, "task_dir": str(task.resolve())},
            }
            f.write(json.dumps(row) + "\n")
    return len(tasks)


def main(argv: list[str] | None = None) -> None:
    """Run one command. Bad input ends in one line on stderr (never a traceback); SIGINT and
    SIGTERM stop it in order (see exits.py) with exit code 128 + the signal."""
    argv = sys.argv[1:] if argv is None else list(argv)
    # transformers draws a "Loading weights" bar on stderr for every model it loads (the trainer's,
    # each pushed checkpoint's): noise between the commands' own lines, and two lines more before
    # a one-line error. (Set before transformers is imported, which reads it then.)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        with SignalGuard() as guard:
            run_command(argv, guard)
    except Interrupted as exc:
        raise SystemExit(exc.exit_code) from None
    except ConfigError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None
    except CommandFailed as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        raise SystemExit(exc.exit_code) from None
    except WeightMismatch as exc:  # the served weights are not the trained ones: the run stopped before training on them
        print(f"{PROG}: error: weight check: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


def build_parser(demo_agent: str = "native") -> OneLineArgumentParser:
    """Every subcommand and its flags (train-local's are trainers/local.py's build_parser). The
    docs' reference is generated from these parsers. `demo_agent`: the agent whose defaults the
    demo's flags take (`demo --agent mini-swe-agent` tunes some for it)."""
    parser = OneLineArgumentParser(prog=PROG, description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    from slime_harbor.policy.chat_formats import FORMATS

    p = sub.add_parser("make-model", help="write a tiny offline policy (random weights) of one chat format: its "
                       "family's tokenizer and architecture (or a named full-attention stand-in)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--renderer", default="qwen3", choices=list(FORMATS), metavar="NAME",
                   help=f"the chat format (a renderers name), recorded in the checkpoint: {', '.join(FORMATS)}")
    p.add_argument("--trained-vocab", action="store_true",
                   help="a BPE trained here with the family's added tokens, not its real tokenizer "
                   "(qwen3.5, qwen3.6: ~2k ids, where 248k make the LM head most of a CPU training step)")

    p = sub.add_parser("serve", help="serve the policy: our embedded engine (the /generate and OpenAI "
                       "/v1/completions APIs), or a real engine from its venv")
    p.add_argument("--model", default=None, help="HF model dir (default: the tiny offline model)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--engine", choices=ENGINES, default=Embedded.name,
                   help=f"{Embedded.name}: ours, in this process; " + "; ".join(
                       f"{name}: the real engine from its venv ({kind.setup_script})" for name, kind in ENGINE_TYPES.items())
                   + "; each with the flags this machine needs")
    p.add_argument("--engine-args", default="", metavar="ARGS",
                   help="extra command-line arguments for the real engine, one string (e.g. \"--tp 2\")")

    p = sub.add_parser("rollout", help="run Harbor trials as GRPO groups and write samples")
    add_rollout_args(p, RolloutConfig())

    p = sub.add_parser("demo", help="the main job on embedded defaults: SFT warm start, then a short GRPO run on "
                       "procedural tasks with real trials; held-out success before and after",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    from slime_harbor.trainers.demo import DEMO_WANDB_PROJECT, add_flags, demo_defaults

    add_flags(p, demo_defaults(demo_agent), skip=("rft_arm",))  # the demo is GRPO only; bench/learning.py adds RFT
    p.add_argument("--wandb-project", default=DEMO_WANDB_PROJECT,
                   help="wandb project (offline unless a W&B login is configured); '' = no wandb")
    field_flags(p, RolloutConfig, DEMO_RUN_FLAGS, RolloutConfig())

    sub.add_parser("train-local", help="GRPO on this machine: rollouts from the current policy, LoRA updates "
                   "(see train-local --help)")

    p = sub.add_parser("view", help="browse a rollout's trials in Harbor's viewer (counts, rewards, errors, "
                       "trajectories)")
    p.add_argument("out", type=Path, help="a rollout's --out dir (OUT/trials is its Harbor job dir)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0: a free port")

    p = sub.add_parser("prepare-data", help="write SLiME --prompt-data rows, one per Harbor task")
    add_task_source_args(p)
    p.add_argument("--out", type=Path, required=True)

    p = sub.add_parser("swebench-tasks", help="convert SWE-bench instance records (JSONL) into Harbor task dirs, "
                       "graded offline by swebench's own harness")
    p.add_argument("--instances", type=Path, required=True, help="JSONL of SWE-bench instance records")
    p.add_argument("--out", type=Path, required=True, help="writes OUT/<instance_id>/ per record")
    p.add_argument("--image-namespace", default="swebench", help="namespace of the published instance images")

    p = sub.add_parser("calibrate", help="run each task's gold solution and the empty answer K times; write the "
                       "manifest of broken and flaky tasks that rollout / train-local / the SLiME hook skip")
    add_task_source_args(p, required=True, filters=False)
    p.add_argument("--env", default="local", help="as in rollout: local | docker | <harbor env type> | module:Class")
    p.add_argument("--repeats", type=int, default=3, help="runs of gold and of the empty answer per task")
    p.add_argument("--out", type=Path, default=None, help="the manifest (default: TASKS/calibration.json; for a dataset, in its dir under $SLIME_HARBOR_CACHE)")
    p.add_argument("--probe-hacks", action="store_true",
                   help="also run each blind attack (slime_harbor/hack_probes) once per task; a task one of "
                        "them scores on is marked hackable")
    p.add_argument("--attacks", type=Path, action="append", default=[], metavar="DIR",
                   help="with --probe-hacks: a directory of your own NAME.sh attack scripts, run beside the "
                        "bundled ones (repeatable)")

    p = sub.add_parser("impossible-tasks", help="write impossible variants of tasks (canaries for train-local "
                       "--canary-tasks): no honest solution passes one, so any pass is a hack nothing caught")
    p.add_argument("--tasks", type=Path, required=True, help="directory of Harbor task dirs")
    p.add_argument("--out", type=Path, required=True, help="writes OUT/canary--<task>/ per task")
    p.add_argument("--env", default="local", help="where the check runs each variant's gold solution (SWE-bench-"
                   "format tasks: docker)")
    p.add_argument("--no-check", dest="check", action="store_false",
                   help="do not run the gold solutions to check that each variant is impossible")

    return parser


def _demo_agent(argv: list[str]) -> str:
    """The demo's --agent (its defaults depend on it); a name the demo cannot run is one line."""
    from slime_harbor.trainers.demo import DEMO_AGENT_DEFAULTS

    if argv[:1] != ["demo"]:
        return "native"
    pre = OneLineArgumentParser(prog=f"{PROG} demo", add_help=False)  # reads --agent as the demo's parser will
    pre.add_argument("--agent", default="native")
    agent = pre.parse_known_args(argv[1:])[0].agent
    if agent not in DEMO_AGENT_DEFAULTS:
        raise ConfigError(f"demo --agent: one of {', '.join(DEMO_AGENT_DEFAULTS)} (the agents it has an SFT warm "
                          f"start for), not {agent!r}; train any other agent with train-local --agent")
    return agent


def run_command(argv: list[str], guard: SignalGuard) -> None:
    if argv[:1] == ["train-local"]:  # its flags are LocalTrainConfig's fields: local_trainer parses them
        from slime_harbor.trainers.local import main as train_local

        train_local(argv[1:], guard)
        return
    a = build_parser(_demo_agent(argv)).parse_args(argv)
    if a.command == "calibrate":
        from slime_harbor.calibrate import main as calibrate

        calibrate(selected_tasks(a)[0], a.env, a.repeats, a.out, a.probe_hacks, a.attacks)
    elif a.command == "impossible-tasks":
        from slime_harbor.canaries import main as impossible_tasks

        impossible_tasks(a.tasks, a.out, a.env, a.check)
    elif a.command == "make-model":
        try:
            print(build_tiny_model(a.out, seed=a.seed, renderer=a.renderer,
                                   config=TinyModelConfig(trained_vocab=a.trained_vocab)))
        except ValueError as exc:  # a format with no trained vocabulary (gpt-oss: harmony's own ids)
            raise ConfigError(str(exc)) from None
    elif a.command == "serve":
        model = a.model or str(ensure_tiny_model())
        if a.engine == Embedded.name:
            if a.engine_args:
                raise ConfigError(f"--engine-args is for an engine started from its venv ({', '.join(ENGINE_TYPES)})")
            from slime_harbor.policy.server import serve

            serve(model, host=a.host, port=a.port)
        else:
            import shlex

            from slime_harbor.policy.engine_launcher import EngineMissing, serve_engine

            try:
                code = serve_engine(a.engine, model, a.host, a.port, shlex.split(a.engine_args))
            except (EngineMissing, RuntimeError) as exc:
                raise ConfigError(str(exc)) from None
            raise CommandFailed(f"{a.engine} stopped on its own (exit code {code})", code)
    elif a.command == "rollout":
        run_rollout_command(rollout_config(a), guard)
    elif a.command == "demo":
        from slime_harbor.trainers.demo import LearningConfig, run_demo

        project = vars(a).pop("wandb_project")
        run_settings = {name: vars(a).pop(name) for name in DEMO_RUN_FLAGS}
        fields = {k: v for k, v in vars(a).items() if k != "command"}
        run_demo(LearningConfig(**fields), wandb_project=project, guard=guard, **run_settings)
    elif a.command == "view":
        view(a.out, host=a.host, port=a.port)
    elif a.command == "prepare-data":
        try:
            tasks_dir, task_names = selected_tasks(a)
            n = prepare_data(tasks_dir, a.out, task_names)
        except FileNotFoundError as exc:
            raise ConfigError(str(exc)) from None
        print(f"wrote {n} prompts to {a.out}")
    elif a.command == "swebench-tasks":
        from slime_harbor.tasks.swebench import InstanceError, SwebenchTaskOptions, convert

        try:
            tasks = convert(a.instances, a.out, SwebenchTaskOptions(image_namespace=a.image_namespace))
        except InstanceError as e:
            raise SystemExit(f"slime-harbor swebench-tasks: error: {e}") from None
        except ModuleNotFoundError as e:  # swebench names images, parsers and scripts
            raise SystemExit(f"slime-harbor swebench-tasks: error: {e}; install swebench==5.0.2") from None
        except OSError as e:  # an unwritable --out, a file in the way
            raise SystemExit(f"slime-harbor swebench-tasks: error: {e}") from None
        print(f"wrote {len(tasks)} Harbor tasks to {a.out}")


if __name__ == "__main__":
    main()
