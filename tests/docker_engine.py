"""The Docker engine of the live Docker tests, and the images scripts/docker-images builds on it.

`make test` starts a private engine (scripts/docker-engine) and passes it as FARMHOST_TEST_DOCKER_HOST; a shell's
own DOCKER_HOST is the fallback. Only the tests that import this module use it: `clean_env` drops DOCKER_HOST,
which would make every test daemon default to the docker runtime. Without an engine, `requires_engine` skips the
test and says why; with an engine but without an image, `image()` fails the test, naming the script that builds it.
"""

from __future__ import annotations

import os
import subprocess

import pytest

AGENT_IMAGE = os.environ.get("FARMHOST_TEST_AGENT_IMAGE", "farmhost-agent:test")
FARMHOST_IMAGE = os.environ.get("FARMHOST_TEST_FARMHOST_IMAGE", "farmhost:test")
ADDON_IMAGE = os.environ.get("FARMHOST_TEST_ADDON_IMAGE", "farmhost-addon:test")
BASE_IMAGE = os.environ.get("FARMHOST_TEST_BASE_IMAGE", "farmhost-base:bookworm")
ENGINE_HOST = os.environ.get("FARMHOST_TEST_DOCKER_HOST") or os.environ.get("DOCKER_HOST") or ""
ENGINE_ENV = {**os.environ, "DOCKER_HOST": ENGINE_HOST} if ENGINE_HOST else dict(os.environ)


def _engine() -> str | None:
    """Why no engine answers, or None when one does."""
    try:
        done = docker("info", timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"the docker CLI cannot run: {exc}"
    if done.returncode != 0:
        return f"no Docker engine answers at DOCKER_HOST={ENGINE_HOST or '(unset)'}"
    return None


def docker(*args: str, timeout: float = 60, input: str | None = None) -> subprocess.CompletedProcess[str]:
    """`docker <args>` on the tests' engine (not checked: the caller reads returncode and stderr)."""
    return subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout, check=False, env=ENGINE_ENV, input=input
    )


NO_ENGINE = _engine()
requires_engine = pytest.mark.skipif(
    NO_ENGINE is not None, reason=f"{NO_ENGINE}; `make test` starts one (scripts/docker-engine start)"
)


def image(name: str) -> str:
    """`name`, after checking the engine has it (fails the test otherwise)."""
    if docker("image", "inspect", name).returncode != 0:
        pytest.fail(f"the image {name} is missing: build it with scripts/docker-images")
    return name


def engine_socket() -> str:
    """The path of the engine's unix socket, as the host sees it (for a bind mount into a container)."""
    host = ENGINE_HOST or "unix:///var/run/docker.sock"
    assert host.startswith("unix://"), f"the tests' engine is not on a unix socket: {host}"
    return host.removeprefix("unix://")
