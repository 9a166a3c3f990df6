"""The persisted memory index: built by the builder process, loaded at restart, checked, and rebuilt when it lies."""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import sqlite3
import stat
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from farmhost_testing import Daemon, drop, ok, wait_result, write_tree

from farmhost.memory.corpus import PROCESS_FILES, MemoryCorpus, SessionDoc
from farmhost.memory.snapshot import FORMAT_VERSION, array_digest

WORDS = ["pump", "valve", "tomatoes", "maize", "north", "south", "tank", "drip", "probe", "wheat", "barley", "hill"]
QUERIES = ["pump valve", "tomatoes north", "drip tank probe", "wheat", "barley hill south", "zzyzx"]


def memory_files(count: int, seed: int = 7) -> dict[str, str]:
    """`count` notes (more than PROCESS_FILES makes the builder process build the first index)."""
    rng = random.Random(seed)
    files = {"MEMORY.md": "# Farm\n\nThe main pump is at the north well.\n"}
    for n in range(count - 1):
        paragraphs = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 30))) for _ in range(rng.randint(1, 6))]
        files[f"memory/notes/n{n:04d}.md"] = f"# Note {n}\n\n" + "\n\n".join(paragraphs) + "\n"
    return files


def corpus(root: Path, snapshot: Path | None, **kwargs: Any) -> MemoryCorpus:
    return MemoryCorpus({"main": root}, snapshot=snapshot, **kwargs)


def answers(c: MemoryCorpus) -> list[list[Any]]:
    return [c.search(q, top_k=8) for q in QUERIES]


def events(caplog: pytest.LogCaptureFixture, name: str) -> list[dict[str, Any]]:
    """The log records of one event, with their extra fields."""
    return [vars(r) for r in caplog.records if getattr(r, "event", None) == name]


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    write_tree(root, memory_files(PROCESS_FILES * 2))
    return root


def test_the_first_index_is_built_by_the_builder_process_and_a_restart_reads_no_file(
    workspace: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    snapshot = tmp_path / "index" / "main.sqlite"
    snapshot.parent.mkdir()
    reference = corpus(workspace, None)
    first = corpus(workspace, snapshot)
    assert answers(first) == answers(reference)
    assert first.stats.snapshots_built == 1 and first.stats.files_chunked == 0, "read by the child, not here"
    assert stat.S_IMODE(snapshot.stat().st_mode) == 0o600
    assert [p.name for p in snapshot.parent.iterdir()] == ["main.sqlite"], "no temporary file left behind"
    first.close()

    again = corpus(workspace, snapshot)
    assert answers(again) == answers(reference)
    assert again.stats.snapshots_loaded == 1 and again.stats.snapshots_built == 0
    assert again.stats.files_chunked == 0 and again.stats.files_from_snapshot == PROCESS_FILES * 2
    loaded = events(caplog, "memory_snapshot_loaded")[-1]
    assert loaded["files"] == PROCESS_FILES * 2 and loaded["stale"] == 0
    again.close()


def test_files_changed_while_stopped_are_read_again_and_the_rest_comes_from_the_snapshot(
    workspace: Path, tmp_path: Path
) -> None:
    snapshot = tmp_path / "main.sqlite"
    corpus(workspace, snapshot).search("pump")
    (workspace / "memory/notes/n0003.md").write_text("# Note 3\n\nThe zzyzx tractor is in the barn.\n")
    (workspace / "memory/notes/n0004.md").unlink()
    write_tree(workspace, {"memory/new.md": "# New\n\nzzyzx seed drill by the hill.\n"})
    again = corpus(workspace, snapshot)
    assert answers(again) == answers(corpus(workspace, None))
    assert again.stats.files_chunked == 2, "the changed file and the new one"
    assert again.stats.files_from_snapshot == PROCESS_FILES * 2 - 2
    hits = again.search("zzyzx")
    assert sorted(h.path for h in hits) == ["memory/new.md", "memory/notes/n0003.md"]  # type: ignore[union-attr]


def test_searches_and_edits_after_a_restart_rank_exactly_like_a_corpus_built_from_the_files(
    workspace: Path, tmp_path: Path
) -> None:
    """Frozen files replaced, removed and added around the snapshot, chat messages beside them: no difference."""
    snapshot = tmp_path / "main.sqlite"
    corpus(workspace, snapshot).search("pump")
    restarted = corpus(workspace, snapshot)
    messages = [SessionDoc(n, f"pump {WORDS[n % len(WORDS)]} message {n}", "telegram:1", "ana", "2026-12-01") for n in
                range(1, 40)]  # fmt: skip
    restarted.add_sessions(messages[:20], keep=30)  # before any search, as the daemon's window does
    assert restarted.stats.snapshots_loaded == 1
    rng = random.Random(11)
    live_messages = messages[:20]
    for step in range(30):
        rel = f"memory/notes/n{rng.randrange(PROCESS_FILES * 2 - 1):04d}.md"
        if step % 3 == 0:
            (workspace / rel).unlink(missing_ok=True)
        else:
            write_tree(workspace, {rel: f"# Edit {step}\n\n" + " ".join(rng.choice(WORDS) for _ in range(12)) + "\n"})
        if step == 10:
            restarted.add_sessions(messages[20:], keep=30)
            live_messages = messages[-30:]
        fresh = corpus(workspace, None)
        fresh.add_sessions(live_messages, keep=30)
        assert answers(restarted) == answers(fresh), f"step {step}"
        fresh.close()


def test_a_small_memory_is_indexed_in_the_daemon_and_persists_nothing(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    write_tree(root, memory_files(PROCESS_FILES // 2))
    snapshot = tmp_path / "main.sqlite"
    small = corpus(root, snapshot)
    assert small.search("pump")
    assert small.stats.files_chunked == PROCESS_FILES // 2 and small.stats.snapshots_built == 0
    assert not snapshot.exists()


def _garbage(path: Path) -> None:
    path.write_bytes(b"this is not a database" * 100)


def _sql(statement: str) -> Callable[[Path], None]:
    def change(path: Path) -> None:
        with closing(sqlite3.connect(path)) as db:
            db.execute(statement)
            db.commit()

    return change


def _array(name: str, change: Callable[[np.ndarray], np.ndarray], *, digest: bool = True) -> Callable[[Path], None]:
    """Change one array; with `digest`, as a faulty writer would (its digest matching), so the checks must see it."""

    def tamper(path: Path) -> None:
        with closing(sqlite3.connect(path)) as db:
            (blob,) = db.execute("SELECT data FROM array WHERE name = ?", (name,)).fetchone()
            dtype = "<i8" if name in ("counts", "doc_len", "offsets") else "<i4"
            data = change(np.frombuffer(blob, dtype=dtype).copy())
            db.execute("UPDATE array SET data = ? WHERE name = ?", (data.astype(dtype).tobytes(), name))
            if digest:
                blobs = dict(db.execute("SELECT name, data FROM array").fetchall())
                db.execute("UPDATE meta SET value = ? WHERE key = 'digest'", (array_digest(blobs),))
            db.commit()

    return tamper


def _bump(values: np.ndarray, at: int, by: int) -> np.ndarray:
    values[at] += by
    return values


TAMPERING = [
    pytest.param(_garbage, "file is not a database", id="garbage"),
    pytest.param(lambda p: p.write_bytes(b""), "", id="empty-file"),
    pytest.param(_sql(f"UPDATE meta SET value = '{FORMAT_VERSION + 1}' WHERE key = 'format'"), "format", id="format"),
    pytest.param(_sql("UPDATE meta SET value = 'x' WHERE key = 'code'"), "code", id="other-code"),
    pytest.param(_sql("UPDATE meta SET value = '400' WHERE key = 'max_chunk_chars'"), "max_chunk_chars", id="chunk"),
    pytest.param(_sql("UPDATE meta SET value = '[]' WHERE key = 'roots'"), "roots", id="other-roots"),
    pytest.param(_sql("DELETE FROM chunk WHERE doc = 5"), "chunk rows", id="chunk-row-missing"),
    pytest.param(_sql("UPDATE file SET root = 3 WHERE seg = 0"), "root", id="root-out-of-range"),
    pytest.param(_sql("UPDATE file SET chunks = chunks + 1 WHERE seg = 2"), "counts", id="file-chunks"),
    pytest.param(_sql("UPDATE file SET rel = 'zz.md' WHERE seg = 0"), "ascending", id="file-order"),
    pytest.param(_sql("DELETE FROM array WHERE name = 'tfs'"), "arrays", id="array-missing"),
    pytest.param(_sql("UPDATE array SET data = substr(data, 1, 5) WHERE name = 'ids'"), "cut short", id="cut"),
    pytest.param(_array("ids", lambda a: _bump(a, 0, 10**6)), "out of range", id="id-out-of-range"),
    pytest.param(_array("ids", lambda a: a[::-1]), "order", id="ids-out-of-order"),
    pytest.param(_array("tfs", lambda a: _bump(a, 3, 2)), "lengths", id="tf-changed"),
    pytest.param(_array("doc_len", lambda a: _bump(a, 0, 1)), "lengths", id="doc-len"),
    pytest.param(_array("offsets", lambda a: _bump(a, 2, 1), digest=False), "digest", id="posting-moved"),
    pytest.param(_array("offsets", lambda a: _bump(a, 2, 10**6)), "offsets", id="offsets"),
    pytest.param(_array("counts", lambda a: a[:-1]), "", id="counts-short"),
]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[list[Any]]]:
    """A workspace, the snapshot the builder process made of it, and the answers of a corpus read from its files.

    Made once for the tampering cases, which only read the workspace and each damage a copy of the snapshot.
    """
    root = tmp_path_factory.mktemp("built")
    workspace = root / "ws"
    write_tree(workspace, memory_files(PROCESS_FILES * 2))
    snapshot = root / "index" / "main.sqlite"
    snapshot.parent.mkdir()
    first = corpus(workspace, snapshot)
    first.search("pump")
    first.close()
    assert first.stats.snapshots_built == 1 and [p.name for p in snapshot.parent.iterdir()] == ["main.sqlite"]
    return workspace, snapshot, answers(corpus(workspace, None))


@pytest.mark.parametrize(("tamper", "reason"), TAMPERING)
def test_a_damaged_or_foreign_snapshot_is_rejected_with_its_reason_and_rebuilt(
    built: tuple[Path, Path, list[list[Any]]],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    tamper: Callable[[Path], None],
    reason: str,
) -> None:
    workspace, pristine, reference = built
    snapshot = tmp_path / "main.sqlite"
    shutil.copy2(pristine, snapshot)
    tamper(snapshot)
    caplog.set_level(logging.INFO)
    again = corpus(workspace, snapshot)
    assert answers(again) == reference
    assert again.stats.snapshots_rejected == 1 and again.stats.snapshots_built == 1
    rejected = events(caplog, "memory_snapshot_rejected")
    assert len(rejected) == 1 and reason in rejected[0]["reason"], rejected[0]["reason"]
    assert corpus(workspace, snapshot).search("pump") and corpus(workspace, snapshot).stats.snapshots_rejected == 0


def test_a_builder_that_fails_or_overruns_leaves_the_daemon_to_build_the_index_itself(
    workspace: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    reference = answers(corpus(workspace, None))
    slow = corpus(workspace, tmp_path / "main.sqlite", build_timeout=0.001)
    assert answers(slow) == reference
    assert slow.stats.snapshots_built == 0 and slow.stats.files_chunked == PROCESS_FILES * 2
    assert "took longer than 0.001 s" in events(caplog, "memory_build_failed")[0]["reason"]

    nowhere = corpus(workspace, tmp_path / "missing-dir" / "main.sqlite")
    assert answers(nowhere) == reference
    failed = events(caplog, "memory_build_failed")[-1]["reason"]
    assert "exited with 1" in failed and "missing-dir" in failed, failed


def test_the_builder_has_a_help_and_refuses_a_bad_root(tmp_path: Path) -> None:
    import subprocess
    import sys

    from farmhost_testing import clean_env

    done = subprocess.run([sys.executable, "-m", "farmhost.memory.indexer", "--help"], capture_output=True, text=True,
                          env=clean_env(), check=False)  # fmt: skip
    assert done.returncode == 0 and "snapshot" in done.stdout
    bad = subprocess.run([sys.executable, "-m", "farmhost.memory.indexer", "--out", str(tmp_path / "x"), "--root", "nope"],
                         capture_output=True, text=True, env=clean_env(), check=False)  # fmt: skip
    assert bad.returncode == 2 and "LABEL=PATH" in bad.stderr


def _search(data_dir: Path, folder: str, rid: str, query: str) -> list[dict[str, Any]]:
    payload = {"type": "memory_action", "action": "memory_search", "params": {"query": query}, "requestId": rid}
    drop(data_dir, folder, "actions", payload)
    hits: list[dict[str, Any]] = ok(wait_result(data_dir, folder, rid, timeout=60))["hits"]
    return hits


def _events(daemon: Daemon, name: str) -> list[dict[str, Any]]:
    found = []
    for line in daemon.log().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("event") == name:
            found.append(record)
    return found


def test_a_restarted_daemon_answers_from_the_persisted_index(data_dir: Path) -> None:
    write_tree(data_dir / "groups" / "field", memory_files(PROCESS_FILES * 3))
    daemon = Daemon(data_dir, args=("--log-format", "json")).start()
    try:
        assert _search(data_dir, "field", "persist-1", "pump valve")
        (first,) = _events(daemon, "memory_snapshot_loaded")
        assert first["stale"] == 0 and first["files"] > PROCESS_FILES * 3, "the group's files and the global memory"
    finally:
        assert daemon.stop() == 0, daemon.log()[-3000:]
    indexed = len(_events(daemon, "memory_indexed"))
    index = data_dir / "memory-index"
    assert stat.S_IMODE(index.stat().st_mode) == 0o700 and sorted(os.listdir(index)) == ["field.sqlite"]
    (data_dir / "groups" / "field" / "memory/notes/n0001.md").write_text("# Note 1\n\nzzyzx pump valve pump valve\n")
    daemon = Daemon(data_dir, args=("--log-format", "json")).start()
    try:
        after = _search(data_dir, "field", "persist-2", "zzyzx")
        assert [h["path"] for h in after] == ["memory/notes/n0001.md"], after
        loaded = _events(daemon, "memory_snapshot_loaded")  # the log goes on from the first run's
        assert len(loaded) == 2 and loaded[1]["files"] == first["files"] - 1 and loaded[1]["stale"] == 1
        assert len(_events(daemon, "memory_indexed")) == indexed, "no build after the restart"
    finally:
        assert daemon.stop() == 0, daemon.log()[-3000:]
