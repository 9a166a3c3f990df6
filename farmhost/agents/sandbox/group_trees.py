"""GroupTrees: a run's set-up and clean-up of its writable trees, costing what changed since the last run.

Before each run the host hands the group's writable trees to its uid, clears setuid/setgid bits and counts them
all against the group's limit (group_disk.py); after it, it clears the bits again. Done by full walks
that cost seconds at hundreds of thousands of files (issue 33). A root daemon keeps a TreeJournal per tree
(`farmhost/agents/sandbox/tree_journal.py`) and re-walks only the directories the kernel saw change, with everything the
full walk does on each of their entries. A daemon that is not root shares its uid with the agents (whose runs could
use up that uid's inotify watches), runs without the seccomp filter (which refuses hard links, a way to write
into a file of an unchanged directory), and a tree the journal lost keep the full walks of `sandbox.py` and
`group_disk.py` (docs/security.md#run-set-up-and-clean-up-cost-what-changed).
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from pathlib import Path

from farmhost.agents.sandbox.backends.base import SandboxSpec
from farmhost.agents.sandbox.group_disk import MAX_DEPTH, DiskLimit, check_group_sync
from farmhost.agents.sandbox.identity import AgentIdentity, clear_setid_sync, own_at
from farmhost.agents.sandbox.mounts import IPC_DIR, after_run_sync, prepare_mounts_sync
from farmhost.agents.sandbox.tree_journal import JournalLost, JournalVisit, TreeJournal
from farmhost.agents.sandbox.treewalk import clear_setid_at

logger = logging.getLogger(__name__)


class GroupTrees:
    """The journals of every group's writable trees (a root daemon's), kept between runs."""

    def __init__(self, *, journal: bool) -> None:
        """No tree journalled yet: each group's first run walks its trees whole.

        `journal`: runs cannot make hard links (the seccomp filter refuses them), so journals may be kept.
        """
        self._journal_ok = journal
        self._journals: dict[Path, TreeJournal] = {}
        # Entries the last set-up and the last clean-up visited, -1 for a full walk (for the figures and the tests).
        self.setup_walked = 0
        self.cleanup_walked = 0

    def close(self) -> None:
        """Drop every journal (the daemon stops)."""
        for journal in self._journals.values():
            journal.close()
        self._journals.clear()

    def prepare_sync(self, spec: SandboxSpec, identity: AgentIdentity | None) -> None:
        """Check the group's limit on disk, create its mounts' directories, hand them over, clear setid bits.

        Blocking: call it in a thread, while no run of the group is active.

        Raises:
            SandboxError: over the limit on disk (OverLimit, naming what to delete).
        """
        if identity is None or not identity.switch or not self._journal_ok:
            self.setup_walked = -1
            check_group_sync(spec)
            prepare_mounts_sync(spec, identity)
            return
        limit = DiskLimit.of_workspace_mb(spec.limits.workspace_mb)
        for mount in spec.mounts:
            mount.source.mkdir(parents=True, exist_ok=True)
        used_bytes = used_files = 0
        self.setup_walked = 0
        try:
            for mount in spec.writable:
                with contextlib.suppress(FileNotFoundError):
                    own_at(identity, None, str(mount.source), os.lstat(mount.source))
                journal = self._journal(mount.source, limit)
                journal.sync(_hand_over(identity, mount.source, whole=mount.target != IPC_DIR))
                self.setup_walked += journal.walked
                used_bytes += journal.bytes
                used_files += journal.files
        except JournalLost as err:
            logger.info("group %s: walking its trees whole (%s)", spec.folder, err)
            self.setup_walked = -1
            check_group_sync(spec)
            prepare_mounts_sync(spec, identity)
            return
        if used_bytes > limit.bytes or used_files > limit.files:
            check_group_sync(spec)  # the walk that names what to delete

    def after_run_sync(self, spec: SandboxSpec) -> int:
        """Clear setuid/setgid bits the run set in its writable trees; returns how many. Never raises."""
        journals = [self._journals.get(m.source) for m in spec.writable]
        if not all(journal is not None and journal.kept for journal in journals):
            self.cleanup_walked = -1
            return after_run_sync(spec)
        cleared = [0]
        walked, whole = 0, False
        for journal in journals:
            assert journal is not None
            try:
                journal.sync(_clear(journal.top, cleared))
                walked += journal.walked
                continue
            except (JournalLost, OSError) as err:
                logger.info("group %s: walking %s whole after the run (%s)", spec.folder, journal.top, err)
            whole = True
            # Walked whole anew into a fresh journal (a run that churned past the event queue costs this one walk,
            # its next set-up only what changed since), else by the plain walk, which any tree allows.
            with contextlib.suppress(JournalLost, OSError):
                journal.sync(_clear(journal.top, cleared))
                continue
            try:
                cleared[0] += clear_setid_sync([journal.top])
            except OSError as walk_err:
                logger.error("run %s of %s: the clean-up after it could not walk %s: %s", spec.run_id, spec.folder,
                             journal.top, walk_err)  # fmt: skip
        self.cleanup_walked = -1 if whole else walked
        return cleared[0]

    def _journal(self, top: Path, limit: DiskLimit) -> TreeJournal:
        journal = self._journals.get(top)
        if journal is None:
            journal = TreeJournal(top, max_depth=MAX_DEPTH, max_files=limit.files)
            self._journals[top] = journal
        return journal


def _hand_over(identity: AgentIdentity, top: Path, *, whole: bool) -> JournalVisit:
    """Give each entry to the agent's uid and clear setid bits, as identity.hand_over_sync does on a full walk.

    In the IPC directory only its first-level directories are given: the host's own files there stay the host's.
    """

    def visit(dir_fd: int, name: str, entry: os.stat_result, depth: int) -> None:
        if whole or (depth == 1 and stat.S_ISDIR(entry.st_mode)):
            own_at(identity, dir_fd, name, entry)
        if clear_setid_at(dir_fd, name, entry):
            logger.warning("%s: cleared the setuid/setgid bits an agent set on %s", top, name)

    return visit


def _clear(top: Path, cleared: list[int]) -> JournalVisit:
    def visit(dir_fd: int, name: str, entry: os.stat_result, depth: int) -> None:
        if clear_setid_at(dir_fd, name, entry):
            cleared[0] += 1
            logger.warning("%s: cleared the setuid/setgid bits an agent set on %s", top, name)

    return visit
