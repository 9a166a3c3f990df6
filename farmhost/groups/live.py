"""GroupRegistry: the daemon's one copy of the registered groups in memory, and who is told when they change.

The groups table (`farmhost/store/groups.py`) is the truth; this is the daemon's view of it. Whatever in the daemon
keeps something per group (the IPC directories it serves, the agent runtime's and the sites' lookups) reads it
here and subscribes to its announcements instead of reading or polling the table on its own. What must agree
with a write in the same transaction (registering, a task's claim, an outbox row's target) still reads the table in
that transaction.

`reload()` re-reads the table and announces what differs, at once, to every subscriber. It is called:

- after a commit of the daemon's own: a `register_group` / `refresh_groups` request (the IPC service) or a chat
  approved in Telegram (its `on_groups_changed`);
- after another process committed (`farmhost group add|remove`): the daemon's one `CommitWatcher` calls it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from farmhost.store import groups as store
from farmhost.store.db import Database
from farmhost.store.groups import Group

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GroupChange:
    """What one reload found, each in folder order: groups registered, unregistered, and changed (new fields)."""

    added: tuple[Group, ...] = ()
    removed: tuple[Group, ...] = ()
    changed: tuple[Group, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed)


GroupListener = Callable[[GroupChange], None]


class GroupRegistry:
    """The registered groups, by folder, as of the last reload."""

    def __init__(self, db: Database) -> None:
        """Read the table (a few rows): the registry is current from the start; nobody is told about this read."""
        self._db = db
        self._groups = {group.folder: group for group in store.list_groups(db.conn)}
        self._listeners: list[GroupListener] = []

    @property
    def groups(self) -> list[Group]:
        """Every registered group, in folder order."""
        return list(self._groups.values())

    def get(self, folder: str) -> Group | None:
        """The group of `folder` (exact, case-sensitive), if registered."""
        return self._groups.get(folder)

    def main(self) -> Group | None:
        """The main group, if one is registered."""
        return next((group for group in self._groups.values() if group.is_main), None)

    def subscribe(self, listener: GroupListener) -> None:
        """Call `listener(change)` after every reload that changed something (on the event loop)."""
        self._listeners.append(listener)

    def unsubscribe(self, listener: GroupListener) -> None:
        """Stop telling `listener`."""
        if listener in self._listeners:
            self._listeners.remove(listener)

    def reload(self) -> None:
        """Re-read the table and tell every subscriber what differs (nobody, when nothing did)."""
        current = {group.folder: group for group in store.list_groups(self._db.conn)}
        change = GroupChange(
            added=tuple(group for folder, group in current.items() if folder not in self._groups),
            removed=tuple(group for folder, group in self._groups.items() if folder not in current),
            changed=tuple(
                group for folder, group in current.items() if folder in self._groups and self._groups[folder] != group
            ),
        )
        self._groups = current
        if change:
            for listener in list(self._listeners):
                try:
                    listener(change)
                except Exception:  # one subscriber's bug must not keep the others on the old registry
                    logger.exception("group registry listener %r failed", listener)
