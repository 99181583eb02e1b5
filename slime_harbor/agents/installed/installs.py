"""How an agent's package is installed into the sandbox from a registry: npm (:class:`NpmInstall`)
or PyPI (:class:`PypiInstall`), each into its own prefix ``/opt/slime-harbor/<name>`` with the
runtime it needs, so the task's own runtime is untouched.

Every install ends in one launcher, ``<prefix>/bin/<binary>``, a shell script that starts the
agent with its own runtime by absolute path: the agent's commands add only ``<prefix>/bin`` to
PATH, so the task's ``python`` and ``node`` stay first for everything the agent runs.

- npm: a pinned Node from the npm registry (``node-linux-<arch>``, the official build as an npm
  package) in ``<prefix>/node``, so a CLI that needs Node 22 runs on a bookworm image whose Debian
  Node is 18. The package is installed with the image's npm, else with Debian's (apt), which is
  removed again afterwards so the image keeps the runtime it had.
- PyPI: a venv of the image's Python when it is new enough, else Debian's ``python3``; for an
  agent that needs a newer Python than a Debian-family image's own (bookworm: 3.11), Debian
  trixie's CPython with its own glibc in ``<prefix>/python`` (debian_python.sh). The launcher
  runs the venv's Python with ``-I`` (the task's PYTHONPATH / PYTHONHOME / working directory
  cannot reach the agent's imports). In the bubblewrap sandbox, which shares the host's /usr, the
  venv is built on the host once (:meth:`PypiInstall.host_dir`).
"""

from __future__ import annotations

import asyncio
import fcntl
import functools
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from abc import ABC, abstractmethod
from pathlib import Path


# --- what an install is: built before the trial, from the registries, within the agent's budget ---
ENVIRONMENT_KWARG = "agent_installs"

DEFAULT_SETUP_TIMEOUT_SEC = 360.0
"""An environment's install budget when no trial set one (Harbor's BaseAgent default)."""
PROGRESS_EVERY_SEC = 30.0
"""How often a running install says how long it has been going."""


class AgentInstallError(RuntimeError):
    """An agent's install could not be built (a registry that did not answer, a failed pip or npm):
    an infrastructure failure, retried like an environment that did not start."""


class AgentInstallTimeoutError(AgentInstallError):
    """An agent's install ran past its budget, the agent's setup timeout (Harbor's
    ``agent_setup_timeout_sec``: its per-agent default, ``override_setup_timeout_sec`` and the
    multipliers), never the task's ``build_timeout_sec``."""


async def within_install_budget(install, *, name: str, where: str, budget_sec: float):
    """Await ``install`` (an awaitable building agent ``name``'s install ``where``: a Docker layer,
    a host venv) for at most ``budget_sec``; past it, :class:`AgentInstallTimeoutError` in one line
    that names the agent, the budget and how to raise it. The build itself is shielded, not
    cancelled: it is shared, and the retry or the next trial joins it. An install that takes more
    than a moment prints its progress on stderr (which agent, elapsed) every PROGRESS_EVERY_SEC."""
    build = asyncio.ensure_future(install)
    build.add_done_callback(lambda f: f.cancelled() or f.exception())  # a waiter that left never reads it
    started = time.monotonic()
    announced = False
    while True:
        elapsed = time.monotonic() - started
        left = budget_sec - elapsed
        if left <= 0:
            raise AgentInstallTimeoutError(
                f"installing agent {name} ({where}) did not finish within its {budget_sec:.0f} s budget, the "
                "agent's setup timeout (Harbor's default for the agent x the timeout multiplier); raise it "
                "with --agent-setup-timeout SEC or --timeout-multiplier"
            )
        wait = min(left, 2.0 if not announced else PROGRESS_EVERY_SEC)
        done, _ = await asyncio.wait({build}, timeout=wait)
        if done:
            result = build.result()
            if announced:
                print(f"[install] {name} ({where}) ready after {time.monotonic() - started:.0f} s", file=sys.stderr)
            return result
        announced = True
        print(f"[install] {name} ({where}): {time.monotonic() - started:.0f} s of its {budget_sec:.0f} s budget",
              file=sys.stderr)


class SandboxInstall(ABC):
    """Something an agent needs inside the sandbox, installed from the registries only and kept
    in ``sandbox_dir`` (away from the task's own Python and packages)."""

    name: str
    """Short name, used in image tags and cache dir names."""
    sandbox_dir: str
    """Where it lives inside the sandbox."""

    @abstractmethod
    def docker_script(self) -> str:
        """POSIX shell run as root in a ``RUN`` step ``FROM`` the task's image, with the host's
        network: installs into ``sandbox_dir``."""

    @abstractmethod
    def host_dir(self) -> Path:
        """A host directory bound read-only at ``sandbox_dir`` in a bubblewrap sandbox (which shares
        the host's /usr): built on first use, reused after. Blocking; safe across processes."""

    def check_host(self) -> None:
        """Raise RuntimeError (one line) when this host cannot build :meth:`host_dir`, so a run
        says so before its first trial."""


async def check_installed(environment, name: str, launcher: str, environments: str) -> None:
    """An agent's ``install()``: raise RuntimeError (one line) unless its launcher is in the
    sandbox, i.e. the environment was started with the agent's install (`environments`: slime-harbor's
    environments that provide it)."""
    done = await environment.exec(f"test -x {launcher}", user="root")
    if done.return_code != 0:
        raise AgentInstallError(
            f"{name} is not installed in this sandbox ({launcher} is missing): start the environment with "
            f"agent_installs={name} (--ek agent_installs={name}; slime-harbor's rollout passes it), on "
            f"slime-harbor's {environments} environment"
        )


def environment_kwargs(agent_config) -> dict[str, list[str]]:
    """The environment kwargs a trial of this agent needs (``{}`` for agents without installs): a
    Harbor ``AgentConfig`` whose class has a ``SANDBOX_INSTALLS`` attribute (a list of names)."""
    from harbor.agents.factory import AgentFactory

    try:
        agent_class = AgentFactory.get_agent_class_from_config(agent_config)
    except Exception:  # unknown agents are reported by the agent check, not here
        return {}
    installs = list(getattr(agent_class, "SANDBOX_INSTALLS", ()))
    return {ENVIRONMENT_KWARG: installs} if installs else {}


# --- the two kinds: npm and PyPI ---

SANDBOX_ROOT = "/opt/slime-harbor"
NODE_VERSION = "22.23.3"
"""The Node every npm agent runs on (npm's ``node-linux-<arch>`` packages)."""
DISTRO_PYTHON = (3, 11)
"""What a Debian-family image's own python3 gives (bookworm's, the tasks' usual base): a recipe
whose ``min_python`` is above it brings its own Python when the image has none new enough."""
DEBIAN_PYTHON_SCRIPT = Path(__file__).with_name("debian_python.sh")
"""Debian trixie's CPython into a prefix, from the Debian archive only (see its header)."""
UV_VERSION = "0.13.9"
"""uv from PyPI, the installer of recipes with ``installer="uv"`` (its resolver, not its Python builds)."""

# npm and pip trust their own CA lists; the image's trust store (with a cluster's TLS proxy CA) is the one.
_TRUST_IMAGE_CA = """if [ -s /etc/ssl/certs/ca-certificates.crt ]; then
  export npm_config_cafile=/etc/ssl/certs/ca-certificates.crt
  [ -n "${PIP_CERT:-}${REQUESTS_CA_BUNDLE:-}" ] || export PIP_CERT=/etc/ssl/certs/ca-certificates.crt
fi
"""


class NpmInstall(SandboxInstall):
    """An npm package under ``<prefix>/pkg``, run by a pinned Node in ``<prefix>/node``."""

    def __init__(self, name: str, package: str, version: str, binary: str, *, node: str = NODE_VERSION,
                 extra_packages: tuple[str, ...] = (), ignore_scripts: bool = False):  # fmt: skip
        self.name, self.package, self.version, self.binary = name, package, version, binary
        self.node, self.extra_packages, self.ignore_scripts = node, extra_packages, ignore_scripts
        self.sandbox_dir = f"{SANDBOX_ROOT}/{name}"

    @property
    def launcher(self) -> str:
        return f"{self.sandbox_dir}/bin/{self.binary}"

    @property
    def spec(self) -> str:
        return f"{self.package}@{self.version}"

    def docker_script(self) -> str:
        prefix, packages = self.sandbox_dir, " ".join(shlex.quote(p) for p in (self.spec, *self.extra_packages))
        scripts = " --ignore-scripts" if self.ignore_scripts else ""
        return f"""set -eu
{_TRUST_IMAGE_CA}added_npm=
if ! command -v npm >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq --no-install-recommends nodejs npm ca-certificates >/dev/null
    added_npm=apt
  elif command -v apk >/dev/null 2>&1; then
    apk add --no-cache -q nodejs npm
  else
    echo "{self.name} needs npm to install: the image has neither npm, apt-get nor apk" >&2
    exit 1
  fi
fi
npm_install() {{ npm install --no-fund --no-audit --no-update-notifier --loglevel=error "$@"; }}
# The agent's Node: npm's packaging of the official build (glibc); a musl image keeps its own.
case "$(uname -m)" in x86_64) arch=x64 ;; aarch64) arch=arm64 ;; *) arch= ;; esac
if [ -n "$arch" ] && ! [ -f /etc/alpine-release ]; then
  npm_install --prefix {prefix}/node-pkg node-linux-$arch@{self.node}
  mkdir -p {prefix}/node/bin
  mv {prefix}/node-pkg/node_modules/node-linux-$arch/bin/node {prefix}/node/bin/node
  rm -rf {prefix}/node-pkg
  node_bin={prefix}/node/bin/node
else
  node_bin=$(command -v node)
fi
PATH={prefix}/node/bin:$PATH npm_install -g{scripts} --prefix {prefix}/pkg {packages}
target=$(readlink -f {prefix}/pkg/bin/{self.binary})
mkdir -p {prefix}/bin
if head -c 64 "$target" | head -n 1 | grep -q '^#!.*node'; then
  printf '#!/bin/sh\\nexec %s %s "$@"\\n' "$node_bin" "$target" > {self.launcher}
else
  printf '#!/bin/sh\\nexec %s "$@"\\n' "$target" > {self.launcher}
fi
chmod 755 {self.launcher}
rm -rf /root/.npm
if [ "$added_npm" = apt ]; then  # the image keeps the runtime it had
  apt-get purge -y -qq --autoremove nodejs npm >/dev/null
  apt-get clean  # the downloaded .debs (over 100 MB) would stay in the layer
  rm -rf /var/lib/apt/lists/*
fi
echo "{self.name}: node $($node_bin --version), $({self.launcher} --version 2>&1 | head -n 1)"
"""

    def host_dir(self) -> Path:
        raise AgentInstallError(f"{self.name} has no bubblewrap install: run it with --env docker")

    def check_host(self) -> None:
        self.host_dir()


class PypiInstall(SandboxInstall):
    """A PyPI package in a venv under ``<prefix>/venv`` (Python >= ``min_python``), started by a
    launcher that runs ``entry`` (``module:function``) or the package's console script (or a
    script that ``files`` puts in ``venv/bin``).

    ``installer``: ``pip`` (the default) or ``uv`` (uv from PyPI, used once and removed again: pip's
    resolver backtracks for minutes through some dependency trees that uv resolves in seconds).
    ``files``: paths inside the prefix -> content, written executable (Harbor's runner script, a
    shim in ``bin``). ``links``: sandbox paths -> paths inside the prefix, made symlinks by the
    Docker layer (for a Harbor class that runs fixed paths of its own install); the bubblewrap
    sandbox binds the prefix alone, so it refuses an install with links. ``apt_packages``: Debian
    packages of programs the agent runs by name (OpenHands' local runtime drives its shells
    through tmux), installed into the image with apt, as Harbor's own install() does; the
    bubblewrap sandbox, which shares the host's /usr, needs them on the host."""

    def __init__(self, name: str, package: str, version: str, binary: str, *, entry: str | None = None,
                 min_python: tuple[int, int] = (3, 10), requirements: tuple[str, ...] = (), no_deps: bool = False,
                 smoke: str = "--help", installer: str = "pip", files: dict[str, str] | None = None,
                 links: dict[str, str] | None = None, apt_packages: tuple[str, ...] = ()):  # fmt: skip
        if installer not in ("pip", "uv"):
            raise ValueError(f"{name}: installer must be 'pip' or 'uv', got {installer!r}")
        self.name, self.package, self.version, self.binary = name, package, version, binary
        self.entry, self.min_python, self.requirements, self.no_deps = entry, min_python, requirements, no_deps
        self.smoke, self.installer, self.files, self.links = smoke, installer, dict(files or {}), dict(links or {})
        self.apt_packages = apt_packages
        self.sandbox_dir = f"{SANDBOX_ROOT}/{name}"
        self.builds = 0
        """Host venvs this process built (tests check that a second trial builds none)."""

    @property
    def launcher(self) -> str:
        return f"{self.sandbox_dir}/bin/{self.binary}"

    def pip_installs(self) -> list[list[str]]:
        """The venv Python's arguments, one command each: the package (alone with no_deps), then
        requirements; with uv, installing uv before and removing it after (``python -m uv`` installs
        into the venv of the Python that runs it)."""
        pip = ["-m", "pip", "install", "--no-cache-dir", "--disable-pip-version-check", "--no-input", "-q"]
        install = pip if self.installer == "pip" else ["-m", "uv", "pip", "install", "--no-cache", "--native-tls", "-q"]
        installs = [install + (["--no-deps"] if self.no_deps else []) + [f"{self.package}=={self.version}"]]
        if self.requirements:
            installs.append(install + list(self.requirements))
        if self.installer == "uv":
            installs = [[*pip, f"uv=={UV_VERSION}"], *installs,
                        ["-m", "pip", "uninstall", "--disable-pip-version-check", "-y", "-q", "uv"]]  # fmt: skip
        return installs

    @property
    def own_python(self) -> bool:
        """Whether the image may need the Python this install brings (debian_python.sh): it needs a
        newer one than a Debian-family image's python3 gives."""
        return tuple(self.min_python) > DISTRO_PYTHON

    def launcher_script(self, root: str) -> str:
        """The launcher, the venv at ``root``/venv: its Python, isolated (-I: no PYTHON* variables,
        no user site, no cwd on sys.path; the filter covers Pythons before 3.11, where -I still put
        '' there for -c)."""
        if self.entry:
            module, _, function = self.entry.partition(":")
            code = (f"import sys\nsys.path[:] = [p for p in sys.path if p]\nsys.argv[0] = {self.binary!r}\n"
                    f"from {module} import {function}\nsys.exit({function}())")  # fmt: skip
            return f"#!/bin/sh\nexec {root}/venv/bin/python -I -c {shlex.quote(code)} \"$@\"\n"
        return f"#!/bin/sh\nexec {root}/venv/bin/python -I {root}/venv/bin/{self.binary} \"$@\"\n"

    def docker_script(self) -> str:
        prefix, want = self.sandbox_dir, "%d, %d" % self.min_python
        pips = "\n".join(f"{prefix}/venv/bin/python {shlex.join(args)}" for args in self.pip_installs())
        return f"""set -eu
{_TRUST_IMAGE_CA}{self._apt_script()}usable() {{ "$1" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < ({want}))' 2>/dev/null; }}
py=
for candidate in /usr/bin/python3 /usr/local/bin/python3 "$(command -v python3 || true)"; do
  if [ -n "$candidate" ] && [ -x "$candidate" ] && usable "$candidate"; then py=$candidate; break; fi
done
{self._own_python_script() if self.own_python else self._distro_python_script()}echo "{self.name} venv on $py ($("$py" --version 2>&1))"
"$py" -m venv {prefix}/venv
{pips}
mkdir -p {prefix}/bin
cat > {self.launcher} <<'LAUNCHER_EOF'
{self.launcher_script(prefix)}LAUNCHER_EOF
chmod 755 {self.launcher}
{self._files_script()}MSWEA_CONFIGURED=true LITELLM_LOCAL_MODEL_COST_MAP=True {self.launcher} {self.smoke} >/dev/null
"""

    def _apt_script(self) -> str:
        """Installs ``apt_packages`` into the image (empty without any)."""
        if not self.apt_packages:
            return ""
        packages = " ".join(shlex.quote(p) for p in self.apt_packages)
        return f"""if ! command -v apt-get >/dev/null 2>&1; then
  echo "{self.name} needs {packages} from Debian: the image has no apt-get" >&2
  exit 1
fi
DEBIAN_FRONTEND=noninteractive apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends {packages} >/dev/null
apt-get clean
rm -rf /var/lib/apt/lists/*
"""

    def _distro_python_script(self) -> str:
        """Without a usable Python in the image: the distribution's python3 (apt or apk)."""
        return f"""if [ -z "$py" ]; then
  if command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq --no-install-recommends python3 python3-venv ca-certificates >/dev/null
    rm -rf /var/lib/apt/lists/*
  elif command -v apk >/dev/null 2>&1; then
    apk add --no-cache -q python3
  fi
  if usable /usr/bin/python3; then py=/usr/bin/python3; else
    echo "{self.name} needs Python >= {'.'.join(map(str, self.min_python))} with venv: the image has none and its distribution's python3 is older or missing" >&2
    exit 1
  fi
fi
"""

    def _own_python_script(self) -> str:
        """Without a usable Python in the image: newer than a Debian image's python3, so Debian
        trixie's into ``<prefix>/python`` (debian_python.sh, in a subshell: its trap and variables
        stay there), leaving the image's own Python and apt state as they were."""
        runtime, version = f"{self.sandbox_dir}/python", ".".join(map(str, self.min_python))
        return f"""if [ -z "$py" ]; then
  if ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg >/dev/null 2>&1; then
    echo "{self.name} needs Python >= {version} with venv: the image has none, nor apt-get and dpkg to bring Debian's" >&2
    exit 1
  fi
  (
PREFIX={runtime}
{DEBIAN_PYTHON_SCRIPT.read_text()}  )
  py={runtime}/bin/python3
  if ! usable "$py"; then echo "{self.name}: Debian's Python in {runtime} is not >= {version} with venv" >&2; exit 1; fi
fi
"""

    def _files_script(self) -> str:
        """Writes ``files`` into the prefix and makes ``links`` (empty without either)."""
        lines = []
        for path, content in self.files.items():
            target = f"{self.sandbox_dir}/{path}"
            lines += [f"mkdir -p {shlex.quote(str(Path(target).parent))}",
                      f"printf %s {shlex.quote(content)} > {shlex.quote(target)}", f"chmod 755 {shlex.quote(target)}"]
        for link, path in self.links.items():
            lines += [f"mkdir -p {shlex.quote(str(Path(link).parent))}",
                      f"ln -sfn {shlex.quote(f'{self.sandbox_dir}/{path}')} {shlex.quote(link)}"]
        return "".join(line + "\n" for line in lines)

    # --- the bubblewrap sandbox: a venv of the host's Python, built once per host -----------------

    def check_host(self) -> None:
        if self.links:
            raise AgentInstallError(f"{self.name} has no bubblewrap install (it needs {', '.join(self.links)} outside "
                               f"{self.sandbox_dir}): run it with --env docker")
        missing = [package for package in self.apt_packages if not shutil.which(package)]  # each names its program
        if missing:
            raise AgentInstallError(f"{self.name} in the bubblewrap sandbox runs {', '.join(missing)} from the host's /usr: "
                               f"apt-get install {' '.join(missing)}, or run it with --env docker")
        host_python(self.min_python, self.name)

    def host_dir(self) -> Path:
        """The host directory holding the venv and launcher (bound read-only at sandbox_dir), built
        once per recipe and host Python (across processes: a lock file, a build into a temporary
        dir renamed into place)."""
        from slime_harbor.cache import cache_dir

        self.check_host()
        python, key = self._host_key()
        root = cache_dir() / "agent-installs" / f"{self.name}-{self.version}-{key}"
        launcher = root / "bin" / self.binary
        if launcher.exists():
            return root
        root.parent.mkdir(parents=True, exist_ok=True)
        with open(root.parent / f"{root.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if launcher.exists():  # built by another process while we waited
                return root
            staging = root.parent / f".{root.name}.{uuid.uuid4().hex[:8]}"
            started = time.monotonic()
            try:
                self._run_build([python, "-m", "venv", str(staging / "venv")])
                for args in self.pip_installs():
                    self._run_build([str(staging / "venv" / "bin" / "python"), *args])
                (staging / "bin").mkdir()
                (staging / "bin" / self.binary).write_text(self.launcher_script(self.sandbox_dir))
                (staging / "bin" / self.binary).chmod(0o755)
                for path, content in self.files.items():
                    (staging / path).parent.mkdir(parents=True, exist_ok=True)
                    (staging / path).write_text(content)
                    (staging / path).chmod(0o755)
                (staging / "build.json").write_text(json.dumps(
                    {"python": python, "seconds": round(time.monotonic() - started, 1), "version": self.version}))
                shutil.rmtree(root, ignore_errors=True)  # a half-built dir from a killed build
                staging.rename(root)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
            self.builds += 1
        return root

    @functools.cache
    def _host_key(self) -> tuple[str, str]:
        """(host Python, key of the install built with it): the Python's version and the recipe."""
        python = host_python(self.min_python, self.name)
        version = subprocess.run([python, "-c", "import sys; print(sys.version)"], capture_output=True, text=True,
                                 check=True).stdout.strip()  # fmt: skip
        recipe = "\n".join([python, version, *map(shlex.join, self.pip_installs()), self.launcher_script(self.sandbox_dir),
                             *(json.dumps(self.files, sort_keys=True) for _ in [0] if self.files)])  # fmt: skip
        return python, hashlib.sha256(recipe.encode()).hexdigest()[:16]

    def _run_build(self, argv: list[str]) -> None:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            output = (done.stdout + done.stderr).strip()
            raise AgentInstallError(f"installing {self.name} failed ({' '.join(argv[:4])} ...): {output[-2000:]}")


_HOST_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")


def host_python(min_python: tuple[int, int], name: str) -> str:
    """A host Python >= min_python with venv whose files a bubblewrap sandbox sees (it binds the
    host's /usr, /bin and /lib*, not /root or /opt): /usr/bin/python3, else /usr/local/bin/python3."""
    check = f"import sys, venv, ensurepip; sys.exit(sys.version_info < {tuple(min_python)!r})"
    for candidate in _HOST_PYTHONS:
        if os.access(candidate, os.X_OK) and subprocess.run([candidate, "-c", check],
                                                            capture_output=True).returncode == 0:  # fmt: skip
            return candidate
    raise AgentInstallError(
        f"{name} in the bubblewrap sandbox needs a Python >= {'.'.join(map(str, min_python))} with venv at one "
        f"of {_HOST_PYTHONS} (e.g. apt-get install python3 python3-venv)"
    )
