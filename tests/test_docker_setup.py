"""What scripts/setup-docker.sh promises, checked through the Docker SDK: the base image the
bundled tasks name exists and behaves like the official one (python/pip work with no network,
the host's CA bundle is in it, pip may install system-wide). Skips with the script's own reason
(SLIME_HARBOR_NO_DOCKER, exported by scripts/test.sh) or when no daemon answers."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

BASE_IMAGE = "python:3.11-slim"
LABEL = {"slime-harbor.test": "docker-setup"}
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
SOCKET = "unix:///var/run/docker.sock"
STARTED: list[str] = []  # ids of the containers this module started


def _client():
    reason = os.environ.get("SLIME_HARBOR_NO_DOCKER")
    if reason:
        pytest.skip(reason)
    docker = pytest.importorskip("docker", reason="the Docker SDK is not installed (bash scripts/setup-docker.sh)")
    base_url = os.environ.get("DOCKER_HOST") or SOCKET
    try:
        client = docker.DockerClient(base_url=base_url, timeout=20)
        client.ping()
    except Exception as error:  # no socket, permission denied, daemon down
        pytest.skip(f"no Docker daemon answers at {base_url} ({error.__class__.__name__}); run bash scripts/setup-docker.sh")
    return client


@pytest.fixture(scope="module")
def client():
    client = _client()
    yield client
    client.close()


def run(client, command: str, network_mode: str = "none") -> tuple[int, str]:
    """Run `sh -c command` in the base image; return (exit code, output). Always removed."""
    container = client.containers.create(BASE_IMAGE, ["sh", "-c", command], network_mode=network_mode, labels=LABEL)
    STARTED.append(container.id)
    try:
        container.start()
        status = container.wait(timeout=30)
        return status["StatusCode"], container.logs().decode()
    finally:
        container.remove(force=True)


def test_bundled_tasks_name_the_base_image():
    tasks = sorted(Path(__file__).parent.parent.glob("examples/harbor/tasks*/*/environment/Dockerfile"))
    assert tasks
    assert any(f"FROM {BASE_IMAGE}" in path.read_text() for path in tasks)


def test_base_image_exists(client):
    image = client.images.get(BASE_IMAGE)  # raises ImageNotFound: run bash scripts/setup-docker.sh
    assert image.attrs["Config"]["Cmd"] == ["python3"]
    env = dict(item.split("=", 1) for item in image.attrs["Config"]["Env"])
    assert env["LANG"] == "C.UTF-8" and "/usr/local/bin" in env["PATH"].split(":")


@pytest.fixture(scope="module")
def probe(client):
    """One container, no network: the commands an official python:3.11-slim has."""
    code, out = run(
        client,
        "set -e; python --version; python3 --version; pip --version; pip3 --version;"
        " echo managed=$(ls /usr/lib/python3*/EXTERNALLY-MANAGED 2>/dev/null | wc -l);"
        " echo ca=$(sha256sum /etc/ssl/certs/ca-certificates.crt | cut -d' ' -f1)",
    )
    assert code == 0, out
    return out


def test_python_and_pip_work_without_network(probe):
    lines = probe.splitlines()
    assert lines[0].startswith("Python 3.11") and lines[1].startswith("Python 3.11")
    assert lines[2].startswith("pip ") and lines[3].startswith("pip ")


def test_pip_may_install_system_wide(probe):
    assert "managed=0" in probe  # bookworm's EXTERNALLY-MANAGED marker is gone


@pytest.mark.skipif(not HOST_CA.is_file(), reason=f"the host has no {HOST_CA}")
def test_host_ca_bundle_is_in_the_image(probe):
    assert f"ca={hashlib.sha256(HOST_CA.read_bytes()).hexdigest()}" in probe


def test_test_containers_are_removed(client, probe):
    assert STARTED
    ours = {c.id for c in client.containers.list(all=True, filters={"label": "slime-harbor.test=docker-setup"})}
    assert ours.isdisjoint(STARTED)
