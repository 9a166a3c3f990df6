"""GroupCommit: the non-durable writes queued in one turn of the event loop, committed in one transaction.

Under load, several groups' read requests reach the ledger in the same turn of the loop; each paid its own
BEGIN/COMMIT (a WAL append and the lock's round trip), the largest single cost of a ping on the loop. A write
queued here runs at the start of the next turn together with every other write queued meanwhile, in one
`BEGIN IMMEDIATE ... COMMIT` (`synchronous = NORMAL`: it survives kill -9, not a power cut, like `tx(durable=False)`).
Its writer awaits that commit before acting on it (renaming the result the row names), so what a crash leaves is
what it left with one transaction per request. A write that raises makes the batch roll back and every write of it
run again alone: one bad write fails only its own request. A writer cancelled before the commit is taken out; one
cancelled after it was committed has had its `on_commit` run already (there is no await in between).
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from farmhost.store.db import Database

Write = Callable[[sqlite3.Connection], None]


@dataclass(frozen=True, slots=True)
class _Queued:
    write: Write
    on_commit: Callable[[], None] | None
    done: asyncio.Future[None]


class GroupCommit:
    """Queues writes of one connection and commits them together at the next turn of the loop."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._queued: list[_Queued] = []

    async def write(self, write: Write, *, on_commit: Callable[[], None] | None = None, alone: bool = False) -> None:
        """Run `write` in the next shared transaction and return once it is committed.

        Args:
            write: the statements (no transaction control of its own); may run twice (a batch rolled back).
            on_commit: called right after the commit that holds `write`, before this returns (no await between).
            alone: nothing else is in progress that could share the commit: with nothing queued either, it is
                committed at once (the loop turn it would wait for has nobody to batch with).

        Raises:
            Exception: what `write` raised when it ran alone, or the commit's error (nothing of it was kept).
        """
        if alone and not self._queued:
            with self._db.tx(durable=False) as conn:
                write(conn)
            if on_commit is not None:
                on_commit()
            return
        loop = asyncio.get_running_loop()
        queued = _Queued(write, on_commit, loop.create_future())
        self._queued.append(queued)
        if len(self._queued) == 1:
            loop.call_soon(self._flush)
        try:
            await queued.done
        except asyncio.CancelledError:
            if queued in self._queued:
                self._queued.remove(queued)  # not run: the batch goes on without it
            raise

    def _flush(self) -> None:
        # A writer cancelled meanwhile had its future cancelled with it: its write is left out.
        batch = [queued for queued in self._queued if not queued.done.done()]
        self._queued = []
        if not batch:
            return
        try:
            with self._db.tx(durable=False) as conn:
                for queued in batch:
                    queued.write(conn)
        except Exception as err:  # noqa: BLE001 - handed to the writer that awaits it
            if len(batch) == 1:
                batch[0].done.set_exception(err)
                return
            for queued in batch:  # rolled back as a whole: each alone, so only the bad one fails
                self._alone(queued)
            return
        for queued in batch:
            _committed(queued)

    def _alone(self, queued: _Queued) -> None:
        try:
            with self._db.tx(durable=False) as conn:
                queued.write(conn)
        except Exception as err:  # noqa: BLE001 - handed to the writer that awaits it
            queued.done.set_exception(err)
            return
        _committed(queued)


def _committed(queued: _Queued) -> None:
    if queued.on_commit is not None:
        queued.on_commit()
    queued.done.set_result(None)
