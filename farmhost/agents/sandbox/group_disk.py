"""GroupDisk: what one group holds on disk (every directory its runs can write into), in bytes and files, up to its limit.

The workspace limit (agent-limits.json `workspaceMb`) once covered only the workspace's bytes: a group kept 400 MB
in the root of its IPC directory, which no one measured, and 300,000 empty files that counted 7 MB but stretched
every later run's set-up and clean-up to seconds; the main group filled the dashboards directory its runs see at
/workspace/dashboard. Every writable mount of a run (`SandboxSpec.writable`: the workspace, the IPC directory, and
for main the dashboards) now counts against one limit in bytes and one in files (FILES_PER_MB for each MB of the
byte limit), measured before each run. The walk is descriptor-relative (no
path is ever built, so no depth is too long), never follows a link, and stops as soon as either limit is passed:
a group over its limit costs the host what the limit allows, not what the group piled up.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from farmhost.agents.sandbox.backends.base import SandboxError, SandboxSpec
from farmhost.files import DIR_FLAGS

# Files (any entry: file, directory, link) a group may hold per MB of its workspace limit: 1,024 MB allow 65,536,
# far above a workspace of notes, logs and a checked-out repository, and a walk of that many takes about 0.2 s.
FILES_PER_MB: Final = 64
# Directories deeper than this are not walked (each level holds a descriptor while its entries are read); a tree
# that deep is refused as it is, with where it is.
MAX_DEPTH: Final = 256


@dataclass(frozen=True, kw_only=True)
class DiskUse:
    """What a walk found: bytes on disk and entries, and which top-level entries hold the most."""

    bytes: int
    files: int
    complete: bool  # False: the walk stopped early, over a limit (the figures are then at least this much)
    too_deep: str | None  # the top-level entry holding a tree deeper than MAX_DEPTH, if one was found
    # (top-level entry, bytes, files), at most 3: the ones with the most bytes, and the ones with the most files
    heaviest: tuple[tuple[str, int, int], ...]
    most_files: tuple[tuple[str, int, int], ...]


@dataclass(frozen=True, kw_only=True)
class DiskLimit:
    """A group's limits on disk."""

    bytes: int
    files: int

    @classmethod
    def of_workspace_mb(cls, workspace_mb: int) -> DiskLimit:
        """The limits that follow from agent-limits.json `workspaceMb`."""
        return cls(bytes=workspace_mb * 2**20, files=workspace_mb * FILES_PER_MB)


class OverLimit(SandboxError):
    """The group holds more than its limit on disk; the message says what and what to delete."""


def measure_sync(roots: dict[str, Path], limit: DiskLimit) -> DiskUse:
    """Walk `roots` (a label such as `groups/field` to its directory) together, stopping past `limit`.

    Blocking: call it in a thread. A root that does not exist holds nothing.
    """
    total_bytes = total_files = 0
    by_top: Counter[str] = Counter()
    files_by_top: Counter[str] = Counter()
    too_deep: str | None = None

    def over() -> bool:
        return total_bytes > limit.bytes or total_files > limit.files

    for label, root in roots.items():
        try:
            fd = os.open(root, DIR_FLAGS)
        except FileNotFoundError:
            continue
        # One frame per open directory: its descriptor, its entries as they are read, the top-level entry it is in.
        stack: list[tuple[int, Iterator[os.DirEntry[str]], str]] = []
        try:
            stack.append((fd, os.scandir(fd), ""))
            while stack and not over():
                dir_fd, entries, top = stack[-1]
                entry = next(entries, None)
                if entry is None:
                    stack.pop()
                    _close(dir_fd, entries)
                    continue
                where = top or f"{label}/{entry.name}"
                try:
                    info = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                total_files += 1
                total_bytes += info.st_blocks * 512
                by_top[where] += info.st_blocks * 512
                files_by_top[where] += 1
                if not stat.S_ISDIR(info.st_mode):
                    continue
                if len(stack) >= MAX_DEPTH:
                    too_deep = too_deep or where
                    continue
                try:
                    child = os.open(entry.name, DIR_FLAGS, dir_fd=dir_fd)
                except (FileNotFoundError, NotADirectoryError):
                    continue
                try:
                    stack.append((child, os.scandir(child), where))
                except OSError:
                    os.close(child)
                    raise
        finally:
            for dir_fd, entries, _ in stack:
                _close(dir_fd, entries)
        if over():
            break
    return DiskUse(
        bytes=total_bytes,
        files=total_files,
        complete=not over(),
        too_deep=too_deep,
        heaviest=tuple((top, size, files_by_top[top]) for top, size in by_top.most_common(3)),
        most_files=tuple((top, by_top[top], files) for top, files in files_by_top.most_common(3)),
    )


def _close(fd: int, entries: Iterator[os.DirEntry[str]]) -> None:
    with contextlib.suppress(OSError):
        entries.close()  # type: ignore[attr-defined]
        os.close(fd)


def check_sync(roots: dict[str, Path], limit: DiskLimit, *, where: str) -> DiskUse:
    """Measure `roots` and refuse a group over `limit`.

    Args:
        roots: a label (how the operator finds it under the data directory) to each directory.
        limit: the group's limits.
        where: the setting the limit comes from, for the message.

    Raises:
        OverLimit: over the byte or the file limit, or a tree deeper than MAX_DEPTH; the message names the
            heaviest entries, to delete before the next run.
    """
    use = measure_sync(roots, limit)
    labels = [f"{label}/" for label in roots]
    names = " and ".join([", ".join(labels[:-1]), labels[-1]] if len(labels) > 2 else labels)
    at_least = "" if use.complete else "at least "
    most = "the most are in " if use.complete else "the most (counted up to the limit) are in "
    if use.too_deep is not None:
        raise OverLimit(
            f"the group's {names} hold a tree nested deeper than {MAX_DEPTH} directories in {use.too_deep}; "
            "delete it before the next run"
        )
    if use.files > limit.files:
        raise OverLimit(
            f"the group's {names} hold {at_least}{use.files} files, over its limit of {limit.files} "
            f"({FILES_PER_MB} per MiB of {where}); delete files before the next run, {most}"
            + ", ".join(f"{top} ({files} files)" for top, _, files in use.most_files)
        )
    if use.bytes > limit.bytes:
        raise OverLimit(
            f"the group's {names} hold {at_least}{use.bytes / 2**20:.0f} MiB, over its limit of "
            f"{limit.bytes // 2**20} MiB ({where}); delete files before the next run, {most}"
            + ", ".join(f"{top} ({size / 2**20:.0f} MiB)" for top, size, _ in use.heaviest)
        )
    return use


def writable_roots(spec: SandboxSpec) -> dict[str, Path]:
    """Every directory the run can write into, by its path: what counts against the group's limit."""
    return {str(mount.source): mount.source for mount in spec.writable}


def check_group_sync(spec: SandboxSpec) -> DiskUse:
    """`check_sync` on every directory the run can write into against its `workspaceMb` (blocking: in a thread).

    Raises:
        OverLimit: what the group holds over its limit, and what to delete.
    """
    limit = DiskLimit.of_workspace_mb(spec.limits.workspace_mb)
    return check_sync(writable_roots(spec), limit, where="agent-limits.json workspaceMb")
