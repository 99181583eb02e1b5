"""Engines as classes (policy/engines/): each kind one class, found by name or from a server's
answers, doing what its abilities declare. A new engine is one class and its line in the registry:
here a stand-in engine, declared in this file alone, is registered, started by EngineProcess under
the parent guard, recognised at its URL, passes the weight check, and serves a short train-local
run with a weight push; then it is stopped with nothing left. A server of a kind with no ability
(any OpenAI-compatible one) is sampled and trained against without pushes or checks, said once."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers.servers import free_port

from slime_harbor.policy.engine_launcher import ENGINES, EngineProcess, engine_python, engine_type, process_group_alive
from slime_harbor.policy.engines import ENGINE_KINDS, ENGINE_TYPES
from slime_harbor.policy.engines.abilities import StartsFromVenv
from slime_harbor.policy.engines.base import Engine, EngineMissing, ServerAnswers
from slime_harbor.policy.engines.embedded import SERVER_NAME
from slime_harbor.policy.engines.generate_server import GenerateServer
from slime_harbor.policy.wire_api import WIRE_APIS

REPO = Path(__file__).resolve().parent.parent
FIXTURE_TASKS = REPO / "tests" / "fixtures" / "tasks"


class StandIn(GenerateServer, StartsFromVenv):
    """Our embedded server in a process of its own, started the way a real engine is, and
    recognised as this kind at the URLs it was started on (its abilities: a /generate server's)."""

    name = "stand-in"
    setup_script = "(none: it runs with this Python)"
    started_at: set[str] = set()

    @classmethod
    def recognise(cls, answers: ServerAnswers) -> Engine | None:
        info = answers.get("/server_info")
        if answers.url not in cls.started_at or (info or {}).get("engine") != SERVER_NAME:
            return None
        return cls(answers.url, info.get("max_total_num_tokens"), answers.served_model, serves_lora=True)

    @classmethod
    def venv_name(cls, gpu: bool) -> str:
        return "unused"

    @classmethod
    def after_start(cls, url: str) -> None:
        cls.started_at.add(url)

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
    assert len({kind.name for kind in ENGINE_KINDS}) == len(ENGINE_KINDS)
    assert all(kind.wire_api in WIRE_APIS for kind in ENGINE_KINDS)


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
    monkeypatch.setattr("slime_harbor.policy.engines.ENGINE_KINDS", [StandIn, *ENGINE_KINDS])
    engine = EngineProcess(StandIn.name, tiny_model_dir, port=free_port(), log_path=tmp_path / "stand-in.log")
    with engine:
        group = engine.process.pid
        assert type(probe(engine.url)) is StandIn and probe(engine.url).weight_version() == "0"
        assert WeightCheck(engine.url).check(model, tokenizer, 0)["weight_sync/probe_gap"] < 1e-5
        out = tmp_path / "run"
        train(LocalTrainConfig(tasks_dir=FIXTURE_TASKS, model=str(tiny_model_dir), n_samples=2, num_rollouts=1,
                               updates_per_rollout=1, step_limit=1, max_new_tokens=16, output_dir=out, device="cpu",
                               kl_coef=0.0, lora=False, policy_url=engine.url))
        metrics = json.loads((out / "metrics.json").read_text())
        assert len(metrics) == 1 and metrics[0]["weights_pushed"] is True
        assert metrics[0]["weight_sync/probe_gap"] < 1e-4
    assert not process_group_alive(group)


@pytest.fixture
def models_only_server():
    """A real HTTP server on loopback that answers the OpenAI API's GET /v1/models and nothing
    else: a kind of server that declares no ability beyond sampling."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            found = self.path == "/v1/models"
            body = json.dumps({"object": "list", "data": [{"id": "served", "max_model_len": 4096}]} if found
                              else {"detail": "Not Found"}).encode()
            self.send_response(200 if found else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_GET

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_kind_without_abilities_is_trained_against_without_pushes_or_checks(models_only_server, model, tokenizer,
                                                                              tmp_path, capsys):
    from slime_harbor.policy.engines.abilities import WeightSyncError
    from slime_harbor.policy.engines.openai_server import OpenAIServer
    from slime_harbor.policy.probe import probe, server_dtype, weight_version
    from slime_harbor.policy.weight_check import WeightCheck
    from slime_harbor.policy.weights import WeightSync

    engine = probe(models_only_server)
    assert type(engine) is OpenAIServer and (engine.api, engine.served_model, engine.context_len) == (
        "openai", "served", 4096)
    assert weight_version(models_only_server) is None and server_dtype(models_only_server) is None
    sync = WeightSync(models_only_server, "auto", tmp_path / "weights")
    assert sync.push(model, tokenizer, 1) is False and sync.mode == "none" and sync.version == 0
    assert "takes no weight updates: weights are not pushed" in capsys.readouterr().err
    with pytest.raises(WeightSyncError, match=r"^http://127.0.0.1:\d+ \(openai\) cannot take a weight update by disk$"):
        WeightSync(models_only_server, "disk", tmp_path / "weights").push(model, tokenizer, 1)
    check = WeightCheck(models_only_server)
    assert check.check(model, tokenizer, 0) == {} and check.check(model, tokenizer, 1) == {}
    assert capsys.readouterr().err.count("cannot score a prompt") == 1


def test_a_stopped_servers_port_is_asked_anew(tiny_model_dir):
    """A server this package stops is forgotten: its port, probed again, answers for what is there now
    (a port handed out again in the same process held a stale Embedded before)."""
    from slime_harbor.policy.engines.base import Unrecognised
    from slime_harbor.policy.engines.embedded import Embedded
    from slime_harbor.policy.probe import probe
    from slime_harbor.policy.server import EmbeddedPolicyServer

    with EmbeddedPolicyServer(tiny_model_dir, port=free_port()) as server:
        assert type(probe(server.url)) is Embedded
    assert type(probe(server.url)) is Unrecognised


def test_a_url_nothing_answers_is_not_remembered_as_a_kind(tiny_model_dir):
    """A server probed before it is up is asked again once it is: the first answer is not kept."""
    from slime_harbor.policy.engines.base import Unrecognised
    from slime_harbor.policy.engines.embedded import Embedded
    from slime_harbor.policy.probe import probe
    from slime_harbor.policy.server import EmbeddedPolicyServer

    port = free_port()
    assert type(probe(f"http://127.0.0.1:{port}")) is Unrecognised
    with EmbeddedPolicyServer(tiny_model_dir, port=port) as server:
        assert type(probe(server.url)) is Embedded and probe(server.url).serves_lora
