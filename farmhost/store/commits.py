"""CommitWatcher: the daemon's one watch for commits another connection made to `farmhost.db` (the CLI, above all).

SQLite tells a connection that another one committed through `PRAGMA data_version`; nothing tells it *when*. The
daemon asks in one place, here, and tells its listeners (the group registry, the scheduler), which re-read what
they hold. A listener learns only that something was committed, never what: each re-reads its own table.

When it asks:

- inotify on the write-ahead log (`farmhost.db-wal`), which every commit appends to. A commit's frames are written
  (`IN_MODIFY`) before the commit is published in the shared index, and the index is written through `mmap`, which
  inotify does not see; so an `IN_MODIFY` is answered with a check at once, and the last one of a burst with
  another check `SETTLE_SECONDS` later.
  A process that closes its connection afterwards (the CLI always does, and so does a crash) closes the log after
  the commit was published (`IN_CLOSE_WRITE`): checked at once, with no race. While the daemon holds its own
  connection the log is never deleted (SQLite removes it only when the last connection closes), so the watch
  holds for the daemon's life.
- after each of the daemon's own commits (`Database.after_commit`): the commit tells the version inside its
  transaction (no system call: every earlier commit of another connection is in it). The log's events of its own
  frames are read when the loop gets to them (after the request that committed was answered) without a check, so
  the daemon's own commits do not take SQLite's read locks to ask. Another process's frames read with them are
  looked at `SETTLE_SECONDS` later, as above.
- besides, every `SAFETY_SECONDS`: a repair for a commit whose publishing took longer than the settle time.
- every `POLL_SECONDS` instead, when inotify is not wanted (`FARMHOST_IPC_MODE=poll`: a file system without it) or
  cannot be used (no instance or watch left, the log missing); each cause is logged once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from typing import Final

from inotify_simple import INotify, parse_events
from inotify_simple import flags as f

from farmhost.store.db import Database

logger = logging.getLogger(__name__)

# How often to ask without inotify: "within a second" of a CLI command, for a PRAGMA read (~10 µs, three syscalls).
POLL_SECONDS: Final = 0.25
# A commit's frames reach the log before its fsync and its publishing: ask again this much later.
SETTLE_SECONDS: Final = 0.25
# With inotify: a check now and then anyway, for a commit published later than SETTLE_SECONDS after its frames.
SAFETY_SECONDS: Final = 5.0
_MASK: Final = f.MODIFY | f.CLOSE_WRITE | f.DELETE_SELF | f.MOVE_SELF
# One read takes the queued events (one system call: no FIONREAD first); a watch of one file queues few.
_READ_BYTES: Final = 4096

CommitListener = Callable[[], None]


class CommitWatcher:
    """Calls its listeners, on the event loop, soon after another connection committed to the database."""

    def __init__(self, db: Database, *, inotify: bool = True, safety_seconds: float = SAFETY_SECONDS) -> None:
        """Remember where the database stands now; nothing is watched before `start()`.

        Args:
            db: The daemon's database; its connection is asked (`data_version`) on the event loop.
            inotify: Watch the log; False polls every POLL_SECONDS (`FARMHOST_IPC_MODE=poll`).
            safety_seconds: While the log is watched, ask this often anyway.
        """
        self._db = db
        self._want_inotify = inotify
        self._safety_seconds = safety_seconds
        self._version = db.data_version()  # before anyone reads: a commit after this is announced
        self._listeners: list[CommitListener] = []
        self._inotify: INotify | None = None
        self._settle: asyncio.TimerHandle | None = None
        self._own = False  # the daemon committed since the log's events were last read
        self._ticker: asyncio.Task[None] | None = None
        self.checks = 0  # how often SQLite was asked (observable by tests and the benchmark)

    def subscribe(self, listener: CommitListener) -> None:
        """Call `listener()` after each foreign commit seen (it re-reads what it holds; a failure is logged)."""
        self._listeners.append(listener)

    @property
    def watching(self) -> bool:
        """True while the log is watched with inotify (False: polled every POLL_SECONDS)."""
        return self._inotify is not None

    def start(self) -> None:
        """Watch the log (or poll), then check once: a commit made before the watch existed is not missed."""
        loop = asyncio.get_running_loop()
        if self._want_inotify:
            self._inotify = self._open_watch()
        if self._inotify is not None:
            loop.add_reader(self._inotify.fileno(), self._read)
        self._ticker = loop.create_task(self._tick(), name="store:commits")
        self._db.after_commit(lambda version: self._own_commit(loop, version))
        self.check()

    async def stop(self) -> None:
        """Stop watching; no listener is called afterwards."""
        self._db.after_commit(None)
        if self._ticker is not None:
            self._ticker.cancel()
            await asyncio.gather(self._ticker, return_exceptions=True)
            self._ticker = None
        if self._settle is not None:
            self._settle.cancel()
            self._settle = None
        self._close_watch()

    def check(self) -> bool:
        """Ask SQLite now; tell every listener when another connection committed since the last check."""
        self.checks += 1
        return self._seen(self._db.data_version())

    def _own_commit(self, loop: asyncio.AbstractEventLoop, version: int) -> None:
        """The daemon committed; `version` is `data_version` inside that transaction (`Database.after_commit`)."""
        self._own = True  # the log's next events are (at least) this commit's own: no check for them
        if version != self._version:
            # Another connection committed before this transaction began: tell the listeners once the caller is
            # done (they re-read their tables; not in the middle of a request's answer). Thread-safe: the daemon's
            # connection may commit from a worker thread.
            self._version = version
            loop.call_soon_threadsafe(self._announce)

    def _seen(self, version: int) -> bool:
        if version == self._version:
            return False
        self._version = version
        self._announce()
        return True

    def _announce(self) -> None:
        for listener in list(self._listeners):
            try:
                listener()
            except Exception:
                logger.exception("commit listener %r failed", listener)

    def _open_watch(self) -> INotify | None:
        wal = self._db.path.with_name(self._db.path.name + "-wal")
        try:
            inotify = INotify(nonblocking=True)
        except OSError as err:
            logger.warning("cannot watch %s (%s); asking SQLite every %g s instead", wal, err, POLL_SECONDS)
            return None
        try:
            inotify.add_watch(wal, _MASK)
        except OSError as err:
            inotify.close()
            logger.warning("cannot watch %s (%s); asking SQLite every %g s instead", wal, err, POLL_SECONDS)
            return None
        return inotify

    def _close_watch(self) -> None:
        if self._inotify is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop is already closed: nothing to unhook
            asyncio.get_running_loop().remove_reader(self._inotify.fileno())
        self._inotify.close()
        self._inotify = None

    def _fall_back(self, why: str) -> None:
        """Poll from now on (the ticker sleeping SAFETY_SECONDS is restarted on POLL_SECONDS)."""
        logger.warning("%s; asking SQLite every %g s instead", why, POLL_SECONDS)
        self._close_watch()
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = asyncio.get_running_loop().create_task(self._tick(), name="store:commits")

    def _read(self) -> None:
        """Read the log's events; ask SQLite now unless the daemon's own commit wrote them (it knows its version)."""
        if self._inotify is None:
            return
        check, self._own = not self._own, False
        try:
            events = parse_events(os.read(self._inotify.fileno(), _READ_BYTES))
        except BlockingIOError:
            return
        except OSError as err:
            self._fall_back(f"cannot read the watch of the database log ({err})")
            return
        mask = 0
        for event in events:
            mask |= event.mask
        if mask & (f.DELETE_SELF | f.MOVE_SELF | f.IGNORED):
            self._fall_back("the database log was removed or moved")
        # Frames written now may be published after this check. A later event asks again, so only the last write
        # of a burst needs the second look: SETTLE_SECONDS after it.
        if mask & (f.MODIFY | f.Q_OVERFLOW):
            if self._settle is not None:
                self._settle.cancel()
            self._settle = asyncio.get_running_loop().call_later(SETTLE_SECONDS, self._settled)
        if check:
            self._check_logged()

    def _settled(self) -> None:
        self._settle = None
        self._check_logged()

    def _check_logged(self) -> None:
        try:
            self.check()
        except Exception:  # one failed look must not end the watch: the next event or tick asks again
            logger.exception("checking the database for other processes' commits failed")

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self._safety_seconds if self._inotify is not None else POLL_SECONDS)
            self._check_logged()
