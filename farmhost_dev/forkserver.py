"""A farmhost imported once, forked for each `farmhost ...` process of the test suite.

`python -m farmhost run` spends about a second importing the daemon (aiohttp, pydantic, numpy, the handlers)
before it does anything, and the suite starts hundreds of daemons and CLI commands. This server imports the CLI and
the daemon's whole tree once, then forks one child per command. A child is a process of its own exactly as
`python -m farmhost ...` would make it: its own pid, environment, working directory, standard streams, signals and
exit code; `kill -9`, SIGTERM and SIGSTOP reach it directly; nothing of it lives in the test's process. What it
skips is the interpreter start and the imports (the modules are the same files, imported before the fork).

The protocol is a SOCK_SEQPACKET socket pair: the client sends `{"token", "argv", "env", "cwd"}` with the child's
stdin, stdout and stderr as passed descriptors; the server answers `{"token", "pid"}` (or `{"token", "error"}`) and
later `{"token", "code"}` when the child exits (a negative code: killed by that signal, as `Popen.returncode`).
The server exits when the client's end closes.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import json
import os
import secrets
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

MAX_MESSAGE = 1 << 20


def _child(request: dict[str, object], fds: list[int], sock: socket.socket, wake: int) -> None:
    """In the forked child: become `python -m farmhost <argv>`; ends the process with its exit code."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        sock.close()
        os.close(wake)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        env = request["env"]
        assert isinstance(env, dict)
        os.environ.clear()
        os.environ.update(env)
        time.tzset()  # a fresh interpreter would read TZ at its start
        os.chdir(str(request["cwd"]))
        argv = [str(a) for a in request["argv"]]  # type: ignore[attr-defined]
        sys.argv = ["farmhost", *argv]
        from farmhost.cli import main

        code = main(argv)
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except BaseException:  # noqa: BLE001 - printed as the interpreter would, then the exit code 1
        traceback.print_exc()
        code = 1
    _end(code)


def _end(code: int) -> None:
    """End as the interpreter's shutdown would, without tearing down the modules the child shares with the server.

    Python's shutdown runs `threading._shutdown` (the threading atexit hooks, such as the one that ends idle
    thread-pool workers, then a wait for the threads that are not daemons), the atexit functions (logging's flush
    among them) and flushes the standard streams, then clears every module, which writes to every object the fork
    shares and so copies the server's whole heap page by page: a `farmhost group list` took 82 ms of CPU with it,
    24 ms without. The child does the first steps, collects its own garbage (an unclosed file it dropped is flushed
    and closed as at shutdown), and ends with `os._exit` (coverage.py's `_exit` patch still saves its data).
    """
    shutdown: Callable[[], None] = getattr(threading, "_shutdown")  # noqa: B009 - private, what Py_Finalize calls
    shutdown()
    atexit._run_exitfuncs()
    gc.collect()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


# Imported once here for the children. The daemon imports the last five only when it is configured to use them:
# Home Assistant's client with niquests, python-telegram-bot with httpx, the seccomp binding (of 285 children of a
# run of tests/integration, farm, telegram, mqtt, ipc and scheduler, 110 imported the first, 74 the second and 164 the
# third, each paying a third of a second or more for it), and httpx's transport (httpcore, with anyio's asyncio
# backend under it), which httpx imports only when a client is built: ~60 modules, 25 ms, in each Telegram child.
PRELOAD = (
    "farmhost.app",
    "farmhost.cli",
    "farmhost.cli.doctor",  # the CLI imports these for their own commands only (a lighter `farmhost health`)
    "farmhost.protocol.schema",
    "farmhost.addon.run",
    "farmhost.farm.homeassistant.transport",
    "farmhost.telegram.service",
    "httpcore",
    "anyio._backends._asyncio",
    "pyseccomp",
)


def serve(sock: socket.socket) -> None:
    """Answer spawn requests on `sock` until the client closes it."""
    for name in PRELOAD:
        importlib.import_module(name)
    # Each daemon's start asks the agent's interpreter where it lives (a Python start, ~25 ms): asked here once, the
    # answer is kept for the children (host_paths keeps it for the process).
    from farmhost.agents.sandbox.backends.host_paths import find_python_install_sync

    with contextlib.suppress(Exception):
        find_python_install_sync(None)
    # And the Bot API's TLS context (the CA bundle read, ~22 ms): built here once for the children with Telegram on,
    # which take it when their CA setting is the server's (farmhost.telegram.bot.tls_context).
    from farmhost.telegram.bot import tls_context

    with contextlib.suppress(Exception):
        tls_context()
    # Out of the collector's sight: a child's collections would otherwise walk, and so copy, the whole shared heap
    # (a CLI call's CPU 320 ms with the preloads, 82 ms frozen).
    gc.freeze()
    read_wake, wake = os.pipe()
    os.set_blocking(wake, False)
    signal.set_wakeup_fd(wake)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    tokens: dict[int, str] = {}  # pid -> the client's token for it
    while True:
        ready, _, _ = select.select([sock.fileno(), read_wake], [], [])
        if read_wake in ready:
            os.read(read_wake, 4096)
        _reap(sock, tokens)
        if sock.fileno() in ready:
            try:
                data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 3)
            except ConnectionResetError:
                return
            if not data:
                return  # the client is gone
            _fork(sock, json.loads(data), fds, tokens, read_wake, wake)


def _reap(sock: socket.socket, tokens: dict[int, str]) -> None:
    """Tell the client the exit code of every child that ended."""
    while tokens:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        token = tokens.pop(pid, None)
        if token is not None:
            _send(sock, {"token": token, "code": os.waitstatus_to_exitcode(status)})


def _fork(
    sock: socket.socket, request: dict[str, object], fds: list[int], tokens: dict[int, str], read_wake: int, wake: int
) -> None:
    token = str(request["token"])
    try:
        pid = os.fork()
    except OSError as err:
        _send(sock, {"token": token, "error": str(err)})
        pid = -1
    if pid == 0:
        os.close(read_wake)
        _child(request, fds, sock, wake)
    for fd in fds:
        os.close(fd)
    if pid > 0:
        tokens[pid] = token
        _send(sock, {"token": token, "pid": pid})


def _send(sock: socket.socket, message: dict[str, object]) -> None:
    with contextlib.suppress(OSError):  # the client is gone; the next receive ends the loop
        sock.send(json.dumps(message).encode())


class ForkServer:
    """The client: one server per test process, started on first use; thread-safe."""

    def __init__(self, env: Mapping[str, str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._server = subprocess.Popen(
            # By path and from a neutral directory: `farmhost` must resolve as it does for `python -m farmhost`
            # run elsewhere (an installed farmhost, not a checkout that happens to be the tests' working directory).
            [sys.executable, os.path.abspath(__file__), str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            env=dict(env),
            cwd=tempfile.gettempdir(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
        theirs.close()
        self._at_exec = _at_exec(env)
        self._sock = ours
        self._send_lock = threading.Lock()
        self._changed = threading.Condition()
        self._messages: dict[str, dict[str, object]] = {}  # token -> the spawn's answer
        self._codes: dict[str, int] = {}  # token -> exit code
        self._gone = False
        threading.Thread(target=self._receive, name="forkserver", daemon=True).start()

    def _receive(self) -> None:
        while True:
            try:
                data = self._sock.recv(MAX_MESSAGE)
            except OSError:
                data = b""
            with self._changed:
                if not data:
                    self._gone = True
                else:
                    message = json.loads(data)
                    token = str(message["token"])
                    if "code" in message:
                        self._codes[token] = int(message["code"])
                    else:
                        self._messages[token] = message
                self._changed.notify_all()
            if not data:
                return

    def alive(self) -> bool:
        """Whether the server still answers (it dies with a bug of its own, or when this process ends)."""
        return not self._gone and self._server.poll() is None

    def can_fork(self, env: Mapping[str, str]) -> bool:
        """Whether a child with `env` is what an exec would make: no variable read at an interpreter's start differs.

        PYTHONPATH, PYTHONHASHSEED, LD_PRELOAD and the like act only when a process starts; a child that needs other
        values than the server's is exec'd instead (the caller's job).
        """
        return _at_exec(env) == self._at_exec

    def spawn(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, stdio: Sequence[int]) -> Forked:
        """Fork `farmhost <argv>` with `env`, `cwd` and the three descriptors `stdio` as its standard streams."""
        token = secrets.token_hex(8)
        request = {"token": token, "argv": list(argv), "env": dict(env), "cwd": str(cwd)}
        with self._send_lock:
            socket.send_fds(self._sock, [json.dumps(request).encode()], list(stdio))
        with self._changed:
            self._changed.wait_for(lambda: token in self._messages or self._gone, timeout=60)
            answer = self._messages.pop(token, None)
        if answer is None or "pid" not in answer:
            raise OSError(f"the fork server could not start farmhost {' '.join(argv)}: {answer or 'it is gone'}")
        return Forked(self, token, int(str(answer["pid"])))

    def _code(self, token: str, timeout: float | None) -> int | None:
        with self._changed:
            self._changed.wait_for(lambda: token in self._codes or self._gone, timeout=timeout)
            return self._codes.get(token)


def _at_exec(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of `env` that the interpreter or the dynamic loader read only at a process's start."""
    return {k: v for k, v in env.items() if k.startswith(("PYTHON", "LD_"))}


class Forked:
    """A forked farmhost process, with the part of `subprocess.Popen` the tests use."""

    def __init__(self, server: ForkServer, token: str, pid: int) -> None:
        self._server = server
        self._token = token
        self.pid = pid
        self.returncode: int | None = None
        self.args = ["farmhost"]

    def poll(self) -> int | None:
        """The exit code, or None while it runs."""
        if self.returncode is None:
            self.returncode = self._server._code(self._token, 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the exit code (`subprocess.TimeoutExpired` after `timeout` seconds)."""
        if self.returncode is None:
            self.returncode = self._server._code(self._token, timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """Signal the process unless it already ended (its pid may be someone else's by now)."""
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        """SIGTERM."""
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL."""
        self.send_signal(signal.SIGKILL)


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])))
