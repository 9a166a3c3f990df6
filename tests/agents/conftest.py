"""Fixtures of the agent tests: the sandbox to run in (the local model server `local_llm` is in local_llm_fixture.py)."""

from __future__ import annotations

import pytest
from docker_engine import AGENT_IMAGE, ENGINE_HOST, image, requires_engine
from runtime_support import PROBE, PROBE_COMMAND, Sandbox


@pytest.fixture(params=["bwrap", pytest.param("docker", marks=requires_engine)])
def sandbox(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Sandbox:
    """bwrap, then docker: a test taking this fixture holds both backends to the same limits.

    docker runs on the tests' engine (tests/docker_engine.py; skipped without one) with the agent image, the engine
    named in the daemon's environment as a deployment's would be.
    """
    if request.param == "bwrap":
        return Sandbox("bwrap", {"FARMHOST_AGENT_RUNTIME": "bwrap"}, PROBE_COMMAND, {})
    engine = {"DOCKER_HOST": ENGINE_HOST} if ENGINE_HOST else {}
    for key, value in engine.items():
        monkeypatch.setenv(key, value)
    values = {"FARMHOST_AGENT_RUNTIME": "docker", "FARMHOST_AGENT_IMAGE": image(AGENT_IMAGE)}
    return Sandbox("docker", values, ("python", "-c", PROBE), engine)
