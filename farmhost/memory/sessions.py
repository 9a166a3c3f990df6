"""The chat messages a folder's corpus holds: the latest of the folder's chats, kept up to date by transcript id.

Transcript rows are only ever inserted, with ever higher ids, so once a window is loaded a search needs only the
rows above the newest id it holds: one index range on the event loop, bounded by `NEW_ROWS_ON_LOOP`, while the
tokenising happens in the search's worker thread. More new rows than that are read in the worker thread, on a
connection of its own (the daemon's connection belongs to the event loop). So is the whole window: on the first
search, when the chats bound to the folder change (a group removed, or a chat registered under another folder),
after more new rows than the window holds, and when rows it holds are gone. Only another connection could
delete rows (farmhost never does), so the held rows are counted (in the thread) only after another connection
committed (`data_version`).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from farmhost.memory.corpus import MemoryCorpus, SessionDoc
from farmhost.store import groups, transcripts
from farmhost.store.db import Database, connect_query_only

# More new rows than this since the last search are read in the worker thread instead of on the event loop.
NEW_ROWS_ON_LOOP: Final = 256


@dataclass(slots=True)
class WindowStats:
    """Counters that show what the window read (observable by tests and the benchmark).

    Attributes:
        loads: Windows read in full.
        rows_fetched: Transcript rows read, by loads and by the searches in between.
        checks: Counts of the held rows (in the worker thread) after another connection committed.
    """

    loads: int = 0
    rows_fetched: int = 0
    checks: int = 0


@dataclass(frozen=True, slots=True)
class SessionUpdate:
    """What a search does to the corpus's messages: planned on the event loop, applied in the worker thread.

    Attributes:
        jids: The chats bound to the folder now.
        new: Messages above the newest one held, oldest first.
        catch_up: More new messages than the loop reads: the thread reads those above the newest one held.
        reload: Read the window of `jids` anew (then `new` is empty).
        verify: Another connection committed since the last search: the thread counts the rows held, and
            reloads the window when some are gone.
    """

    jids: tuple[str, ...]
    new: tuple[SessionDoc, ...] = ()
    catch_up: bool = False
    reload: bool = False
    verify: bool = False


class SessionWindow:
    """The latest `limit` messages of one folder's chats, as held by that folder's corpus.

    `plan` runs on the event loop and `apply` in the worker thread, one search at a time (the caller's lock).
    """

    def __init__(self, folder: str, *, limit: int = transcripts.RECENT_LIMIT, batch: int = NEW_ROWS_ON_LOOP) -> None:
        """Nothing is read until the first `plan`.

        Args:
            folder: The group folder whose chats are searched.
            limit: How many of the latest messages are held.
            batch: The most new rows one search reads on the event loop.
        """
        if limit < 1 or batch < 1:
            raise ValueError("limit and batch must be at least 1")
        self._folder = folder
        self._limit = limit
        self._batch = batch
        self._jids: tuple[str, ...] | None = None  # None: no window loaded yet
        self._version: int | None = None
        self._count = self._first = self._last = 0
        self.stats = WindowStats()

    def plan(self, db: Database | None) -> SessionUpdate:
        """What the next search must change (on the event loop: a few small queries on the daemon's connection).

        Args:
            db: The daemon's database; None searches no chat at all.
        """
        if db is None:
            return SessionUpdate((), reload=self._jids != ())
        group = groups.get_group(db.conn, self._folder)
        jids = () if group is None else (group.jid,)  # a registered group has exactly one chat
        version = db.data_version()
        if jids != self._jids:
            self._version = version
            return SessionUpdate(jids, reload=True)
        if not jids:
            return SessionUpdate(jids)
        verify = version != self._version
        self._version = version
        rows = transcripts.since(db.conn, jids, self._last, limit=self._batch + 1)
        self.stats.rows_fetched += len(rows)
        if len(rows) > self._batch:
            return SessionUpdate(jids, catch_up=True, verify=verify)
        return SessionUpdate(jids, new=_docs(rows), verify=verify)

    @staticmethod
    def reads(update: SessionUpdate, db_path: Path | None) -> bool:
        """Whether `apply` reads the database for `update` (else it only adds the few messages `plan` fetched)."""
        return db_path is not None and bool(update.jids) and (update.reload or update.catch_up or update.verify)

    def apply(self, corpus: MemoryCorpus, update: SessionUpdate, db_path: Path | None) -> None:
        """Bring the corpus's messages up to date (in the worker thread: it may read up to `limit` rows).

        Args:
            corpus: The folder's corpus.
            update: What `plan` said.
            db_path: The database file the thread reads (on its own connection); None for no chat.
        """
        self._jids = None  # until the corpus is up to date: a failure here makes the next search reload
        full, docs = update.reload, update.new
        if db_path is not None and self.reads(update, db_path):
            with closing(connect_query_only(db_path)) as conn:
                if update.verify and not full:
                    self.stats.checks += 1
                    full = transcripts.count_between(conn, update.jids, self._first, self._last) != self._count
                if update.catch_up and not full:
                    rows = transcripts.since(conn, update.jids, self._last, limit=self._limit + 1)
                    self.stats.rows_fetched += len(rows)
                    full = len(rows) > self._limit  # more than the window: only its latest `limit` stay
                    docs = _docs(rows)
                if full:
                    rows = transcripts.latest(conn, update.jids, limit=self._limit)
                    self.stats.rows_fetched += len(rows)
                    docs = _docs(rows)
        if full:
            corpus.clear_sessions()
            self.stats.loads += 1
        corpus.add_sessions(docs, keep=self._limit)
        self._jids = update.jids
        self._count, self._first, self._last = corpus.session_span()


def _docs(rows: Sequence[transcripts.MessageRow]) -> tuple[SessionDoc, ...]:
    return tuple(
        SessionDoc(id=r.id, text=r.text, chat_jid=r.chat_jid, sender=r.sender, sent_at=r.sent_at) for r in rows
    )
