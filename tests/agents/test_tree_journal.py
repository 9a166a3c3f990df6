"""The journal of a tree agrees with a full walk after any change: files, directories moved, deleted, grown."""

from __future__ import annotations

import os
import random
import shutil
import stat
from pathlib import Path

import pytest

from farmhost.agents.sandbox.group_disk import DiskLimit, measure_sync
from farmhost.agents.sandbox.tree_journal import JournalLost, TreeJournal

SETID = stat.S_ISUID | stat.S_ISGID


def _full(top: Path) -> tuple[int, int]:
    use = measure_sync({"t": top}, DiskLimit(bytes=2**60, files=2**60))
    return use.bytes, use.files


def _sync(journal: TreeJournal) -> list[str]:
    seen: list[str] = []
    journal.sync(lambda fd, name, entry, depth: seen.append(name))
    return seen


def _dirs(top: Path) -> list[Path]:
    return [Path(d) for d, _, _ in os.walk(top)]


def test_the_journal_agrees_with_a_full_walk_after_random_changes(tmp_path: Path) -> None:
    top = tmp_path / "tree"
    (top / "a" / "b").mkdir(parents=True)
    journal = TreeJournal(top, max_depth=256, max_files=100_000)
    rng = random.Random(33)
    try:
        _sync(journal)
        for step in range(300):
            dirs = _dirs(top)
            where = rng.choice(dirs)
            action = rng.choice(["file", "dir", "grow", "delete", "rename", "move", "rmtree"])
            files = [p for p in where.iterdir() if p.is_file()]
            subdirs = [p for p in where.iterdir() if p.is_dir()]
            if action == "file":
                (where / f"f{step}").write_bytes(b"x" * rng.randrange(0, 20_000))
            elif action == "dir":
                (where / f"d{step}").mkdir()
            elif action == "grow" and files:
                with rng.choice(files).open("ab") as f:
                    f.write(b"y" * 50_000)
            elif action == "delete" and files:
                rng.choice(files).unlink()
            elif action == "rename" and subdirs:
                rng.choice(subdirs).rename(where / f"r{step}")
            elif action == "move" and subdirs:
                moved = rng.choice(subdirs)
                target = rng.choice([d for d in dirs if not d.is_relative_to(moved)])
                moved.rename(target / f"m{step}")
            elif action == "rmtree" and subdirs and rng.random() < 0.3:
                shutil.rmtree(rng.choice(subdirs))
            if step % 7 == 0:
                _sync(journal)
                assert journal.kept and (journal.bytes, journal.files) == _full(top), step
        _sync(journal)
        assert (journal.bytes, journal.files) == _full(top)
    finally:
        journal.close()


def test_an_unchanged_tree_is_not_walked_and_a_changed_directory_is(tmp_path: Path) -> None:
    top = tmp_path / "tree"
    for d in range(20):
        (top / f"d{d}").mkdir(parents=True)
        for f in range(50):
            (top / f"d{d}" / f"f{f}").touch()
    journal = TreeJournal(top, max_depth=256, max_files=100_000)
    try:
        assert len(_sync(journal)) == 20 + 20 * 50
        assert _sync(journal) == []
        os.chmod(top / "d3" / "f7", 0o4755)  # an existing file: its directory's entries are unchanged
        assert sorted(_sync(journal)) == sorted(f"f{f}" for f in range(50)), "d3 is walked again, alone"
        (top / "d5" / "deep" / "er").mkdir(parents=True)
        assert sorted(_sync(journal)) == ["deep", "er"] + sorted(f"f{f}" for f in range(50))
    finally:
        journal.close()


def test_a_first_walk_over_the_limit_is_not_kept(tmp_path: Path) -> None:
    top = tmp_path / "tree"
    (top / "many").mkdir(parents=True)
    for f in range(30):
        (top / "many" / f"f{f}").touch()
    journal = TreeJournal(top, max_depth=256, max_files=10)
    with pytest.raises(JournalLost, match="holds over 10 entries"):
        _sync(journal)
    assert not journal.kept
    assert journal.walked == 11, "it stops at the limit, even inside one directory"


def test_a_file_with_two_names_drops_the_journal(tmp_path: Path) -> None:
    """Written through one name, the other's directory would hear nothing: the caller walks in full instead."""
    top = tmp_path / "tree"
    (top / "a").mkdir(parents=True)
    (top / "b").mkdir()
    (top / "a" / "f").write_text("x")
    journal = TreeJournal(top, max_depth=256, max_files=100)
    try:
        _sync(journal)
        os.link(top / "a" / "f", top / "b" / "g")  # made by the operator between runs (runs cannot)
        with pytest.raises(JournalLost, match="more than one name"):
            _sync(journal)
        assert not journal.kept
    finally:
        journal.close()
