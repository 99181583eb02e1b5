"""Our Docker environment (slime_harbor.environments.docker) on the real Docker Engine, through real
Harbor Trials, and Harbor's own docker environment once. Skipped when no Docker daemon answers or
SLIME_HARBOR_NO_DOCKER is set. Every container a test starts carries our labels and is removed."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from helpers.cli import first_line_then_sigkill
from helpers.docker import containers_labelled, docker_skip_reason
from helpers.rollout import NATIVE_REPLY
from helpers.samples import check_sample_against_model, masked_spans

from slime_harbor.policy.sampling import SamplingParams
from slime_harbor.rollout import run_rollouts
from slime_harbor.run_config import DEFAULT_TASKS, RolloutConfig
from slime_harbor.samples import SampleStatus, read_jsonl

REPO = Path(__file__).resolve().parent.parent

_SKIP = docker_skip_reason()
pytestmark = pytest.mark.skipif(_SKIP is not None, reason=f"no Docker: {_SKIP}")

if _SKIP is None:
    import slime_harbor.environments.docker as dockerenv
    import slime_harbor.environments.docker_images as docker_images
    from slime_harbor.environments.common import ExecTimeoutError


def client():
    return dockerenv.docker_client()


def copy_task(src: Path, dest_root: Path, name: str | None = None, *, dockerfile_extra: str = "",
              toml_subs: tuple[tuple[str, str], ...] = (), solve: str | None = None) -> Path:
    """A copy of a bundled task; a unique line in the Dockerfile makes its image new."""
    dest = dest_root / (name or src.name)
    shutil.copytree(src, dest)
    if dockerfile_extra:
        dockerfile = dest / "environment" / "Dockerfile"
        dockerfile.write_text(dockerfile.read_text() + dockerfile_extra)
    toml = (dest / "task.toml").read_text()
    for pattern, replacement in toml_subs:
        toml = re.sub(pattern, replacement, toml)
    (dest / "task.toml").write_text(toml)
    if solve is not None:
        (dest / "solution" / "solve.sh").write_text(solve)
    return dest


def remove_image(tag: str) -> None:
    import docker

    try:
        client().api.remove_image(tag, force=True)
    except docker.errors.NotFound:
        pass
    docker_images.image_builds.pop(tag, None)


def make_env(task_dir: Path, tmp_path: Path, **kwargs):
    from harbor.models.task.task import Task
    from harbor.models.trial.paths import TrialPaths

    task = Task(task_dir)
    paths = TrialPaths(tmp_path / f"trial-{uuid.uuid4().hex[:6]}")
    paths.mkdir()
    return dockerenv.DockerEnvironment(
        environment_dir=task.paths.environment_dir, environment_name=task_dir.name,
        session_id=f"test-{task_dir.name}-{uuid.uuid4().hex[:6]}__env", trial_paths=paths,
        task_env_config=task.config.environment, **kwargs,
    )  # fmt: skip


def rollout(tmp_path, **overrides) -> tuple[dict, list]:
    base = dict(tasks_dir=DEFAULT_TASKS, agent="oracle", n_samples=1, env="docker", concurrency=4,
                out_dir=tmp_path / f"out-{uuid.uuid4().hex[:6]}", progress=False)  # fmt: skip
    cfg = RolloutConfig(**{**base, **overrides})
    summary = asyncio.run(run_rollouts(cfg))
    return summary, read_jsonl(cfg.out_dir / "samples.jsonl")


def no_container_of_run(run_id: str) -> bool:
    return containers_labelled(f"slime-harbor.run={run_id}") == []


def no_container_of_trials(samples) -> bool:
    """None of these samples' trials left a container (other tests' containers may be running)."""
    trials = {Path(s.metadata["trial_dir"]).name for s in samples}
    assert trials
    return all(containers_labelled(f"slime-harbor.trial={t}") == [] for t in trials)


# --- through real Harbor Trials -----------------------------------------------------------------


@pytest.mark.slow
def test_oracle_scores_1_and_nop_0_on_every_bundled_task(tmp_path):
    tasks = sorted(p.name for p in DEFAULT_TASKS.iterdir() if (p / "task.toml").is_file())
    for agent, expected in (("oracle", 1.0), ("nop", 0.0)):
        summary, samples = rollout(tmp_path, agent=agent)
        assert summary["n_trials"] == len(tasks) and not summary["errors"], summary["errors"]
        assert {s.metadata["task_name"]: s.reward for s in samples} == dict.fromkeys(tasks, expected)
        assert no_container_of_trials(samples)


def test_harbor_own_docker_environment_runs_an_oracle_trial(tmp_path):
    # Harbor's no-network mode needs an egress-control image it would pull: use a public copy.
    task = copy_task(DEFAULT_TASKS / "dedupe-lines", tmp_path / "tasks",
                     toml_subs=((r'network_mode = "no-network"', 'network_mode = "public"'),))  # fmt: skip
    summary, (sample,) = rollout(tmp_path, tasks_dir=task.parent, env="harbor-docker")
    assert sample.reward == 1.0, summary["errors"]
    result = json.loads((Path(sample.metadata["trial_dir"]) / "result.json").read_text())
    assert result["config"]["environment"]["type"] == "docker" and not result["config"]["environment"]["import_path"]


def test_unbuildable_image_fails_its_trials_once_with_the_build_log(tmp_path, monkeypatch):
    token = uuid.uuid4().hex
    task = copy_task(DEFAULT_TASKS / "dedupe-lines", tmp_path / "tasks", "broken-image",
                     dockerfile_extra=f"RUN echo building-{token} && exit 7\n")  # fmt: skip
    builds = []
    real_build = docker_images._build_image
    monkeypatch.setattr(docker_images, "_build_image", lambda *a: (builds.append(a[1]), real_build(*a))[1])
    summary, samples = rollout(tmp_path, tasks_dir=task.parent, n_samples=3)
    again, more = rollout(tmp_path, tasks_dir=task.parent, n_samples=1)  # the failure is remembered
    assert len(builds) == 1
    for s in samples + more:
        assert s.status == SampleStatus.FAILED and s.remove_sample and s.reward is None  # never retried
        assert s.metadata["exception_type"] == "SandboxBuildFailedError"
        assert f"building-{token}" in s.metadata["status_reason"]  # the build log's tail
        assert "7" in s.metadata["status_reason"]
    assert summary["n_scored"] == 0 and again["n_scored"] == 0


def test_no_docker_daemon_is_one_clear_error_before_any_trial(tmp_path, monkeypatch):
    dead = tmp_path / "dead.sock"
    monkeypatch.setenv("DOCKER_HOST", f"unix://{dead}")
    out = tmp_path / "out"
    with pytest.raises(dockerenv.DockerUnavailableError) as err:
        rollout(tmp_path, out_dir=out)
    message = str(err.value)
    assert str(dead) in message and "Docker is not reachable" in message and "\n" not in message
    assert not (out / "trials").exists()


# --- the environment itself ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def started(tmp_path_factory):
    """One running environment of a bundled task (cpus = 1, memory_mb = 1024) and its container."""
    tmp = tmp_path_factory.mktemp("docker-env")
    env = make_env(DEFAULT_TASKS / "dedupe-lines", tmp)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(env.start(force_build=False))
    container = client().containers.get(env.container_id)
    try:
        yield env, container, loop
    finally:
        loop.run_until_complete(env.stop(delete=True))
        loop.close()
    assert containers_labelled(f"slime-harbor.trial={env.trial_name}") == []


PARITY_CASES = [
    # (command, cwd, env, user)
    ("echo hi", None, None, None),
    ("printf 'no trailing newline'", None, None, None),
    ("echo out; echo err >&2; exit 3", None, None, None),
    ("printf 'a\\0b\\377\\n'; printf '\\001' >&2", None, None, None),
    ("head -c 300000 /dev/zero | tr '\\0' x", None, None, None),
    ("pwd; ls", "/tmp", None, None),
    ("echo \"$GREETING\" \"$EMPTY\"; env | sort", "/", {"GREETING": "hello 'world' $x", "EMPTY": ""}, None),
    ("id; echo $HOME; pwd; touch /root/x", "/tmp", None, "nobody"),
    ("id; echo $HOME", None, None, "1234"),
    ("cat; echo stdin-was-empty", None, None, None),
    ("kill -9 $$", None, None, None),
    # Through an Engine API exec (a user:group, an env name no shell can export).
    ("id; echo $HOME; pwd", "/tmp", None, "nobody:nogroup"),
    ("env | grep -c '^A-B=1$'; echo err >&2; exit 4", None, {"A-B": "1"}, None),
]


@pytest.mark.parametrize("command,cwd,env,user", PARITY_CASES)
def test_exec_matches_the_engine_exec(started, command, cwd, env, user):
    environment, container, loop = started
    ours = loop.run_until_complete(environment.exec(command, cwd=cwd, env=env, user=user))
    theirs = container.exec_run(["bash", "-c", command], workdir=cwd or environment.task_env_config.workdir,
                                environment=env, user=str(user) if user else "", demux=True)  # fmt: skip
    out, err = ((b or b"").decode(errors="replace") for b in theirs.output)
    assert (ours.return_code, ours.stdout, ours.stderr) == (theirs.exit_code, out, err)


def test_concurrent_execs_on_one_container(started):
    environment, _, loop = started

    async def many():
        return await asyncio.gather(*[environment.exec(f"sleep 0.{i % 3}; echo {i}; echo e{i} >&2") for i in range(8)])

    results = loop.run_until_complete(many())
    assert [(r.stdout, r.stderr, r.return_code) for r in results] == [(f"{i}\n", f"e{i}\n", 0) for i in range(8)]


def test_timeout_kills_the_whole_process_tree(started):
    environment, container, loop = started
    started_at = time.monotonic()
    with pytest.raises(ExecTimeoutError, match="timed out after 1 seconds"):
        loop.run_until_complete(environment.exec("sleep 1000 & sleep 1000", timeout_sec=1))
    assert time.monotonic() - started_at < 10
    # Read by the Engine's own exec, independently of our exec server.
    procs = container.exec_run(["sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"]).output.decode()
    assert "sleep 1000" not in procs
    assert loop.run_until_complete(environment.exec("echo still-usable")).stdout == "still-usable\n"


def test_timeout_kills_the_tree_of_an_engine_api_exec_too(started):
    environment, container, loop = started
    with pytest.raises(ExecTimeoutError):
        loop.run_until_complete(environment.exec("sleep 1001 & sleep 1001", timeout_sec=1, user="root:root"))
    procs = container.exec_run(["sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"]).output.decode()
    assert "sleep 1001" not in procs


def test_cpus_and_memory_are_enforced_and_visible_inside(started):
    environment, _, loop = started
    result = loop.run_until_complete(environment.exec(
        "cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/cpu/cpu.cfs_period_us "
        "/sys/fs/cgroup/memory/memory.limit_in_bytes"))  # fmt: skip
    quota, period, memory = (int(x) for x in result.stdout.split())
    assert quota / period == environment.task_env_config.cpus == 1
    assert memory == environment.task_env_config.memory_mb * 2**20 == 1024 * 2**20


def test_container_is_labelled_and_has_no_network(started):
    environment, container, loop = started
    labels = container.labels
    assert labels["slime-harbor.trial"] == environment.trial_name and labels["slime-harbor.run"] == dockerenv.RUN_ID
    assert labels["slime-harbor.owner-pid"] == str(os.getpid())
    assert container.attrs["HostConfig"]["NetworkMode"] == "none"
    links = loop.run_until_complete(environment.exec("ls /sys/class/net")).stdout.split()
    assert links == ["lo"]


def test_file_transfers_round_trip(started, tmp_path):
    environment, _, loop = started
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_text("A")
    (src / "sub" / "b.bin").write_bytes(bytes(range(256)) * 100)
    loop.run_until_complete(environment.upload_dir(src, "/data/dir"))
    loop.run_until_complete(environment.upload_file(src / "a.txt", "/data/renamed.txt"))
    loop.run_until_complete(environment.upload_file(src / "a.txt", "/data/dir/sub"))  # into a dir
    listing = loop.run_until_complete(environment.exec("cd /data && find . -type f | sort")).stdout
    assert listing.split() == ["./dir/a.txt", "./dir/sub/a.txt", "./dir/sub/b.bin", "./renamed.txt"]
    loop.run_until_complete(environment.download_dir("/data/dir", tmp_path / "back"))
    loop.run_until_complete(environment.download_file("/data/renamed.txt", tmp_path / "one.txt"))
    assert (tmp_path / "back" / "sub" / "b.bin").read_bytes() == (src / "sub" / "b.bin").read_bytes()
    assert (tmp_path / "back" / "a.txt").read_text() == (tmp_path / "one.txt").read_text() == "A"


def test_dead_exec_server_raises_a_clear_error(tmp_path):
    environment = make_env(DEFAULT_TASKS / "dedupe-lines", tmp_path)

    async def scenario():
        await environment.start(force_build=False)
        try:
            client().api.kill(environment.container_id)  # the container (and every worker) dies
            with pytest.raises(RuntimeError, match="not running|exited|ended"):
                await asyncio.wait_for(environment.exec("echo hi"), 60)
        finally:
            await environment.stop(delete=True)

    asyncio.run(scenario())
    assert containers_labelled(f"slime-harbor.trial={environment.trial_name}") == []


def test_killed_exec_servers_are_replaced(started):
    """A command that kills every shell server (as `pkill bash` would) fails with a clear error;
    the next command gets a fresh server."""
    environment, _, loop = started
    kill_servers = (
        "for p in /proc/[0-9]*; do case \"$(tr '\\0' ' ' < $p/cmdline 2>/dev/null)\" in "
        "*slime-harbor-exec*) [ ${p#/proc/} = $$ ] || kill -9 ${p#/proc/};; esac; done; echo done > /tmp/killed"
    )
    with pytest.raises(RuntimeError, match="exec server"):
        loop.run_until_complete(environment.exec(kill_servers))
    # The killing command outlives the server it ran on: let it finish before the next command.
    container = client().containers.get(environment.container_id)
    deadline = time.monotonic() + 30
    while container.exec_run(["cat", "/tmp/killed"]).exit_code != 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert loop.run_until_complete(environment.exec("echo back")).stdout == "back\n"


def test_a_group_of_four_builds_the_image_once(tmp_path, monkeypatch):
    task = copy_task(DEFAULT_TASKS / "dedupe-lines", tmp_path / "tasks", "fresh-image",
                     dockerfile_extra=f"RUN echo {uuid.uuid4().hex} > /stamp\n")  # fmt: skip
    builds = []
    real_build = docker_images._build_image
    monkeypatch.setattr(docker_images, "_build_image", lambda *a: (builds.append(a[1]), real_build(*a))[1])
    environments = [make_env(task, tmp_path) for _ in range(4)]

    async def group():
        try:
            await asyncio.gather(*[e.start(force_build=False) for e in environments])
            return [(await e.exec("cat /stamp")).stdout for e in environments]
        finally:
            await asyncio.gather(*[e.stop(delete=True) for e in environments])

    try:
        stamps = asyncio.run(group())
        assert len(builds) == 1 and len(set(stamps)) == 1
    finally:
        remove_image(environments[0].image)


@pytest.mark.parametrize("removed,mode", [("bash", "sh + setsid worker"), ("bash setsid", "Engine API execs")])
def test_images_without_bash_or_setsid(tmp_path, removed, mode):
    """Only /bin/sh is assumed: without bash the worker is sh + setsid; without both, every
    command is an Engine API exec. Exit codes, output and the timeout's tree kill hold in both."""
    paths = " ".join(f"/bin/{tool} /usr/bin/{tool}" for tool in removed.split())
    task = copy_task(DEFAULT_TASKS / "dedupe-lines", tmp_path / "tasks", f"no-{removed.replace(' ', '-')}",
                     dockerfile_extra=f"RUN rm -f {paths}\n")  # fmt: skip
    environment = make_env(task, tmp_path)

    async def scenario():
        await environment.start(force_build=False)
        try:
            server = environment._server
            assert (server is not None and not server.has_bash) if mode.startswith("sh") else server is None
            result = await environment.exec("echo out; printf 'err' >&2; exit 3", env={"X": "y z"})
            assert (result.return_code, result.stdout, result.stderr) == (3, "out\n", "err")
            assert (await environment.exec("echo $X; pwd", env={"X": "y z"})).stdout == "y z\n/app\n"
            with pytest.raises(ExecTimeoutError):
                await environment.exec("sleep 1002 & sleep 1002", timeout_sec=1)
            procs = client().containers.get(environment.container_id).exec_run(
                ["sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"]).output.decode()  # fmt: skip
            assert "sleep 1002" not in procs
        finally:
            await environment.stop(delete=True)

    try:
        asyncio.run(scenario())
    finally:
        remove_image(environment.image)


# --- the native agent, Ctrl-C and crashes ---------------------------------------------------------


@pytest.fixture(scope="module")
def ls_policy(tiny_model_dir, tmp_path_factory):
    """(server URL, model dir, fp32 model): the tiny model after 15 SFT steps on one task's first
    turn, so it answers `ls` (test_rollout_e2e's responsive model, at a fraction of the cost)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from slime_harbor.agents.native import initial_prompt_ids
    from slime_harbor.policy.renderer import make_renderer
    from slime_harbor.policy.server import EmbeddedPolicyServer
    from slime_harbor.trainers.sft import SFTConfig, sft_model_dir

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    instruction = (DEFAULT_TASKS / "dedupe-lines" / "instruction.md").read_text()
    pairs = [(initial_prompt_ids(make_renderer(tiny_model_dir, tok), instruction), tok.encode(NATIVE_REPLY, add_special_tokens=False))]
    out = tmp_path_factory.mktemp("ls_policy")
    losses = sft_model_dir(tiny_model_dir, out, pairs, SFTConfig(steps=15, batch_size=1))
    assert losses[-1] < 0.05 * losses[0]
    with EmbeddedPolicyServer(out) as server:
        yield server.url, out, AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()


def test_native_agent_samples_in_docker_are_token_exact(tmp_path, ls_policy, tokenizer):
    """test_rollout_e2e's token-exactness checks, with the agent's commands running in Docker."""
    policy_url, model_dir, hf_model = ls_policy
    summary, samples = rollout(tmp_path, agent="native", task_names=["dedupe-lines"], n_samples=2,
                               policy_url=policy_url, model_dir=str(model_dir), step_limit=3,
                               sampling=SamplingParams(max_new_tokens=48))  # fmt: skip
    assert summary["status_counts"]["aborted"] == 0 and summary["status_counts"]["failed"] == 0, summary["errors"]
    assert summary["drift_count"] == 0
    for s in samples:
        assert s.status in (SampleStatus.COMPLETED, SampleStatus.TRUNCATED) and s.reward is not None
        assert check_sample_against_model(s, hf_model, 1.0) < 1e-4
        trajectory = json.loads((Path(s.metadata["trial_dir"]) / "agent" / "trajectory.json").read_text())
        observations = [st["observation"]["results"][0]["content"] for st in trajectory["steps"] if st.get("observation")]
        spans = [tokenizer.decode(span) for span in masked_spans(s)]
        assert len(spans) == s.metadata["turns"] - 1 and len(observations) >= len(spans)
        for text, obs in zip(spans, observations):
            assert text.removeprefix("<|im_end|>") == f"\n<|im_start|>user\n{obs}<|im_end|>\n<|im_start|>assistant\n"
    # The SFT'd policy answers `ls`: its commands really ran in the container and came back.
    assert any("<returncode>0</returncode>" in tokenizer.decode(s.response_ids) for s in samples)
    assert no_container_of_trials(samples)


def test_sigint_mid_rollout_removes_every_container_and_keeps_finished_samples(tmp_path):
    # Oracle trials that take a few seconds, so SIGINT lands while some run and some are done.
    tasks = tmp_path / "tasks"
    for name in ("dedupe-lines", "fix-sort-key"):
        solve = (DEFAULT_TASKS / name / "solution" / "solve.sh").read_text()
        copy_task(DEFAULT_TASKS / name, tasks, solve=solve.replace("\n", "\nsleep 3\n", 1))
    run_id = f"test-sigint-{uuid.uuid4().hex[:8]}"
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "slime_harbor.cli", "rollout", "--env", "docker", "--agent", "oracle",
         "--tasks", str(tasks), "--n-samples", "4", "--concurrency", "2", "--out", str(out), "--no-progress"],
        env={**os.environ, "SLIME_HARBOR_RUN_ID": run_id, "PYTHONPATH": str(REPO)}, cwd=REPO,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        sink = out / "samples.jsonl"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if sink.exists() and sink.read_text().count("\n") >= 1 and containers_labelled(f"slime-harbor.run={run_id}"):
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()[0]
        proc.send_signal(signal.SIGINT)
        output = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, output
    assert no_container_of_run(run_id), output
    finished = read_jsonl(sink)
    assert 1 <= len(finished) < 8 and all(s.reward == 1.0 for s in finished)


def test_containers_of_a_sigkilled_run_are_swept_by_the_next_start(tmp_path, monkeypatch):
    script = textwrap.dedent(f"""
        import asyncio, sys, time
        sys.path.insert(0, {str(REPO / "tests")!r})
        from test_docker_env import make_env
        from pathlib import Path
        env = make_env(Path({str(DEFAULT_TASKS / "dedupe-lines")!r}), Path({str(tmp_path)!r}))
        asyncio.run(env.start(force_build=False))
        print(env.container_id, flush=True)
        time.sleep(600)
    """)
    container_id = first_line_then_sigkill(script)  # no teardown, no atexit
    assert container_id, "the child did not start its container"
    assert client().api.containers(all=True, filters={"id": container_id})  # left behind
    monkeypatch.setattr(docker_images, "_sweep_done", False)  # as in a fresh process
    environment = make_env(DEFAULT_TASKS / "dedupe-lines", tmp_path)

    async def next_start():
        await environment.start(force_build=False)
        await environment.stop(delete=True)

    asyncio.run(next_start())
    assert client().api.containers(all=True, filters={"id": container_id}) == []


def test_concurrent_removals_of_one_container_are_not_an_error():
    """A trial's agent and verifier environments both remove what carries the trial's label: when
    their teardowns meet (a SIGINT mid-rollout under load did it), Docker answers the later removal
    409 "already in progress". remove_container waits for the removal instead of raising."""
    import threading

    import docker

    from slime_harbor.environments.docker_images import docker_client, remove_container

    api = docker_client().api

    def race(remove) -> list[str]:
        container = api.create_container("python:3.11-slim", command=["sleep", "60"],
                                         host_config=api.create_host_config(network_mode="none"))["Id"]
        api.start(container)
        barrier, errors = threading.Barrier(4), []

        def one():
            barrier.wait()
            try:
                remove(container)
            except docker.errors.APIError as error:
                errors.append(str(error))

        threads = [threading.Thread(target=one) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        with pytest.raises(docker.errors.NotFound):
            api.inspect_container(container)
        return errors

    bare = [e for _ in range(3) for e in race(lambda c: api.remove_container(c, force=True))]
    assert any("already in progress" in e for e in bare), bare  # what the daemon does
    assert [e for _ in range(3) for e in race(lambda c: remove_container(api, c))] == []
