"""Launch: one sandboxed process from start to exit: stdin in, bounded output out, timeout and termination."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import resource
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from farmhost.agents.capture import OutputCapture
from farmhost.agents.sandbox.backends.base import LaunchPlan
from farmhost.agents.sandbox.backends.engine_cli import engine_command
from farmhost.agents.sandbox.cgroups import joiner

logger = logging.getLogger(__name__)

# After the agent exits, a process it left behind may still hold the pipes open; this long, then it is killed.
PIPE_GRACE: Final = 2.0


@dataclass(frozen=True, kw_only=True)
class Exit:
    """How the process ended and what it printed."""

    exit_code: int | None
    timed_out: bool
    cancelled: bool
    ended: str | None  # why the host ended it over a limit other than wall time (the disk), None otherwise
    stdout: OutputCapture
    stderr: OutputCapture
    duration_seconds: float


class Launch:
    """Runs one LaunchPlan; `cancel()` from elsewhere ends it early (SIGTERM, then SIGKILL after a grace)."""

    def __init__(
        self, plan: LaunchPlan, *, output_bytes: int, term_grace: float, cgroup_procs: tuple[str, ...] = ()
    ) -> None:
        self._plan = plan
        self._cgroup_procs = cgroup_procs
        self._term_grace = term_grace
        self._cancel = asyncio.Event()
        self._cancel_grace = term_grace
        self._ended: str | None = None
        self.stdout = OutputCapture(output_bytes)
        self.stderr = OutputCapture(output_bytes)

    def cancel(self, *, grace: float | None = None) -> None:
        """Stop the run now (the daemon is stopping); `grace` overrides the SIGTERM grace."""
        if grace is not None:
            self._cancel_grace = grace
        self._cancel.set()

    def end(self, reason: str) -> None:
        """End the run over a limit (SIGTERM, SIGKILL after the grace); its Exit says `reason`."""
        if self._ended is None and not self._cancel.is_set():
            self._ended = reason
        self._cancel.set()

    async def run(self, stdin: bytes, *, timeout: float) -> Exit:
        """Start the process, feed `stdin`, collect output until it exits, is timed out or cancelled.

        Raises:
            OSError: the process could not be started (missing program, ...).
        """
        started = time.monotonic()
        argv = list(self._plan.argv)
        fds: list[int] = []
        try:
            for arg in self._plan.fd_args:
                fds.append(sealed_memfd(arg.data))
                argv[arg.index] = str(fds[-1])
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=dict(self._plan.env),
                cwd=self._plan.cwd,
                start_new_session=True,  # its own process group: the whole run can be signalled at once
                preexec_fn=_preexec(self._plan.rlimits, self._cgroup_procs),
                pass_fds=fds,
            )
        finally:
            for fd in fds:
                os.close(fd)  # the child holds its own copy
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        feeding = asyncio.create_task(_feed(proc.stdin, stdin), name="agent:stdin")
        readers = [
            asyncio.create_task(self.stdout.drain(proc.stdout), name="agent:stdout"),
            asyncio.create_task(self.stderr.drain(proc.stderr), name="agent:stderr"),
        ]
        exited = asyncio.create_task(proc.wait(), name="agent:wait")
        cancelled = asyncio.create_task(self._cancel.wait(), name="agent:cancel")
        try:
            await asyncio.wait({exited, cancelled}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            timed_out = not exited.done() and not cancelled.done()
            was_cancelled = cancelled.done() and not exited.done()
            if not exited.done():
                await self._terminate(proc, exited, self._cancel_grace if was_cancelled else self._term_grace)
            await self._finish_pipes(proc.pid, readers)
        finally:
            for task in (feeding, cancelled, exited, *readers):
                task.cancel()
            await asyncio.gather(feeding, cancelled, exited, *readers, return_exceptions=True)
        return Exit(
            exit_code=proc.returncode,
            timed_out=timed_out,
            cancelled=was_cancelled and self._ended is None,
            ended=self._ended if was_cancelled else None,
            stdout=self.stdout,
            stderr=self.stderr,
            duration_seconds=time.monotonic() - started,
        )

    async def _terminate(self, proc: asyncio.subprocess.Process, exited: asyncio.Task[int], grace: float) -> None:
        """SIGTERM to the run's processes, SIGKILL to whatever is left after `grace` seconds."""
        for pid in descendants(proc.pid):
            _kill(pid, signal.SIGTERM)
        if self._plan.signal_leader:
            _killpg(proc.pid, signal.SIGTERM)
        done, _ = await asyncio.wait({exited}, timeout=grace)
        if done:
            return
        for pid in descendants(proc.pid):
            _kill(pid, signal.SIGKILL)
        _killpg(proc.pid, signal.SIGKILL)
        if self._plan.kill_argv:
            await _run_kill_command(self._plan.kill_argv)
        await exited

    async def _finish_pipes(self, pid: int, readers: list[asyncio.Task[None]]) -> None:
        """Let the readers reach the end of the output; kill leftovers that keep the pipes open."""
        _done, pending = await asyncio.wait(readers, timeout=PIPE_GRACE)
        if pending:
            logger.warning("agent process %d left processes holding its output open; killing them", pid)
        _killpg(pid, signal.SIGKILL)  # nothing of a finished run may live on in its process group
        if pending:
            await asyncio.wait(pending, timeout=PIPE_GRACE)


async def _feed(writer: asyncio.StreamWriter, data: bytes) -> None:
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        writer.write(data)
        await writer.drain()
        # Not `await writer.wait_closed()`: cancelling this task there would cancel asyncio's own
        # stdin-closed future, and the pipe's later close then fails with InvalidStateError (CPython 3.11).
        writer.close()


def sealed_memfd(data: bytes) -> int:
    """A descriptor that reads `data` from its start; sealed, so nothing that inherits it can change it."""
    fd = os.memfd_create("farmhost-launch", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        fcntl.fcntl(
            fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
        )
        os.lseek(fd, 0, os.SEEK_SET)
    except OSError:
        os.close(fd)
        raise
    return fd


def _preexec(limits: tuple[tuple[int, int], ...], cgroup_procs: tuple[str, ...]) -> Callable[[], None] | None:
    """The function the child runs between fork and exec: setrlimit and joining the run's cgroup, no locks."""
    if not limits and not cgroup_procs:
        return None
    join = joiner(cgroup_procs)

    def apply() -> None:
        join()
        for which, value in limits:
            _soft, hard = resource.getrlimit(which)
            limit = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(which, (limit, limit))

    return apply


def descendants(pid: int) -> list[int]:
    """Every live process below `pid`, children first (read from /proc)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(name))
    found: list[int] = []
    frontier = [pid]
    while frontier:
        below = [child for parent in frontier for child in children.get(parent, ())]
        found += below
        frontier = below
    return found


def _kill(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def end_container(plan: LaunchPlan) -> bool:
    """After a container run: whether the engine saw the kernel kill a process of it for memory; then remove it.

    A container the kill path removed already has nothing to say and nothing to remove (the inspection fails).
    """
    if plan.oom_argv is None:
        return False
    out = await engine_command(
        plan.oom_argv, doing="inspect the agent's container", env=plan.env, refusal_logged=False
    )  # a refusal: gone already (removed after a kill); a silent engine: orphan clean-up removes it later
    if out is None:
        return False
    if plan.remove_argv is not None:
        await _run_kill_command(plan.remove_argv)
    return out.strip() == "true"


async def _run_kill_command(argv: tuple[str, ...]) -> None:
    await engine_command(argv, doing="remove the agent's sandbox")
