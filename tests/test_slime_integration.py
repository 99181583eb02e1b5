"""SLiME's own rollout loop drives our hook, end to end, on this machine.

SLiME's `generate_rollout` (slime.rollout.sglang_rollout) reads the prompts file `slime-harbor
prepare-data` wrote through SLiME's own data source, calls `slime_harbor.hooks.generate` for every
sample, and ends the round with its own abort; real Harbor trials run in the local bubblewrap
sandbox against the embedded policy server standing in for the SGLang router (or, in the router
variant, the real sglang-router in front of two embedded servers). Then RolloutManager's own
`_get_rollout_data` (validation + flattening), `_post_process_rewards` (with our post-process) and
`_convert_samples_to_train_data`, and SLiME's policy loss (slime.utils.ppo_utils) on the result.

The round: a group of the native agent, a group of terminus-2 and a group of Harbor's mini-swe-agent
(both through the hook's recording gateway in front of the policy: terminus-2 re-renders its history
one way, mini-swe-agent through LiteLLM another, and each episode is still one token-exact sample whose
logprobs a recomputation by the model matches), a task whose image does not build
(permanent: FAILED, not retried), and a surplus group still running when SLiME ends the round (its
abort cancels the trial; the sandbox is gone when the round returns). The verifier of the sampled
tasks flips a coin, so the untrained policy still gets rewards that differ within a group.

Stubbed, because they need a GPU or an engine that cannot run here (nothing else is):
  - `ray` (remote/get, util.scheduling_strategies): RolloutManager is a Ray actor class; its
    methods run here on a minimal self instead (its __init__ starts SGLang engines on GPUs).
  - `sglang.srt.{server_args,utils,constants}`: SGLang's engine; only names imported at module load.
  - Megatron: not stubbed but avoided; slime/backends/megatron_utils/loss.py needs it, so the loss
    is SLiME's compute_policy_loss from slime/utils/ppo_utils.py, reduced per rollout as SLiME does.

Run: PYTHONPATH=$PWD:<a THUDM/slime checkout> .venv/bin/python -m pytest tests/test_slime_integration.py
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import shutil
import sys
import time
import types
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from slime_harbor import hooks
from slime_harbor.cli import prepare_data
from slime_harbor.retries import RetryBudget
from slime_harbor.run_config import DEFAULT_TASKS

try:
    HAVE_SLIME = importlib.util.find_spec("slime") is not None
except ModuleNotFoundError:
    HAVE_SLIME = False

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not HAVE_SLIME, reason="slime is not importable (PYTHONPATH=<a THUDM/slime checkout>)"),
]

from helpers.rollout import leftovers, NATIVE_REPLY, TERMINUS_REPLY  # noqa: E402
from helpers.slime import install_slime_stubs  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
N_PER_PROMPT = 2


@pytest.fixture(scope="module")
def policy_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model after a short SFT on the one instruction of this round, so both agents answer
    in their format and end their turn (the untrained model rambles to its token limit every turn,
    and terminus-2 then never finishes a parseable turn before the task's timeout)."""
    from transformers import AutoTokenizer

    from slime_harbor.agents.native import initial_prompt_ids
    from slime_harbor.policy.renderer import make_renderer
    from slime_harbor.trainers.sft import SFTConfig, sft_model_dir

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    instruction = (DEFAULT_TASKS / "dedupe-lines" / "instruction.md").read_text()
    # terminus-2's own first prompt (its template, this instruction, a fresh shell's screen), so the
    # taught reply is what the policy answers in the trial.
    import harbor.agents.terminus_2 as terminus_2

    template = (Path(terminus_2.__file__).parent / "templates" / "terminus-json-plain.txt").read_text()
    screen = "Current Terminal Screen:\nroot@sandbox:/app#\n" + "\n" * 40
    terminus_prompt = tok.apply_chat_template(
        [{"role": "user", "content": template.format(instruction=instruction, terminal_state=screen)}],
        add_generation_prompt=True, tokenize=True)
    terminus_prompt = terminus_prompt if isinstance(terminus_prompt, list) else terminus_prompt["input_ids"]
    # terminus-2's reply is taught one character per token: its JSON parses, but when terminus-2
    # re-renders the history next turn the chat template tokenizes that text canonically, so the
    # next prompt does not extend the sampled tokens: real drift, which splits the episode.
    body = TERMINUS_REPLY.removesuffix("<|im_end|>")
    char_ids = [i for ch in body for i in tok.encode(ch, add_special_tokens=False)]
    assert char_ids != tok.encode(body, add_special_tokens=False) and tok.decode(char_ids) == body
    pairs = [(initial_prompt_ids(make_renderer(tiny_model_dir, tok), instruction), tok.encode(NATIVE_REPLY, add_special_tokens=False)),
             (list(terminus_prompt), char_ids + tok.encode("<|im_end|>", add_special_tokens=False))]
    out = tmp_path_factory.mktemp("policy")
    sft_model_dir(tiny_model_dir, out, pairs, SFTConfig(steps=40, batch_size=2))
    return out


@pytest.fixture(scope="module")
def slime_modules():
    added = install_slime_stubs()  # the stand-ins for ray and SGLang's engine (module docstring)
    from slime.ray import rollout as ray_rollout

    yield ray_rollout
    for name in added:  # SLiME's modules imported with them stay; nothing else sees the stubs
        sys.modules.pop(name, None)


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    """SLiME's GenerateState is a process-wide singleton (it holds the router address and the
    abort flag); each test starts without one, and our hook's counters start at zero."""
    monkeypatch.setattr(hooks, "METRICS", Counter())
    monkeypatch.setattr(hooks, "RETRY_BUDGET", RetryBudget())
    yield
    from slime.utils.misc import SingletonMeta

    for cls in [c for c in SingletonMeta._instances if c.__name__ == "GenerateState"]:
        SingletonMeta._instances.pop(cls)


# ---- tasks, prompts, args ----------------------------------------------------------------------

COIN_VERIFIER = """#!/bin/bash
# A coin flip: the untrained policy rarely solves anything, and GRPO needs rewards that differ.
mkdir -p /logs/verifier
echo $((RANDOM % 2)) > /logs/verifier/reward.txt
"""


def make_tasks(root: Path) -> Path:
    """coin (sampled by the policy), broken-image (its Dockerfile fails), slow (the oracle sleeps)."""
    tasks = root / "tasks"
    base = DEFAULT_TASKS / "dedupe-lines"
    for name in ("coin", "broken-image", "slow"):
        shutil.copytree(base, tasks / name)
    (tasks / "coin" / "tests" / "test.sh").write_text(COIN_VERIFIER)
    toml = tasks / "coin" / "task.toml"  # bounds an episode of the untrained policy on a busy machine
    toml.write_text(toml.read_text().replace("[agent]\ntimeout_sec = 120.0", "[agent]\ntimeout_sec = 60.0"))
    slow = tasks / "slow" / "task.toml"  # outlasts the round: SLiME's abort must be what ends it
    slow.write_text(slow.read_text().replace("[agent]\ntimeout_sec = 120.0", "[agent]\ntimeout_sec = 900.0"))
    with open(tasks / "broken-image" / "environment" / "Dockerfile", "a") as f:
        f.write("RUN exit 3\n")
    (tasks / "slow" / "solution" / "solve.sh").write_text("#!/bin/bash\nsleep 600\n")
    return tasks


def write_prompts(tasks: Path, out: Path, rows_for) -> Path:
    """`slime-harbor prepare-data`, then each row as the round needs it (an agent per row)."""
    prepare_data(tasks, out / "all.jsonl")
    by_name = {json.loads(line)["label"]: json.loads(line) for line in (out / "all.jsonl").read_text().splitlines()}
    prompts = out / "prompts.jsonl"
    with open(prompts, "w") as f:
        for label, agent in rows_for:
            row = json.loads(json.dumps(by_name[label]))
            if agent:
                row["metadata"]["harbor_agent"] = agent
            f.write(json.dumps(row) + "\n")
    return prompts


def slime_args(policy_url: str, model_dir: Path, prompts: Path, tmp_path: Path, *flags: str):
    """SLiME's own argument parser and defaults, plus the values its validation / launcher set."""
    import argparse

    from slime.utils.arguments import get_slime_extra_args_provider

    parser = argparse.ArgumentParser()
    get_slime_extra_args_provider()(parser)
    args = parser.parse_args([
        "--hf-checkpoint", str(model_dir), "--prompt-data", str(prompts),
        "--input-key", "prompt", "--label-key", "label", "--metadata-key", "metadata",
        "--n-samples-per-prompt", str(N_PER_PROMPT), "--rollout-max-response-len", "160",
        "--custom-generate-function-path", "slime_harbor.hooks.generate",
        "--custom-reward-post-process-path", "slime_harbor.hooks.reward_post_process",
        "--disable-grpo-std-normalization",  # as scripts/run_harbor_grpo.sh: advantages = r - group mean
        *flags,
    ])
    host, port = policy_url.removeprefix("http://").split(":")
    # Set by slime_validate_args / SGLang's parser / the launch script in a real run.
    args.sglang_router_ip, args.sglang_router_port = host, int(port)
    args.sglang_server_concurrency, args.rollout_num_engines, args.sglang_dp_size = 8, 1, None
    args.router_policy, args.load_debug_rollout_data = None, None
    if args.over_sampling_batch_size is None:
        args.over_sampling_batch_size = args.rollout_batch_size
    # Our plugin settings (--custom-config-path YAML in a real run).
    args.harbor_step_limit, args.harbor_trials_dir = 2, str(tmp_path / "trials")
    args.harbor_retry_backoff_sec = 0.0
    return args


class Manager:
    """RolloutManager's own methods on a minimal self: its __init__ starts Ray actors and SGLang
    engines. `_get_rollout_data` calls the rollout function, validates rollout ids and flattens."""

    def __init__(self, ray_rollout, args, data_source):
        from slime.utils.misc import load_function

        cls = getattr(ray_rollout.RolloutManager, "__ray_actor_class__", ray_rollout.RolloutManager)
        self._get_rollout_data = cls._get_rollout_data.__get__(self)
        self._post_process_rewards = cls._post_process_rewards.__get__(self)
        self._convert_samples_to_train_data = cls._convert_samples_to_train_data.__get__(self)
        self.args, self.data_source = args, data_source
        self.generate_rollout = load_function(args.rollout_function_path)
        self.custom_reward_post_process_func = load_function(args.custom_reward_post_process_path)
        self.custom_convert_samples_to_train_data_func = None


# ---- checks on what SLiME made of our samples ---------------------------------------------------

def check_train_data(samples, train, tokenizer_dir):
    """The train data is our samples token for token (re-derived from Harbor's trial records),
    removed samples carry no loss, and each episode counts once."""
    from harbor.models.trial.result import TrialResult

    from slime_harbor.converter import trial_to_episode

    assert train["tokens"] == [s.tokens for s in samples]
    assert train["response_lengths"] == [s.response_length for s in samples]
    assert train["rollout_ids"] == [s.rollout_id for s in samples] and None not in train["rollout_ids"]
    by_rollout = defaultdict(list)
    for i, s in enumerate(samples):
        by_rollout[s.rollout_id].append(i)
        mask = train["loss_masks"][i]
        assert len(mask) == s.response_length == len(train["rollout_log_probs"][i])
        if s.remove_sample:
            assert sum(mask) == 0 and train["rewards"][i] == 0.0
            continue
        if "gateway" in s.metadata:  # a gateway agent's record is the gateway's: check_gateway_samples
            continue
        # Harbor's own record of the trial, converted again: the same tokens, mask and logprobs.
        result = TrialResult.model_validate_json((Path(s.metadata["trial_dir"]) / "result.json").read_text())
        pieces = trial_to_episode(result, group_index=s.group_index, index=s.index).samples
        piece = pieces[s.metadata["segment"]]
        assert s.tokens == piece.tokens and mask == piece.loss_mask and s.rollout_log_probs == piece.rollout_log_probs
        assert s.response and s.response_length > 0 and sum(mask) > 0
        # SLiME's Sample.weight_versions: one string per model call of the piece, the weights that sampled it
        assert s.weight_versions == piece.weight_versions == ["0"] * len(piece.metadata["turn_indices"])
    for rid, idx in by_rollout.items():
        # Siblings of one episode share one denominator: the episode is one token-weighted mean.
        assert {train["rollout_mask_sums"][i] for i in idx} == {sum(sum(train["loss_masks"][i]) for i in idx)}
        assert len({train["rewards"][i] for i in idx}) == 1  # one advantage per episode
    # Group advantages: kept episodes only, each once.
    groups = defaultdict(dict)
    for i, s in enumerate(samples):
        if not s.remove_sample:
            groups[s.group_index][s.rollout_id] = (train["raw_reward"][i], train["rewards"][i])
    for episodes in groups.values():
        mean = sum(r for r, _ in episodes.values()) / len(episodes)
        for raw, adv in episodes.values():
            assert adv == pytest.approx(raw - mean)
    return by_rollout


def check_policy_loss(train, by_rollout):
    """SLiME's clipped policy loss on the train data, reduced per rollout with rollout_mask_sums
    (as its loss reducer does): removed samples get no gradient, masked tokens none, and each
    episode's gradient weighs |advantage| in total however many samples it fanned out into."""
    import torch

    from slime.utils.ppo_utils import compute_policy_loss

    log_probs = [torch.tensor(lp, dtype=torch.float64, requires_grad=True) for lp in train["rollout_log_probs"]]
    total = 0.0
    for i, lp in enumerate(log_probs):
        old = torch.tensor(train["rollout_log_probs"][i], dtype=torch.float64)
        advantages = torch.full_like(old, float(train["rewards"][i]))
        pg_loss, clipfrac = compute_policy_loss(old - lp, advantages, 0.2, 0.28)
        mask = torch.tensor(train["loss_masks"][i], dtype=torch.float64)
        total = total + (pg_loss * mask).sum() / max(train["rollout_mask_sums"][i], 1)
        assert float(clipfrac.sum()) == 0.0  # on-policy: ratio 1
    total.backward()
    for rid, idx in by_rollout.items():
        grads = torch.cat([log_probs[i].grad for i in idx])
        mask = torch.cat([torch.tensor(train["loss_masks"][i], dtype=torch.float64) for i in idx])
        assert torch.all(grads[mask == 0] == 0)
        assert float(grads.abs().sum()) == pytest.approx(abs(train["rewards"][idx[0]]), abs=1e-9)


# ---- the round ----------------------------------------------------------------------------------

def run_round(ray_rollout, front_url, model_dir, tmp_path, flags=()):
    """One SLiME rollout round through our hook; returns (flat samples, train data, args)."""
    from slime.rollout.data_source import RolloutDataSourceWithBuffer
    from slime.utils import http_utils

    tasks = make_tasks(tmp_path)
    prompts = write_prompts(tasks, tmp_path, [("coin", None), ("coin", "terminus-2"), ("coin", "mini-swe-agent"),
                                              ("broken-image", None), ("slow", "oracle")])
    # A low temperature: the briefly trained policy then repeats what it was taught (terminus-2's
    # one-character-per-token reply, whose re-rendering drifts) instead of sampling its tail.
    args = slime_args(front_url, model_dir, prompts, tmp_path, "--rollout-batch-size", "4",
                      "--over-sampling-batch-size", "5", "--rollout-temperature", "0.3", *flags)
    args.harbor_tasks_dir = str(tasks)
    http_utils.init_http_client(args)  # SLiME's HTTP client (its abort talks to the router with it)
    manager = Manager(ray_rollout, args, RolloutDataSourceWithBuffer(args))
    samples, metrics = manager._get_rollout_data(rollout_id=0)
    train = manager._convert_samples_to_train_data(samples)
    return samples, train, args


def check_gateway_samples(samples, agent, model_dir, temperature, append_only: bool):
    """A gateway agent's group trains: every episode's samples are kept, one per branch of its
    gateway session (an append-only conversation is one branch however the agent re-renders its
    history); together their loss masks are the completion tokens the gateway recorded as trained
    for the trial, and their logprobs are the model's on each sample's own tokens."""
    import torch
    from transformers import AutoModelForCausalLM

    from helpers.samples import recompute_logprobs

    group = [s for s in samples if s.metadata.get("harbor_agent") == agent]
    episodes = defaultdict(list)
    for s in group:
        episodes[s.rollout_id].append(s)
    assert len(episodes) == N_PER_PROMPT
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype="float32").eval()
    for siblings in episodes.values():
        assert all(not s.remove_sample for s in siblings), [s.metadata.get("status_reason") for s in siblings]
        assert len(siblings) == siblings[0].metadata["n_branches"] == siblings[0].metadata["gateway"]["branches"]
        assert siblings[0].metadata["drift_count"] == 0 and (len(siblings) == 1 or not append_only)
        calls = [json.loads(line) for line in (Path(siblings[0].metadata["trial_dir"]) / "agent" / "gateway" /
                                               "calls.jsonl").read_text().splitlines()]
        trained = [c for c in calls if c.get("trained")]
        assert trained and sum(sum(s.loss_mask) for s in siblings) == sum(
            c["usage"]["completion_tokens"] for c in trained)
        for s in siblings:
            n = s.response_length  # SLiME's Sample: the response is the last n tokens
            assert n == len(s.loss_mask) == len(s.rollout_log_probs) > 0
            mask = torch.tensor(s.loss_mask, dtype=torch.bool)
            recomputed = recompute_logprobs(model, s.tokens, temperature)[-n:][mask]
            assert (recomputed - torch.tensor(s.rollout_log_probs)[mask]).abs().mean().item() < 1e-4
    return group


def check_round(samples, train, args, tmp_path, model_dir):
    labels = Counter((s.label, s.metadata.get("harbor_agent", "native")) for s in samples)
    # The four groups that finished first are the batch; the slow one was cut by SLiME's abort.
    assert {label for label, _ in labels} == {"coin", "broken-image"}
    episodes = {s.rollout_id for s in samples}
    assert len(episodes) == 4 * N_PER_PROMPT
    native = [s for s in samples if s.label == "coin" and "harbor_agent" not in s.metadata]
    broken = [s for s in samples if s.label == "broken-image"]
    assert len(native) == N_PER_PROMPT and all(not s.remove_sample for s in native), [s.metadata for s in native]
    for s in broken:  # permanent: FAILED, removed, not retried
        assert s.status.value == "failed" and s.remove_sample and "SandboxBuildFailedError" in s.metadata["status_reason"] or \
            "DockerfileError" in s.metadata["status_reason"]
    assert hooks.hook_metrics().get("retries", 0) == 0
    # terminus-2's reply was taught one character per token: its own re-rendering of the history
    # tokenizes that text canonically, which split the episode before the gateway; the gateway
    # renders its own earlier replies with the tokens it sampled, so the episode is one sample.
    check_gateway_samples(samples, "terminus-2", model_dir, args.rollout_temperature, append_only=True)
    # mini-swe-agent drops a reply without a tool call from its history and sends a format-error
    # message instead (the untrained policy's usual turn): a real edit, so a new branch; every
    # branch is a sample of the episode, trained with the episode's advantage.
    check_gateway_samples(samples, "mini-swe-agent", model_dir, args.rollout_temperature, append_only=False)
    by_rollout = check_train_data(samples, train, model_dir)
    check_policy_loss(train, by_rollout)
    # The slow group's trials were started and then cancelled by SLiME's abort: aborted, gone.
    slow_trials = [p for p in (tmp_path / "trials").iterdir() if p.name.startswith("slow__")]
    assert len(slow_trials) == N_PER_PROMPT
    assert hooks.hook_metrics()["status/aborted"] == N_PER_PROMPT
    procs, dirs = leftovers(tmp_path)
    assert procs == [] and dirs == []
    return {"n_samples": len(samples), "agents": dict(labels)}


@pytest.fixture(scope="module")
def embedded_front(policy_dir):
    """The embedded policy server as the router. SLiME's abort lists the router's workers first
    (GET /workers, a router endpoint): the server answers it with itself."""
    from slime_harbor.policy.server import EmbeddedPolicyServer

    with EmbeddedPolicyServer(policy_dir) as server:
        server.policy.app.add_api_route("/workers", lambda: {"workers": [{"url": server.url}]}, methods=["GET"])
        yield server.url


def test_slime_generate_rollout_drives_our_hook(slime_modules, embedded_front, policy_dir, tmp_path):
    samples, train, args = run_round(slime_modules, embedded_front, policy_dir, tmp_path)
    print("round:", check_round(samples, train, args, tmp_path, policy_dir))


# ---- the real SGLang router in front of two embedded servers ------------------------------------

@pytest.fixture(scope="module")
def router_front(policy_dir):
    """sglang-router (conftest.sglang_router) on loopback before two embedded servers."""
    from helpers.servers import sglang_router

    from slime_harbor.policy.server import EmbeddedPolicyServer

    servers = [EmbeddedPolicyServer(policy_dir), EmbeddedPolicyServer(policy_dir)]
    try:
        with sglang_router([s.url for s in servers]) as url:
            yield url, servers
    finally:
        for s in servers:
            s.stop()


def test_slime_round_through_the_real_sglang_router(slime_modules, router_front, policy_dir, tmp_path):
    """The same round with sglang-router 0.3.2 in front: our agents' X-SMG-Routing-Key header
    (sample.session_id) is accepted (0.3.2 has no consistent_hashing policy to use it), SLiME's
    abort finds the workers through the router's /workers. The router drops prompt_token_ids and
    token_ids from /v1/chat/completions replies, which once left terminus-2 without tokens behind
    it; through the gateway (which calls the router's /generate) terminus-2 and mini-swe-agent train."""
    url, servers = router_front
    samples, train, args = run_round(slime_modules, url, policy_dir, tmp_path)
    print("router round:", check_round(samples, train, args, tmp_path, policy_dir))
    assert all(s.session_id for s in samples)  # SLiME gave every sample one; our agent sent it


def test_abort_through_the_router(slime_modules, router_front):
    """SLiME aborts a round by asking the router for its workers and sending each /abort_request
    {"abort_all": true} (server_control.abort_servers_until_idle). A generation running behind
    the router ends with finish_reason abort. The router itself has no /abort_request in 0.3.2."""
    import httpx

    from slime.backends.sglang_utils.server_control import abort_servers_until_idle

    url, servers = router_front

    async def scenario():
        async with httpx.AsyncClient(timeout=120) as client:
            long = asyncio.create_task(client.post(f"{url}/generate", json={
                "input_ids": [1, 2, 3], "return_logprob": True,
                "sampling_params": {"max_new_tokens": 4000, "temperature": 1.0, "ignore_eos": True}},
                headers={"X-SMG-Routing-Key": "session-1"}))
            await asyncio.sleep(2.0)
            workers = [w["url"] for w in (await client.get(f"{url}/workers")).json()["workers"]]
            assert sorted(workers) == sorted(s.url for s in servers)
            router_abort = await client.post(f"{url}/abort_request", json={"abort_all": True})
            await abort_servers_until_idle(workers)
            reply = (await long).json()
            return router_abort.status_code, reply

    from slime.utils import http_utils

    from slime.utils.async_utils import run

    http_utils.init_http_client(types.SimpleNamespace(rollout_num_engines=2, sglang_server_concurrency=4,
                                                      use_distributed_post=False))
    status, reply = run(scenario())  # on SLiME's own loop, where its HTTP client lives
    assert status == 404  # sglang-router 0.3.2: aborts go to the workers, as SLiME sends them
    assert reply["meta_info"]["finish_reason"]["type"] == "abort"
    assert len(reply["meta_info"]["output_token_logprobs"]) < 4000


# ---- SLiME's fully-async rollout ---------------------------------------------------------------

def test_fully_async_rollout_drives_our_hook(slime_modules, embedded_front, policy_dir, tmp_path):
    """slime.rollout.fully_async_rollout (examples/fully_async): a background worker keeps groups
    in flight across rounds and sends a group with an ABORTED sample back to the buffer. With our
    list-shaped results its check (`s.status` on each item of a group) sees lists, never ABORTED,
    so nothing of ours is requeued: aborted samples reach training removed (no loss), and a
    transient failure is retried inside the hook (its budget), not by the buffer."""
    from slime.rollout import fully_async_rollout
    from slime.rollout.data_source import RolloutDataSourceWithBuffer
    from slime.rollout.sglang_rollout import GenerateState
    from slime.utils import http_utils

    tasks = make_tasks(tmp_path)
    prompts = write_prompts(tasks, tmp_path, [("coin", None), ("broken-image", None)])
    # With --rollout-top-p < 1 SLiME asks for top-p replay and its conversion asserts well-formed
    # rollout_top_p_token_ids/offsets on every sample, placeholders of failed trials included.
    args = slime_args(embedded_front, policy_dir, prompts, tmp_path, "--rollout-batch-size", "2",
                      "--rollout-function-path", "slime_harbor.hooks.generate_rollout_fully_async",
                      "--rollout-top-p", "0.95")
    args.harbor_tasks_dir = str(tasks)
    args.sglang_server_concurrency = 2  # two groups in flight
    http_utils.init_http_client(args)
    data_source = RolloutDataSourceWithBuffer(args)
    manager = Manager(slime_modules, args, data_source)
    try:
        # SLiME's own rollout function orders its groups by getattr(item, "index"): for our list
        # results that is list.index (a method) and the round dies; ours, on SLiME's same worker:
        with pytest.raises(TypeError, match="int"):
            fully_async_rollout.generate_rollout_fully_async(args, 0, data_source)
        samples, _ = manager._get_rollout_data(rollout_id=1)
        train = manager._convert_samples_to_train_data(samples)
    finally:
        worker = fully_async_rollout._global_worker
        GenerateState(args).aborted = True  # SLiME pausing for a weight update: our trials stop
        fully_async_rollout._stop_global_worker()
        if worker is not None:
            worker.worker_thread.join(timeout=120)
            assert not worker.worker_thread.is_alive()
    assert {s.label for s in samples} == {"coin", "broken-image"}
    by_rollout = check_train_data(samples, train, policy_dir)
    check_policy_loss(train, by_rollout)
    assert len(by_rollout) == 2 * N_PER_PROMPT  # each episode once
    assert data_source.buffer == []  # nothing requeued
    for i, s in enumerate(samples):  # top-p replay data, as SLiME's conversion checked it
        offsets = list(train["rollout_top_p_token_offsets"][i])
        assert len(offsets) == s.response_length + 1 and offsets[-1] == len(train["rollout_top_p_token_ids"][i])
        if not s.remove_sample:
            assert offsets[-1] > 0
    procs, dirs = leftovers(tmp_path)
    assert procs == [] and dirs == []


def stop_fully_async_worker(args) -> None:
    """End SLiME's fully-async background worker (its round aborted) and wait for its thread."""
    from slime.rollout import fully_async_rollout
    from slime.rollout.sglang_rollout import GenerateState

    worker = fully_async_rollout._global_worker
    GenerateState(args).aborted = True
    fully_async_rollout._stop_global_worker()
    if worker is not None:
        worker.worker_thread.join(timeout=120)


def check_trained_tokens(samples, model_dirs: dict[str, Path], bound: float) -> dict[str, int]:
    """Every trained token of `samples` (SLiME's) has the logprob of the weights that sampled it:
    within `bound` of its version's (metadata["version_spans"], per call; `model_dirs`: version ->
    HF dir) and farther from every other version's. Returns {"calls", "spanning_calls"}."""
    import torch
    from transformers import AutoModelForCausalLM

    from helpers.samples import check_token_versions

    models = {v: AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval() for v, d in model_dirs.items()}
    figures = {"calls": 0, "spanning_calls": 0}
    for s in samples:
        if s.remove_sample and s.metadata.get("masked_by") != "stale" or not s.response_length:
            continue
        calls = s.metadata["version_spans"]
        assert len(calls) == len(s.weight_versions)
        # weight_versions names each call's oldest version: what a staleness bound reads
        assert [call[0][0] for call in calls] == list(s.weight_versions)
        trained = [span for call in calls for span in call if all(s.loss_mask[span[1]:span[2]])]
        assert sorted(i for _, a, b in trained for i in range(a, b)) == [i for i, m in enumerate(s.loss_mask) if m]
        check_token_versions(s.tokens, s.response_length, s.rollout_log_probs, trained, models, bound=bound)
        figures["calls"] += len(calls)
        figures["spanning_calls"] += sum(len(call) > 1 for call in calls)
    return figures


def test_fully_async_trials_span_a_weight_update_and_stale_episodes_are_masked(slime_modules, tiny_model_dir,
                                                                                tmp_path):
    """SLiME's fully-async worker with a weight update between two rounds, done as SLiME's updater
    does it (pause_generation, which aborts the calls in flight; update_weights_from_disk with
    weight_version "1"; continue_generation), with SLiME's --partial-rollout and
    --mask-offpolicy-in-partial-rollout. The trials in flight go on: none is aborted, and the calls
    the pause interrupted go on from their tokens under the new weights (nothing discarded); the
    tokens sampled before the update are masked (SLiME's flag), the rest train, each with the
    logprob of the weights its version names. With harbor_max_staleness 0 an episode with a
    version-0 call, collected when the engines serve version 1, is masked and counted as stale."""
    import httpx

    from slime.rollout.data_source import RolloutDataSourceWithBuffer
    from slime.utils import http_utils

    from slime_harbor.policy.server import EmbeddedPolicyServer
    from slime_harbor.policy.tiny_model import build_tiny_model

    new_weights = build_tiny_model(tmp_path / "v1", seed=7)
    tasks = make_tasks(tmp_path)
    prompts = write_prompts(tasks, tmp_path, [("coin", None)] * 8)
    with EmbeddedPolicyServer(tiny_model_dir) as server:
        args = slime_args(server.url, tiny_model_dir, prompts, tmp_path, "--rollout-batch-size", "1",
                          "--rollout-function-path", "slime_harbor.hooks.generate_rollout_fully_async",
                          "--partial-rollout", "--mask-offpolicy-in-partial-rollout")
        args.harbor_tasks_dir, args.harbor_step_limit, args.harbor_max_staleness = str(tasks), 3, 0
        args.rollout_max_response_len = 600  # the untrained model writes to the limit: long calls
        args.sglang_server_concurrency = 4  # SLiME's per-sample semaphore: four trials at once
        http_utils.init_http_client(args)
        data_source = RolloutDataSourceWithBuffer(args)
        try:
            first = hooks._flatten(hooks.generate_rollout_fully_async(args, 0, data_source))
            deadline = time.monotonic() + 120
            while not any(len(r.prompt_ids) > 600 and len(r.token_ids) > 20 for r in list(server.engine._active.values())):
                assert time.monotonic() < deadline  # wait for a trial's later call to be decoding
                time.sleep(0.01)
            aborted = httpx.post(f"{server.url}/pause_generation", json={}).json()["num_aborted_requests"]
            update = httpx.post(f"{server.url}/update_weights_from_disk", timeout=120,
                                json={"model_path": str(new_weights), "weight_version": "1"})
            httpx.post(f"{server.url}/continue_generation", json={})
            args.rollout_batch_size = 4  # every group in flight at the update, and more
            second = hooks._flatten(hooks.generate_rollout_fully_async(args, 1, data_source))
        finally:
            stop_fully_async_worker(args)
    metrics = hooks.hook_metrics()
    assert aborted >= 1 and update.json()["success"], (aborted, update.text)
    assert all(s.weight_versions and set(s.weight_versions) == {"0"} and not s.remove_sample for s in first)
    assert not any(s.status == s.Status.ABORTED for s in second)  # the update ended no trial
    assert metrics["weight_sync/interrupted_calls"] >= 1 and metrics.get("weight_sync/discarded_tokens", 0) == 0
    spanning = [call for s in second for call in s.metadata.get("version_spans", []) if len(call) > 1]
    assert spanning and all([v for v, _, _ in call] == ["0", "1"] for call in spanning)
    # SLiME's --mask-offpolicy-in-partial-rollout: the tokens of version 0 in those calls train not
    for s in second:
        for call in s.metadata.get("version_spans", []):
            (_, start, end), *_ = call
            assert all(m == 0 for m in s.loss_mask[start:end]) == (len(call) > 1)
    assert metrics["weight_sync/offpolicy_masked_tokens"] == sum(end - start for (_, start, end), *_ in spanning)
    for s in second:
        stale = "0" in s.weight_versions
        assert s.remove_sample == stale and (s.metadata.get("masked_by") == "stale") == stale
    assert metrics["masked/stale"] == len({s.rollout_id for s in second if "0" in s.weight_versions})
    assert metrics["weight_sync/stale_masked_tokens"] == sum(sum(s.loss_mask) for s in second if "0" in s.weight_versions)
    figures = check_trained_tokens(second, {"0": tiny_model_dir, "1": new_weights}, bound=1e-3)
    print(f"\nfully-async through the hook, our engine: {figures}, hook metrics "
          f"{ {k: v for k, v in metrics.items() if k.startswith('weight_sync/')} }")
    procs, dirs = leftovers(tmp_path)
    assert procs == [] and dirs == []


def test_fully_async_against_the_real_sglang_behind_its_router(slime_modules, tiny_model_dir, tmp_path):
    """The test above with the engines SLiME runs: a real SGLang behind the real sglang-router. The
    update is SLiME's (pause_generation, update_weights_from_disk with weight_version "1",
    continue_generation, on the engine); harbor_max_staleness reads the version the engines serve
    through the router (SGLang 0.5.23 keeps it in /model_info, under no /get_weight_version). No
    trial is aborted; the calls in flight at the pause go on from their tokens under the new
    weights (SLiME's own generate drives the trials; nothing is discarded), so turns hold tokens
    of both versions, and every trained token's logprob is within 1e-3 of the weights that
    sampled it and farther from the other version's; episodes with a version-0 call are masked as
    stale."""
    import httpx

    from helpers.servers import free_port, sglang_router
    from slime.rollout.data_source import RolloutDataSourceWithBuffer
    from slime.utils import http_utils

    from slime_harbor.policy.engine_launcher import EngineMissing, EngineProcess
    from slime_harbor.policy.tiny_model import build_tiny_model

    new_weights = build_tiny_model(tmp_path / "v1", seed=7)
    tasks = make_tasks(tmp_path)
    prompts = write_prompts(tasks, tmp_path, [("coin", None)] * 8)
    try:
        engine = EngineProcess("sglang", tiny_model_dir, port=free_port(), log_path=tmp_path / "sglang.log").start()
    except EngineMissing as exc:
        pytest.skip(str(exc))
    with engine, sglang_router([engine.url]) as router:
        args = slime_args(router, tiny_model_dir, prompts, tmp_path, "--rollout-batch-size", "1",
                          "--rollout-function-path", "slime_harbor.hooks.generate_rollout_fully_async")
        args.harbor_tasks_dir, args.harbor_step_limit, args.harbor_max_staleness = str(tasks), 3, 0
        args.rollout_max_response_len = 600  # the untrained model writes to the limit: long calls
        args.sglang_server_concurrency = 4
        http_utils.init_http_client(args)
        data_source = RolloutDataSourceWithBuffer(args)
        try:
            first = hooks._flatten(hooks.generate_rollout_fully_async(args, 0, data_source))
            time.sleep(3.0)  # the four trials' 600-token calls are decoding (SGLang: ~40 tokens a second here)
            httpx.post(f"{engine.url}/pause_generation", json={"mode": "abort"}, timeout=60).raise_for_status()
            update = httpx.post(f"{engine.url}/update_weights_from_disk", timeout=300,
                                json={"model_path": str(new_weights), "weight_version": "1"})
            httpx.post(f"{engine.url}/continue_generation", json={}, timeout=60).raise_for_status()
            args.rollout_batch_size = 4
            second = hooks._flatten(hooks.generate_rollout_fully_async(args, 1, data_source))
        finally:
            stop_fully_async_worker(args)
    assert update.json()["success"], update.text
    for s in first:  # a trial whose time ran out before its first call came back has nothing (see below)
        assert (s.weight_versions and set(s.weight_versions) == {"0"} and not s.remove_sample) if s.response_length \
            else s.remove_sample
    assert not any(s.status == s.Status.ABORTED for s in second)
    assert any("0" in s.weight_versions for s in second)  # trials that were mid-episode at the pause
    for s in second:
        if not s.response_length:  # the agent's time ran out before its first call came back (a
            assert s.remove_sample  # busy 2-core machine, 600-token calls): nothing to train on
            continue
        stale = "0" in s.weight_versions
        assert s.remove_sample == stale and (s.metadata.get("masked_by") == "stale") == stale
    metrics = hooks.hook_metrics()
    assert metrics["weight_sync/interrupted_calls"] >= 1 and metrics.get("weight_sync/discarded_tokens", 0) == 0
    figures = check_trained_tokens(second, {"0": tiny_model_dir, "1": new_weights}, bound=1e-3)
    print(f"\nfully-async through the hook, real SGLang: {figures}, hook metrics "
          f"{ {k: v for k, v in metrics.items() if k.startswith('weight_sync/')} }")
    assert figures["spanning_calls"] >= 1
    procs, dirs = leftovers(tmp_path)
    assert procs == [] and dirs == []


# ---- a non-Qwen chat format under SLiME's own rollout loop --------------------------------------

@pytest.mark.parametrize("renderer, named", [("glm-5", False), ("deepseek-r1", True)])
def test_slime_round_on_a_non_qwen_format(slime_modules, format_model, renderer, named, tmp_path):
    """SLiME's generate_rollout drives our hook on another family's tiny checkpoint (GLM-5 on its
    real glm_moe_dsa architecture; DeepSeek-R1 on deepseek_v3 with MLA and DeepSeek's real tokenizer):
    the native agent and a chat agent through the gateway train their sampled tokens, the logprobs
    are the model's. `named`: the checkpoint carries no record of its format, and its model_type
    (deepseek_v3) carries two, so the YAML's harbor_renderer names it; without it the hook refuses
    the round in one line before any trial."""
    from slime.rollout.data_source import RolloutDataSourceWithBuffer
    from slime.utils import http_utils

    from slime_harbor.hooks import HookConfigError
    from slime_harbor.policy.server import EmbeddedPolicyServer

    model_dir = format_model(renderer)[0]
    if named:
        model_dir = Path(shutil.copytree(model_dir, tmp_path / "checkpoint"))
        (model_dir / "slime_harbor.json").unlink()
    tasks = make_tasks(tmp_path)
    prompts = write_prompts(tasks, tmp_path, [("coin", None), ("coin", "chat_tools_agent:ChatToolsAgent")])
    with EmbeddedPolicyServer(model_dir) as server:
        server.policy.app.add_api_route("/workers", lambda: {"workers": [{"url": server.url}]}, methods=["GET"])
        args = slime_args(server.url, model_dir, prompts, tmp_path, "--rollout-batch-size", "2")
        args.harbor_tasks_dir = str(tasks)
        http_utils.init_http_client(args)
        if named:
            with pytest.raises(HookConfigError, match=r"deepseek-v3 \| deepseek-r1"):
                hooks.check_supported(args)
            args.harbor_renderer = renderer
        manager = Manager(slime_modules, args, RolloutDataSourceWithBuffer(args))
        samples, _ = manager._get_rollout_data(rollout_id=0)
        train = manager._convert_samples_to_train_data(samples)
    assert len({s.rollout_id for s in samples}) == 2 * N_PER_PROMPT
    assert all(not s.remove_sample for s in samples), [s.metadata.get("status_reason") for s in samples]
    import torch
    from transformers import AutoModelForCausalLM

    from helpers.samples import recompute_logprobs

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    for s in [s for s in samples if "harbor_agent" not in s.metadata]:  # the native agent's
        config = json.loads((Path(s.metadata["trial_dir"]) / "config.json").read_text())
        assert config["agent"]["kwargs"]["renderer"] == renderer  # the trial ran this format
        mask = torch.tensor(s.loss_mask, dtype=torch.bool)
        recomputed = recompute_logprobs(model, s.tokens, args.rollout_temperature)[-s.response_length:][mask]
        assert (recomputed - torch.tensor(s.rollout_log_probs)[mask]).abs().max().item() < 1e-3
    check_gateway_samples(samples, "chat_tools_agent:ChatToolsAgent", model_dir, args.rollout_temperature,
                          append_only=True)
    by_rollout = check_train_data(samples, train, model_dir)
    check_policy_loss(train, by_rollout)
