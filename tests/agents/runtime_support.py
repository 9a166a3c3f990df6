"""Helpers of the agent runtime tests: a probe agent, a runtime factory and a registry for more groups."""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import tempfile
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from farmhost_testing import (
    drop,
    group_lookup,
    init_data_dir_in_process,
    ok,
    once_time,
    register_in_process,
    wait_result,
)

from farmhost.agents.jobs import AgentJob, AgentOutcome
from farmhost.agents.runtime import AgentRuntime
from farmhost.agents.sandbox.backends import SandboxBackend
from farmhost.config import AGENT_UID_BASE, Settings, build_config
from farmhost.layout import DataLayout

# Secrets the host holds; no sandbox may ever see one (argv, environment, files).
SECRETS = {
    "HA_TOKEN": "ha-secret-0123456789",
    "TELEGRAM_BOT_TOKEN": "123456:telegram-secret-abcdef",
    "FARMHOST_LLM_API_KEY": "sk-llm-secret-9876543210",
}

# The probe agent: reads the AgentInput, does what its prompt (a JSON object) asks, and prints an AgentResult
# whose `answer` is a JSON report. Every step catches its own failure and reports it by errno name.
PROBE = r"""
import errno, json, os, resource, signal, socket, sys, time

started = time.time()
agent_input = json.load(sys.stdin)
todo = json.loads(agent_input["prompt"] or "{}")
report = {"started": started, "input": agent_input, "env": dict(os.environ), "cwd": os.getcwd(), "uid": os.getuid()}

def why(err):
    return "error:" + (errno.errorcode.get(err.errno, type(err).__name__) if isinstance(err, OSError) else type(err).__name__)

if todo.get("ignore_term"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if todo.get("note_term"):
    def on_term(*_):
        print("probe got SIGTERM", file=sys.stderr, flush=True)
        sys.exit(7)
    signal.signal(signal.SIGTERM, on_term)

reads = {}
for path in todo.get("read", []):
    try:
        with open(path, "rb") as f:
            reads[path] = "ok:" + f.read(200).decode(errors="replace")
    except Exception as err:
        reads[path] = why(err)
report["read"] = reads

listings = {}
for path in todo.get("list", []):
    try:
        listings[path] = sorted(os.listdir(path))
    except Exception as err:
        listings[path] = why(err)
report["list"] = listings

writes = {}
for path in todo.get("write", []):
    try:
        with open(path, "w") as f:
            f.write("written by the probe")
        writes[path] = "ok"
    except Exception as err:
        writes[path] = why(err)
report["write"] = writes

if "tcp" in todo:
    try:
        socket.create_connection(tuple(todo["tcp"]), timeout=2).close()
        report["tcp"] = "connected"
    except Exception as err:
        report["tcp"] = why(err)

if "unix_get" in todo:
    path, target = todo["unix_get"]
    try:
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(5)
        s.connect(path)
        s.sendall(f"GET {target} HTTP/1.1\r\nHost: farmhost\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        report["unix_get"] = data.decode(errors="replace")
    except Exception as err:
        report["unix_get"] = why(err)

if todo.get("proc_scan"):
    seen = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            for name in ("environ", "cmdline"):
                try:
                    with open(f"/proc/{pid}/{name}", "rb") as f:
                        seen.append(f.read().decode(errors="replace"))
                except OSError:
                    pass
    report["proc_text"] = "\n".join(seen)
    with open("/proc/self/status") as f:
        report["caps"] = [line.split()[1] for line in f if line.startswith("CapEff")]

if "ipc_ping" in todo:
    rid = todo["ipc_ping"]
    ipc = os.environ["FARMAGENT_IPC_DIR"]
    tmp = f"{ipc}/actions/.{rid}.tmp"
    with open(tmp, "x") as f:
        json.dump({"type": "ping", "requestId": rid}, f)
    os.rename(tmp, f"{ipc}/actions/{rid}.json")
    result_path = f"{ipc}/action_results/{rid}.json"
    deadline = time.time() + 10
    while not os.path.exists(result_path) and time.time() < deadline:
        time.sleep(0.02)
    try:
        with open(result_path) as f:
            report["ipc_result"] = json.load(f)
    except Exception as err:
        report["ipc_result"] = why(err)

if "openai" in todo:  # one OpenAI-style chat completion through the proxy socket, by farmagent's own client
    try:
        from farmagent.config import AgentSettings
        from farmagent.llm import ChatClient
        client = ChatClient(AgentSettings.from_env())
        status, _, body = client.post("/chat/completions", json.dumps({"model": "whatever-the-agent-asks",
                                      "messages": [{"role": "user", "content": todo["openai"]}]}).encode())
        answer = json.loads(body)
        if status == 200:
            report["openai"] = {"content": answer["choices"][0]["message"]["content"], "model": answer["model"]}
        else:
            report["openai"] = f"error:HTTP {status}: {answer['error']['message']}"
    except Exception as err:
        report["openai"] = why(err) + ": " + str(err)

if "sockets" in todo:  # {"socket(AF_X)" or "socketpair(AF_X)": type name}: what each creation gets
    made = {}
    for call, kind in todo["sockets"].items():
        make, _, family = call.rstrip(")").partition("(")
        try:
            args = (getattr(socket, family), getattr(socket, kind))
            for s in (socket.socket(*args),) if make == "socket" else socket.socketpair(*args):
                s.close()
            made[call] = "ok"
        except Exception as err:
            made[call] = why(err)
    report["sockets"] = made

if "threads" in todo:  # how many threads start (each waits until all are counted), and why the next one did not
    import threading
    release, started, failed = threading.Event(), [], None
    for _ in range(todo["threads"]):
        thread = threading.Thread(target=release.wait)
        try:
            thread.start()
        except Exception as err:
            failed = why(err) + ": " + str(err)
            break
        started.append(thread)
    release.set()
    for thread in started:
        thread.join()
    report["threads"] = [len(started), failed]

limits = {}
for name in ("RLIMIT_AS", "RLIMIT_NPROC", "RLIMIT_CORE", "RLIMIT_NOFILE"):
    limits[name] = resource.getrlimit(getattr(resource, name))[0]
report["rlimits"] = limits

if "alloc_mb" in todo:
    try:
        block = bytearray(todo["alloc_mb"] * 1024 * 1024)
        report["alloc"] = "ok"
        del block
    except MemoryError:
        report["alloc"] = "MemoryError"

if "spam_bytes" in todo:
    line = b"x" * 1023 + b"\n"
    for _ in range(todo["spam_bytes"] // 1024):
        sys.stdout.buffer.write(line)
        sys.stderr.buffer.write(line)
    sys.stdout.flush()

if "setid_file" in todo:
    path = todo["setid_file"]
    with open(path, "w") as f:
        f.write("#!/bin/sh\nid\n")
    try:
        os.chmod(path, 0o6755)
        report["setid_mode"] = oct(os.stat(path).st_mode & 0o7777)
    except OSError as err:
        report["setid_mode"] = why(err)

if "exec_when" in todo:  # says it is ready, waits for the host to put a program at that path, runs it
    path = todo["exec_when"]
    open(path + ".ready", "w").close()
    deadline = time.time() + 30
    while not os.path.exists(path) and time.time() < deadline:
        time.sleep(0.02)
    try:
        import subprocess
        report["exec"] = subprocess.run([path], capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception as err:
        report["exec"] = why(err)

for path in todo.get("chmod_setid", []):  # an existing file made setuid (its directory's entries unchanged)
    os.chmod(path, 0o6755)

for path, mb in todo.get("grow", {}).items():  # an existing file grown
    with open(path, "ab") as f:
        f.write(os.urandom(mb * 1024 * 1024))

chowns = {}
for path, (uid, gid) in todo.get("chown", {}).items():  # give a file to another owner or group
    try:
        os.chown(path, uid, gid, follow_symlinks=False)
        chowns[path] = "ok"
    except OSError as err:
        chowns[path] = why(err)
report["chown"] = chowns

if "hardlink" in todo:  # a second name for an existing file
    source, name = todo["hardlink"]
    try:
        os.link(source, name)
        report["hardlink"] = "ok"
    except OSError as err:
        report["hardlink"] = why(err)

for path, count in todo.get("many_files", {}).items():  # `count` new empty files (in a new directory or not)
    os.makedirs(path, exist_ok=True)
    for index in range(count):
        open(f"{path}/f{index}", "w").close()

for link, target in todo.get("symlink", {}).items():
    os.symlink(target, link)

deep = {}
for top, depth in todo.get("deep_setid", {}).items():  # a setuid file below `depth` bytes of directory names
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    made, name = 0, "d" * 200
    while made < depth:
        os.mkdir(name, dir_fd=fd)
        below = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd, made = below, made + len(name) + 1
    f = os.open("sh-root", os.O_WRONLY | os.O_CREAT, 0o755, dir_fd=fd)
    os.write(f, b"#!/bin/sh\nid\n")
    os.fchmod(f, 0o6755)
    deep[top] = [made, oct(os.fstat(f).st_mode & 0o7777)]
    os.close(f)
    os.close(fd)
report["deep_setid"] = deep

if "trickle" in todo:  # [path, MB a second, MB at most]: keeps writing 1 MB chunks (until the host ends the run)
    path, rate, most = todo["trickle"]
    begun = time.monotonic()
    with open(path, "wb") as f:
        for index in range(most):
            f.write(b"t" * (1024 * 1024))
            f.flush()
            time.sleep(max(0.0, begun + (index + 1) / rate - time.monotonic()))
    report["trickled"] = most

fills = {}
for path, mb in todo.get("fill", {}).items():
    written = 0
    try:
        with open(path, "wb") as f:
            chunk = b"x" * (1024 * 1024)
            for _ in range(mb):
                f.write(chunk)
                f.flush()
                written += len(chunk)
        fills[path] = ["ok", written]
    except OSError as err:
        fills[path] = [why(err), written]
    try:
        os.unlink(path)
    except OSError:
        pass
report["fill"] = fills

if "forks" in todo:
    children, failed = [], None
    for _ in range(todo["forks"]):
        try:
            pid = os.fork()
        except OSError as err:
            failed = why(err)
            break
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        children.append(pid)
    for pid in children:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    report["forks"] = [len(children), failed]

def children(count, work):
    pids = []
    for _ in range(count):
        pid = os.fork()
        if pid == 0:
            try:
                work()
            finally:
                os._exit(0)
        pids.append(pid)
    return [os.waitpid(pid, 0)[1] for pid in pids]

if "mem_children" in todo:
    count, mb = todo["mem_children"]
    def hold():
        block = b"\x01" * (mb * 1024 * 1024)  # written, so every page is really used
        time.sleep(2)
    report["mem_children"] = children(count, hold)

if "shm_child" in todo:
    def fill_shm():
        with open("/dev/shm/big", "wb") as f:
            for _ in range(todo["shm_child"]):
                f.write(b"x" * (1024 * 1024))
    statuses = children(1, fill_shm)
    report["shm_child"] = [statuses[0], os.path.getsize("/dev/shm/big")]

if "cpu_children" in todo:
    count, seconds = todo["cpu_children"]
    def spin():
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pass
    begun = time.monotonic()
    children(count, spin)
    used = os.times()
    report["cpu_children"] = [used.children_user + used.children_system, time.monotonic() - begun]

time.sleep(todo.get("sleep", 0))
for line in todo.get("stderr", []):
    print(line, file=sys.stderr)
report["ended"] = time.time()
if "print" in todo:
    print(todo["print"], flush=True)
else:
    print(json.dumps({"status": "ok", "answer": json.dumps(report), "error": None, "turns": 1, "toolCalls": 0}))
sys.exit(todo.get("exit", 0))
"""

PROBE_COMMAND = (sys.executable, "-c", PROBE)

# What a run tries to create: each family with a socket type it offers (AF_PACKET: SOCK_DGRAM needs no header).
SOCKETS = {
    "socket(AF_UNIX)": "SOCK_STREAM",
    "socketpair(AF_UNIX)": "SOCK_DGRAM",
    "socket(AF_INET)": "SOCK_STREAM",
    "socket(AF_INET6)": "SOCK_DGRAM",
    "socket(AF_VSOCK)": "SOCK_STREAM",  # not network-namespaced: on a virtual machine it reaches the hypervisor
    "socket(AF_NETLINK)": "SOCK_RAW",
    "socket(AF_PACKET)": "SOCK_DGRAM",
    "socketpair(AF_INET)": "SOCK_STREAM",
}


def report(outcome: AgentOutcome) -> dict[str, Any]:
    """The probe's report (the run must have ended `ok`)."""
    assert outcome.status == "ok", outcome
    assert outcome.answer is not None
    return json.loads(outcome.answer)  # type: ignore[no-any-return]


def probe_job(folder: str, *, scheduled: bool = False, **todo: Any) -> AgentJob:
    """A job whose prompt tells the probe what to do."""
    return AgentJob(folder=folder, prompt=json.dumps(todo), scheduled=scheduled)


def add_group(root: Path, folder: str, jid: str) -> None:
    """Register one more (non-main) group in the data dir."""
    register_in_process(root, jid=jid, name=folder, folder=folder, requires_trigger=False)


async def no_hook(folder: str) -> None:
    """A before_run hook that does nothing."""


async def no_memory(folder: str, prompt: str) -> list[dict[str, Any]]:
    """A memory search that finds nothing."""
    return []


def make_runtime(
    settings: Settings,
    *,
    before_run: Callable[[str], Awaitable[None]] = no_hook,
    memory_snippets: Callable[[str, str], Awaitable[list[dict[str, Any]]]] = no_memory,
    backend: SandboxBackend | None = None,
    term_grace: float = 1.0,
    command: Sequence[str] | None = PROBE_COMMAND,
) -> AgentRuntime:
    """An AgentRuntime on the settings' data dir that runs the probe."""
    return AgentRuntime(
        settings=build_config(settings).agents,
        layout=DataLayout(settings.data_dir),
        group=group_lookup(settings.data_dir),
        before_run=before_run,
        memory_snippets=memory_snippets,
        command=command,
        backend=backend,
        term_grace=term_grace,
    )


def settings_for(data_dir: Path, **values: Any) -> Settings:
    """Settings on `data_dir`, read from nothing but `values` (no .env, no farmhost variables of the shell)."""
    return Settings(_env_file=None, FARMHOST_DATA_DIR=data_dir, TZ="Europe/Lisbon", **values)  # type: ignore[call-arg]


@dataclass(frozen=True)
class Sandbox:
    """Where the probe runs: `bwrap` (the host's interpreter) or `docker` (a container of the agent image).

    The fixture `sandbox` (tests/agents/conftest.py) gives each in turn to a test that runs on both.
    """

    name: str
    values: dict[str, str]  # the settings that choose it
    command: tuple[str, ...]  # the probe, by the interpreter of that sandbox
    env: dict[str, str]  # what a daemon subprocess needs in its environment besides (clean_env drops DOCKER_HOST)

    def settings(self, data_dir: Path, **values: Any) -> Settings:
        """`settings_for` with this runtime chosen."""
        return settings_for(data_dir, **self.values, **values)

    def runtime(self, settings: Settings, **options: Any) -> AgentRuntime:
        """`make_runtime` running the probe in this sandbox."""
        return make_runtime(settings, command=self.command, **options)


def schedule_run(data_dir: Path, prompt: str, *, folder: str = "field", zone: str = "Europe/Lisbon") -> None:
    """A once task of `folder` with `prompt`, due as soon as the running daemon surely has it."""
    due = once_time(data_dir, folder, ZoneInfo(zone))
    task = {"type": "schedule_task", "prompt": prompt, "schedule_type": "once"}
    rid = drop(data_dir, folder, "tasks", {**task, "schedule_value": due.strftime("%Y-%m-%dT%H:%M:%S")})
    ok(wait_result(data_dir, folder, rid))


def run_logs(data_dir: Path, count: int, folder: str = "field") -> list[Path]:
    """The group's run logs, oldest first, once there are `count` of them (written when each run has ended)."""
    found = sorted((data_dir / "logs" / "runs" / folder).glob("run-*.log"), key=lambda p: p.stat().st_mtime_ns)
    return found if len(found) >= count else []


def logged_answer(log: Path) -> dict[str, Any]:
    """The agent's report, from the AgentResult line of the run's stdout in its log (the run must have ended ok)."""
    text = log.read_text()
    assert "status: ok, exit code 0" in text, text[-3000:]
    line = text.split("--- stdout ---", 1)[1].split("--- stderr ---", 1)[0].strip().splitlines()[-1]
    report: dict[str, Any] = json.loads(json.loads(line)["answer"])
    return report


# A Python any user can run: another user cannot reach the tests' own interpreter under /root.
SYSTEM_PYTHON = "/usr/bin/python3"


@dataclass(frozen=True)
class OtherUser:
    """A data directory owned by a uid no user or other test has, and the interpreter that runs farmhost as it."""

    uid: int
    data_dir: Path
    python: Path


@contextmanager
def as_another_user(prefix: str) -> Iterator[OtherUser]:
    """A farm for a daemon of another user, outside pytest's tmp dir (root's 0700: that user must reach it)."""
    assert os.path.exists(SYSTEM_PYTHON), f"{SYSTEM_PYTHON} (a Python any user can run) is missing"
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        tmp.chmod(0o755)
        uid = AGENT_UID_BASE - 65536 * random.randrange(1, 4096)  # nothing else counts against it
        data_dir = init_data_dir_in_process(tmp / "data")
        for path in (data_dir, *data_dir.rglob("*")):
            os.chown(path, uid, uid, follow_symlinks=False)
        yield OtherUser(uid=uid, data_dir=data_dir, python=python_as_user(tmp, uid))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def python_as_user(tmp: Path, uid: int) -> Path:
    """An interpreter that runs farmhost as `uid` as deploy/'s unit does (User=, NoNewPrivileges, no capability)."""
    wrapper = tmp / "python-as-user"
    setpriv = shutil.which("setpriv")
    assert setpriv is not None
    unit = f"--reuid={uid} --regid={uid} --clear-groups --no-new-privs --bounding-set=-all --inh-caps=-all"
    wrapper.write_text(f'#!/bin/sh\nexec {setpriv} {unit} {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper
