"""What the host keeps of a group's refused files is capped per group (issue 33, finding 2), through the real daemon.

A group once kept 600 MB in `ipc/errors/` by sending oversized "requests" the host moved there whole and kept for
30 days. Now each is kept as its first 64 KiB, and past the group's caps (FARMHOST_QUARANTINE_MAX_MB of content,
FARMHOST_QUARANTINE_MAX_FILES entries) new ones are kept as their reason only, then not at all; the answer to the
agent is the same either way, and each refused file has its log line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from farmhost_testing import Daemon, clean_env, wait_for, wait_result
from ipc_support import uid, write_raw

from farmhost.ipc.quarantine import KEEP_BYTES, NOTE_SUFFIX

LIMIT = 1024 * 1024  # FARMHOST_IPC_MAX_REQUEST_BYTES default
MAX_FILES = 20
MAX_MB = 1
KEPT_WHOLE = MAX_MB * 2**20 // KEEP_BYTES  # cut requests that fit in the byte cap


@pytest.fixture
def capped(data_dir: Path) -> Iterator[Daemon]:
    env = clean_env(FARMHOST_QUARANTINE_MAX_FILES=str(MAX_FILES), FARMHOST_QUARANTINE_MAX_MB=str(MAX_MB))
    daemon = Daemon(data_dir, env=env).start()
    yield daemon
    assert daemon.stop() == 0, daemon.log()


def _kept(note: Path) -> str | None:
    """What the note's reason says was kept of its entry (None: nothing said, the entry is whole)."""
    document = json.loads(note.read_bytes())
    assert set(document) == {"folder", "queue", "file", "reason", "errorCode", "receivedAt"}, document
    _, said, kept = document["reason"].partition("; kept: ")
    return kept if said else None


def _oversized(rid: str) -> bytes:
    body = json.dumps({"type": "ping", "requestId": rid}).encode()
    return body + b" " * (LIMIT + 512 * 1024 - len(body))


def test_oversized_requests_are_kept_cut_and_capped_per_group(data_dir: Path, capped: Daemon) -> None:
    queue = data_dir / "ipc" / "field" / "actions"
    errors = data_dir / "ipc" / "errors" / "field"
    sent = [uid(f"big{index:02d}") for index in range(MAX_FILES + 4)]
    for rid in sent:
        write_raw(queue, f"{rid}.json", _oversized(rid))
        # Every one is answered, kept or not.
        result = wait_result(data_dir, "field", rid)
        assert result["status"] == "error" and "over the 1048576-byte limit" in result["error"], result
    wait_for(lambda: "its quarantine is full" in capped.log(), what="the full quarantine to be logged")
    notes = sorted(errors.glob(f"*{NOTE_SUFFIX}"))
    entries = sorted(p for p in errors.iterdir() if not p.name.endswith(NOTE_SUFFIX))
    kept = [_kept(note) for note in notes]
    # The first ones cut up to the byte cap, then reasons only up to the entry cap, then nothing.
    assert kept == [f"the first {KEEP_BYTES} of {LIMIT + 512 * 1024} bytes"] * KEPT_WHOLE + [
        f"this note only (field's quarantine holds its limit of {MAX_MB * 2**20} bytes)"
    ] * (MAX_FILES - KEPT_WHOLE)
    assert len(entries) == KEPT_WHOLE and all(p.stat().st_size == KEEP_BYTES for p in entries)
    assert sum(p.stat().st_size for p in errors.iterdir()) < MAX_MB * 2**20 + MAX_FILES * 1024
    # Each file's log line comes after its answer (the answer first, then the move): wait for the last one's.
    lines = [
        f"quarantined field/actions/{rid}.json: request file is {LIMIT + 512 * 1024} bytes, over the "
        f"{LIMIT}-byte limit; kept: nothing, the quarantine is full"
        for rid in sent[MAX_FILES:]
    ]
    wait_for(lambda: all(line in capped.log() for line in lines), what="a log line for each file kept as nothing")
    log = capped.log()
    assert "delete files from ipc/errors/field/ to keep them again" in log
    # The cap is the group's: main's refused file is kept.
    rid = uid("main-big")
    write_raw(data_dir / "ipc" / "main" / "actions", f"{rid}.json", _oversized(rid))
    wait_result(data_dir, "main", rid)
    # The answer comes first and the file is moved out of the spool after it (a crash in between answers again).
    (note,) = wait_for(
        lambda: list((data_dir / "ipc" / "errors" / "main").glob(f"*{NOTE_SUFFIX}")), what="main's quarantine note"
    )
    assert _kept(note).startswith("the first ")


def test_a_refused_directory_is_kept_only_if_it_fits_and_a_big_one_is_emptied(data_dir: Path, capped: Daemon) -> None:
    queue = data_dir / "ipc" / "field" / "actions"
    errors = data_dir / "ipc" / "errors" / "field"
    small, big = uid("small"), uid("big")
    kept = {}
    for rid, files in ((small, 3), (big, 5000)):
        # Made beside the queue and moved in whole, as an agent would: the host claims an entry by its name.
        made = queue.parent / f"{rid}.json"
        (made / "inner").mkdir(parents=True)
        for index in range(files):
            (made / "inner" / f"f{index}").touch()
        made.rename(queue / f"{rid}.json")
        wait_for(lambda rid=rid: any(errors.glob(f"*{rid}.json{NOTE_SUFFIX}")), what=f"{rid} to be quarantined")
        (note,) = errors.glob(f"*{rid}.json{NOTE_SUFFIX}")
        kept[rid] = _kept(note)
    # The small one took 5 entries (itself, inner/ and 3 files); the big one's own takes 1.
    assert kept[small] is None  # kept whole: the reason says nothing of it
    assert (
        kept[big]
        == f"this note only (a directory of more than {MAX_FILES - 6} entries, more than field's quarantine holds)"
    )
    (entry,) = (p for p in errors.iterdir() if small in p.name and not p.name.endswith(NOTE_SUFFIX))
    assert sorted(p.name for p in (entry / "inner").iterdir()) == ["f0", "f1", "f2"]
    assert not any(big in p.name and not p.name.endswith(NOTE_SUFFIX) for p in errors.iterdir())
    trash = data_dir / "ipc" / "errors" / ".trash"
    wait_for(lambda: not trash.exists() or not any(trash.iterdir()), what="the trash to be emptied")
