"""The Docker daemon's side of the `docker` sandbox (environments/docker.py): the client, the labels
that say which run owns a container and the sweep of containers a dead run left, the task images
(built once per content hash, one build at a time per tag) and the tool layers put on top of them
(tmux for terminus-2, registry-only agent installs).

Images: built through the Engine API, tagged by a hash of the build context
(``slime-harbor-env/<task>:<hash>``) and reused across trials and runs. A whole GRPO group starting
at once waits on one build (one shared future per tag in this process, a lock file across
processes). A build that fails is remembered per tag: every trial of that task fails with the build
log's tail (``SandboxBuildFailedError``, a permanent failure), and it is not retried in this
process. ``docker_image`` in task.toml is used as is (never pulled: it must be present).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import socket
import tempfile
import threading
import time
import uuid
from pathlib import Path

from harbor.environments.base import SandboxBuildFailedError

from slime_harbor.environments.common import owner_stamp, tail
from slime_harbor.environments.dockerfile import rebased_dockerfile, single_base_image

API_TIMEOUT_SEC = 120
"""How long an Engine API call (and a command of our own in a container) may take."""

LABEL = "slime-harbor"
"""Prefix of every label we put on containers and images."""


IMAGE_REPOSITORY = "slime-harbor-env"
KEPT_REPOSITORY = "slime-harbor-kept"
"""Where DockerEnvironment.keep_state commits a container's state (one tag per kept state)."""


class DockerUnavailableError(RuntimeError):
    """No Docker daemon answers where the Docker SDK looks (DOCKER_HOST or the default socket)."""


def docker_host() -> str:
    """The daemon the Docker SDK talks to: DOCKER_HOST, else the default socket."""
    return os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"


_clients: dict[str, object] = {}


_clients_lock = threading.Lock()


def docker_client():
    """The process's ``docker.DockerClient`` for the current DOCKER_HOST (one per host)."""
    import docker

    host = docker_host()
    with _clients_lock:
        client = _clients.get(host)
        if client is None:
            client = docker.DockerClient(base_url=host, timeout=API_TIMEOUT_SEC, max_pool_size=64)
            _clients[host] = client
        return client


def remove_container(api, container_id: str, wait_s: float = 30.0) -> None:
    """Force-remove a container. One already gone, or being removed by another teardown (a trial's
    agent and verifier environments both remove what carries the trial's label, and Docker answers
    the later of two removals 409 "already in progress"), is not an error: wait until it is gone."""
    import docker

    try:
        api.remove_container(container_id, force=True)
        return
    except docker.errors.NotFound:
        return
    except docker.errors.APIError as error:
        if error.status_code != 409 or "already in progress" not in str(error):
            raise
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            api.inspect_container(container_id)
        except docker.errors.NotFound:
            return
        time.sleep(0.05)


def check_docker(timeout: float = 10.0) -> None:
    """Raise :class:`DockerUnavailableError` (a one-line message) unless a daemon answers."""
    import docker

    try:
        probe = docker.DockerClient(base_url=docker_host(), timeout=timeout)
        try:
            probe.ping()
        finally:
            probe.close()
    except Exception as exc:  # connection refused, missing socket, permission denied, bad URL...
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DockerUnavailableError(
            f"Docker is not reachable at {docker_host()} (--env docker needs a running Docker "
            f"daemon; set DOCKER_HOST to use another): {reason}"
        ) from None


RUN_ID = os.environ.get("SLIME_HARBOR_RUN_ID") or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
"""Label value shared by every container this process starts (SLIME_HARBOR_RUN_ID overrides)."""


def owner_labels() -> dict[str, str]:
    return {
        f"{LABEL}.owner": owner_stamp(os.getpid()) or "",
        f"{LABEL}.owner-host": socket.gethostname(),
        f"{LABEL}.owner-pid": str(os.getpid()),
    }


def _owner_died(labels: dict) -> bool:
    """Whether the process that labelled a container or image (owner_labels) is gone, or its pid
    now belongs to another process. Owners on another host or in another pid namespace: False."""
    stamp = labels.get(f"{LABEL}.owner", "")
    try:
        namespace, pid, _ = stamp.split()
    except ValueError:
        return False
    if labels.get(f"{LABEL}.owner-host") != socket.gethostname() or namespace != os.readlink("/proc/self/ns/pid"):
        return False
    return owner_stamp(int(pid)) != stamp


def sweep_stale_containers(client=None) -> list[str]:
    """Remove our containers, and the states keep_state committed, whose owning process died (or
    whose pid now belongs to another process). Those owned from another host or pid namespace are
    left alone."""
    client = client or docker_client()
    removed = []
    for container in client.api.containers(all=True, filters={"label": f"{LABEL}.owner"}):
        if _owner_died(container.get("Labels") or {}):
            with contextlib.suppress(Exception):  # already gone, or another sweeper got there first
                client.api.remove_container(container["Id"], force=True)
                removed.append(container["Id"])
    for image in client.api.images(filters={"label": f"{LABEL}.kept"}):
        if _owner_died(image.get("Labels") or {}):
            with contextlib.suppress(Exception):
                remove_kept_image(image["Id"], client)
                removed.append(image["Id"])
    return removed


def remove_kept_image(image: str, client=None) -> None:
    """Remove a state keep_state committed (its tag with it); one already gone is not an error."""
    import docker

    with contextlib.suppress(docker.errors.NotFound):
        (client or docker_client()).api.remove_image(image, force=True, noprune=False)


_sweep_done = False


_sweep_lock = threading.Lock()


def sweep_stale_containers_once() -> None:
    """sweep_stale_containers, the first time any environment of this process starts."""
    global _sweep_done
    with _sweep_lock:
        if not _sweep_done:
            _sweep_done = True
            sweep_stale_containers()


# tag -> the build's outcome: one build per tag in this process, whichever event loop asks; a
# failed build stays failed (later trials of the task fail fast with the same reason).
image_builds: dict[str, concurrent.futures.Future] = {}


_image_builds_lock = threading.Lock()


def _lock_dir() -> Path:
    path = Path(tempfile.gettempdir()) / "slime-harbor-docker-locks"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def _build_image(context: Path, tag: str, task_name: str, timeout_sec: float, force: bool = False,
                 dockerfile: Path | None = None) -> None:
    """Build ``context`` as ``tag`` unless it exists (``force``: rebuild anyway); one builder at a
    time across processes. ``dockerfile``: a Dockerfile outside the context to build it with."""
    import docker

    client = docker_client()
    with open(_lock_dir() / (re.sub(r"[^A-Za-z0-9_.-]", "_", tag) + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force:
            with contextlib.suppress(docker.errors.ImageNotFound):
                client.api.inspect_image(tag)
                return  # built by an earlier run, or by another process while we waited
        log_lines: list[str] = []
        error = None
        try:
            for chunk in client.api.build(
                path=str(context), tag=tag, rm=True, forcerm=True, pull=False, decode=True,
                dockerfile=str(dockerfile) if dockerfile else None,
                network_mode="host",  # RUN apt-get / pip reach the package registries
                labels={f"{LABEL}.task": task_name}, timeout=timeout_sec,
            ):  # fmt: skip
                if "stream" in chunk:
                    log_lines.append(chunk["stream"])
                if "error" in chunk:
                    error = chunk.get("errorDetail", {}).get("message") or chunk["error"]
        except Exception as exc:  # bad Dockerfile syntax (400), daemon errors, read timeout
            error = str(exc)
        if error is not None:
            raise SandboxBuildFailedError(
                f"building the image of task {task_name} failed: {error.strip()}\n"
                f"{tail(''.join(log_lines), 3000)}"
            )


async def ensure_image(context: Path, tag: str, task_name: str, timeout_sec: float, force: bool = False,
                       dockerfile: Path | None = None) -> None:
    """Wait for ``tag`` to exist, building it once per process however many trials ask at once
    (``force``: the first build in this process rebuilds even an existing image)."""
    with _image_builds_lock:
        future = image_builds.get(tag)
        if future is None:
            future = concurrent.futures.Future()
            future.set_running_or_notify_cancel()  # a cancelled waiter must not cancel the build
            image_builds[tag] = future

            def build() -> None:
                try:
                    _build_image(context, tag, task_name, timeout_sec, force, dockerfile)
                except BaseException as exc:  # the build thread's end: every waiter gets it from the future
                    if not isinstance(exc, SandboxBuildFailedError):
                        exc = SandboxBuildFailedError(f"building the image of task {task_name} failed: {exc}")
                    future.set_exception(exc)
                else:
                    future.set_result(None)

            threading.Thread(target=build, name=f"build {tag}", daemon=True).start()
    waiting = asyncio.wrap_future(future)
    # A waiter cancelled (a start timeout) before the build fails must not leave asyncio a
    # "Future exception was never retrieved" traceback: the failure reaches the next waiter.
    waiting.add_done_callback(lambda f: f.cancelled() or f.exception())
    await asyncio.shield(waiting)


def tools_dockerfile_path(digest: str) -> Path:
    """Where a task's Dockerfile rebased on a tool layer is kept (outside the task's dir: the build
    sends it with the task's context)."""
    directory = _lock_dir() / "dockerfiles"
    directory.mkdir(exist_ok=True)
    return directory / f"{digest[:24]}.Dockerfile"


def image_tag(environment_name: str, content_hash: str) -> str:
    name = re.sub(r"[^a-z0-9._-]", "-", environment_name.lower()).strip("-._") or "task"
    return f"{IMAGE_REPOSITORY}/{name}:{content_hash[:24]}"


def remove_environment_images(environment_names, client=None) -> int:
    """Untag the images built for these environments (each task image and its rebase on tool
    layers); Docker deletes an image when its last tag goes. For throwaway tasks (calibrate's attack
    copies): their images are the task's own under another name. Returns how many tags went."""
    client = client or docker_client()
    repositories = {image_tag(n, "x").rsplit(":", 1)[0] for name in environment_names for n in (name, f"{name}-tools")}
    removed = 0
    for image in client.images.list(name=f"{IMAGE_REPOSITORY}/*"):
        for tag in image.tags:
            if tag.rsplit(":", 1)[0] in repositories:
                client.images.remove(tag, noprune=False)
                removed += 1
    return removed


def docker_disk_bytes(client=None) -> int:
    """The bytes Docker's image layers take on disk."""
    return int((client or docker_client()).df().get("LayersSize") or 0)


TOOLS_REPOSITORY = f"{IMAGE_REPOSITORY}-tools"


TMUX_SCRIPT = """set -eu
command -v tmux >/dev/null 2>&1 && exit 0
if command -v apt-get >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq --no-install-recommends tmux >/dev/null && rm -rf /var/lib/apt/lists/*
elif command -v apk >/dev/null 2>&1; then apk add --no-cache -q tmux
elif command -v dnf >/dev/null 2>&1; then dnf install -y -q tmux && dnf clean all
elif command -v yum >/dev/null 2>&1; then yum install -y -q tmux && yum clean all
fi
tmux -V
"""
"""What the ``provide_tmux`` layer runs: the distribution's own tmux, from its package registry."""


def layer_image(base_image: str, name: str, script: str) -> tuple[str, str, str]:
    """(tag, digest, Dockerfile) of ``base_image`` plus the layer ``name`` running ``script``."""
    base = docker_client().api.inspect_image(base_image)
    user = base["Config"].get("User")
    dockerfile = "\n".join([
        f"FROM {base_image}", *(["USER root"] if user else []),
        f"COPY layer.sh /tmp/slime-harbor-{name}.sh",
        f"RUN sh /tmp/slime-harbor-{name}.sh && rm -f /tmp/slime-harbor-{name}.sh",
        *([f"USER {user}"] if user else []),
    ]) + "\n"  # fmt: skip
    digest = hashlib.sha256("\0".join([base["Id"], dockerfile, script]).encode()).hexdigest()[:24]
    return f"{TOOLS_REPOSITORY}/{name}:{digest}", digest, dockerfile


async def ensure_layer_image(base_image: str, name: str, script: str, timeout_sec: float) -> str:
    """``base_image`` plus one layer that runs ``script`` (sh, as root, with the host's network, at
    build time), built once per base image id and script and reused after; returns its tag. The
    base image's user is kept. ``timeout_sec`` is the layer's own budget (an agent's install: its
    setup timeout, never the task's build timeout): past it, AgentInstallTimeoutError naming it."""
    from slime_harbor.agents.installed.installs import within_install_budget

    tag, digest, dockerfile = await asyncio.to_thread(layer_image, base_image, name, script)
    # Kept as long as the tag may be built (a cancelled waiter must not delete it under the build).
    context = _lock_dir() / "contexts" / digest
    if not (context / "Dockerfile").is_file():
        staging = context.with_name(f".{digest}.{uuid.uuid4().hex[:8]}")
        staging.mkdir(parents=True)
        (staging / "layer.sh").write_text(script)
        (staging / "Dockerfile").write_text(dockerfile)
        with contextlib.suppress(OSError):  # another process put the same files there first
            os.rename(staging, context)
        shutil.rmtree(staging, ignore_errors=True)
    build = ensure_image(context, tag, f"{base_image} + {name}", timeout_sec)
    await within_install_budget(build, name=name, where=f"a Docker layer on {base_image}", budget_sec=timeout_sec)
    return tag


def tools_base_image(environment_dir: Path) -> str | None:
    """The image the tool layers of a task built from ``environment_dir`` go on, when it is the
    task's base image (its Dockerfile is single-stage and the base is present here), so the layers
    are built once per base image, not once per task: procedural tasks share a base and differ in
    the files they copy. None: the layers go on top of the task's own image."""
    import docker

    dockerfile = environment_dir / "Dockerfile"
    base = single_base_image(dockerfile.read_text()) if dockerfile.is_file() else None
    if base is None:
        return None
    try:
        docker_client().api.inspect_image(base)
    except docker.errors.ImageNotFound:
        return None  # the task's own build says what is missing
    return base


async def task_image_on_tools(environment_dir: Path, environment_name: str, environment_id: str, tools_image: str,
                              timeout_sec: float, force: bool = False) -> str:
    """The task's Dockerfile built on ``tools_image`` (its base image plus the tool layers,
    :func:`tools_base_image`) instead of its base image; its tag."""
    dockerfile = environment_dir / "Dockerfile"
    rebased = rebased_dockerfile(dockerfile.read_text(), tools_image)
    digest = hashlib.sha256(f"{environment_id}\0{rebased}".encode()).hexdigest()
    path = tools_dockerfile_path(digest)
    if not path.is_file():  # written whole, then renamed: a concurrent build never reads half of it
        staging = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
        staging.write_text(rebased)
        os.replace(staging, path)
    tag = image_tag(f"{environment_name}-tools", digest)
    await ensure_image(environment_dir, tag, environment_name, timeout_sec, force, dockerfile=path)
    return tag
