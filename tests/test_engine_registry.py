"""The engines we start, as classes found by name (policy/engines/): a new engine is one class and
its line in the registry. Here a stand-in engine, declared in this file alone, is registered,
started by EngineProcess under the parent guard, passes the weight check, and serves a short
train-local run; then it is stopped with nothing left."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers.servers import free_port

from slime_harbor.policy.engine_launcher import ENGINES, EngineProcess, engine_python, engine_type, process_group_alive
from slime_harbor.policy.engines import ENGINE_TYPES
from slime_harbor.policy.engines.base import Engine, EngineMissing
from slime_harbor.policy.wire_api import WIRE_APIS

REPO = Path(__file__).resolve().parent.parent
FIXTURE_TASKS = REPO / "tests" / "fixtures" / "tasks"


class StandIn(Engine):
    """Our embedded server in a process of its own, started the way a real engine is."""

    name = "stand-in"
    wire_api = "sglang"
    setup_script = "(none: it runs with this Python)"

    @classmethod
    def python(cls, gpu: bool) -> Path:
        return Path(sys.executable)

    @classmethod
    def command(cls, python: Path, model: str, host: str, port: int, gpu: bool, env: dict[str, str]) -> list[str]:
        env["PYTHONPATH"] = str(REPO)
        return [str(python), "-m", "slime_harbor.cli", "serve", "--engine", "embedded", "--model", model,
                "--host", host, "--port", str(port)]


def test_every_engine_we_start_declares_a_wire_api_and_is_an_engine_name():
    assert ENGINES == ("embedded", *ENGINE_TYPES)
    for name, kind in ENGINE_TYPES.items():
        assert issubclass(kind, Engine) and kind.name == name and kind.wire_api in WIRE_APIS


def test_an_unknown_or_uninstalled_engine_is_one_line(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=r"^engine must be one of sglang, vllm to start a real one, got 'embedded'$"):
        engine_type("embedded")
    monkeypatch.setenv("SLIME_HARBOR_CACHE", str(tmp_path))
    for name, kind in ENGINE_TYPES.items():
        with pytest.raises(EngineMissing, match=rf"^{name} is not installed .*run 'bash {kind.setup_script}' first$"):
            engine_python(name, gpu=False)


@pytest.mark.slow
def test_a_stand_in_engine_added_through_the_registry_passes_the_weight_check_and_trains(
        tiny_model_dir, model, tokenizer, tmp_path, monkeypatch):
    from slime_harbor.policy.probe import probe
    from slime_harbor.policy.weight_check import WeightCheck
    from slime_harbor.trainers.local import train
    from slime_harbor.trainers.local_config import LocalTrainConfig

    monkeypatch.setitem(ENGINE_TYPES, StandIn.name, StandIn)
    engine = EngineProcess(StandIn.name, tiny_model_dir, port=free_port(), log_path=tmp_path / "stand-in.log")
    with engine:
        group = engine.process.pid
        assert probe(engine.url).api == StandIn.wire_api
        assert WeightCheck(engine.url).check(model, tokenizer, 0)["weight_sync/probe_gap"] < 1e-5
        out = tmp_path / "run"
        train(LocalTrainConfig(tasks_dir=FIXTURE_TASKS, model=str(tiny_model_dir), n_samples=2, num_rollouts=1,
                               updates_per_rollout=1, step_limit=1, max_new_tokens=16, output_dir=out, device="cpu",
                               kl_coef=0.0, lora=False, policy_url=engine.url))
        metrics = json.loads((out / "metrics.json").read_text())
        assert len(metrics) == 1 and metrics[0]["weights_pushed"] is True
        assert metrics[0]["weight_sync/probe_gap"] < 1e-4
    assert not process_group_alive(group)
