"""A Harbor environment that runs each trial in a bubblewrap sandbox on this machine.

Use it wherever Harbor takes an environment::

    EnvironmentConfig(import_path="slime_harbor.environments.bubblewrap:BubblewrapEnvironment")
    harbor run -p TASK -a oracle -e slime_harbor.environments.bubblewrap:BubblewrapEnvironment

No Docker, no images: the host's own tools (/usr and the /bin, /lib* it links to) play the base
image. /usr and /etc are per-trial overlays (/usr over the host's, /etc over a copy of what any
host user may read of the host's /etc: no /etc/shadow), so Dockerfile steps and agents can write
them, never the host's; their upper dirs are ``<base_dir>/<session>-<id>/overlay/{usr,etc}``.
Everything else the sandbox writes lives in the per-trial ``rootfs`` beside them, bound as the
sandbox's ``/``: the task workdir, /root, /tmp, /opt, /tests, /solution, /installed-agent and
anything the agent creates. What the agent changed is read from those dirs on the host
(:mod:`slime_harbor.environments.agent_changes`), for the verifier's check.
Harbor's log mounts (/logs/agent, /logs/verifier, /logs/artifacts) are bound to the trial
directory, so Harbor reads them in place. /proc is the sandbox's own, /dev a minimal one.
The task's environment/Dockerfile is replayed on top (see :mod:`slime_harbor.environments.dockerfile`).
``keep_state()`` copies those dirs (the root and the overlays' upper dirs) on the host, for a second
verifier that starts a copy of the agent's final state later (the impossible twin's:
:mod:`slime_harbor.grading.impossible_twin`); the copy is an owned dir under ``base_dir``, swept likewise.

How processes are kept together and torn down: ``start()`` launches one long-lived bwrap
"init" with its own user (sandbox root = the host user), pid, ipc, uts and (unless the task
allows public network) network namespaces; ``sleep infinity`` is pid 1 inside, like Docker's
``sleep infinity`` container command, so nothing inside can kill it. Every ``exec`` joins those
namespaces with ``nsenter`` and runs ``bash -c`` there in its own process group, so a tmux
server or a ``nohup`` job started by one exec is visible to later ones (shared /tmp, one pid
namespace, one loopback). A timed-out or cancelled exec has its process group killed.
``stop()`` kills pid 1, and the kernel then kills every process in the pid namespace, detached
or not; the per-trial directory is then removed (``delete=True``). bwrap's
``--die-with-parent`` kills the sandbox if this Python process dies; directories left by a
killed process are swept by the next sandbox started under the same ``base_dir``.

Files (the Dockerfile's COPY, Harbor's uploads and downloads) go through tar/cat inside the
sandbox (:mod:`slime_harbor.environments.bubblewrap_files`); what happens on the host (trial
directories, sweeps, the /etc copy) is :mod:`slime_harbor.environments.bubblewrap_host`.

Network: a task gets the host's network only when its task.toml sets
``[environment] network_mode = "public"``; otherwise (``no-network``, or nothing set) the sandbox
has a loopback of its own. Harbor itself treats an unset mode as public; set
``default_network_mode="public"`` (``--ek default_network_mode=public``) to follow it.
With ``gateway_port`` set, a sandbox without the host's network still reaches the model gateway,
and only it, at ``127.0.0.1:<gateway_port>`` (see :mod:`slime_harbor.environments.gateway_reach`).
``allowlist`` policies and policies that change between phases are rejected, as Harbor requires
of providers that cannot enforce them.

Limits: every command runs as root inside (a task or agent asking for another user gets an
error); cpus/memory_mb are accepted and not enforced (no cgroups); GPU and TPU requests are
rejected; Linux tasks only; one container (no docker-compose.yaml, no prebuilt
``docker_image`` without a Dockerfile); exec output is returned whole (no streaming callbacks).
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import select
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import IO

from harbor.environments.base import ExecResult
from harbor.environments.capabilities import EnvironmentResourceCapabilities
from harbor.models.task.config import EnvironmentConfig
from harbor.models.trial.paths import TrialPaths

from slime_harbor.environments.abilities import KeptState, Sandbox
from slime_harbor.environments.common import ROOT_USERS, CompletedCommand, ExecTimeoutError, SandboxError
from slime_harbor.environments.dockerfile import DEFAULT_PATH, BuildRecipe, DockerfileError, parse_dockerfile
from slime_harbor.environments.agent_changes import HostLayout, SandboxChanges
from slime_harbor.environments.bubblewrap_files import SandboxFiles
from slime_harbor.environments.gateway_reach import GatewayForward

# Host-side plumbing (trial dirs, sweeps, the /etc copy, marked processes): bubblewrap_host.py.
from slime_harbor.environments.bubblewrap_host import (
    SANDBOX_TYPE, ETC_TEMPLATE_MOUNT, OVERLAY_MOUNT, OVERLAYS, HOST_TOOL_DIRS,
    default_sandbox_root, host_tool, sigkill, new_owned_dir, sweep_stale_sandboxes, MARKER_VAR,
    pids_with_marker, pids_in_namespace, remove_tree, populate_root, etc_template,
)

# /usr and /etc are overlays, so Dockerfile steps and agents can write them (never the host's):
# /usr over the host's, /etc over a copy of what any host user may read of the host's /etc
# (see etc_template). Their upper dirs live in the trial directory on the host, bound at
# OVERLAY_MOUNT while pid 1 mounts the overlays in the sandbox's own mount namespace and
# detached after: the agent cannot reach them, the host reads them to see what it changed
# (slime_harbor.environments.agent_changes). Mounting takes well under a millisecond; copying
# /etc into a tmpfs, as before, took several.
# pid 1: mount the overlays, name the host in /etc/hosts, report ready, then sleep like Docker's
# `sleep infinity` container command (pid 1 ignores signals sent from inside the sandbox).
_INIT_SCRIPT = " && ".join(
    [f"mount -t overlay overlay -o lowerdir={lower},upperdir={OVERLAY_MOUNT}{point}/upper,"
     f"workdir={OVERLAY_MOUNT}{point}/work {point}" for point, lower in OVERLAYS.items()]
    + [f"umount -l {OVERLAY_MOUNT} {ETC_TEMPLATE_MOUNT}", f"rmdir {OVERLAY_MOUNT}",
       """printf '127.0.0.1\\t%s\\n' "$(hostname)" >> /etc/hosts""", "echo ready", "exec sleep infinity"])
_INIT_READY_TIMEOUT_SEC = 30
# /proc/PID/ns names an exec enters (net only when the sandbox has a network of its own).
_ENTERED_NAMESPACES = ("user", "mnt", "pid", "ipc", "uts", "net")
_NSENTER_FLAGS = {"user": "user", "mnt": "mount", "pid": "pid", "ipc": "ipc", "uts": "uts",
                  "net": "net"}  # fmt: skip


class BubblewrapEnvironment(SandboxFiles, SandboxChanges, Sandbox):
    """Harbor ``BaseEnvironment`` on bubblewrap; see the module docstring for the design.

    Keyword arguments (Harbor passes ``EnvironmentConfig.kwargs`` / ``--ek``): those of every
    sandbox of ours (abilities.SandboxOptions; ``provide_tmux`` only checks that the host has tmux,
    which the sandbox uses; ``agent_installs`` are host installs, built once and cached, bound
    read-only; ``kept_state`` is a dir ``keep_state()`` kept, used itself and removed with the
    sandbox), and its own:

    - ``base_dir``: folder for per-trial sandbox directories (default: the system temp dir's
      ``slime-harbor-sandboxes``, created with mode 0700).
    """

    HOST_LAYOUT = HostLayout(overlays=tuple(OVERLAYS), plumbing=("/proc", "/dev", ETC_TEMPLATE_MOUNT, OVERLAY_MOUNT),
                             host_links=HOST_TOOL_DIRS)  # fmt: skip
    """Where its files lie on the host, for reading what the agent changed (agent_changes.SandboxChanges)."""

    def __init__(
        self,
        environment_dir: Path,
        environment_name: str,
        session_id: str,
        trial_paths: TrialPaths,
        task_env_config: EnvironmentConfig,
        *,
        base_dir: str | Path | None = None,
        **kwargs,
    ):
        self._install_dirs: dict[str, Path] | None = None
        # Set before super().__init__(), which validates the definition.
        self._base_dir = Path(base_dir) if base_dir else default_sandbox_root()
        super().__init__(environment_dir, environment_name, session_id, trial_paths, task_env_config, **kwargs)
        for mount in self._mounts:
            if mount.get("type") != "bind":
                raise ValueError(
                    f"{SANDBOX_TYPE} environment supports bind mounts only, got {mount!r}"
                )
        self.sandbox_dir: Path | None = None
        """The per-trial directory on the host (None before ``start()``)."""
        self._recipe: BuildRecipe | None = None
        self._etc_template: Path | None = None
        self._init: asyncio.subprocess.Process | None = None
        self._init_pid: int | None = None
        # Open handles on the sandbox's namespaces and root, which execs enter. Holding them
        # (instead of naming pid 1 to nsenter) means a dead sandbox fails the exec: a recycled
        # pid can never send a command into some other process's namespaces, or the host's.
        self._namespace_fds: dict[str, int] = {}
        self._pid1_fd: int | None = None  # a pidfd: readable once pid 1 has exited
        self._execs: set[asyncio.subprocess.Process] = set()
        self._gateway_forward: GatewayForward | None = None
        self._stopped = False
        self._stop_task: asyncio.Future | None = None
        self._built: dict | None = None  # agent_changes.snapshot of the sandbox once built
        self._built_mounts: set[tuple[str, str]] = set()

    @staticmethod
    def type() -> str:
        return SANDBOX_TYPE

    @classmethod
    def resource_capabilities(cls) -> EnvironmentResourceCapabilities:
        # No cgroups: cpus/memory_mb are hints; explicit limit/request policies are rejected.
        return EnvironmentResourceCapabilities()

    @classmethod
    def preflight(cls) -> None:
        try:
            bwrap = host_tool("bwrap")
            host_tool("nsenter")
        except FileNotFoundError as e:
            raise SystemExit(str(e)) from None
        probe = subprocess.run(
            [bwrap, "--unshare-user", "--unshare-pid", "--ro-bind", "/", "/", "true"],
            capture_output=True,
            text=True,
        )
        if probe.returncode != 0:
            raise SystemExit(
                "bubblewrap cannot create namespaces here (user namespaces disabled?): "
                f"{probe.stderr.strip()}"
            )

    @property
    def _dockerfile(self) -> Path:
        return self.environment_dir / "Dockerfile"

    def _validate_definition(self) -> None:
        if (self.environment_dir / "docker-compose.yaml").exists():
            raise DockerfileError(
                f"{self.environment_dir}/docker-compose.yaml: multi-container tasks are not "
                f"supported by the {SANDBOX_TYPE} environment"
            )
        if not self._dockerfile.is_file():
            image = self.task_env_config.docker_image
            raise DockerfileError(
                f"{self._dockerfile} not found"
                + (f"; the prebuilt image {image!r} cannot run without Docker" if image else "")
            )

    # --- lifecycle --------------------------------------------------------------------------

    async def install_agents(self, force_build: bool = False) -> None:
        """Build (or find) the host installs of this trial's agent, each within
        ``agent_setup_timeout_sec`` (the agent's setup budget, which the trial runner sets from
        Harbor's: trial_setup.install_agents_first), not the task's build timeout. The trial runner
        calls it before Harbor starts the environment; ``start()`` calls it too (a no-op once
        done). A build that fails raises AgentInstallError (an infrastructure failure, retried)."""
        from slime_harbor.agents.installed.installs import AgentInstallError, within_install_budget

        if self._install_dirs is not None:
            return
        dirs = {}
        for install in self.options.agent_installs:
            build = asyncio.to_thread(install.host_dir)
            try:
                dirs[install.name] = await within_install_budget(
                    build, name=install.name, where="a venv on this host", budget_sec=self.agent_setup_timeout_sec)
            except AgentInstallError:
                raise
            except RuntimeError as exc:  # pip failed, no usable host Python: one line, retried
                raise AgentInstallError(str(exc)) from None
        self._install_dirs = dirs

    async def start(self, force_build: bool) -> None:
        if self.sandbox_dir is not None:
            raise SandboxError("the sandbox was already started")
        self.make_watch_dir()
        if self.options.provide_tmux and not any(Path(d, "tmux").is_file() for d in ("/usr/bin", "/usr/local/bin", "/bin")):
            raise SandboxError(f"tmux is not installed on this host, and the {SANDBOX_TYPE} sandbox uses the "
                               "host's (e.g. 'apt-get install tmux')")  # fmt: skip
        self._recipe = parse_dockerfile(self._dockerfile, self.environment_dir)
        self.logger.debug(
            f"Sandbox for {self.environment_name}: base image {self._recipe.base_image!r} "
            f"replaced by host tools; ignored: {[i.keyword for i in self._recipe.ignored]}"
        )
        self._base_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        await asyncio.to_thread(sweep_stale_sandboxes, self._base_dir)
        if self.options.kept_state is not None:  # a kept state, as it was: its files, fresh overlay work dirs
            self.sandbox_dir = Path(self.options.kept_state)
            _live_sandboxes[self.sandbox_dir] = self
            self._etc_template = await asyncio.to_thread(etc_template, self._base_dir)
            for point in OVERLAYS:
                (self._overlay_dir(point) / "work").mkdir(parents=True, mode=0o755)
            await self._start_init()
            return
        self.sandbox_dir = new_owned_dir(self._base_dir, self.session_id)
        _live_sandboxes[self.sandbox_dir] = self
        self._etc_template = await asyncio.to_thread(etc_template, self._base_dir)
        await asyncio.to_thread(populate_root, self._rootfs)
        await self.install_agents()
        for install in self.options.agent_installs:  # bound like Harbor's read-only mounts
            self._mounts.append({"type": "bind", "source": str(self._install_dirs[install.name]),
                                 "target": install.sandbox_dir, "read_only": True})  # fmt: skip
        await self._start_init()
        await self._open_gateway_forward()
        for step in self._recipe.steps:
            await self._apply(step)
        if self.task_env_config.workdir:
            await self._check(["mkdir", "-p", "--", self.task_env_config.workdir], "workdir")
        # The image, as built: what the agent changes is judged against it (verifier_runtime).
        self._built = await asyncio.to_thread(self._snapshot)
        self._built_mounts = self._mount_points()

    async def keep_state(self) -> KeptSandbox:
        """The sandbox's files as they are now (its root and the overlays' upper dirs), copied on
        the host into an owned dir beside it, for a copy started later (``kept_state``): untouched by
        what runs in this sandbox afterwards. The copy runs in the sandbox's user namespace, whose
        root may read what the agent made unreadable; Harbor's mounts are not in it."""
        if self._init_pid is None or self._stopped:
            raise SandboxError("the sandbox is not running")
        kept = new_owned_dir(self._base_dir, f"{self.session_id}-kept")
        sources = {self._rootfs: kept / "rootfs"}
        sources |= {self._overlay_dir(p) / "upper": kept / self._overlay_dir(p).relative_to(self.sandbox_dir) / "upper"
                    for p in OVERLAYS}
        try:
            for target in sources.values():
                target.parent.mkdir(parents=True, exist_ok=True)
            argv = [host_tool("nsenter"), f"--user=/proc/self/fd/{self._namespace_fds['user']}", "--preserve-credentials",
                    "--", "cp", "-a", "--reflink=auto", "--"]  # fmt: skip
            for source, target in sources.items():
                copy = await asyncio.create_subprocess_exec(
                    *argv, str(source), str(target), pass_fds=(self._namespace_fds["user"],),
                    stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
                _, err = await copy.communicate()
                if copy.returncode != 0:
                    raise SandboxError(f"keeping the sandbox's files failed: {err.decode(errors='replace').strip()[-300:]}")
        except BaseException:  # a half-kept copy is removed (re-raised)
            await asyncio.to_thread(remove_tree, kept)
            raise
        return KeptSandbox(self, kept)

    async def stop(self, delete: bool) -> None:
        """Kill everything in the sandbox and (delete=True) remove its directory.

        Every caller waits for the same teardown: Harbor runs stop() under asyncio.shield, and a
        caller cancelled twice returns early while the teardown goes on, so whoever calls again
        (the rollout runner does, after a cancellation) must be able to wait for it to finish.
        """
        if self._stop_task is None:
            self._stop_task = asyncio.ensure_future(self._stop(delete))
        await asyncio.shield(self._stop_task)

    async def _stop(self, delete: bool) -> None:
        self._stopped = True
        if self._gateway_forward is not None:
            self._gateway_forward.close()
        self._kill_all()
        if self._init is not None:
            try:
                await asyncio.wait_for(self._init.wait(), timeout=30)
            except TimeoutError:
                self.logger.error(f"sandbox init {self._init.pid} did not exit after SIGKILL")
        for fd in [*self._namespace_fds.values(), self._pid1_fd]:
            if fd is not None:
                os.close(fd)
        self._namespace_fds.clear()
        self._pid1_fd = None
        self.remove_watch_dir()
        if self.sandbox_dir is None:
            return
        _live_sandboxes.pop(self.sandbox_dir, None)
        if delete:
            # A start() cancelled mid-way may still have a worker thread populating the root for
            # a moment, and killed processes need a moment to die: sweep and retry briefly.
            for attempt in range(10):
                try:
                    await asyncio.to_thread(remove_tree, self.sandbox_dir)
                    break
                except OSError:
                    if attempt == 9:
                        raise
                    self._kill_all()
                    await asyncio.sleep(0.2)
        else:
            self.logger.info(f"Sandbox directory kept at {self.sandbox_dir}")

    def _kill_all(self) -> None:
        """SIGKILL the sandbox's pid 1 (the kernel then kills its whole pid namespace)."""
        if self._init_pid is not None:
            # bwrap stays alive to reap pid 1 and then exits; killing it too would leave pid 1
            # a zombie of the host's init.
            sigkill(os.kill, self._init_pid)
        elif self._init is not None:
            sigkill(os.killpg, self._init.pid)  # failed or interrupted before pid 1 was known
        for proc in list(self._execs):
            sigkill(os.killpg, proc.pid)
        # Belt and braces: a start() cancelled between spawning bwrap and learning pid 1's pid,
        # or an exec spawned while we were stopping, escapes the bookkeeping above. Every process
        # of this sandbox carries its marker in its environment, so find them all and kill them.
        if self.sandbox_dir is not None:
            for pid in pids_with_marker(self._marker):
                sigkill(os.kill, pid)

    @property
    def _marker(self) -> str:
        return self.sandbox_dir.name if self.sandbox_dir is not None else ""

    @property
    def _rootfs(self) -> Path:
        assert self.sandbox_dir is not None
        return self.sandbox_dir / "rootfs"

    def _overlay_dir(self, point: str) -> Path:
        """The host dir of the overlay at `point` (/usr, /etc): its upper and work dirs."""
        return self.sandbox_dir / "overlay" / point.strip("/")

    def _overlay_lower(self, point: str) -> Path:
        """The host dir the overlay at `point` lies over: the host's /usr, the readable copy of /etc."""
        return {"/usr": Path("/usr"), "/etc": self._etc_template}[point]

    def copy_kwargs(self) -> dict:
        return {"base_dir": self._base_dir}

    @property
    def _hostname(self) -> str:
        assert self.sandbox_dir is not None
        return self.sandbox_dir.name.rsplit("-", 1)[-1]

    async def _start_init(self) -> None:
        info_read, info_write = os.pipe()
        log_path = self.sandbox_dir / "bwrap.log"
        try:
            with open(log_path, "wb") as log:
                self._init = await asyncio.create_subprocess_exec(
                    *self._bwrap_argv(info_write),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=log,
                    pass_fds=(info_write,),
                    start_new_session=True,
                    # The marker is inherited by pid 1; _kill_all sweeps by it (see there).
                    env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), MARKER_VAR: self._marker},
                )
        finally:
            os.close(info_write)
        try:
            # bwrap writes {"child-pid": ...} and closes the fd right after creating pid 1.
            info = await asyncio.to_thread(_read_until_eof, info_read)
        finally:
            os.close(info_read)
        try:
            ready = await asyncio.wait_for(
                self._init.stdout.readline(), timeout=_INIT_READY_TIMEOUT_SEC
            )
        except TimeoutError:
            ready = b""
        if ready != b"ready\n" or not info:
            raise SandboxError(
                f"bubblewrap sandbox did not start: {log_path.read_text(errors='replace')}"
            )
        self._open_namespaces(json.loads(info))

    def _open_namespaces(self, info: dict) -> None:
        pid = info["child-pid"]
        self._pid1_fd = os.pidfd_open(pid)
        for name in _ENTERED_NAMESPACES:
            self._namespace_fds[name] = os.open(f"/proc/{pid}/ns/{name}", os.O_RDONLY)
        self._namespace_fds["root"] = os.open(f"/proc/{pid}/root", os.O_RDONLY | os.O_DIRECTORY)
        # bwrap reported these inodes itself, so the handles are this sandbox's, not a reused pid's.
        if os.fstat(self._namespace_fds["pid"]).st_ino != info["pid-namespace"]:
            raise SandboxError("bubblewrap sandbox exited while starting")
        self._init_pid = pid

    async def _open_gateway_forward(self) -> None:
        """127.0.0.1:<gateway_port> in the sandbox's own network, piped to the host's gateway."""
        if self.options.gateway_port is None or self.shares_host_network:
            return  # no gateway, or the sandbox reaches it directly
        self._gateway_forward = await GatewayForward.open(
            self._namespace_fds["net"], self.options.gateway_port, self.options.gateway_host,
            user_ns_fd=self._namespace_fds["user"],  # the network namespace is the sandbox user's
        )  # fmt: skip
        if self._stopped:  # stop() ran while it opened
            self._gateway_forward.close()

    def _bwrap_argv(self, info_fd: int) -> list[str]:
        argv = [
            host_tool("bwrap"), "--unshare-user", "--uid", "0", "--gid", "0",
            "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--hostname", self._hostname,
            "--die-with-parent", "--as-pid-1",
            "--bind", str(self._rootfs), "/",
        ]  # fmt: skip
        if not self.shares_host_network:
            argv.append("--unshare-net")
        for name in HOST_TOOL_DIRS:
            host = Path("/") / name
            if host.is_dir() and not host.is_symlink():
                argv += ["--ro-bind", str(host), str(host)]
        argv += ["--proc", "/proc", "--dev", "/dev", "--cap-add", "CAP_SYS_ADMIN"]  # pid 1 mounts the overlays
        argv += ["--ro-bind", str(self._etc_template), ETC_TEMPLATE_MOUNT,
                 "--bind", str(self.sandbox_dir / "overlay"), OVERLAY_MOUNT]
        for mount in self._mounts:
            flag = "--ro-bind" if mount.get("read_only") else "--bind"
            argv += [flag, mount["source"], mount["target"]]
        return [*argv, "--chdir", "/", "--info-fd", str(info_fd), "--", "/bin/sh", "-c", _INIT_SCRIPT]

    async def end_agent_processes(self) -> None:
        """Kill every process in the sandbox but its pid 1 (detached daemons and a tmux server
        included); the files stay. Before a verifier that runs in the agent's sandbox
        (:mod:`slime_harbor.grading.isolation`). Done from the host, by pid namespace, with nothing of
        the sandbox's (whose shell the agent may have replaced); repeated until nothing but
        zombies (orphans ``sleep infinity`` never reaps) is left."""
        # Not a restart, as the Docker environment does: killing pid 1 ends the sandbox itself (its
        # namespaces, the overlays it mounted), so everything else is found and killed from here.
        if self._init_pid is None or self._stopped:
            raise SandboxError("the sandbox is not running")
        namespace = os.fstat(self._namespace_fds["pid"]).st_ino
        for _ in range(50):
            live = pids_in_namespace(namespace, exclude=self._init_pid)
            if not live:
                return
            for pid in live:
                sigkill(os.kill, pid)
            await asyncio.sleep(0.05)
        raise SandboxError(f"processes of the agent survived in the sandbox: {live[:10]}")

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
        if user not in ROOT_USERS:
            raise SandboxError(
                f"the {SANDBOX_TYPE} environment runs every command as root; "
                f"user {user!r} is not supported"
            )
        done = await self._run(
            ["/bin/bash", "-c", command],
            cwd=cwd or self._default_cwd,
            env=self._command_env(self._merge_env(env)),
            timeout_sec=timeout_sec,
        )
        return ExecResult(
            stdout=done.stdout.decode(errors="replace"),
            stderr=done.stderr.decode(errors="replace"),
            return_code=done.return_code,
        )

    @property
    def _default_cwd(self) -> str:
        assert self._recipe is not None
        return self.task_env_config.workdir or self._recipe.workdir

    def _command_env(self, extra: dict[str, str] | None) -> dict[str, str]:
        """What a command sees: HOME and HOSTNAME, the image's ENV, then Harbor's env."""
        assert self._recipe is not None
        return {**self._base_env, **self._recipe.env, **(extra or {})}

    def image_env(self) -> dict[str, str]:
        return dict(self._recipe.env) if self._recipe is not None else {}

    @property
    def _base_env(self) -> dict[str, str]:
        return {"HOME": "/root", "HOSTNAME": self._hostname}

    async def _run(
        self,
        argv: list[str],
        *,
        cwd: str = "/",
        env: dict[str, str] | None = None,
        stdin: IO[bytes] | None = None,
        stdout: IO[bytes] | None = None,
        timeout_sec: float | None = None,
    ) -> CompletedCommand:
        """Run ``argv`` inside the sandbox; ``stdout`` captured unless a file is given.

        Output goes to files, not pipes: a background job that inherits them (``nohup x &``)
        must not keep the exec waiting for end-of-file after its shell has exited.
        """
        if self._init_pid is None or self._stopped:
            raise SandboxError("the sandbox is not running")
        if select.select([self._pid1_fd], [], [], 0)[0]:
            raise SandboxError("the sandbox exited unexpectedly (its pid 1 was killed)")
        with tempfile.TemporaryFile() as out_file, tempfile.TemporaryFile() as err_file:
            proc = await asyncio.create_subprocess_exec(
                *self._nsenter_argv(), "/usr/bin/env", "-C", cwd, *argv,
                pass_fds=tuple(self._namespace_fds.values()),
                stdin=stdin if stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=stdout if stdout is not None else out_file,
                stderr=err_file,
                # Our own commands (tar, mkdir ...) get the standard PATH, whatever ENV says.
                env={**(env if env is not None else {**self._base_env, "PATH": DEFAULT_PATH}), MARKER_VAR: self._marker},
                start_new_session=True,  # its own process group, killed as a whole
            )  # fmt: skip
            self._execs.add(proc)
            try:
                await asyncio.wait_for(proc.wait(), timeout=timeout_sec or None)
            except TimeoutError:
                sigkill(os.killpg, proc.pid)
                await proc.wait()
                raise ExecTimeoutError(f"Command timed out after {timeout_sec} seconds") from None
            except BaseException:  # cancelled: leave nothing running behind
                sigkill(os.killpg, proc.pid)
                raise
            finally:
                self._execs.discard(proc)
            out_file.seek(0)
            err_file.seek(0)
            return CompletedCommand(proc.returncode, out_file.read(), err_file.read())

    def _nsenter_argv(self) -> list[str]:
        argv = [host_tool("nsenter")]
        for name in _ENTERED_NAMESPACES:
            if name != "net" or not self.shares_host_network:
                argv.append(f"--{_NSENTER_FLAGS[name]}=/proc/self/fd/{self._namespace_fds[name]}")
        argv.append(f"--root=/proc/self/fd/{self._namespace_fds['root']}")
        # Keep our uid (it is root inside): for a non-root host user bwrap denies setgroups
        # in the namespace, so nsenter's default switch to uid/gid 0 would fail.
        return [*argv, "--preserve-credentials", "--"]

    async def _check(self, argv: list[str], what: str, **kwargs) -> CompletedCommand:
        done = await self._run(argv, **kwargs)
        if done.return_code != 0:
            raise SandboxError(f"{what} failed (exit {done.return_code}): {done.output()}")
        return done


class KeptSandbox(KeptState):
    """A sandbox's files kept by BubblewrapEnvironment.keep_state (a dir beside it): one copy of them
    starts (it takes the kept dir over, and removes it when stopped), or they are discarded."""

    kept: Path

    async def discard(self) -> None:
        if self.kept.exists() and self.kept not in _live_sandboxes:
            await asyncio.to_thread(remove_tree, self.kept)


# --- host-side helpers ------------------------------------------------------------------------


def _read_until_eof(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 4096):
        chunks.append(chunk)
    return b"".join(chunks)


# Sandboxes started by this process and not yet stopped: killed and removed at interpreter exit
# (e.g. a script that never awaited stop()).
_live_sandboxes: dict[Path, BubblewrapEnvironment] = {}


@atexit.register
def _stop_live_sandboxes() -> None:
    for path, environment in list(_live_sandboxes.items()):
        environment._kill_all()
        shutil.rmtree(path, ignore_errors=True)
    _live_sandboxes.clear()


