"""Publishing results: `action_results/<requestId>.json` written at most once per claimed request file.

A result is prepared under a temp name and fsync'd (in a thread), the temp name is recorded against the claimed
file (for a read, in the same transaction that stores the request's result: `FileAnswer`), then the rename
publishes it. A kill -9 anywhere leaves a state the restart reads exactly: no record, write it; a
record and the temp file, publish that; a record and no temp file, it was published (and maybe collected and
deleted by the agent already), so nothing is written again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any

from farmhost.files import commit_atomic, create_unsynced, discard, dump_json, temp_target
from farmhost.ipc.fsyncs import FsyncBatch
from farmhost.ipc.phases import LEDGER, RESULT, RequestPhases
from farmhost.ipc.quarantine import Quarantine
from farmhost.protocol.codes import RESULTS_DIR
from farmhost.store import ledger
from farmhost.store.db import Database

if TYPE_CHECKING:
    from farmhost.ipc.processor import ClaimedFile

logger = logging.getLogger(__name__)


class ResultWriter:
    """Writes the result of a claimed request file into its group's results directory."""

    def __init__(self, *, db: Database, quarantine: Quarantine, clock: Callable[[], datetime]) -> None:
        self._db = db
        self._quarantine = quarantine
        self._clock = clock
        self._fsyncs = FsyncBatch()
        self._answering = 0  # requests between their ledger lookup and their log line (`answering`)

    @contextlib.contextmanager
    def answering(self) -> Iterator[None]:
        """Around one request's answer: a result prepared while it is the only one may be fsync'd on the loop."""
        self._answering += 1
        try:
            yield
        finally:
            self._answering -= 1

    def answer_for(self, item: ClaimedFile, file_key: str, request_id: str) -> FileAnswer:
        """The result of `item`, to be prepared while its ledger row is written (`Router.execute`'s `sink`)."""
        return FileAnswer(self, item, file_key, request_id)

    async def publish(
        self,
        item: ClaimedFile,
        request_id: str,
        document: dict[str, object],
        *,
        fsync_dir: bool,
        phases: RequestPhases | None = None,
        key: str | None = None,
        looked_up: tuple[str | None] | None = None,
    ) -> bool:
        """Write the result unless this very file's result was published before; False to retry later.

        Args:
            item: the claimed request file.
            request_id: the id the result is published under (`<requestId>.json`).
            document: the result.
            fsync_dir: fsync the results directory after the rename (a state change's result).
            phases: where the time goes.
            key: the file's `file_key`, if the caller has it.
            looked_up: what `ledger.answering` gave for this file, if the caller read it already (only this
                file's own processing writes that row, so it is not read again).
        """
        phases = phases or RequestPhases()
        key = key or file_key(item)
        folder = item.group.folder
        name = result_name(request_id)
        try:
            results_fd = item.gdir.results_fd()
        except OSError as err:
            logger.error("group %s: cannot open action_results/: %s", folder, err)
            return False
        # fsync can take milliseconds on an SD card: in threads, it never stalls another group's queue. The
        # descriptor is closed here, after the last thread returned, so nothing can use its number afterwards.
        try:
            phases.lap(RESULT)
            tmp = looked_up[0] if looked_up is not None else ledger.answering(self._db.conn, folder, key, request_id)
            phases.lap(LEDGER)
            if tmp is not None:
                return await asyncio.to_thread(self._finish_sync, item, results_fd, tmp, name, fsync_dir)
            tmp = await self.prepare_file(results_fd, item, name, dump_json(document))
            if tmp is None:
                return False
            phases.lap(RESULT)
            with self._db.tx(durable=False) as conn:
                self.record_answering(conn, item, key, request_id, tmp)
            phases.lap(LEDGER)
            return await self.commit(item, results_fd, key, request_id, tmp, fsync_dir)
        finally:
            os.close(results_fd)

    @property
    def alone(self) -> bool:
        """At most one request is being answered (the caller's own): nothing to batch its fsync or commit with."""
        return self._answering <= 1

    async def prepare_file(self, results_fd: int, item: ClaimedFile, name: str, data: bytes) -> str | None:
        """Create, write and fsync the result under a temp name; None when it cannot be."""
        # The create and the write (into the page cache) run on the loop; the fsync, which can take milliseconds,
        # in a thread shared with the other results prepared in the same turn (`FsyncBatch`).
        try:
            tmp, fd = create_unsynced(results_fd, name, data)
        except OSError as err:
            logger.error("group %s: cannot write result %s: %s", item.group.folder, name, err)
            return None
        try:
            await self._fsyncs.sync_and_close(fd, alone=self.alone)
        except OSError as err:
            discard(results_fd, tmp)
            logger.error("group %s: cannot write result %s: %s", item.group.folder, name, err)
            return None
        except BaseException:
            discard(results_fd, tmp)
            raise
        return tmp

    def record_answering(
        self, conn: sqlite3.Connection, item: ClaimedFile, key: str, request_id: str, tmp: str
    ) -> None:
        """Name a prepared result in the ledger (in the caller's transaction)."""
        ledger.mark_answering(
            conn, folder=item.group.folder, file_key=key, request_id=request_id, result_tmp=tmp, at=self._clock()
        )

    async def commit(
        self, item: ClaimedFile, results_fd: int, key: str, request_id: str, tmp: str, fsync_dir: bool
    ) -> bool:
        """Publish a prepared and recorded result; on failure forget it, so the next attempt prepares it again.

        A rename alone is microseconds: it runs on the loop. Only the directory's fsync (a state change's
        result) or a directory planted where the result goes takes a thread.
        """
        name = result_name(request_id)
        if fsync_dir:
            published = await asyncio.to_thread(self._commit_sync, item, results_fd, tmp, name, fsync_dir)
        else:
            try:
                commit_atomic(results_fd, tmp, name)
                published = True
            except IsADirectoryError:
                published = await asyncio.to_thread(self._commit_sync, item, results_fd, tmp, name, fsync_dir)
            except OSError as err:
                logger.error("group %s: cannot publish result %s: %s", item.group.folder, name, err)
                published = False
        if published:
            return True
        discard(results_fd, tmp)
        with self._db.tx(durable=False) as conn:
            ledger.forget_answering(conn, item.group.folder, key, request_id)
        return False

    def _finish_sync(self, item: ClaimedFile, results_fd: int, tmp: str, name: str, fsync_dir: bool) -> bool:
        try:
            os.stat(tmp, dir_fd=results_fd, follow_symlinks=False)
        except FileNotFoundError:
            # Published before the host died; the agent may have collected it since: never a second copy.
            logger.info("group %s: the result %s was published before the restart", item.group.folder, name)
            return True
        return self._commit_sync(item, results_fd, tmp, name, fsync_dir)

    def _commit_sync(self, item: ClaimedFile, results_fd: int, tmp: str, name: str, fsync_dir: bool) -> bool:
        try:
            try:
                commit_atomic(results_fd, tmp, name, fsync_dir=fsync_dir)
            except IsADirectoryError:
                # The agent planted a directory where the result goes; left there, it would block the queue.
                with contextlib.suppress(FileNotFoundError):
                    self._quarantine.evict(
                        results_fd,
                        name,
                        os.stat(name, dir_fd=results_fd, follow_symlinks=False),
                        folder=item.group.folder,
                        queue=RESULTS_DIR,
                        reason=f"a directory stood at {RESULTS_DIR}/{name}, where the host writes the result",
                        at=self._clock(),
                    )
                commit_atomic(results_fd, tmp, name, fsync_dir=fsync_dir)
        except OSError as err:
            logger.error("group %s: cannot publish result %s: %s", item.group.folder, name, err)
            return False
        return True


class FileAnswer:
    """The result of one claimed file, prepared before the ledger's one transaction and published after it.

    The order keeps a crash readable exactly as `publish`'s does: the temp file exists (fsync'd) before the row
    that names it commits, and the rename comes after. The row goes into the transaction that stores the
    request's result, so a read costs the ledger one transaction instead of two.
    """

    def __init__(self, writer: ResultWriter, item: ClaimedFile, key: str, request_id: str) -> None:
        self._writer = writer
        self._item = item
        self._key = key
        self._name = result_name(request_id)
        self._request_id = request_id
        self._fd: int | None = None
        self.tmp: str | None = None  # the prepared result's temp name
        self.recorded = False  # named in a committed ledger transaction: `publish` it
        self.failed = False  # the result could not be prepared: the request stays in the spool for a retry

    async def prepare(self, document: dict[str, Any], data: bytes) -> bool:
        """Write the result (`data`) under its temp name; False when that failed (the ledger row is written anyway)."""
        try:
            self._fd = self._item.gdir.results_fd()
        except OSError as err:
            logger.error("group %s: cannot open action_results/: %s", self._item.group.folder, err)
            self.failed = True
            return False
        self.tmp = await self._writer.prepare_file(self._fd, self._item, self._name, data)
        self.failed = self.tmp is None
        return not self.failed

    def record(self, conn: sqlite3.Connection) -> None:
        """Name the prepared temp file in the ledger, inside the transaction that stores the request's result."""
        assert self.tmp is not None
        self._writer.record_answering(conn, self._item, self._key, self._request_id, self.tmp)

    def committed(self) -> None:
        """The transaction that names the prepared result committed: `publish` it."""
        self.recorded = True

    @property
    def alone(self) -> bool:
        """No other request is being answered: its transaction need not wait for others to share it."""
        return self._writer.alone

    async def publish(self, *, fsync_dir: bool) -> bool:
        """Rename the prepared, recorded result into place; False to retry later."""
        assert self._fd is not None and self.tmp is not None
        return await self._writer.commit(self._item, self._fd, self._key, self._request_id, self.tmp, fsync_dir)

    def close(self) -> None:
        """Close the results directory (after the last thread that used it returned).

        A result prepared but never named in the ledger (its transaction failed) is removed: no restart would
        publish it.
        """
        if self._fd is not None:
            if self.tmp is not None and not self.recorded:
                discard(self._fd, self.tmp)
            os.close(self._fd)
            self._fd = None


def file_key(item: ClaimedFile) -> str:
    """What identifies one claimed file across a restart: its name, inode and mtime (all survive the claim)."""
    return key_of(item, os.stat(item.name, dir_fd=item.spool_fd, follow_symlinks=False))


def key_of(item: ClaimedFile, info: os.stat_result) -> str:
    """`file_key` from the file's `stat` (or the `fstat` of the descriptor it was read through) taken already."""
    return f"{item.queue.value}/{os.fsencode(item.name).hex()}/{info.st_ino}/{info.st_mtime_ns}"


def result_name(request_id: str) -> str:
    """The file in `action_results/` that answers `request_id`."""
    return f"{request_id}.json"


def prepared_for(tmp: str) -> str | None:
    """The request id a prepared result's temp file (`create_unsynced` of its `result_name`) is for, or None."""
    target = temp_target(tmp)
    return target.removesuffix(".json") if target is not None and target.endswith(".json") else None
