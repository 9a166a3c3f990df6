"""Tests for farmhost.memory.watch through MemoryCorpus: real files, real inotify, no sleeps.

`stats.listings` counts the roots a search listed, so each test shows both that an edit is seen by the
next search and whether that search had to list anything to see it.
"""

from __future__ import annotations

import gc
import logging
import os
import resource
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from farmhost_testing import inotify_instances, write_tree

from farmhost.memory.corpus import MemoryCorpus
from farmhost.memory.watch import MAX_WATCHED_DIRS, REVALIDATE_SECONDS, MemoryWatch

FILES = {
    "field/MEMORY.md": "# Farm\nThe north field grows tomatoes.\n",
    "field/memory/pt/campo.md": "# Campo\nO milho precisa de água.\n",
    "field/memory/pl/pole.md": "# Pole\nŻółte pomidory w szklarni.\n",
    "global/MEMORY.md": "# Rules\nNever open the main valve.\n",
    "global/memory/appliance.md": "# Appliance\nThe pump is switch.pump_north.\n",
}


@pytest.fixture
def roots(tmp_path: Path) -> dict[str, Path]:
    write_tree(tmp_path, FILES)
    return {"field": tmp_path / "field", "global": tmp_path / "global"}


@pytest.fixture
def corpus(roots: dict[str, Path]) -> MemoryCorpus:
    corpus = MemoryCorpus(roots)
    assert corpus.search("tomatoes")
    assert corpus.stats.listings == 2  # the first search lists both roots
    return corpus


def _paths(corpus: MemoryCorpus, query: str) -> set[tuple[str, str]]:
    return {(h.root, h.path) for h in corpus.search(query, top_k=20)}


def _in_place(ws: Path) -> None:
    with open(ws / "MEMORY.md", "r+", encoding="utf-8") as handle:  # same inode, truncated and rewritten
        handle.truncate(0)
        handle.write("# Farm\nThe north field grows cucumbers now.\n")


def _append(ws: Path) -> None:
    with open(ws / "memory/pt/campo.md", "a", encoding="utf-8") as handle:
        handle.write("\nA cucumbers horta foi plantada.\n")


def _replace_by_rename(ws: Path) -> None:
    (ws / "MEMORY.md.tmp").write_text("# Farm\nThe north field grows cucumbers.\n")
    os.replace(ws / "MEMORY.md.tmp", ws / "MEMORY.md")


def _new_nested_dir(ws: Path) -> None:
    (ws / "memory/new/deeper").mkdir(parents=True)
    (ws / "memory/new/deeper/x.md").write_text("cucumbers in the new bed\n")  # right after the mkdir


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (_in_place, {("field", "MEMORY.md")}),
        (_append, {("field", "memory/pt/campo.md")}),
        (_replace_by_rename, {("field", "MEMORY.md")}),
        (_new_nested_dir, {("field", "memory/new/deeper/x.md")}),
    ],
    ids=["in-place", "append", "replace-by-rename", "new-nested-dir"],
)
def test_an_edit_is_seen_by_the_next_search(
    corpus: MemoryCorpus, roots: dict[str, Path], edit: Callable[[Path], None], expected: set[tuple[str, str]]
) -> None:
    assert _paths(corpus, "cucumbers") == set()
    assert corpus.stats.listings == 2
    edit(roots["field"])
    assert _paths(corpus, "cucumbers") == expected
    assert corpus.stats.listings == 3  # the field root only


def test_a_deleted_file_is_dropped(corpus: MemoryCorpus, roots: dict[str, Path]) -> None:
    assert _paths(corpus, "milho") == {("field", "memory/pt/campo.md")}
    (roots["field"] / "memory/pt/campo.md").unlink()
    assert _paths(corpus, "milho") == set()
    (roots["global"] / "MEMORY.md").unlink()
    assert _paths(corpus, "valve") == set()
    assert corpus.stats.listings == 4


def test_a_file_in_a_directory_made_after_the_listing_is_seen(corpus: MemoryCorpus, roots: dict[str, Path]) -> None:
    (roots["field"] / "memory/later").mkdir()
    assert _paths(corpus, "cucumbers") == set()  # lists field: the new directory is watched from now on
    (roots["field"] / "memory/later/x.md").write_text("cucumbers\n")
    assert _paths(corpus, "cucumbers") == {("field", "memory/later/x.md")}
    (roots["field"] / "memory/later/sub").mkdir()
    (roots["field"] / "memory/later/sub/y.md").write_text("cucumbers again\n")
    assert _paths(corpus, "cucumbers") == {("field", "memory/later/x.md"), ("field", "memory/later/sub/y.md")}
    assert corpus.stats.listings == 5


def test_a_renamed_directory_is_followed(corpus: MemoryCorpus, roots: dict[str, Path]) -> None:
    ws = roots["field"]
    os.rename(ws / "memory/pt", ws / "memory/portugues")
    assert _paths(corpus, "milho") == {("field", "memory/portugues/campo.md")}
    with open(ws / "memory/portugues/campo.md", "a", encoding="utf-8") as handle:
        handle.write("cucumbers\n")
    assert _paths(corpus, "cucumbers") == {("field", "memory/portugues/campo.md")}
    os.rename(ws / "memory", ws / "old-memory")  # out of the walk: its watches are dropped
    assert _paths(corpus, "milho") == set()
    listings = corpus.stats.listings
    (ws / "old-memory/portugues/campo.md").write_text("cucumbers\n")
    (ws / "old-memory/z.md").write_text("cucumbers\n")
    assert _paths(corpus, "cucumbers") == set()
    assert corpus.stats.listings == listings  # a directory no longer walked is no longer watched


def test_a_memory_dir_replaced_by_a_symlink_is_not_followed(
    corpus: MemoryCorpus, roots: dict[str, Path], tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "secret.md").write_text("cucumbers secret\n")
    ws = roots["field"]
    os.rename(ws / "memory", ws / "memory.old")
    (ws / "memory").symlink_to(outside)
    assert _paths(corpus, "milho cucumbers") == set()
    listings = corpus.stats.listings
    (outside / "secret.md").write_text("cucumbers secret, rewritten\n")
    (outside / "sub" / "more.md").write_text("cucumbers\n")
    (outside / "new.md").write_text("cucumbers\n")
    assert _paths(corpus, "cucumbers") == set()
    assert corpus.stats.listings == listings  # nothing outside the workspace is watched
    (ws / "memory").unlink()
    os.rename(ws / "memory.old", ws / "memory")
    assert _paths(corpus, "milho") == {("field", "memory/pt/campo.md")}


def test_a_subdirectory_replaced_by_a_symlink_is_not_followed(
    corpus: MemoryCorpus, roots: dict[str, Path], tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "campo.md").write_text("cucumbers\n")
    ws = roots["field"]
    shutil.rmtree(ws / "memory/pt")
    (ws / "memory/pt").symlink_to(outside)
    assert _paths(corpus, "milho cucumbers") == set()
    listings = corpus.stats.listings
    (outside / "campo.md").write_text("cucumbers, milho\n")
    assert _paths(corpus, "milho cucumbers") == set()
    assert corpus.stats.listings == listings


def test_touching_only_the_mtime_is_seen(corpus: MemoryCorpus, roots: dict[str, Path]) -> None:
    chunked = corpus.stats.files_chunked
    path = roots["global"] / "memory/appliance.md"
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns - 10**9))
    assert _paths(corpus, "pump") == {("global", "memory/appliance.md")}
    assert corpus.stats.listings == 3
    assert corpus.stats.files_chunked == chunked + 1  # its signature changed, so it was read again


def test_unchanged_roots_are_not_listed_again(corpus: MemoryCorpus, roots: dict[str, Path]) -> None:
    for query in ["tomatoes", "valve", "milho", "pomidory", "nothing"] * 4:
        corpus.search(query)
    assert corpus.stats.listings == 2
    assert corpus.stats.searches == 21

    ws = roots["field"]
    (ws / "notes.md").write_text("cucumbers")  # not memory: the root's other entries are ignored
    (ws / "logs").mkdir()
    (ws / "logs" / "run-1.log").write_text("cucumbers")
    (ws / "memory" / "note.txt").write_text("cucumbers")  # not *.md
    assert _paths(corpus, "cucumbers") == set()
    assert corpus.stats.listings == 2

    chunked = corpus.stats.files_chunked
    (roots["global"] / "memory" / "appliance.md").write_text("The pump is switch.pump_south now.\n")
    assert _paths(corpus, "pump_south") == {("global", "memory/appliance.md")}
    assert corpus.stats.listings == 3  # only the global root was listed
    assert corpus.stats.files_chunked == chunked + 1
    corpus.search("pump_south")
    assert corpus.stats.listings == 3


def test_a_hard_linked_file_is_not_searched_and_its_root_re_listed_until_it_has_one_link_again(
    roots: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    ws = roots["field"]
    other = ws / "pole-link.md"  # outside memory/: a directory that is not watched for it
    os.link(ws / "memory/pl/pole.md", other)
    corpus = MemoryCorpus(roots)
    with caplog.at_level(logging.WARNING, logger="farmhost.memory.watch"):
        assert _paths(corpus, "pomidory") == set()  # memory_get refuses a file of two links: never cited
        with open(other, "a", encoding="utf-8") as handle:
            handle.write("cucumbers by the other link\n")
        assert _paths(corpus, "cucumbers") == set()
        corpus.search("cucumbers")
    assert corpus.stats.listings == 2 + 1 + 1  # the linked root at every search, the global root once
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1, warnings
    assert "memory/pl/pole.md has more than one hard link" in warnings[0]

    other.unlink()  # one link again: found at the next search, with what was written through the other link
    assert _paths(corpus, "cucumbers") == {("field", "memory/pl/pole.md")}
    listings = corpus.stats.listings
    corpus.search("cucumbers")
    assert corpus.stats.listings == listings  # watched again from here


def test_a_hard_link_made_after_the_listing_is_seen_within_the_revalidation_bound(roots: dict[str, Path]) -> None:
    now = [100.0]
    hub = MemoryWatch("field", clock=lambda: now[0])
    watch = hub.root(roots["field"])
    try:
        before = watch.list()["memory/pl/pole.md"]
        assert watch.trusted
        other = roots["field"] / "pole-link.md"
        os.link(roots["field"] / "memory/pl/pole.md", other)
        with open(other, "a", encoding="utf-8") as handle:
            handle.write("written through a link made after the listing\n")
        hub.poll()
        assert not watch.dirty  # the documented limit: the link count change goes to the file's own watchers
        now[0] += REVALIDATE_SECONDS
        assert watch.dirty
        assert watch.list()["memory/pl/pole.md"] != before
        assert not watch.trusted  # and from now on it is re-listed at every search
        assert watch.dirty
    finally:
        hub.close()


def test_a_lost_event_after_a_queue_overflow_still_dirties_every_root(
    corpus: MemoryCorpus, roots: dict[str, Path]
) -> None:
    queued = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    if queued > 200_000:
        pytest.skip(f"fs.inotify.max_queued_events is {queued}: too many events to make")
    # Events on names the global root's watch ignores; alternating two files, so none merges with the last.
    flood = [roots["global"] / "a.txt", roots["global"] / "b.txt"]
    for path in flood:
        path.write_text("")
    for i in range(queued + 16):
        os.utime(flood[i % 2])
    # The queue is full: this edit's events are lost, only the overflow says that something happened.
    (roots["field"] / "MEMORY.md").write_text("# Farm\nThe north field grows cucumbers.\n")
    assert _paths(corpus, "cucumbers") == {("field", "MEMORY.md")}
    assert corpus.stats.listings == 4
    corpus.search("cucumbers")
    assert corpus.stats.listings == 4


def test_a_root_with_too_many_directories_is_re_listed_at_every_search(
    roots: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    many = roots["field"] / "memory" / "many"
    # The root, memory/, memory/pl, memory/pt and memory/many are 5: one directory more than the cap.
    for i in range(MAX_WATCHED_DIRS - 5 + 1):
        (many / f"d{i:03d}").mkdir(parents=True)
    corpus = MemoryCorpus(roots)
    with caplog.at_level(logging.WARNING, logger="farmhost.memory.watch"):
        assert _paths(corpus, "milho") == {("field", "memory/pt/campo.md")}
        (many / "d000" / "x.md").write_text("cucumbers\n")
        assert _paths(corpus, "cucumbers") == {("field", "memory/many/d000/x.md")}
        corpus.search("cucumbers")
    assert corpus.stats.listings == 2 + 1 + 1
    assert [r.getMessage() for r in caplog.records if "directories to watch" in r.getMessage()] != []
    assert len(caplog.records) == 1

    shutil.rmtree(many / f"d{MAX_WATCHED_DIRS - 5:03d}")
    corpus.search("cucumbers")  # counts few enough directories: the next listing watches them
    corpus.search("cucumbers")  # that listing
    listings = corpus.stats.listings
    corpus.search("cucumbers")
    assert corpus.stats.listings == listings
    (many / "d001" / "y.md").write_text("cucumbers\n")
    assert ("field", "memory/many/d001/y.md") in _paths(corpus, "cucumbers")


def test_without_inotify_every_search_re_lists(roots: dict[str, Path], caplog: pytest.LogCaptureFixture) -> None:
    MemoryCorpus(roots).close()  # libc and inotify_simple loaded before the descriptors run out
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowest_free = os.open(os.devnull, os.O_RDONLY)
    os.close(lowest_free)
    with caplog.at_level(logging.WARNING, logger="farmhost.memory.watch"):
        resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))  # every descriptor number is taken
        try:
            corpus = MemoryCorpus(roots)
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert _paths(corpus, "tomatoes") == {("field", "MEMORY.md")}
        (roots["field"] / "MEMORY.md").write_text("cucumbers\n")
        assert _paths(corpus, "cucumbers") == {("field", "MEMORY.md")}
        corpus.search("cucumbers")
    assert corpus.stats.listings == 6  # both roots at every search
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "cannot create an inotify instance" in warning and "max_user_instances" in warning


def test_close_and_drop_release_the_inotify_instance(roots: dict[str, Path]) -> None:
    gc.collect()
    before = inotify_instances()
    corpus = MemoryCorpus(roots)
    dropped = MemoryCorpus(roots)
    assert inotify_instances() == before + 2
    corpus.search("tomatoes")
    corpus.close()
    corpus.close()
    assert inotify_instances() == before + 1
    del dropped
    gc.collect()
    assert inotify_instances() == before
    # A closed corpus still answers, re-listing every root each time.
    (roots["field"] / "MEMORY.md").write_text("cucumbers\n")
    assert _paths(corpus, "cucumbers") == {("field", "MEMORY.md")}
    assert corpus.stats.listings == 4
