"""Docker in tests: whether a daemon answers (tests skip when none does, or when
SLIME_HARBOR_NO_DOCKER is set), a client, and the containers a test left."""

from __future__ import annotations

import os

import pytest


def docker_skip_reason() -> str | None:
    if os.environ.get("SLIME_HARBOR_NO_DOCKER"):
        return "SLIME_HARBOR_NO_DOCKER is set"
    try:
        from slime_harbor.environments.docker_images import check_docker, DockerUnavailableError
    except ImportError as exc:
        return f"cannot import the Docker environment: {exc}"
    try:
        check_docker(timeout=5)
    except DockerUnavailableError as exc:
        return str(exc)
    return None


needs_docker = pytest.mark.skipif((reason := docker_skip_reason()) is not None, reason=f"no Docker: {reason}")


def docker_available() -> str | None:
    if os.environ.get("SLIME_HARBOR_NO_DOCKER"):
        return "SLIME_HARBOR_NO_DOCKER is set"
    try:
        from slime_harbor.environments.docker_images import check_docker

        check_docker()
    except Exception as e:
        return f"no Docker daemon answers ({e})"
    return None


def docker_client():
    if os.environ.get("SLIME_HARBOR_NO_DOCKER"):
        pytest.skip("SLIME_HARBOR_NO_DOCKER is set")
    try:
        import docker

        client = docker.from_env(timeout=30)
        client.ping()
    except Exception as e:  # no SDK, no socket, no daemon
        pytest.skip(f"no Docker daemon answers ({type(e).__name__}: {e})")
    return client


def containers_labelled(label: str) -> list[dict]:
    from slime_harbor.environments.docker import docker_client

    return docker_client().api.containers(all=True, filters={"label": label})
