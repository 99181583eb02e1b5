"""The local trainer against a separately started policy server (`slime-harbor serve` in its own
process, on loopback): weights go over SGLang's HTTP endpoints, and the next rollout is sampled
from the trained policy. Also the endpoints themselves, on the embedded server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch

from helpers.servers import free_port
from slime_harbor.samples import read_jsonl
from slime_harbor.trainers.local import config_from_args, train
from slime_harbor.trainers.local_config import LocalTrainConfig
from slime_harbor.trainers.learner import make_batch, token_logprobs

REPO = Path(__file__).resolve().parent.parent
FIXTURE_TASKS = REPO / "tests" / "fixtures" / "tasks"



@pytest.fixture
def serve_process(tiny_model_dir):
    """`slime-harbor serve` on the tiny model, in a process of its own; killed in finally."""
    yield from serve(tiny_model_dir)


def serve(model_dir):
    """Yields the URL of `slime-harbor serve --model model_dir` in a process of its own; killed in finally."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "slime_harbor.cli", "serve", "--model", str(model_dir), "--port", str(port)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "serve did not come up"
            time.sleep(0.3)
        yield url
    finally:
        proc.kill()
        proc.wait(timeout=30)


def _logprobs(model, samples) -> tuple[torch.Tensor, torch.Tensor]:
    """(recomputed, server's) logprobs of the sampled tokens of `samples`."""
    batch = make_batch(samples, [0.0] * len(samples))
    with torch.no_grad():
        lp = token_logprobs(model, batch, 1.0)
    mask = batch.loss_mask.bool()
    return lp[mask], batch.old_logprobs[mask]


def _load(path: Path, base: Path, lora: bool):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    if lora:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, path)
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model.eval()


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True], ids=["full-disk", "lora-adapters"])
def test_trainer_pushes_weights_to_a_separate_server(serve_process, tiny_model_dir, tmp_path, lora):
    out = tmp_path / "run"
    cfg = LocalTrainConfig(
        tasks_dir=FIXTURE_TASKS, model=str(tiny_model_dir), n_samples=4, num_rollouts=2, lr=1e-3, lora=lora,
        updates_per_rollout=1, step_limit=1, max_new_tokens=24, save_every=1, output_dir=out, device="cpu",
        kl_coef=0.0, policy_url=serve_process,
    )
    train(cfg)
    metrics = json.loads((out / "metrics.json").read_text())
    assert [m["skipped"] for m in metrics] == [None, None]
    assert metrics[0]["weights_pushed"] is True
    # The weight check scored its probe on the server after each push: the trained weights.
    assert all(m["weight_sync/probe_gap"] < 1e-4 for m in metrics), [m["weight_sync/probe_gap"] for m in metrics]
    # Step 2's rollout came from the server after it took step 1's weights: the trainer saw no gap.
    assert metrics[1]["server_logprob_gap"] < 1e-4, metrics[1]["server_logprob_gap"]

    samples = [s for s in read_jsonl(out / "rollouts" / "step_2" / "samples.jsonl") if any(s.loss_mask)]
    trained = _load(out / "checkpoint_1", tiny_model_dir, lora)
    ours, servers = _logprobs(trained, samples)
    assert (ours - servers).abs().mean().item() < 1e-4
    base, _ = _logprobs(_load(tiny_model_dir, tiny_model_dir, False), samples)
    assert (base - servers).abs().mean().item() > 1e-2  # the policy moved, and the server followed
    if lora:  # the previous step's adapter was unloaded; only the current one is left
        info = httpx.get(serve_process + "/get_model_info").json()
        assert list(info["lora_adapters"]) == ["policy-step2"]  # pushed after each step, the last one too


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_a_server_on_another_model_stops_the_run_before_its_first_rollout(tiny_model_dir, tmp_path, lora):
    """`train-local --policy-url` at a server started on another model than --model: the weight
    check before the first rollout stops the run in one line naming the engine, the version, the
    gap and the cause; no trial ran, no step trained, no process is left."""
    from helpers.cli import assert_one_line_error, command, env

    from slime_harbor.policy.tiny_model import build_tiny_model

    other = build_tiny_model(tmp_path / "other_model", seed=1)
    out = tmp_path / "run"
    for url in serve(other):
        proc = subprocess.run(command("train-local", "--tasks", str(FIXTURE_TASKS), "--model", str(tiny_model_dir),
                                      "--policy-url", url, "--num-rollouts", "1", "--n-samples", "2",
                                      "--output-dir", str(out), *([] if lora else ["--no-lora"])),
                              capture_output=True, text=True, env=env(), timeout=300)
    line = assert_one_line_error(proc, 1, "weight check", "embedded at", "version 0", "bound 1e-03 for float32")
    assert ("the server's base model is not --model" if lora else "started on another model than --model") in line
    assert not (out / "rollouts").exists() and not (out / "metrics.json").exists()


def test_the_weight_check_compares_the_served_logprobs_with_the_trainers(tiny_model_dir, tmp_path, capsys):
    """Through the embedded server's SGLang /generate (input_token_logprobs) and vLLM-style
    /v1/completions (prompt_logprobs): the same model agrees to float precision, another one is a
    WeightMismatch in mode error, a warning in mode warn, nothing in mode off."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from slime_harbor.policy.server import EmbeddedPolicyServer
    from slime_harbor.policy.tiny_model import build_tiny_model
    from slime_harbor.policy.weight_check import PROBE_TOKENS, WeightCheck, WeightMismatch
    from slime_harbor.policy.wire_api import CompletionsAPI, GenerateAPI

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    ours = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    other = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "other", seed=1), dtype=torch.float32).eval()
    with EmbeddedPolicyServer(tiny_model_dir) as server:
        check = WeightCheck(server.url)
        figures = check.check(ours, tokenizer, 0)
        assert figures["weight_sync/probe_gap"] < 1e-5 and figures["weight_sync/probe_ms"] > 0
        tokens = tokenizer.encode("def add(a, b):\n    return a + b\n" * 40)
        check.fix_probe(tokens)
        check.fix_probe(tokens[5:])  # only the run's first trained sample counts
        assert check.probe == tokens[:PROBE_TOKENS] and len(check.probe) == PROBE_TOKENS
        generate_api = GenerateAPI.score(server.url, check.probe, None, None, 60)
        completions_api = CompletionsAPI.score(server.url, check.probe, "policy", None, 60)
        assert len(generate_api) == PROBE_TOKENS - 1 and generate_api == pytest.approx(completions_api, abs=1e-6)
        assert check.check(ours, tokenizer, 1)["weight_sync/probe_gap"] < 1e-5
        with pytest.raises(WeightMismatch, match=r"version 2: mean \|logprob gap\| .* over 255 probe tokens .*"
                                                 r"likely cause: a test"):
            check.check(other, tokenizer, 2, "a test")
        check.mode = "warn"
        assert check.check(other, tokenizer, 3)["weight_sync/probe_gap"] > 1e-1
        assert "weight check: embedded at" in capsys.readouterr().err
        check.mode = "off"
        assert check.check(other, tokenizer, 4) == {}


@pytest.mark.slow
def test_asynchronous_training_labels_each_call_with_the_version_the_server_held(serve_process, tiny_model_dir,
                                                                                 tmp_path):
    """--max-staleness 1 against a separate server: a LoRA policy goes over as merged weights
    (update_weights_from_disk with weight_version N, swapped in between calls), and every call's
    logprobs are those of the weights its version names (checkpoint_N; the base for 0)."""
    out = tmp_path / "run"
    train(LocalTrainConfig(
        tasks_dir=FIXTURE_TASKS, model=str(tiny_model_dir), n_samples=4, num_rollouts=3, lr=1e-2, updates_per_rollout=1,
        step_limit=1, max_new_tokens=24, save_every=1, output_dir=out, device="cpu", kl_coef=0.0,
        policy_url=serve_process, max_staleness=1, concurrency=4,
    ))
    metrics = json.loads((out / "metrics.json").read_text())
    assert [m["weight_version"] for m in metrics] == [1, 2, 3] and all(m["weights_pushed"] for m in metrics)
    assert httpx.get(serve_process + "/model_info").json()["weight_version"] == "3"
    from helpers.samples import check_token_versions

    versions, models = set(), {}
    for m in metrics:
        for s in read_jsonl(out / "rollouts" / f"step_{m['step']}" / "samples.jsonl"):
            # One call per episode (step_limit 1); an update that lands on it splits it into spans of
            # two versions (the call goes on from its tokens), each token scored by its own version.
            spans = [span for call in s.metadata["version_spans"] for span in call]
            used = {version for version, _, _ in spans}
            for version in used - models.keys():
                models[version] = _load(out / f"checkpoint_{version}", tiny_model_dir, True) if version != "0" else \
                    _load(tiny_model_dir, tiny_model_dir, False)
            check_token_versions(s.tokens, s.response_length, s.rollout_log_probs, spans,
                                 {v: models[v] for v in used})
            versions |= used
            assert m["step"] - 1 - min(map(int, used)) <= 1  # the oldest token within the bound, so trained
    assert len(versions) > 1


@pytest.mark.slow
def test_server_without_weight_endpoints_recomputes_old_logprobs(policy_server, tiny_model_dir, tmp_path):
    """--weight-sync none: the server keeps the base weights; the trainer recomputes old logprobs
    and logs how far the server's are (step 2: the base's against the moved policy)."""
    out = tmp_path / "run"
    cfg = LocalTrainConfig(
        tasks_dir=FIXTURE_TASKS, model=str(tiny_model_dir), n_samples=4, num_rollouts=2, lr=1e-3, lora=False,
        step_limit=1, max_new_tokens=24, save_every=0, output_dir=out, device="cpu", kl_coef=0.0,
        policy_url=policy_server, weight_sync="none",
    )
    train(cfg)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics[0]["weights_pushed"] is False
    assert metrics[0]["server_logprob_gap"] < 1e-4  # nothing trained yet: same weights
    assert metrics[1]["server_logprob_gap"] > 1e-2  # the server still serves the base
    assert abs(metrics[1]["ratio_mean"] - 1.0) < 1e-4  # recomputed old logprobs: on-policy ratio


def test_lora_endpoints_follow_sglang(tiny_model_dir, tmp_path, tokenizer):
    """load / unload / per-request adapters, and update_weights_from_disk, on the embedded server."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from slime_harbor.policy.server import EmbeddedPolicyServer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    peft.save_pretrained(tmp_path / "adapter")
    merged = peft.merge_and_unload()
    prompt = tokenizer.encode("hello world", add_special_tokens=False)
    with torch.no_grad():
        want = torch.log_softmax(merged(torch.tensor([prompt])).logits[0, -1], -1)
    with EmbeddedPolicyServer(tiny_model_dir) as server:
        def gen(**extra):
            body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 1, "temperature": 0},
                    "return_logprob": True, **extra}
            return httpx.post(server.url + "/generate", json=body, timeout=60)

        assert gen(lora_path="a").status_code == 400  # not loaded yet
        base_lp = gen().json()["meta_info"]["output_token_logprobs"][0]
        r = httpx.post(server.url + "/load_lora_adapter", json={"lora_name": "a", "lora_path": str(tmp_path / "adapter")})
        assert r.status_code == 200 and r.json()["success"]
        assert httpx.post(server.url + "/load_lora_adapter",
                          json={"lora_name": "a", "lora_path": str(tmp_path / "adapter")}).status_code == 400
        lp, token, _ = gen(lora_path="a").json()["meta_info"]["output_token_logprobs"][0]
        assert abs(lp - want[token].item()) < 1e-4
        assert gen().json()["meta_info"]["output_token_logprobs"][0] == pytest.approx(base_lp[:2] + [None])
        models = httpx.get(server.url + "/v1/models").json()["data"]
        assert [m["id"] for m in models][1:] == ["a"]
        r = httpx.post(server.url + "/unload_lora_adapter", json={"lora_name": "a"})
        assert r.status_code == 200 and r.json()["loaded_adapters"] == {}
        assert gen(lora_path="a").status_code == 400

        merged.save_pretrained(tmp_path / "merged")
        r = httpx.post(server.url + "/update_weights_from_disk", json={"model_path": str(tmp_path / "merged")})
        assert r.status_code == 200 and r.json()["success"], r.text
        lp, token, _ = gen().json()["meta_info"]["output_token_logprobs"][0]
        assert abs(lp - want[token].item()) < 1e-4
        bad = httpx.post(server.url + "/update_weights_from_disk", json={"model_path": str(tmp_path / "missing")})
        assert bad.status_code == 400 and bad.json()["success"] is False
        assert httpx.get(server.url + "/get_model_info").json()["model_path"] == str(tmp_path / "merged")


def test_flags_users_type_today():
    cfg = config_from_args(["--vllm-url", "http://h:1", "--agent-step-limit", "7", "--eval-timeout", "90",
                            "--save-every", "3", "--temperature", "0.7", "--weight-sync", "disk"])
    assert (cfg.policy_url, cfg.step_limit, cfg.verifier_timeout_sec, cfg.save_every, cfg.temperature, cfg.weight_sync) \
        == ("http://h:1", 7, 90.0, 3, 0.7, "disk")
    assert config_from_args(["--policy-url", "http://h:2"]).policy_url == "http://h:2"
    rollout = cfg.rollout("http://h:1", "m", Path("o"), lora_name="policy-step1")
    assert rollout.verifier_timeout_sec == 90.0 and rollout.lora_name == "policy-step1"


def test_a_bf16_engine_is_held_to_the_half_precision_bound(tiny_model_dir, tmp_path, capsys):
    """An engine computing in bf16 (the embedded one, as /server_info says): the trainer's own weights
    sit within HALF_PRECISION_BOUND, quietly (bf16's rounding, not a fault); another model is a
    WeightMismatch naming the bf16 bound (it was only ever a warning for bf16)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from slime_harbor.policy.embedded_engine import EngineConfig
    from slime_harbor.policy.server import EmbeddedPolicyServer
    from slime_harbor.policy.tiny_model import build_tiny_model
    from slime_harbor.policy.weight_check import GAP_BOUNDS, WeightCheck, WeightMismatch

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    ours = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    other = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "other", seed=1), dtype=torch.float32).eval()
    with EmbeddedPolicyServer(tiny_model_dir, engine_config=EngineConfig(dtype="bfloat16")) as server:
        check = WeightCheck(server.url)
        gap = check.check(ours, tokenizer, 0)["weight_sync/probe_gap"]
        assert 1e-3 < gap < GAP_BOUNDS["bfloat16"]  # bf16's rounding: over float32's bound, within its own
        assert "weight check" not in capsys.readouterr().err
        with pytest.raises(WeightMismatch, match=r"version 1: .* \(bound 5e-01 for bfloat16\)"):
            check.check(other, tokenizer, 1)
