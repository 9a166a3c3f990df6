"""The farmhost image for real: started as docker-compose.yml starts it, on the tests' engine.

scripts/docker-images builds `farmhost:test` from the root Dockerfile (on the debootstrap-made Debian base and a
CLI image of this machine's docker client, without Chromium) and the agent image `farmhost-agent:test`. Here the
farmhost container gets what compose gives it: host networking, the data dir bind-mounted at the same path inside
and outside, the engine's socket at /var/run/docker.sock with its group added, uid:gid 1000:1000 (the data dir's
owner), FARMHOST_AGENT_RUNTIME=docker. The image's HEALTHCHECK command is kept; only its interval is shortened
(the first check would otherwise come 30 s after the start). The LLM is the scripted server on the host's
loopback, which the farmhost container reaches through the host network and its agent containers (--network none)
through the proxy socket in the data dir.

Without an engine the tests skip, saying so; with one but without the images they fail, naming the script.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from docker_engine import (
    AGENT_IMAGE,
    BASE_IMAGE,
    ENGINE_HOST,
    FARMHOST_IMAGE,
    docker,
    engine_socket,
    image,
    requires_engine,
)
from farmhost_testing import MAIN_JID, clean_env, drop, init_data_dir_in_process, ok, scaled, wait_for, wait_result
from ha_fixture import HaInstance
from llm_stub import Recorded, Reply, ScriptedLLM, ToolCall

pytestmark = [requires_engine, pytest.mark.slow]

UID = GID = 1000  # docker-compose.yml's defaults (FARMHOST_UID, FARMHOST_GID): the data dir's owner


@pytest.fixture(scope="module")
def images() -> tuple[str, str]:
    return image(FARMHOST_IMAGE), image(AGENT_IMAGE)


def owned_data_dir(tmp_path: Path) -> Path:
    """A data dir with groups main and field, owned by the uid farmhost runs as (compose: `install -d -o 1000`)."""
    root = init_data_dir_in_process(tmp_path / "data")
    for path in (root, *root.rglob("*")):
        os.lchown(path, UID, GID)
    # The parents stay root's, 0700 under pytest's tmp dir: the container sees only the mount, the engine is root.
    return root


def health(name: str) -> str:
    done = docker("inspect", "-f", "{{if .State.Health}}{{.State.Health.Status}}{{end}} {{.State.Status}}", name)
    return done.stdout.strip() if done.returncode == 0 else f"inspect failed: {done.stderr.strip()}"


def last_health_checks(name: str) -> str:
    """The container's last health-check outputs and its log's tail, for a failure message."""
    checks = docker("inspect", "-f", "{{json .State.Health}}", name).stdout
    logs = docker("logs", "--tail", "40", name)
    return f"health: {checks[-1500:]}\nlog:\n{(logs.stdout + logs.stderr)[-3000:]}"


def wait_healthy(name: str) -> None:
    wait_for(
        lambda: health(name).startswith("healthy "),
        timeout=60,
        interval=0.5,
        what=f"container {name} to be healthy (docker inspect .State.Health.Status)",
        seen=lambda: last_health_checks(name),
    )


def in_container(name: str, *args: str) -> Any:
    """`farmhost <args> --json` run inside the container (as its user), parsed."""
    done = docker("exec", name, "farmhost", *args, "--json", timeout=scaled(60))
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def schedule_once(root: Path, folder: str, prompt: str, seconds: float) -> None:
    due = (datetime.now(UTC) + timedelta(seconds=scaled(seconds))).strftime("%Y-%m-%dT%H:%M:%S")
    task = {"type": "schedule_task", "prompt": prompt, "schedule_type": "once", "schedule_value": due}
    ok(wait_result(root, folder, drop(root, folder, "tasks", task), timeout=20))


def agent_containers(root: Path, *, ended: bool = False) -> list[dict[str, str]]:
    """This data dir's agent containers running now (`ended`: or not removed yet): labels, image, user, network."""
    listed = docker("ps", *(["-a"] if ended else []), "-q", "--filter", f"label=farmhost.data={root}")
    assert listed.returncode == 0, listed.stderr
    found = []
    for cid in listed.stdout.split():
        form = "{{json .Config.Labels}}\t{{.Config.Image}}\t{{.Config.User}}\t{{.HostConfig.NetworkMode}}"
        done = docker("inspect", "-f", form, cid)
        if done.returncode != 0:  # gone between the two commands
            continue
        labels, image_name, user, network = done.stdout.strip().split("\t")
        found.append({**json.loads(labels), "image": image_name, "user": user, "network": network})
    return found


def finished_runs(name: str) -> list[str]:
    statuses = [t["lastRunStatus"] for t in in_container(name, "task", "list", "--all")]
    return statuses if statuses and all(s not in (None, "running") for s in statuses) else []


@pytest.fixture
def container_name() -> Iterator[str]:
    name = f"farmhost-test-{secrets.token_hex(4)}"
    yield name
    docker("rm", "-f", name)


def test_the_farmhost_image_runs_healthy_answers_and_starts_agents_through_the_hosts_socket(
    tmp_path: Path, images: tuple[str, str], container_name: str
) -> None:
    farmhost_image, agent_image = images
    root = owned_data_dir(tmp_path)
    socket_path = engine_socket()
    held = threading.Event()
    release = threading.Event()

    def hold(_: Recorded) -> ToolCall:
        held.set()
        release.wait(scaled(60))  # the run (and its container) goes on until the test has looked at it
        return ToolCall("send_message", {"chatJid": MAIN_JID, "text": "Soil is fine."})

    with ScriptedLLM([hold, Reply("Told them.")]) as llm:
        started = docker(
            "run", "-d", "--name", container_name,
            "--network", "host",
            "--user", f"{UID}:{GID}", "--group-add", str(os.stat(socket_path).st_gid),
            "-v", f"{root}:{root}", "-v", f"{socket_path}:/var/run/docker.sock",
            "-e", f"FARMHOST_DATA_DIR={root}", "-e", "FARMHOST_AGENT_RUNTIME=docker",
            "-e", f"FARMHOST_AGENT_IMAGE={agent_image}", "-e", "TZ=UTC",
            "-e", f"FARMHOST_LLM_BASE_URL={llm.base_url}", "-e", "FARMHOST_LLM_MODEL=farm-model",
            "-e", "FARMHOST_LLM_API_KEY=sk-container-test",
            "--health-interval", "1s",
            farmhost_image,
        )  # fmt: skip
        assert started.returncode == 0, started.stderr
        try:
            wait_healthy(container_name)
            assert health(container_name) == "healthy running"
            pinged = drop(root, "main", "actions", {"type": "ping"})
            assert ok(wait_result(root, "main", pinged, timeout=20))["pong"] is True

            schedule_once(root, "main", "Check the soil and tell the office.", 2)
            wait_for(held.is_set, timeout=60, interval=0.2, what="the agent run's first LLM request",
                     seen=lambda: last_health_checks(container_name))  # fmt: skip
            # The agent container, started by farmhost inside its container through the host's engine.
            (agent,) = wait_for(lambda: agent_containers(root), timeout=10, interval=0.2, what="the agent container")
            assert agent["farmhost.group"] == "main" and agent["image"] == agent_image, agent
            assert agent["user"] == f"{UID}:{GID}" and agent["network"] == "none", agent
            release.set()
            entries = wait_for(
                lambda: in_container(container_name, "outbox", "list"), timeout=30, interval=0.5,
                what="the agent's message in the outbox",
            )  # fmt: skip
            assert [(e["chatJid"], e["body"]) for e in entries] == [(MAIN_JID, "Soil is fine.")], entries
            runs = wait_for(
                lambda: finished_runs(container_name), timeout=30, interval=0.5, what="the task's run to end"
            )
            assert runs == ["ok"], runs
        finally:
            release.set()
        (request, _) = llm.requests
        assert request.headers["authorization"] == "Bearer sk-container-test" and request.model == "farm-model"
        assert "Check the soil and tell the office." in request.text()
    # The run's log names the engine's command and the agent image, in the bind-mounted data dir on the host.
    (run_log,) = sorted((root / "logs" / "runs" / "main").glob("run-*.log"))
    text = run_log.read_text()
    assert "docker run" in text or "run --rm" in text, text[:2000]
    assert agent_image in text and "--network none" in text, text[:2000]
    wait_for(lambda: not agent_containers(root, ended=True), timeout=15, what="the agent container to be removed")
    # SIGTERM through tini: farmhost stops cleanly within compose's stop_grace_period.
    stopped = docker("stop", "-t", "15", container_name, timeout=scaled(60))
    assert stopped.returncode == 0, stopped.stderr
    state = docker("inspect", "-f", "{{.State.ExitCode}}", container_name).stdout.strip()
    assert state == "0", last_health_checks(container_name)
    logs = docker("logs", container_name)
    assert "Traceback" not in logs.stdout + logs.stderr, (logs.stdout + logs.stderr)[-3000:]


# --- docker-compose up ----------------------------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]
COUNTER = "input_number.irrigation_duration_raw"  # a helper of the test instance's simulated farm


def compose_project(tmp_path: Path, root: Path, ha_url: str, ha_token: str) -> tuple[Path, Path]:
    """The project dir (its .env, as an operator writes it) and the override file that stands the test's parts in.

    The project dir is a copy of the checkout made of symlinks (as in test_compose_config.py), so the build contexts
    are the checkout's and the test's `.env` never touches a developer's own. The images are the ones scripts/docker-images built (present, so `up` builds nothing); the homeassistant service
    is a container of the Debian base that only reports health, with the real service's check pointed at the
    test's Home Assistant, which farmhost then uses through HA_URL.
    """
    project = tmp_path / "project"
    project.mkdir()
    for entry in REPO.iterdir():
        if entry.name != ".env":
            (project / entry.name).symlink_to(entry)
    socket_path = engine_socket()
    settings = {
        "TZ": "UTC",
        "HA_URL": ha_url,
        "HA_TOKEN": ha_token,
        "FARMHOST_DATA_DIR_HOST": str(root),
        "FARMHOST_UID": str(UID),
        "FARMHOST_GID": str(GID),
        "DOCKER_GID": str(os.stat(socket_path).st_gid),
        "DOCKER_SOCKET": socket_path,
        "FARMHOST_AGENT_IMAGE": AGENT_IMAGE,
        "HA_CONFIG_DIR": str(tmp_path / "ha-config"),
    }
    (project / ".env").write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    manifest = f"import urllib.request; urllib.request.urlopen('{ha_url}/manifest.json', timeout=5)"
    override = {
        "services": {
            "homeassistant": {
                "image": BASE_IMAGE,
                "entrypoint": ["sleep", "infinity"],
                "healthcheck": {"test": ["CMD", "python3", "-c", manifest], "interval": "1s", "start_period": "0s"},
            },
            "farmhost": {"image": FARMHOST_IMAGE, "healthcheck": {"interval": "1s"}},
        }
    }
    file = project / "docker-compose.test.yml"
    file.write_text(json.dumps(override, indent=2))  # JSON is YAML
    return project, file


def compose(project: Path, override: Path, name: str, *args: str, timeout: float = 120) -> tuple[int, str]:
    """`docker-compose -p <name> -f docker-compose.yml -f <override> <args>` in the project dir: (exit code, output)."""
    command = ["docker-compose", "-p", name, "-f", str(project / "docker-compose.yml"), "-f", str(override), *args]
    # The shell's own farmhost/HA settings and DOCKER_HOST never reach compose; the .env and the engine do.
    env = clean_env(**({"DOCKER_HOST": ENGINE_HOST} if ENGINE_HOST else {}))
    done = subprocess.run(
        command, capture_output=True, text=True, cwd=project, env=env, timeout=scaled(timeout), check=False
    )
    return done.returncode, done.stdout + done.stderr


def test_docker_compose_up_starts_farmhost_with_the_agent_image_and_the_test_home_assistant(
    tmp_path: Path, images: tuple[str, str], ha_reset: HaInstance
) -> None:
    root = owned_data_dir(tmp_path)
    project, override = compose_project(tmp_path, root, ha_reset.url, ha_reset.farmhost_token)
    name = f"farmhosttest{secrets.token_hex(4)}"
    try:
        code, output = compose(project, override, name, "up", "-d", "farmhost")
        assert code == 0, output
        farmhost_container = f"{name}_farmhost_1"
        wait_healthy(farmhost_container)
        # `up` started farmhost after what it depends on: the stand-in for HA healthy, the agent image's check exited 0.
        assert health(f"{name}_homeassistant_1") == "healthy running"
        agent_check = docker("inspect", "-f", "{{.State.Status}} {{.State.ExitCode}}", f"{name}_farmhost-agent_1")
        assert agent_check.stdout.strip() == "exited 0", agent_check
        pinged = drop(root, "main", "actions", {"type": "ping"})
        assert ok(wait_result(root, "main", pinged, timeout=20))["pong"] is True
        asked = {"type": "farm_action", "action": "ha_get_status", "params": {"entityIds": [COUNTER]}}
        status = ok(wait_result(root, "main", drop(root, "main", "actions", asked), timeout=30))
        (state,) = status["states"]
        assert (
            state["entity_id"] == COUNTER and state["state"] == ha_reset.api("GET", f"/api/states/{COUNTER}")["state"]
        ), status
        # farmhost runs as compose says: the data dir's owner, with the socket's group, the data dir at its host path.
        form = "{{.Config.User}} {{.HostConfig.NetworkMode}} {{json .HostConfig.GroupAdd}}"
        seen = docker("inspect", "-f", form, farmhost_container).stdout.strip()
        assert seen == f'{UID}:{GID} host ["{os.stat(engine_socket()).st_gid}"]', seen
        mounts = json.loads(docker("inspect", "-f", "{{json .Mounts}}", farmhost_container).stdout)
        assert {(m["Source"], m["Destination"]) for m in mounts} == {
            (str(root), str(root)), (engine_socket(), "/var/run/docker.sock"),
        }  # fmt: skip
    finally:
        _, logs = compose(project, override, name, "logs", "--no-color", "farmhost")
        code, output = compose(project, override, name, "down", "-t", "15")
    assert code == 0, output
    assert "Traceback" not in logs, logs[-3000:]
    assert docker("ps", "-aq", "--filter", f"label=com.docker.compose.project={name}").stdout.strip() == ""
