"""Which agent runtime farmhost picks when FARMHOST_AGENT_RUNTIME is not set: from what the host has, not this machine.

`default_runtime` decides from the docker CLI found on PATH, DOCKER_HOST and the engine's socket; the cases give
it each combination on real files under tmp_path (a real Unix socket, a plain file of the same name, nothing), so
the answer does not depend on whether the machine running the tests has Docker.
"""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from farmhost.config import DOCKER_SOCKET, Settings, build_config, default_runtime


@pytest.fixture
def engine_socket(tmp_path: Path) -> Iterator[Path]:
    """A real listening Unix socket, as a Docker engine's."""
    path = tmp_path / "docker.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen()
    try:
        yield path
    finally:
        server.close()


def test_a_docker_cli_without_an_engine_falls_back_to_bwrap(tmp_path: Path) -> None:
    cli = "/usr/bin/docker"
    assert default_runtime(docker_cli=cli, docker_host=None, socket=tmp_path / "docker.sock") == "bwrap"
    not_a_socket = tmp_path / "plain.sock"
    not_a_socket.write_text("")
    assert default_runtime(docker_cli=cli, docker_host=None, socket=not_a_socket) == "bwrap"
    assert default_runtime(docker_cli=cli, docker_host="", socket=tmp_path / "docker.sock") == "bwrap"


def test_an_engine_makes_docker_the_default_only_with_its_cli(engine_socket: Path, tmp_path: Path) -> None:
    cli = "/usr/bin/docker"
    assert default_runtime(docker_cli=cli, docker_host=None, socket=engine_socket) == "docker"
    remote = "unix:///run/user/1000/docker.sock"
    assert default_runtime(docker_cli=cli, docker_host=remote, socket=tmp_path / "absent.sock") == "docker"
    # No CLI, no docker: farmhost runs agents through the docker program.
    assert default_runtime(docker_cli=None, docker_host=remote, socket=engine_socket) == "bwrap"


def test_the_settings_decide_with_what_this_host_has(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Unset, the sandbox's runtime is default_runtime of this host's PATH, DOCKER_HOST and socket, whatever they are."""
    monkeypatch.delenv("FARMHOST_AGENT_RUNTIME", raising=False)
    found = default_runtime(
        docker_cli=shutil.which("docker"), docker_host=os.environ.get("DOCKER_HOST"), socket=DOCKER_SOCKET
    )
    before = build_config(Settings(_env_file=None))  # type: ignore[call-arg]
    assert before.agents.sandbox.runtime == found
    # A docker CLI on PATH and DOCKER_HOST set: docker, on any machine.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text("#!/bin/sh\nexit 1\n")
    (bin_dir / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("DOCKER_HOST", "unix:///run/user/1000/docker.sock")
    assert build_config(Settings(_env_file=None)).agents.sandbox.runtime == "docker"  # type: ignore[call-arg]
    # Looked up once, when the settings were built: a section built before keeps its answer.
    assert before.agents.sandbox.runtime == found


def test_an_explicit_runtime_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FARMHOST_AGENT_RUNTIME", "process")
    monkeypatch.setenv("DOCKER_HOST", "unix:///run/user/1000/docker.sock")
    assert build_config(Settings(_env_file=None)).agents.sandbox.runtime == "process"  # type: ignore[call-arg]
