"""Experiment tracking for the local trainer: wandb, and the reward-curve PNG.

metrics.json is the source of truth; wandb gets every numeric field of every record of it, under
the name SLiME's own logging gives the same quantity (slime/observability/: rollout/raw_reward,
passrate/pass@1, train/pg_loss, train/kl_loss, train/pg_clipfrac, perf/rollout_time, eval/<set>,
eval/<set>-pass@k, ...), so dashboards built on SLiME runs read local runs too. Fields SLiME has
no name for keep their metrics.json path under the side they belong to (rollout/ or train/).

wandb never reaches the network unless the user asked for it: the mode is WANDB_MODE when set,
"online" only where a W&B API key is configured (WANDB_API_KEY or a netrc entry), else
"offline" (the run is written under OUTPUT_DIR/wandb/ and can be uploaded later with
`wandb sync`). `read_offline_history` reads such a run back without wandb's servers.
"""

from __future__ import annotations

import json
import netrc
import os
import struct
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

EVAL_SET = "heldout"  # the evaluation set's name in eval/<set> keys (SLiME names it per dataset)

# metrics.json path -> SLiME's name for the same quantity.
SLIME_NAMES = {
    "reward_mean": "rollout/raw_reward",
    "pass_rate": "passrate/pass@1",
    "truncated_ratio": "rollout/truncated_ratio",
    "loss": "train/loss",
    "pg_loss": "train/pg_loss",
    "kl": "train/kl_loss",
    "clipfrac": "train/pg_clipfrac",
    "ppo_kl": "train/ppo_kl",
    # |log pi - log pi_sampler| over the sampled tokens: the old logprobs ARE the rollout's.
    "abs_ppo_kl": "train/train_rollout_logprob_abs_diff",
    "grad_norm": "train/grad_norm",
    "timings/rollout_s": "perf/rollout_time",
    "timings/train_s": "perf/actor_train_time",
    "timings/eval_s": "perf/eval_time",
    "n_groups_zero_std": "rollout/dynamic_filter/drop_zero_std",  # groups; filters/zero_std counts episodes
    "eval/reward_mean": f"eval/{EVAL_SET}",
    "eval/truncated_ratio": f"eval/{EVAL_SET}-truncated_ratio",
}
TRAIN_FIELDS = {"n_trained_samples", "n_tokens", "ratio_mean", "skipped", "updates"}


def flatten(record: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """Every numeric leaf of a metrics.json record, by its path ("timings/rollout_s", "updates/0/loss");
    a string `skipped` reason counts as 1 (skipped) and None as 0."""
    out: dict[str, float] = {}
    for key, value in record.items():
        path = f"{prefix}{key}"
        if key == "skipped" and not prefix:
            out[path] = float(value is not None)
        elif isinstance(value, dict):
            out |= flatten(value, path + "/")
        elif isinstance(value, list):
            out |= flatten({str(i): v for i, v in enumerate(value)}, path + "/")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[path] = float(value)
        elif isinstance(value, bool):
            out[path] = float(value)
    return out


def wandb_key(path: str) -> str:
    """The wandb name of a metrics.json path (SLiME's where it has one)."""
    if path in SLIME_NAMES:
        return SLIME_NAMES[path]
    head, _, rest = path.partition("/")
    if head == "eval":
        if rest.startswith("pass@"):
            return f"eval/{EVAL_SET}-{rest}"  # SLiME: eval/<set>-pass@k
        return f"eval/{EVAL_SET}/{rest}"
    if head in ("timings",):
        return f"perf/{rest}"
    if head in ("weight_sync", "time"):  # the weight check's figures, time/twin_s: their own sections
        return path
    return f"{'train' if head in TRAIN_FIELDS else 'rollout'}/{path}"


def wandb_mode() -> str:
    """WANDB_MODE if set; online only where an API key is configured; else offline."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    try:
        if netrc.netrc().authenticators("api.wandb.ai"):
            return "online"
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        pass
    return "offline"


RUN_ID_FILE = "wandb_run_id"  # in OUTPUT_DIR: the wandb run a resumed training run continues


class WandbRun:
    """One wandb run for one training run; `log(record)` per metrics.json record.

    The run's id is kept in OUTPUT_DIR/wandb_run_id, so a `--resume`d run logs on into the same
    wandb run (resume="allow") instead of starting a second one; offline, its steps land in a new
    offline-run dir with the same id, which `wandb sync` joins to the first."""

    def __init__(self, project: str, run_name: str | None, out_dir: Path, config: dict[str, Any]):
        import wandb

        self.wandb = wandb
        self.mode = wandb_mode()
        id_file = Path(out_dir) / RUN_ID_FILE
        run_id = id_file.read_text().strip() if id_file.is_file() else ""
        if not run_id:
            run_id = uuid.uuid4().hex[:12]
            id_file.parent.mkdir(parents=True, exist_ok=True)
            id_file.write_text(run_id + "\n")
        self.run = wandb.init(
            project=project, name=run_name, dir=str(out_dir), config=config, mode=self.mode, reinit="finish_previous",
            id=run_id, resume="allow", settings=wandb.Settings(console="off", x_disable_stats=True, silent=True),
        )
        # SLiME's step axes (slime/observability/wandb_utils.py).
        for axis, pattern in (("train/step", "train/*"), ("rollout/step", "rollout/*"), ("rollout/step", "passrate/*"),
                              ("eval/step", "eval/*"), ("rollout/step", "perf/*")):
            self.run.define_metric(axis)
            self.run.define_metric(pattern, step_metric=axis)
        self.dir = Path(self.run.dir).parent  # .../wandb/<offline-run-...>

    def log(self, record: dict[str, Any]) -> None:
        step = record["step"]
        values = {wandb_key(p): v for p, v in flatten(record).items() if p != "step"}
        values.update({"rollout/step": step, "train/step": step})
        if "eval" in record:
            values["eval/step"] = step
        self.run.log(values)

    def log_image(self, key: str, path: Path) -> None:
        self.run.log({key: self.wandb.Image(str(path))})

    def finish(self) -> None:
        self.run.finish()


# --------------------------------------------------------------------------------------------


def plot_reward_curve(path: Path, steps: Sequence[int], rewards: Sequence[float | None],
                      heldout: Sequence[tuple[int, float]], title: str,
                      heldout_label: str = "held-out success (step 0: before training)") -> None:
    """Training reward per step and held-out success on one chart (matplotlib, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, [float("nan") if r is None else r for r in rewards], "o-", ms=3,
            label="GRPO training reward (this step's rollouts)")
    if heldout:
        ax.plot(*zip(*heldout), "s--", label=heldout_label)
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("reward / success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# --------------------------------------------------------------------------------------------
# Reading an offline run back (the .wandb file is a LevelDB-style log of protobuf Records).

_BLOCK = 32768
_HEADER = 7  # ":W&B", a 2-byte magic, a version byte


def _chunks(data: bytes) -> Iterator[bytes]:
    pos, pending = _HEADER, b""
    while pos + 7 <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < 7:  # block trailer: zero padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 1:  # full
            yield chunk
        elif kind == 2:  # first
            pending = chunk
        elif kind == 3:  # middle
            pending += chunk
        elif kind == 4:  # last
            yield pending + chunk
            pending = b""


def read_offline_history(run_dir: Path) -> list[dict[str, Any]]:
    """The history rows (one dict per wandb.log call) of an offline run dir (wandb/offline-run-*)."""
    from wandb.proto import wandb_internal_pb2

    (file,) = Path(run_dir).glob("run-*.wandb")
    data = file.read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{file} is not a wandb transaction log")
    rows = []
    for chunk in _chunks(data):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(chunk)
        if record.WhichOneof("record_type") == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item})
    return rows
