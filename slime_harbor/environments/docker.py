"""A Harbor environment on the Docker Engine API: one container per trial, fast execs.

Use it wherever Harbor takes an environment (``--env docker`` in our commands)::

    EnvironmentConfig(import_path="slime_harbor.environments.docker:DockerEnvironment")
    harbor trials start -p TASK -a oracle -e slime_harbor.environments.docker:DockerEnvironment

What it does differently from Harbor's own docker environment (``--env harbor-docker``), which
runs a ``docker compose`` process for every build, start, command and file transfer:

- Images: built once per task from ``environment/``, tagged by a hash of the build context and
  reused across trials and runs; a build that fails fails every trial of the task, permanently
  (:mod:`slime_harbor.environments.docker_images`, with the tool layers put on top of them).
- Containers: one per trial, labelled (``slime-harbor.*``: run, trial, owner) and removed by
  ``stop()``, with everything else labelled with the trial. Network ``none`` unless the task's
  task.toml sets ``network_mode = "public"`` (then ``host``: the daemon here has no bridge).
  With ``gateway_port`` set, a ``none`` container still reaches the model gateway on the host, and
  only it, at ``127.0.0.1:<gateway_port>`` (:mod:`slime_harbor.environments.gateway_reach`; needs
  the daemon on this machine). ``cpus`` / ``memory_mb`` are enforced (CFS quota, memory cgroup)
  and visible inside. pid 1 is Docker's init, so the orphans of killed commands are reaped.
- Commands: one long-lived shell loop per concurrent command inside the container
  (:mod:`slime_harbor.environments.docker_exec`) instead of a process and Engine API calls per
  command; same semantics as ``docker exec`` (exit code, separate stdout/stderr, cwd, env, user)
  and a timeout kills the command's whole process group. A non-root user is switched to with
  ``setpriv``; an image without it (or without bash and setsid) gets Engine API execs.
- Files: tar archives through the Engine API (put_archive / get_archive).
- Leftovers: each container records its owner (pid namespace, pid, process start time); the first
  environment of a process removes those whose owner died; those live at interpreter exit too.
- What the agent changed (for the verifier, :mod:`slime_harbor.grading.isolation`): read from the daemon.
- The agent's final state, kept for a second verifier (``keep_state()``, the impossible twin's:
  :mod:`slime_harbor.grading.impossible_twin`): the container committed to an image (labelled with its
  owner, swept like a container when that process died), from which a copy starts later.

``check_docker()`` raises one clear error when no daemon answers; rollouts call it up front.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import io
import json
import os
import posixpath
import re
import shlex
import signal
import tarfile
import tempfile
import uuid
from pathlib import Path
from typing import IO

from harbor.environments.base import ExecResult, SandboxBuildFailedError, transfer_tar_filter
from harbor.environments.capabilities import EnvironmentResourceCapabilities
from harbor.models.trial.config import ResourceMode

from slime_harbor.environments.abilities import KeptState, Sandbox
from slime_harbor.environments.agent_changes import ContainerChanges
from slime_harbor.environments.common import (
    ROOT_USERS, CompletedCommand, ExecTimeoutError, SandboxError, SandboxFileNotFoundError, root_owned, tar_excludes, write_dir_archive,
)
from slime_harbor.environments.docker_exec import ExecServer, ExecServerError, ExecServerUnavailable
from slime_harbor.environments.gateway_reach import GatewayForward, GatewayReachError

# The daemon side (client, sweeps of stale containers, task images, tool layers): docker_images.py.
from slime_harbor.environments.docker_images import (
    API_TIMEOUT_SEC, docker_host, DockerUnavailableError, KEPT_REPOSITORY, LABEL, RUN_ID, TMUX_SCRIPT,
    sweep_stale_containers_once, check_docker, docker_client, ensure_image, ensure_layer_image, image_tag,
    owner_labels, remove_container, remove_kept_image, task_image_on_tools, tools_base_image,
)

ENV_TYPE = "slime-docker"
KEEPALIVE = ["sh", "-c", "sleep infinity"]  # the command Harbor's compose files give the container
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# --- the environment ---------------------------------------------------------------------------


class DockerEnvironment(ContainerChanges, Sandbox):
    """Harbor ``BaseEnvironment`` on the Docker Engine API; see the module docstring.

    Keyword arguments (Harbor passes ``EnvironmentConfig.kwargs`` / ``--ek``): those of every
    sandbox of ours (abilities.SandboxOptions). ``provide_tmux`` runs the trial in the task's image
    plus a layer with the distribution's tmux (built once per image, with the host's network), for
    terminus-2, which installs tmux itself at agent setup, which a no-network container cannot;
    ``agent_installs`` go into an image layer on top of the task's, built once per task image;
    ``kept_state`` is an image ``keep_state()`` committed, run as it is.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.container_id: str | None = None
        """The trial's container (None before ``start()`` and after ``stop()``)."""
        self.run_image: str | None = None
        """The image the container runs: ``image``, or it plus the tmux and agent-install layers (set
        by ``start()``)."""
        self._image_workdir = "/"
        self._image_env_keys: set[str] = set()
        self._image_env: dict[str, str] = {}
        self._server: ExecServer | None = None
        self._gateway_forward: GatewayForward | None = None
        self._has_bash = False  # until start() knows: commands run with bash if the image has it
        self._stop_task: asyncio.Future | None = None
        self._tools_image: str | None = None
        self._tools_on_task_image = False

    @staticmethod
    def type() -> str:
        return ENV_TYPE

    @classmethod
    def resource_capabilities(cls) -> EnvironmentResourceCapabilities:
        return EnvironmentResourceCapabilities(cpu_limit=True, memory_limit=True)

    @classmethod
    def preflight(cls) -> None:
        try:
            check_docker()
        except DockerUnavailableError as e:
            raise SystemExit(str(e)) from None

    def _validate_definition(self) -> None:
        if (self.environment_dir / "docker-compose.yaml").exists():
            raise SandboxBuildFailedError(
                f"{self.environment_dir}/docker-compose.yaml: multi-container tasks need "
                "--env harbor-docker"
            )
        if not self.task_env_config.docker_image and not (self.environment_dir / "Dockerfile").is_file():
            raise SandboxBuildFailedError(f"{self.environment_dir}/Dockerfile not found and no docker_image set")

    @property
    def trial_name(self) -> str:
        return self.session_id.removesuffix("__env")

    @property
    def image(self) -> str:
        return self.task_env_config.docker_image or image_tag(self.environment_name, self.environment_id)

    @property
    def _client(self):
        return docker_client()

    # --- lifecycle --------------------------------------------------------------------------

    async def install_agents(self, force_build: bool = False) -> None:
        """Build the tool layers this trial's agent needs (tmux, its registry install), each within
        ``agent_setup_timeout_sec`` (the agent's setup budget, which the trial runner sets from
        Harbor's: trial_setup.install_agents_first), not the task's build timeout. The trial
        runner calls it before Harbor starts the environment, so Harbor's build timeout bounds the
        task's image alone; ``start()`` calls it too (a no-op once done). Where the layers go on the
        task's own image (no single base image here), that image is built first, within the task's
        build timeout."""
        layers = self._tool_layers()
        if self._tools_image is not None or not layers:
            return
        prebuilt = self.task_env_config.docker_image
        base = prebuilt or await asyncio.to_thread(tools_base_image, self.environment_dir)
        on_task_image = base is None
        if on_task_image:
            await self._ensure_task_image(force_build)
            base = self.image
        for name, script in layers:  # one layer each, on top of the previous one
            base = await ensure_layer_image(base, name, script, self.agent_setup_timeout_sec)
        self._tools_image, self._tools_on_task_image = base, on_task_image or bool(prebuilt)

    def _tool_layers(self) -> list[tuple[str, str]]:
        return ([("tmux", TMUX_SCRIPT)] if self.options.provide_tmux else []) + [(i.name, i.docker_script()) for i in self.options.agent_installs]

    async def _ensure_task_image(self, force_build: bool) -> None:
        """The task's own image: docker_image as is (present, never pulled), else its Dockerfile built
        within the task's build timeout."""
        if self.task_env_config.docker_image:
            await asyncio.to_thread(self._check_prebuilt_image)
            return
        build = ensure_image(self.environment_dir, self.image, self.environment_name,
                             self.task_env_config.build_timeout_sec, force_build)  # fmt: skip
        await self._within_build_timeout(build)

    async def _within_build_timeout(self, build) -> None:
        """A task image build, within the task's build_timeout_sec (Harbor's own bound when
        start() runs under it; ours when install_agents runs before it)."""
        timeout = self.task_env_config.build_timeout_sec
        try:
            await asyncio.wait_for(asyncio.shield(asyncio.ensure_future(build)), timeout)
        except TimeoutError:
            raise SandboxBuildFailedError(
                f"building the image of task {self.environment_name} did not finish within the task's build_timeout_sec "
                f"({timeout:.0f} s)"
            ) from None

    async def start(self, force_build: bool) -> None:
        if self.container_id is not None or self._stop_task is not None:
            raise SandboxError("the container was already started")
        self.make_watch_dir()
        await asyncio.to_thread(sweep_stale_containers_once)
        if self.options.kept_state is not None:  # a kept state, as it was: nothing to build
            self.run_image = self.options.kept_state
        else:
            await self._ensure_run_image(force_build)
        # Recorded as soon as it exists, so a stop() racing this start() removes it.
        await asyncio.to_thread(self._create_container)
        await self._open_gateway_forward()
        await self._start_exec_server()
        if not self._has_bash:
            self.logger.debug(f"{self.image} has no bash: commands run with /bin/sh")
        writable = self._mount_targets(writable_only=True)
        if writable:  # bind mounts exist already; chmod so a non-root agent can write its logs
            await self.ensure_dirs(writable)
        if self.options.kept_state is None:
            await self._upload_environment_dir_after_start()

    async def _ensure_run_image(self, force_build: bool) -> None:
        """The image the container runs (run_image): the task's, with the tool layers on top."""
        await self.install_agents(force_build)
        if self._tools_image is None:  # no layers
            await self._ensure_task_image(force_build)
            self.run_image = self.image
        elif self._tools_on_task_image:
            self.run_image = self._tools_image
        else:  # the task's own instructions on its base image plus the layers
            self.run_image = await task_image_on_tools(
                self.environment_dir, self.environment_name, self.environment_id, self._tools_image,
                self.task_env_config.build_timeout_sec, force_build)  # fmt: skip

    async def _start_exec_server(self) -> None:
        try:
            self._server = ExecServer(self._client.api, self.container_id)
            await self._server.start()
        except ExecServerUnavailable:
            self._server.close()
            self._server = None
            probe = await self._api_exec("command -v bash", cwd="/", env={}, user="root", timeout_sec=60)
            self._has_bash = probe.return_code == 0
        else:
            self._has_bash = self._server.has_bash

    async def end_agent_processes(self) -> None:
        """Kill every process in the container (detached daemons and a tmux server included);
        its files and mounts stay. Before a verifier that runs in the agent's container
        (:mod:`slime_harbor.grading.isolation`): the container is restarted with an immediate SIGKILL,
        which reaches every process wherever it hid, and the exec workers are started again."""
        # Not a search of /proc, as bubblewrap does: the daemon may run elsewhere, and a restart
        # keeps the container's files and mounts, which is all the verifier needs.
        if self.container_id is None or self._stop_task is not None:
            raise SandboxError("the container is not running")
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._gateway_forward is not None:  # the agent is done; a restart gives a new namespace anyway
            self._gateway_forward.close()
            self._gateway_forward = None
        await asyncio.to_thread(self._client.api.restart, self.container_id, timeout=0)
        await self._start_exec_server()

    async def keep_state(self) -> KeptContainer:
        """The container's files as they are now, committed to an image (the container paused
        meanwhile; Harbor's bind mounts are not in it), for a copy started later: untouched by what
        runs in this container afterwards. Labelled with this process as its owner; removed by
        KeptContainer.discard(), at exit, or by the sweep of a later process when this one died."""
        if self.container_id is None or self._stop_task is not None:
            raise SandboxError("the container is not running")
        labels = {f"{LABEL}.kept": self.trial_name, **owner_labels()}
        committed = await asyncio.to_thread(
            self._client.api.commit, self.container_id, repository=KEPT_REPOSITORY, tag=uuid.uuid4().hex[:16],
            changes=[f"LABEL {k}={json.dumps(v)}" for k, v in labels.items()])  # fmt: skip
        _live_kept_images.add(committed["Id"])
        return KeptContainer(self, committed["Id"])

    def _check_prebuilt_image(self) -> None:
        import docker

        try:
            self._client.api.inspect_image(self.image)
        except docker.errors.ImageNotFound:
            raise SandboxBuildFailedError(
                f"task {self.environment_name}: docker_image {self.image!r} is not present and images "
                "are never pulled here (docker load / build it first)"
            ) from None

    def _create_container(self) -> None:
        api = self._client.api
        cpus = self._resource_limit_value("cpu", auto_mode=ResourceMode.LIMIT)
        memory_mb = self._resource_limit_value("memory", auto_mode=ResourceMode.LIMIT)
        binds = [f"{m['source']}:{m['target']}:{'ro' if m.get('read_only') else 'rw'}"
                 for m in self._mounts if m.get("type") == "bind"]  # fmt: skip
        host_config = api.create_host_config(
            binds=binds,
            network_mode="host" if self.shares_host_network else "none",
            nano_cpus=int(cpus * 1e9) if cpus else None,
            mem_limit=f"{memory_mb}m" if memory_mb else None,
            init=True,  # Docker's init as pid 1 reaps the orphans of killed commands
        )
        name = re.sub(r"[^a-zA-Z0-9_.-]", "-", f"sh-{self.trial_name}")[:60] + f"-{uuid.uuid4().hex[:6]}"
        created = api.create_container(
            self.run_image or self.image, command=KEEPALIVE, name=name, detach=True, host_config=host_config,
            environment=self._startup_env() or None, labels=self._labels(),
        )  # fmt: skip
        self.container_id = created["Id"]
        _live_containers[self.container_id] = self
        if self._stop_task is not None:  # stop() ran while we were creating it (a cancelled start)
            remove_container(api, self.container_id)
            _live_containers.pop(self.container_id, None)
            raise SandboxError("the environment was stopped while its container was being created")
        api.start(self.container_id)
        config = api.inspect_container(self.container_id)["Config"]
        self._image_workdir = config.get("WorkingDir") or "/"
        self._image_env = dict(e.split("=", 1) for e in config.get("Env") or [] if "=" in e)
        self._image_env_keys = {e.split("=", 1)[0] for e in config.get("Env") or []}

    async def _open_gateway_forward(self) -> None:
        """127.0.0.1:<gateway_port> in the container's own network, piped to the host's gateway."""
        if self.options.gateway_port is None or self.shares_host_network:
            return  # no gateway, or the container reaches it directly
        container_id = self.container_id
        pid = (await asyncio.to_thread(self._client.api.inspect_container, container_id))["State"]["Pid"]
        net_ns, ours = None, False
        try:
            with contextlib.suppress(OSError):
                net_ns = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
                # The pid is the container's (not a pid of this machine that a remote daemon reported).
                ours = container_id in Path(f"/proc/{pid}/cgroup").read_text()
            if not ours:
                raise GatewayReachError(
                    f"gateway_port: container {container_id[:12]} has no process on this machine (pid {pid}): "
                    f"it exited, or the Docker daemon at {docker_host()} runs elsewhere, where a "
                    "no-network container cannot reach the gateway"
                )
            self._gateway_forward = await GatewayForward.open(net_ns, self.options.gateway_port, self.options.gateway_host)
        finally:
            if net_ns is not None:
                os.close(net_ns)
        if self._stop_task is not None:  # stop() ran while it opened
            self._gateway_forward.close()

    def _labels(self) -> dict[str, str]:
        return {
            f"{LABEL}.sandbox": ENV_TYPE,
            f"{LABEL}.run": RUN_ID,
            f"{LABEL}.trial": self.trial_name,
            f"{LABEL}.task": self.environment_name,
            **owner_labels(),
        }

    async def stop(self, delete: bool) -> None:
        """Remove the container (delete=True; else stop it) and anything labelled with the trial.

        Every caller waits for the same teardown (Harbor runs stop() under asyncio.shield, and a
        caller cancelled twice returns early while it goes on; a later caller must be able to
        wait for it to finish).
        """
        if self._stop_task is None:
            if self._server is not None:
                self._server.close()  # on the event loop: its streams belong to it
            if self._gateway_forward is not None:
                self._gateway_forward.close()
            self._stop_task = asyncio.ensure_future(asyncio.to_thread(self._stop_blocking, delete))
        await asyncio.shield(self._stop_task)

    def _stop_blocking(self, delete: bool) -> None:
        import docker

        api = self._client.api
        ids = {self.container_id} - {None}
        if delete:
            ids |= {c["Id"] for c in api.containers(all=True, filters={"label": f"{LABEL}.trial={self.trial_name}"})}
        for container_id in ids:
            try:
                if delete:
                    remove_container(api, container_id)
                else:
                    api.stop(container_id, timeout=1)
                    self.logger.info(f"Container kept: {container_id[:12]}")
            except docker.errors.NotFound:
                pass
            _live_containers.pop(container_id, None)
        self.container_id = None
        self.remove_watch_dir()

    def image_env(self) -> dict[str, str]:
        return dict(self._image_env)

    # --- running commands -------------------------------------------------------------------

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        user = self._resolve_user(user)
        env = self._merge_env(env) or {}
        cwd = cwd or self.task_env_config.workdir or self._image_workdir
        done = await self._run(command, cwd=cwd, env=env, user=user, timeout_sec=timeout_sec)
        if done.timed_out:
            raise ExecTimeoutError(f"Command timed out after {timeout_sec} seconds")
        return ExecResult(
            stdout=done.stdout.decode(errors="replace"),
            stderr=done.stderr.decode(errors="replace"),
            return_code=done.return_code,
        )

    async def _run(self, command: str, *, cwd: str, env: dict[str, str], user, timeout_sec) -> CompletedCommand:
        if self.container_id is None or self._stop_task is not None:
            raise SandboxError("the container is not running")
        root = user in ROOT_USERS
        server = self._server
        if (
            server is None
            or not all(_ENV_NAME.match(k) for k in env)
            or (not root and (not server.has_setpriv or ":" in str(user)))
        ):
            return await self._api_exec(command, cwd=cwd, env=env, user=user, timeout_sec=timeout_sec)
        try:
            return await server.run(self._job_script(command, cwd, env, user), timeout_sec)
        except ExecServerError as exc:
            raise SandboxError(f"{exc} ({self._container_state()})") from None

    def _container_state(self) -> str:
        try:
            state = self._client.api.inspect_container(self.container_id)["State"]
            return f"container {self.container_id[:12]} is {state['Status']}" + (
                " (killed: out of memory)" if state.get("OOMKilled") else ""
            )
        except Exception as exc:  # only words for an error message: the daemon's refusal says what is wrong
            return f"container {str(self.container_id)[:12]}: {exc}"

    def _shell(self) -> str:
        return "bash" if self._has_bash else "/bin/sh"

    def _job_script(self, command: str, cwd: str, env: dict[str, str], user) -> str:
        """What the worker runs for one command: ``docker exec -w CWD -e ... -u USER bash -c``."""
        q = shlex.quote
        lines = [
            f"cd -- {q(cwd)} 2>/dev/null || {{ echo {q(f'chdir to cwd ({cwd!r}) failed: no such file or directory')} >&2; exit 126; }}",
            "unset OLDPWD",  # as in a fresh exec (cd set it)
        ]
        lines += [f"export {k}={q(v)}" for k, v in env.items()]
        run = f"{self._shell()} -c {q(command)}"
        if user in ROOT_USERS:
            lines.append(f"exec {run}")
            return "\n".join(lines) + "\n"
        # Resolve the user as docker exec does: by name, else a numeric uid (gid 0, HOME /).
        lines += [
            f"u={q(str(user))}; uid=; gid=0; home=/; groups=--clear-groups",
            'while IFS=: read -r n _ i g _ h _; do',
            '  if [ "$n" = "$u" ] || [ "$i" = "$u" ]; then uid=$i; gid=$g; home=$h; groups=--init-groups; break; fi',
            "done < /etc/passwd",
            'if [ -z "$uid" ]; then case $u in *[!0-9]*|"")',
            '  echo "unable to find user $u: no matching entries in passwd file" >&2; exit 126;; esac; uid=$u; fi',
        ]  # fmt: skip
        if "HOME" not in env and "HOME" not in self._image_env_keys:
            lines.append('export HOME="$home"')
        lines.append(f'exec setpriv --reuid="$uid" --regid="$gid" "$groups" -- {run}')
        return "\n".join(lines) + "\n"

    async def _api_exec(self, command: str, *, cwd: str, env: dict[str, str], user, timeout_sec) -> CompletedCommand:
        """One Engine API exec (images without setpriv / bash+setsid, exotic env names or users).

        Docker starts each exec as a session leader, so a timeout kills its process group, from
        the host (the daemon reports the exec's pid; checked to be in this container first).
        """
        api = self._client.api
        exec_id = await asyncio.to_thread(
            api.exec_create, self.container_id, [self._shell(), "-c", command], stdout=True, stderr=True,
            workdir=cwd, environment=env or None, user="" if user is None else str(user),
        )  # fmt: skip
        exec_id = exec_id["Id"]

        def run() -> tuple[bytes, bytes]:
            out, err = api.exec_start(exec_id, demux=True)
            return out or b"", err or b""

        task = asyncio.ensure_future(asyncio.to_thread(run))
        timed_out = False
        try:
            out, err = await asyncio.wait_for(asyncio.shield(task), timeout_sec or None)
        except TimeoutError:
            timed_out = True
        except BaseException:  # cancelled or the daemon failed: nothing of the command outlives it
            await asyncio.to_thread(self._kill_exec_session, exec_id)
            raise
        if timed_out:
            await asyncio.to_thread(self._kill_exec_session, exec_id)
            try:  # its output ends when the killed group's last pipe holder is gone
                out, err = await asyncio.wait_for(asyncio.shield(task), 30)
            except TimeoutError:  # not killable from here (a remote daemon): give up on it
                out, err = b"", b""
        rc = (await asyncio.to_thread(api.exec_inspect, exec_id))["ExitCode"]
        return CompletedCommand(rc if rc is not None else -1, out, err, timed_out=timed_out)

    def _kill_exec_session(self, exec_id: str) -> None:
        pid = self._client.api.exec_inspect(exec_id).get("Pid")
        try:
            if pid and self.container_id in Path(f"/proc/{pid}/cgroup").read_text():
                os.killpg(pid, signal.SIGKILL)
        except OSError:  # gone already, or a daemon on another host (nothing to kill from here)
            pass

    async def _root_check(self, command: str, what: str) -> str:
        done = await self._run(command, cwd="/", env={}, user="root", timeout_sec=API_TIMEOUT_SEC)
        if done.return_code != 0:
            raise SandboxError(f"{what} failed (exit {done.return_code}): {done.output()}")
        return done.stdout.decode(errors="replace")

    # --- file transfer ------------------------------------------------------------------------

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        # Like `docker cp`: into the directory if the target is one, else as that file.
        source = Path(source_path)
        parent = posixpath.dirname(target_path.rstrip("/")) or "/"
        q = shlex.quote
        kind = await self._root_check(
            f"if [ -d {q(target_path)} ]; then echo dir; else mkdir -p -- {q(parent)}; fi",
            f"upload_file {source} -> {target_path}",
        )
        directory, name = (target_path, source.name) if kind.strip() == "dir" else (parent, posixpath.basename(target_path))
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            info = tar.gettarinfo(source.resolve(), arcname=name)
            with open(source, "rb") as data:
                tar.addfile(root_owned(info), data)
        await self._put_archive(directory, buffer.getvalue(), f"upload_file {source} -> {target_path}")

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        # Like `docker cp source/. target`: the directory's contents land in target_dir.
        await self._root_check(f"mkdir -p -- {shlex.quote(target_dir)}", f"upload_dir -> {target_dir}")
        with tempfile.TemporaryFile() as archive:
            await asyncio.to_thread(write_dir_archive, archive, Path(source_dir))
            archive.seek(0)
            await self._put_archive(target_dir, archive, f"upload_dir {source_dir} -> {target_dir}")

    async def _put_archive(self, directory: str, data: bytes | IO[bytes], what: str) -> None:
        ok = await asyncio.to_thread(self._client.api.put_archive, self.container_id, directory, data)
        if not ok:
            raise SandboxError(f"{what} failed")

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        target = Path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.partial")
        try:
            await asyncio.to_thread(self._download_file_blocking, source_path, partial)
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)

    def _download_file_blocking(self, source_path: str, target: Path) -> None:
        with tempfile.TemporaryFile() as archive:
            self._get_archive(source_path, archive)
            with tarfile.open(fileobj=archive, mode="r:") as tar:
                member = tar.next()
                if member is None or not member.isfile():
                    raise SandboxError(f"download_file {source_path}: not a regular file")
                with tar.extractfile(member) as data, open(target, "wb") as out:
                    while chunk := data.read(1 << 20):
                        out.write(chunk)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        target = Path(target_dir)
        target.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(self._download_dir_blocking, source_dir, target)

    async def _download_dir_with_exclusions_impl(self, *, source_dir: str, target_dir: Path | str,
                                                 exclude: list[str], service: str | None) -> None:
        # Filtered on this side of the Engine API's archive, as tar --exclude would (a pattern
        # matches a path or any of its components): Harbor's default runs `tar` in the container,
        # whose tools the agent may have replaced (the SWE-bench tasks' /testbed artifact).
        if not self.is_main_service(service):
            from harbor.environments.base import ServiceOperationsUnsupportedError

            raise ServiceOperationsUnsupportedError(self._service_unsupported_message(service))
        target = Path(target_dir)
        target.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(self._download_dir_blocking, source_dir, target, tuple(exclude))

    def _download_dir_blocking(self, source_dir: str, target: Path, exclude: tuple[str, ...] = ()) -> None:
        with tempfile.TemporaryFile() as archive:
            self._get_archive(source_dir.rstrip("/") + "/.", archive)
            with tarfile.open(fileobj=archive, mode="r:") as tar:
                members = []
                for member in tar:
                    # The archive of DIR/. holds "./..." (or "DIR/..." on some daemons): strip it.
                    parts = member.name.split("/", 1)
                    if len(parts) == 1:
                        continue
                    member.name = parts[1]
                    if exclude and tar_excludes(member.name, exclude):
                        continue
                    members.append(member)
                tar.extractall(path=target, members=members, filter=transfer_tar_filter)

    def _get_archive(self, path: str, archive: IO[bytes]) -> None:
        import docker

        try:
            stream, _ = self._client.api.get_archive(self.container_id, path)
        except docker.errors.NotFound:
            raise SandboxFileNotFoundError(f"{path}: no such file or directory in the container") from None
        for chunk in stream:
            archive.write(chunk)
        archive.seek(0)

class KeptContainer(KeptState):
    """A container's state kept by DockerEnvironment.keep_state (a committed image): copies of it
    start, then it is discarded."""

    async def discard(self) -> None:
        await asyncio.to_thread(remove_kept_image, self.kept)
        _live_kept_images.discard(self.kept)


# Containers started by this process and not yet removed: removed at interpreter exit (e.g. a
# script that never awaited stop(), or a Ctrl-C that cut a teardown short).
_live_containers: dict[str, DockerEnvironment] = {}


# Images keep_state committed and not yet discarded: removed at interpreter exit too.
_live_kept_images: set[str] = set()


@atexit.register
def _remove_live_containers() -> None:
    if not _live_containers and not _live_kept_images:
        return
    with contextlib.suppress(Exception):
        api = docker_client().api
        for container_id in list(_live_containers):
            with contextlib.suppress(Exception):
                api.remove_container(container_id, force=True)
        for image in list(_live_kept_images):
            with contextlib.suppress(Exception):
                remove_kept_image(image)
    _live_containers.clear()
    _live_kept_images.clear()

