"""The real daemon under a flood of connections to a run's LLM proxy socket, at a lowered descriptor limit.

Issue 13, item 3: connections that send headers and never a body took the daemon to its descriptor limit; pings
went unanswered, the log filled with accept tracebacks and SIGTERM no longer stopped it. With bwrap the flood comes
from the host side of the socket; with Docker from inside the run's own container (`docker exec`), as an agent
that turned against the proxy would send it, across the bind mount of the socket.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import resource
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from docker_engine import ENGINE_ENV, docker
from farmhost_testing import (
    Daemon,
    clean_env,
    drop,
    init_data_dir_in_process,
    ok,
    once_time,
    scaled,
    wait_for,
    wait_result,
)
from llm_stub import Recorded, Reply, ScriptedLLM
from runtime_support import Sandbox

pytestmark = pytest.mark.slow  # a real daemon and a real agent run in bubblewrap or in a container

ZONE = "Europe/Lisbon"
HEADERS_ONLY = b"POST /v1/chat/completions HTTP/1.1\r\nHost: farmhost\r\nContent-Length: 100000\r\n\r\n"


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@contextlib.contextmanager
def _soft_nofile(limit: int) -> Iterator[None]:
    """This process's soft RLIMIT_NOFILE at `limit` for the block (a child started in it inherits that)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(limit, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _flood(path: str, count: int) -> list[socket.socket]:
    """`count` connections that send a request's headers and never its body (waiting out a full listen backlog)."""
    held: list[socket.socket] = []
    while len(held) < count:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.setblocking(False)

        def connected(conn: socket.socket = conn) -> bool:
            err = conn.connect_ex(path)
            if err in (errno.EAGAIN, errno.EINPROGRESS):
                return False
            assert err in (0, errno.EISCONN), os.strerror(err)
            return True

        wait_for(connected, timeout=30, interval=0.001, what=f"connection {len(held) + 1} of the flood")
        with contextlib.suppress(OSError):  # a refused connection may be closed already
            conn.send(HEADERS_ONLY)
        held.append(conn)
    return held


# The same flood from inside a container: connect until `count` are held (a full backlog is waited out), print
# how many, and on a line from stdin print what each got back; hold them until stdin closes.
IN_CONTAINER = r"""
import errno, json, socket, sys, time
path, count, headers = sys.argv[1], int(sys.argv[2]), sys.argv[3].encode()
held, deadline = [], time.monotonic() + 60
while len(held) < count and time.monotonic() < deadline:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.setblocking(False)
    while (err := conn.connect_ex(path)) in (errno.EAGAIN, errno.EINPROGRESS) and time.monotonic() < deadline:
        time.sleep(0.001)
    try:
        conn.send(headers)
    except OSError:
        pass
    held.append(conn)
print(json.dumps({"held": len(held)}), flush=True)
sys.stdin.readline()
answers = []
for conn in held:
    try:
        answers.append(conn.recv(65536).decode(errors="replace"))
    except BlockingIOError:
        answers.append("")
    except OSError:
        answers.append("reset")
print(json.dumps({"answers": [a for a in answers if a]}), flush=True)
sys.stdin.read()
"""


class ContainerFlood:
    """`count` connections from inside the run's container to its /workspace/run/llm.sock (`docker exec`)."""

    def __init__(self, data_dir: Path, count: int) -> None:
        listed = docker(
            "ps", "-q", "--filter", f"label=farmhost.data={data_dir}", "--filter", "label=farmhost.group=field"
        )
        (container,) = listed.stdout.split()
        argv = ["docker", "exec", "-i", container, "python", "-c", IN_CONTAINER, "/workspace/run/llm.sock"]
        self.proc = subprocess.Popen(
            [*argv, str(count), HEADERS_ONLY.decode()], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env=ENGINE_ENV,
        )  # fmt: skip
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.held = json.loads(self.proc.stdout.readline() or "{}").get("held", 0)
        assert self.held == count, f"the flood from the container held {self.held} of {count} connections"

    def answers(self) -> list[bytes]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("answers\n")
        self.proc.stdin.flush()
        return [a.encode() for a in json.loads(self.proc.stdout.readline())["answers"]]

    def close(self) -> None:
        """Let go of the connections (stdin closed) and wait for the exec to end."""
        try:
            self.proc.communicate(timeout=scaled(15))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()


def _answered(conn: socket.socket) -> bytes:
    try:
        return conn.recv(65536)
    except BlockingIOError:
        return b""
    except OSError:
        return b"reset"


@pytest.mark.parametrize(
    "caps",
    [{}, {"FARMHOST_LLM_RUN_CONNECTIONS": "1024", "FARMHOST_LLM_MAX_CONNECTIONS": "4096"}],
    ids=["default-caps", "caps-above-the-limit"],
)
def test_a_daemon_flooded_at_its_descriptor_limit_answers_pings_and_stops(
    tmp_path: Path, caps: dict[str, str], sandbox: Sandbox
) -> None:
    data_dir = init_data_dir_in_process(tmp_path / "data")
    release = threading.Event()

    def hold(_: Recorded) -> Reply:
        release.wait(scaled(60))  # the agent's first LLM request stays open: its run (and socket) goes on
        return Reply("done")

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))  # this side holds the flood
    with ScriptedLLM([hold], then=Reply("done")) as llm:
        env = clean_env(
            TZ=ZONE,
            **sandbox.values,
            **sandbox.env,
            FARMHOST_LLM_BASE_URL=llm.base_url,
            FARMHOST_LLM_MODEL="farm-model",
            FARMHOST_LLM_API_KEY="sk-flood-secret",
            **caps,
        )
        daemon = Daemon(data_dir, env=env)
        with _soft_nofile(256):
            daemon.start()
        assert daemon.proc is not None
        pid = daemon.proc.pid
        try:
            # farmhost raises its soft limit to the hard one at start
            assert resource.prlimit(pid, resource.RLIMIT_NOFILE)[0] == hard
            due = once_time(data_dir, "field", ZoneInfo(ZONE))
            task = {"type": "schedule_task", "prompt": "check the pumps", "schedule_type": "once"}
            rid = drop(data_dir, "field", "tasks", {**task, "schedule_value": due.strftime("%Y-%m-%dT%H:%M:%S")})
            ok(wait_result(data_dir, "field", rid))
            llm.wait_requests(1, timeout=30)
            # A small limit makes the flood cheap: what the daemon has open now and a little room.
            limit = _open_fds(pid) + 100
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (limit, limit))
            if sandbox.name == "docker":
                flood = ContainerFlood(data_dir, 4 * limit)
            else:
                held = _flood(str(data_dir / "run" / "field" / "llm.sock"), 4 * limit)
            for folder in ("main", "field"):
                ping = drop(data_dir, folder, "actions", {"type": "ping"})
                assert ok(wait_result(data_dir, folder, ping, timeout=15))["pong"] is True
            assert _open_fds(pid) < limit
            if sandbox.name == "docker":
                refusals = flood.answers()
            else:
                refusals = [answer for conn in held if (answer := _answered(conn))]
            assert any(b"503" in answer and b"too many connections" in answer for answer in refusals), refusals[:3]
            log = daemon.log()
            assert log.count("Traceback") <= 1, log[-3000:]
            assert len(log) < 200_000
            code = daemon.stop(timeout=10)  # with the flood still connected and the upstream request still open
            if sandbox.name == "docker":
                flood.close()
                wait_for(
                    lambda: docker("ps", "-aq", "--filter", f"label=farmhost.data={data_dir}").stdout == "",
                    timeout=15, interval=0.2, what="the run's container to be removed",
                )  # fmt: skip
            else:
                for conn in held:
                    conn.close()
        finally:
            release.set()
            if daemon.proc is not None:
                daemon.kill()
        assert code == 0, daemon.log()[-3000:]
        wait_for(lambda: not (data_dir / "run" / "field" / "llm.sock").exists(), what="the socket to go")
