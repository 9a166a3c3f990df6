"""docker-compose.yml validated by Debian's `docker-compose config` (1.29) with sample .env files.

`config` resolves the file the way `up` would (variables, defaults, build contexts, health checks) without an
engine. The project directory is a copy of the checkout made of symlinks, so the sample `.env` never touches a
developer's own `.env`, and the build contexts resolve to the real `.` and `container/`.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

REPO = Path(__file__).resolve().parents[2]


def _project(tmp_path: Path, env: str) -> Path:
    project = tmp_path / "farmhost"
    project.mkdir()
    for entry in REPO.iterdir():
        if entry.name != ".env":
            (project / entry.name).symlink_to(entry)
    (project / ".env").write_text(env, encoding="utf-8")
    return project


def _config(tmp_path: Path, env: str) -> dict[str, Any]:
    binary = shutil.which("docker-compose")
    assert binary, "docker-compose is missing: apt-get install docker-compose (.ci/run installs it)"
    project = _project(tmp_path, env)
    done = subprocess.run([binary, "config"], cwd=project, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    config: dict[str, Any] = YAML(typ="safe").load(done.stdout)
    return config


def _volumes(service: dict[str, Any]) -> list[tuple[str, str, str]]:
    parts = [v.split(":") for v in service["volumes"]]
    return [(p[0], p[1], p[2] if len(p) > 2 else "rw") for p in parts]


def test_the_defaults_give_ha_farmhost_and_the_agent_image(tmp_path: Path) -> None:
    config = _config(tmp_path, "TZ=Europe/Lisbon\nHA_URL=http://127.0.0.1:8123\nHA_TOKEN=secret-token\n")
    services = config["services"]
    assert sorted(services) == ["farmhost", "farmhost-agent", "homeassistant", "mosquitto"]
    assert services["mosquitto"]["profiles"] == ["mqtt"]  # only with `--profile mqtt`: HA often has a broker

    ha = services["homeassistant"]
    assert ha["image"] == "ghcr.io/home-assistant/home-assistant:stable"
    assert ("/srv/farmhost/homeassistant", "/config", "rw") in _volumes(ha)
    assert ha["restart"] == "unless-stopped" and ha["network_mode"] == "host"
    assert "manifest.json" in " ".join(ha["healthcheck"]["test"])

    farm = services["farmhost"]
    # The project directory is made of symlinks to the checkout: the contexts are the checkout's `.` and container/.
    assert (Path(farm["build"]["context"]) / "Dockerfile").resolve() == REPO / "Dockerfile"
    assert farm["restart"] == "unless-stopped" and farm["stop_grace_period"] == "15s"
    assert farm["healthcheck"]["test"] == ["CMD", "farmhost", "health"]
    assert farm["depends_on"] == {
        "homeassistant": {"condition": "service_healthy"},
        "farmhost-agent": {"condition": "service_completed_successfully"},
    }
    # env_file .env reaches the daemon; the data dir is the host path, mounted at the same path inside.
    environment = farm["environment"]
    assert environment["HA_TOKEN"] == "secret-token" and environment["TZ"] == "Europe/Lisbon"
    assert environment["FARMHOST_DATA_DIR"] == "/srv/farmhost/data"
    assert environment["FARMHOST_AGENT_RUNTIME"] == "docker"
    assert ("/srv/farmhost/data", "/srv/farmhost/data", "rw") in _volumes(farm)
    assert ("/var/run/docker.sock", "/var/run/docker.sock", "rw") in _volumes(farm)
    assert farm["user"] == "1000:1000" and farm["group_add"] == ["999"]
    for service in services.values():
        assert service["logging"] == {"driver": "json-file", "options": {"max-size": "10m", "max-file": "3"}}

    agent = services["farmhost-agent"]
    assert (Path(agent["build"]["context"]) / "Dockerfile").resolve() == REPO / "container" / "Dockerfile"
    assert agent["image"] == environment["FARMHOST_AGENT_IMAGE"] == "farmhost-agent:latest"
    assert agent["restart"] == "no" and agent["network_mode"] == "none"


def test_the_compose_variables_of_the_env_file_move_every_path_together(tmp_path: Path) -> None:
    # FARMHOST_DATA_DIR is the non-Docker setting: compose's own FARMHOST_DATA_DIR (from the _HOST path) wins.
    env = (
        "FARMHOST_DATA_DIR=./data\n"
        "FARMHOST_DATA_DIR_HOST=/mnt/ssd/farm data\n"
        "FARMHOST_UID=1001\nFARMHOST_GID=1002\nDOCKER_GID=996\n"
        "DOCKER_SOCKET=/run/user/1001/docker.sock\n"
        "HA_CONFIG_DIR=/mnt/ssd/ha\nHA_VERSION=2025.4.4\n"
        "FARMHOST_AGENT_IMAGE=registry.local/farm-agent:1.2\n"
    )
    services = _config(tmp_path, env)["services"]
    farm = services["farmhost"]
    assert farm["environment"]["FARMHOST_DATA_DIR"] == "/mnt/ssd/farm data"
    assert ("/mnt/ssd/farm data", "/mnt/ssd/farm data", "rw") in _volumes(farm)
    assert ("/run/user/1001/docker.sock", "/var/run/docker.sock", "rw") in _volumes(farm)
    assert farm["user"] == "1001:1002" and farm["group_add"] == ["996"]
    assert services["homeassistant"]["image"] == "ghcr.io/home-assistant/home-assistant:2025.4.4"
    assert ("/mnt/ssd/ha", "/config", "rw") in _volumes(services["homeassistant"])
    # farmhost starts agents from the very image compose builds.
    assert services["farmhost-agent"]["image"] == farm["environment"]["FARMHOST_AGENT_IMAGE"]
    assert farm["environment"]["FARMHOST_AGENT_IMAGE"] == "registry.local/farm-agent:1.2"


def test_the_example_env_file_is_a_valid_compose_env_file(tmp_path: Path) -> None:
    config = _config(tmp_path, (REPO / ".env.example").read_text(encoding="utf-8"))
    farm = config["services"]["farmhost"]
    # Everything in the example is commented out: no setting leaks in, the defaults apply.
    assert set(farm["environment"]) == {"FARMHOST_DATA_DIR", "FARMHOST_AGENT_RUNTIME", "FARMHOST_AGENT_IMAGE"}
