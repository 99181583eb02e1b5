"""Docker in tests: whether a daemon answers (tests skip when none does, or when
SLIME_HARBOR_NO_DOCKER is set), a client, and the containers a test left."""

from __future__ import annotations

import functools
import os

import pytest


@functools.cache
def docker_skip_reason() -> str | None:
    """Why Docker tests cannot run here, or None when a daemon answers (asked once per session)."""
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


def docker_client():
    """The process's Docker client (slime_harbor's); the test skips where no daemon answers."""
    if why := docker_skip_reason():
        pytest.skip(why)
    from slime_harbor.environments.docker_images import docker_client

    return docker_client()


def containers_labelled(label: str) -> list[dict]:
    from slime_harbor.environments.docker_images import docker_client

    return docker_client().api.containers(all=True, filters={"label": label})
