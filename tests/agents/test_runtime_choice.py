"""Which agent runtime farmhost picks when FARMHOST_AGENT_RUNTIME is not set."""

from __future__ import annotations

from pathlib import Path

import pytest

from farmhost.config import Settings


@pytest.fixture
def docker_cli_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A `docker` program on PATH, as on machines with the CLI but no engine."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text("#!/bin/sh\nexit 1\n")
    docker.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.delenv("FARMHOST_AGENT_RUNTIME", raising=False)


@pytest.mark.usefixtures("docker_cli_on_path")
def test_a_docker_cli_without_an_engine_falls_back_to_bwrap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    assert not Path("/var/run/docker.sock").exists()  # this machine has no engine
    assert Settings(_env_file=None).runtime == "bwrap"  # type: ignore[call-arg]


@pytest.mark.usefixtures("docker_cli_on_path")
def test_a_configured_engine_makes_docker_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///run/user/1000/docker.sock")
    assert Settings(_env_file=None).runtime == "docker"  # type: ignore[call-arg]


def test_an_explicit_runtime_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FARMHOST_AGENT_RUNTIME", "process")
    monkeypatch.setenv("DOCKER_HOST", "unix:///run/user/1000/docker.sock")
    assert Settings(_env_file=None).runtime == "process"  # type: ignore[call-arg]
