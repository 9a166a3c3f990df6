"""The process that keeps `hass` running: starts it again on exit 100 (restart), stops it with its parent or a signal.

Run by path with HA's own interpreter (`<ha venv>/bin/python .../supervisor.py --python ... --config ...`, see
HaInstance.start), so stdlib only: it must not import farmhost, and its command line names it in `ps` as the local
HA's supervisor. Run so, it imports HA's start-up modules once and forks each `hass` from itself: a start or a
restart then skips about 1.8 CPU-seconds of imports (of ~4.5; ~7 s on a Raspberry Pi). Each forked `hass` leaves
the names of the modules it imported beyond those (its integrations and their libraries) in `hass.modules` when it
exits, and the supervisor imports them before it forks the next: a restart or an outage then skips those imports
too. What it learned it keeps in `--modules-cache` (beside HA's venv), which the next supervisor imports before its
first `hass`. Run by another interpreter, or if that import fails, it starts `python -m homeassistant` as a child process
instead.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import BinaryIO, Final

RESTART_EXIT_CODE: Final = 100  # `hass` exits with this on homeassistant.restart; the supervisor starts it again
POLL_S: Final = 0.1  # how often the loop looks at hass, the signal flag and the parent: a stop takes at most this
# What `python -m homeassistant` imports before it reads its config: the bulk of a start's import time.
PRELOAD: Final = ("homeassistant.__main__", "homeassistant.runner", "homeassistant.bootstrap")


def hass_argv(config: str) -> list[str]:
    """`hass`'s arguments after the interpreter (the same for a child process and a fork)."""
    return ["-c", config, "--skip-pip", "--log-no-color"]


def preloaded(python: str) -> bool:
    """Whether this process can fork `hass`: it is HA's interpreter and has imported HA's start-up modules.

    A fork copies only the calling thread, so the imports must leave this process with one thread.
    """
    if os.path.realpath(python) != os.path.realpath(sys.executable):
        return False
    try:
        for name in PRELOAD:
            importlib.import_module(name)
    except (ImportError, OSError):  # a broken venv: `python -m homeassistant` will say why, in hass.log
        return False
    return single_threaded()


def single_threaded() -> bool:
    """Whether this process has one thread (a fork copies only the calling one), native threads counted too."""
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return threading.active_count() == 1


def write_modules(modules_file: Path, names: list[str]) -> None:
    """The list `learn` reads, whole or not at all.

    With os calls: hass's blocking-call detector, still armed as its main() returns, reports file writes by open().
    """
    partial = modules_file.with_name(f".{modules_file.name}.{os.getpid()}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, "".join(f"{name}\n" for name in names).encode())
    finally:
        os.close(fd)
    os.replace(partial, modules_file)


def learn(modules_file: Path) -> list[str]:
    """Import the modules a forked `hass` listed in `modules_file` that this process lacks; the listed ones it has now.

    One that fails to import is skipped: it only costs the next `hass` its own import, as before.
    """
    try:
        names = modules_file.read_text().split()
    except OSError:
        return []
    for name in names:
        if name not in sys.modules:
            with contextlib.suppress(Exception):  # left to hass, which imported it before
                importlib.import_module(name)
    return [name for name in names if name in sys.modules]


class ForkedHass:
    """`hass` run in a fork of this preloaded process, with the little of Popen's interface the loop uses."""

    def __init__(self, config: str, log_fd: int, modules_file: Path) -> None:
        self.returncode: int | None = None
        self.pid = os.fork()
        if self.pid == 0:
            self._run(config, log_fd, modules_file)

    @staticmethod
    def _run(config: str, log_fd: int, modules_file: Path) -> None:
        rc = 1
        inherited = set(sys.modules)
        try:
            # As a new interpreter has them: the supervisor's own handlers would swallow hass's signals.
            for signum in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
                signal.signal(signum, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            os.dup2(log_fd, 1)
            os.dup2(log_fd, 2)
            sys.argv = ["hass", *hass_argv(config)]
            main = importlib.import_module("homeassistant.__main__").main
            rc = main()
        except SystemExit as err:
            rc = err.code if isinstance(err.code, int) else 1
        except BaseException:  # noqa: BLE001 - whatever it was, in hass.log; the fork must not run on as a supervisor
            traceback.print_exc()
        finally:
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            with contextlib.suppress(Exception):  # the list only saves the next hass time: never a reason to fail
                write_modules(modules_file, [name for name in list(sys.modules) if name not in inherited])
            os._exit(rc)

    def poll(self) -> int | None:
        """The exit code of hass once it has exited (reaped then), else None."""
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def terminate(self) -> None:
        """SIGTERM: hass stops cleanly."""
        if self.poll() is None:
            os.kill(self.pid, signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL."""
        if self.poll() is None:
            os.kill(self.pid, signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        """The exit code of hass, waiting at most `timeout` seconds (subprocess.TimeoutExpired past it)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while (rc := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(["hass"], timeout or 0.0)
            time.sleep(0.02)
        return rc


class Supervisor:
    """The loop of one supervisor process: its child `hass`, and the flags its signals set."""

    def __init__(
        self, python: str, config: str, pid_file: str, parent: int | None, modules_cache: str | None = None
    ) -> None:
        self.python, self.config, self.pid_file, self.parent = python, config, Path(pid_file), parent
        self.stopping = False  # SIGTERM/SIGINT: stop hass and exit
        self.held = False  # SIGUSR1 sets, SIGUSR2 clears: hass kept down
        self.modules_file = self.pid_file.with_name("hass.modules")
        # What every hass of this Home Assistant imported beyond the preload, kept beside its venv: a new supervisor
        # imports it before its first hass, which then imports nothing a hass before it needed.
        self.modules_cache = Path(modules_cache) if modules_cache else None
        self.learned: dict[str, None] = {}  # the names imported from the lists, in order
        self.fork = preloaded(python)
        self.handle_signals()

    def handle_signals(self) -> None:
        """Our handlers for the signals the loop acts on."""
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(signum, self.on_signal)

    def learn(self, *, cached: bool = False) -> str | None:
        """Import what the last forked hass imported beyond us (`learn`); a line for the log if that did anything.

        With `cached`, first what the cache lists; what was learned goes back into the cache.
        """
        before = len(sys.modules)
        sources = [self.modules_cache] if cached and self.modules_cache else []
        for source in [*sources, self.modules_file]:
            self.learned.update(dict.fromkeys(learn(source)))
        if not (learned := len(sys.modules) - before):
            return None  # nothing new: the cache already says what it would
        if self.modules_cache is not None:
            with contextlib.suppress(OSError):  # a cache that cannot be written only costs the next supervisor time
                write_modules(self.modules_cache, list(self.learned))
        self.handle_signals()  # an imported module may have set its own
        if not single_threaded():  # a module started a thread: forking now could copy a lock held by it
            self.fork = False
            return f"imported {learned} modules hass used before; one started a thread, so hass runs as a new process"
        return f"imported {learned} modules hass used before"

    def on_signal(self, signum: int, _frame: object) -> None:
        """Set the flag the loop acts on within POLL_S."""
        if signum in (signal.SIGUSR1, signal.SIGUSR2):
            self.held = signum == signal.SIGUSR1
        else:
            self.stopping = True

    def ending(self) -> bool:
        """Asked to stop, or orphaned: the parent that started us is gone."""
        return self.stopping or (self.parent is not None and os.getppid() != self.parent)

    def run_hass(self, log: BinaryIO) -> tuple[int | None, bool]:
        """Start hass and wait until it exits, or until it is to be stopped (then stop it).

        Returns its exit code, and whether it was taken down on request (SIGUSR1).
        """
        child: subprocess.Popen[bytes] | ForkedHass
        if self.fork:
            child = ForkedHass(self.config, log.fileno(), self.modules_file)
        else:
            child = subprocess.Popen(
                [self.python, "-m", "homeassistant", *hass_argv(self.config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.pid_file.write_text(f"{child.pid}\n")
        taken_down = False
        while child.poll() is None:
            if self.held or self.ending():
                taken_down = self.held
                child.terminate()
                try:
                    child.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
                break
            time.sleep(POLL_S)
        rc = child.returncode
        (self.pid_file.parent / "hass.rc").write_text(f"{rc}\n")
        return rc, taken_down

    def run(self, log: BinaryIO) -> int:
        """Run hass until it exits with something other than 100, or until asked to stop; the supervisor's rc."""

        def note(line: str) -> None:
            log.write(f"### supervisor: {line} ({time.strftime('%H:%M:%S')})\n".encode())
            log.flush()

        def learn(*, cached: bool = False) -> None:  # while hass is down anyway: after it exits, before a hold
            if self.fork and not self.ending() and (learned := self.learn(cached=cached)):
                note(learned)

        learn(cached=True)  # the lists that hass processes of earlier supervisors left
        while True:
            note(f"starting hass {'forked from the preloaded supervisor' if self.fork else 'as a new process'}")
            rc, taken_down = self.run_hass(log)
            if taken_down and not self.ending():  # SIGUSR2 may have come already: then it starts again at once
                note(f"hass exited {rc}, taken down on request (SIGUSR1): kept down until SIGUSR2")
                learn()
                while self.held and not self.ending():
                    time.sleep(POLL_S)
                if not self.ending():
                    continue
            if self.ending() or rc != RESTART_EXIT_CODE:
                note(f"hass exited {rc}, done")
                return 0 if self.stopping else (rc or 0)
            note("hass exited 100 (restart requested): starting it again")
            learn()


def supervise(
    python: str, config: str, log_path: str, pid_file: str, parent: int | None, modules_cache: str | None = None
) -> int:
    """Run `hass` until it exits with something other than 100; forward SIGTERM/SIGINT; die with the parent.

    SIGUSR1 takes hass down and keeps it down (its port closed, as a Home Assistant that is off), SIGUSR2 starts it
    again: an outage costs no new supervisor, and the next hass is forked from the preloaded one.
    """
    supervisor = Supervisor(python, config, pid_file, parent, modules_cache)
    with open(log_path, "ab") as log:
        return supervisor.run(log)


def main(argv: list[str] | None = None) -> int:
    """The supervisor's command line (HaInstance.start writes it)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", required=True, help="the HA venv's interpreter")
    parser.add_argument("--config", required=True, help="HA's config dir")
    parser.add_argument("--log", required=True, help="hass.log: hass's output and the supervisor's lines")
    parser.add_argument("--pid-file", required=True, help="hass.pid (hass.rc goes beside it)")
    parser.add_argument("--parent", type=int, help="stop hass when this process is no longer our parent")
    parser.add_argument("--modules-cache", help="the modules hass imports, kept for the next supervisor")
    args = parser.parse_args(argv)
    return supervise(args.python, args.config, args.log, args.pid_file, args.parent, args.modules_cache)


if __name__ == "__main__":
    sys.exit(main())
