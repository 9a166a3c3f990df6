"""Publishing results: `action_results/<requestId>.json` written at most once per claimed request file.

A result is prepared under a temp name and fsync'd, the temp name is recorded against the claimed file, then
the rename publishes it. A kill -9 anywhere leaves a state the restart reads exactly: no record, write it; a
record and the temp file, publish that; a record and no temp file, it was published (and maybe collected and
deleted by the agent already), so nothing is written again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

from farmhost.files import commit_atomic, discard, dump_json, prepare_atomic
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

    async def publish(
        self,
        item: ClaimedFile,
        request_id: str,
        document: dict[str, object],
        *,
        fsync_dir: bool,
        phases: RequestPhases | None = None,
    ) -> bool:
        """Write the result unless this very file's result was published before; False to retry later."""
        phases = phases or RequestPhases()
        key = file_key(item)
        folder = item.group.folder
        name = f"{request_id}.json"
        try:
            results_fd = item.gdir.results_fd()
        except OSError as err:
            logger.error("group %s: cannot open action_results/: %s", folder, err)
            return False
        # fsync can take milliseconds on an SD card: in threads, it never stalls another group's queue. The
        # descriptor is closed here, after the last thread returned, so nothing can use its number afterwards.
        try:
            phases.lap(RESULT)
            tmp = ledger.answering(self._db.conn, folder, key)
            phases.lap(LEDGER)
            if tmp is not None:
                return await asyncio.to_thread(self._finish_sync, item, results_fd, tmp, name, fsync_dir)
            try:
                tmp = await asyncio.to_thread(prepare_atomic, results_fd, name, dump_json(document))
            except OSError as err:
                logger.error("group %s: cannot write result %s: %s", folder, request_id, err)
                return False
            phases.lap(RESULT)
            with self._db.tx(durable=False) as conn:
                ledger.mark_answering(
                    conn, folder=folder, file_key=key, request_id=request_id, result_tmp=tmp, at=self._clock()
                )
            phases.lap(LEDGER)
            if await asyncio.to_thread(self._commit_sync, item, results_fd, tmp, name, fsync_dir):
                return True
            await asyncio.to_thread(discard, results_fd, tmp)
            with self._db.tx(durable=False) as conn:
                ledger.forget_answering(conn, folder, key)
            return False
        finally:
            os.close(results_fd)

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


def file_key(item: ClaimedFile) -> str:
    """What identifies one claimed file across a restart: its name, inode and mtime (all survive the claim)."""
    info = os.stat(item.name, dir_fd=item.spool_fd, follow_symlinks=False)
    return f"{item.queue.value}/{os.fsencode(item.name).hex()}/{info.st_ino}/{info.st_mtime_ns}"
