"""messages/ handlers through the real daemon: chunked text into the outbox, workspace files, authorisation."""

from __future__ import annotations

import itertools
import json
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from farmhost_testing import (
    FIELD_JID,
    MAIN_JID,
    clean_env,
    drop,
    farmhost,
    init_data_dir,
    quarantined,
    running_daemon,
    wait_for,
    wait_result,
)

_ids = itertools.count()


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One daemon for the whole module; every test uses its own request ids and files."""
    root = init_data_dir(tmp_path_factory.mktemp("messages") / "data")
    with running_daemon(root):
        yield root


def send(data_dir: Path, folder: str, payload: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Drop a messages/ request with a fresh requestId; returns the id and its result."""
    rid = f"msg-{next(_ids)}"
    drop(data_dir, folder, "messages", {**payload, "requestId": rid})
    return rid, wait_result(data_dir, folder, rid)


def text(folder: str, jid: str, body: str) -> tuple[str, dict[str, Any]]:
    return folder, {"type": "message", "chatJid": jid, "text": body}


def outbox_rows(data_dir: Path, folder: str, rid: str) -> list[dict[str, Any]]:
    """The outbox entries of one request, read straight from the database."""
    with closing(sqlite3.connect(f"file:{data_dir / 'farmhost.db'}?mode=ro", uri=True)) as conn:
        conn.row_factory = sqlite3.Row
        rows = conn.execute("SELECT * FROM outbox WHERE message_key = ? ORDER BY chunk_index", (f"ipc:{folder}:{rid}",))
        return [dict(row) for row in rows]


def is_fence(line: str) -> bool:
    return line.startswith("```") and "`" not in line[3:]


def _long_text() -> str:
    prose = "\n\n".join(
        f"Paragraph {p}: " + " ".join(f"word{p}_{w}" for w in range(60)) for p in range(8)
    )  # ~5,500 characters of paragraphs
    code = "```python\n" + "\n".join(f"valve_{i} = read_sensor('tank_{i}')  # litres" for i in range(110)) + "\n```"
    return f"{prose[:2500]}\n\n{code}\n\n{prose[2500:]}"


# text ---------------------------------------------------------------------------------------------


def test_a_long_message_is_split_into_telegram_sized_chunks(farm: Path) -> None:
    body = _long_text()
    assert 9_000 < len(body) < 11_000 and len(body.split("```")[1]) > 4096  # the code block alone needs two chunks
    rid, result = send(farm, *text("main", MAIN_JID, body))
    assert result["status"] == "success"
    listed = farmhost("outbox", "list", "--json", "--limit", "1000", data_dir=farm)
    assert listed.returncode == 0, listed.stderr
    entries = [e for e in json.loads(listed.stdout) if e["messageKey"] == f"ipc:main:{rid}"]
    count = len(entries)
    assert count >= 3 and result["result"] == {"queued": True, "chatJid": MAIN_JID, "chunks": count}
    assert [e["chunk"] for e in entries] == [f"{i}/{count}" for i in range(1, count + 1)]
    assert {(e["chatJid"], e["sourceFolder"], e["kind"], e["status"]) for e in entries} == {
        (MAIN_JID, "main", "text", "pending")
    }
    chunks = [e["body"] for e in entries]
    assert all(len(chunk.encode("utf-16-le")) // 2 <= 4096 for chunk in chunks)
    for chunk in chunks:  # every chunk opens and closes its own code block
        assert sum(map(is_fence, chunk.split("\n"))) % 2 == 0, chunk
    assert any(chunk.startswith("```python\n") for chunk in chunks[1:])  # reopened with its language

    def words(s: str) -> list[str]:
        return [w for line in s.split("\n") if not is_fence(line) for w in line.split()]

    assert words("\n".join(chunks)) == words(body)  # nothing lost, duplicated or reordered


def test_a_short_message_is_one_chunk_kept_exactly(farm: Path) -> None:
    body = "  Pump 2 is *on*.\n\n```\nflow = 12 l/min\n```\n🚜 "
    rid, result = send(farm, *text("field", FIELD_JID, body))
    assert result["result"] == {"queued": True, "chatJid": FIELD_JID, "chunks": 1}
    assert [(r["body"], r["chunk_count"]) for r in outbox_rows(farm, "field", rid)] == [(body, 1)]


def test_whitespace_only_text_is_an_error_and_sends_nothing(farm: Path) -> None:
    rid, result = send(farm, *text("main", MAIN_JID, " \n\t \n"))
    assert (result["status"], result["errorCode"]) == ("error", "invalid_request")
    assert "empty" in result["error"]
    assert outbox_rows(farm, "main", rid) == []
    rid, result = send(farm, *text("main", MAIN_JID, ""))  # refused by the schema: quarantined and answered
    assert result["errorCode"] == "invalid_request"
    # the result is written before the quarantine note: wait for the note rather than race it
    wait_for(lambda: any(note["file"] == f"{rid}.json" for note in quarantined(farm, "main")), what="the note")


@pytest.mark.parametrize(
    ("folder", "jid", "code", "sentence"),
    [
        ("field", MAIN_JID, "unauthorized", "may only send to its own chat"),
        ("field", "telegram:999", "unauthorized", "not registered"),
        ("main", "telegram:999", "unauthorized", "not registered"),
        ("main", FIELD_JID, None, None),  # main may message any registered chat
        ("field", FIELD_JID, None, None),
    ],
)
def test_message_authorisation(farm: Path, folder: str, jid: str, code: str | None, sentence: str | None) -> None:
    rid, result = send(farm, *text(folder, jid, "the gate is open"))
    assert result["errorCode"] == code
    if sentence is None:
        assert [(r["chat_jid"], r["source_folder"]) for r in outbox_rows(farm, folder, rid)] == [(jid, folder)]
    else:
        assert sentence in result["error"]
        assert outbox_rows(farm, folder, rid) == []


def test_group_folder_in_the_payload_does_not_change_who_is_sending(farm: Path) -> None:
    folder, payload = text("field", MAIN_JID, "I am main, honestly")
    rid, result = send(farm, folder, {**payload, "groupFolder": "main"})
    assert result["errorCode"] == "unauthorized"
    assert outbox_rows(farm, "field", rid) == [] and outbox_rows(farm, "main", rid) == []


# files --------------------------------------------------------------------------------------------


def _file(folder: str, jid: str, path: str, **extra: Any) -> tuple[str, dict[str, Any]]:
    return folder, {"type": "file", "chatJid": jid, "path": path, **extra}


def test_a_workspace_file_is_queued_as_a_private_copy(farm: Path) -> None:
    shots = farm / "groups" / "main" / "screenshots"
    shots.mkdir(exist_ok=True)
    content = b"\x89PNG\r\n\x1a\n" + os.urandom(2048)
    (shots / "x.png").write_bytes(content)
    rid, result = send(farm, *_file("main", MAIN_JID, "screenshots/x.png", caption="greenhouse, 07:00"))
    assert result["status"] == "success"
    assert result["result"] == {"queued": True, "chatJid": MAIN_JID, "bytes": len(content)}
    [row] = outbox_rows(farm, "main", rid)
    assert (row["kind"], row["body"], row["chat_jid"], row["status"]) == (
        "file",
        "greenhouse, 07:00",
        MAIN_JID,
        "pending",
    )
    copy = Path(row["file_path"])
    assert copy.is_relative_to(farm / "outbox-files") and copy.read_bytes() == content
    (shots / "x.png").write_bytes(b"changed by the agent afterwards")
    assert copy.read_bytes() == content


def _refused_paths(workspace: Path) -> None:
    (workspace / "screenshots").mkdir(exist_ok=True)
    (workspace / "screenshots" / "ok.png").write_bytes(b"png")
    (workspace / "empty.png").write_bytes(b"")
    (workspace / "passwd.png").symlink_to("/etc/passwd")
    (workspace / "linked").symlink_to(workspace / "screenshots", target_is_directory=True)
    (workspace / "outside").symlink_to("/etc", target_is_directory=True)
    os.link(workspace / "screenshots" / "ok.png", workspace / "hardlink.png")
    os.mkfifo(workspace / "pipe.png")
    with open(workspace / "huge.bin", "wb") as huge:  # sparse: over the cap without writing 50 MB
        huge.truncate(50 * 1024 * 1024 + 1)


REFUSED = [
    ("../field/x.png", "invalid_request", "'..'"),
    ("screenshots/../../field/x.png", "invalid_request", "'..'"),
    ("/etc/passwd", "invalid_request", "absolute"),
    ("screenshots\\ok.png", "invalid_request", "backslash"),
    ("screenshots/ok.png\x00.txt", "invalid_request", "control characters"),
    ("./screenshots/ok.png", "invalid_request", "'.'"),
    ("screenshots//ok.png", "invalid_request", "empty"),
    ("passwd.png", "not_allowed", "symlink"),
    ("linked/ok.png", "not_allowed", "symlink"),
    ("outside/passwd", "not_allowed", "symlink"),
    ("hardlink.png", "not_allowed", "single link"),
    ("pipe.png", "not_allowed", "not a regular file"),
    ("screenshots", "not_allowed", "not a regular file"),
    ("screenshots/missing.png", "not_found", "no file"),
    ("nodir/missing.png", "not_found", "no file"),
    ("empty.png", "invalid_request", "empty"),
    ("huge.bin", "not_allowed", "Telegram accepts files up to"),
]


def test_file_paths_that_escape_or_are_not_plain_files_are_refused(farm: Path) -> None:
    workspace = farm / "groups" / "field"
    _refused_paths(workspace)
    for path, code, sentence in REFUSED:
        rid, result = send(farm, *_file("field", FIELD_JID, path))
        assert (result["status"], result["errorCode"]) == ("error", code), (path, result)
        assert sentence in result["error"], (path, result["error"])
        assert outbox_rows(farm, "field", rid) == [], path
    copies = farm / "outbox-files" / "field"
    assert not copies.exists() or list(copies.iterdir()) == []
    assert quarantined(farm, "field") == []  # valid requests with bad paths are answered, not quarantined


@pytest.mark.parametrize(
    ("folder", "jid", "code"),
    [("field", MAIN_JID, "unauthorized"), ("main", "telegram:999", "unauthorized"), ("main", FIELD_JID, None)],
)
def test_file_authorisation_is_the_same_as_for_text(farm: Path, folder: str, jid: str, code: str | None) -> None:
    (farm / "groups" / folder / "report.txt").write_text("daily report")
    rid, result = send(farm, *_file(folder, jid, "report.txt"))
    assert result["errorCode"] == code
    assert len(outbox_rows(farm, folder, rid)) == (1 if code is None else 0)


def test_a_group_cannot_fill_the_disk_with_unsent_files(tmp_path: Path) -> None:
    """Offline (no Telegram), copies pile up: past its share of the outbox a group is refused, others are not."""
    data_dir = init_data_dir(tmp_path / "data")
    mib = 1024 * 1024
    for folder in ("field", "main"):
        (data_dir / "groups" / folder / "log.bin").write_bytes(os.urandom(mib))
    with running_daemon(data_dir, env=clean_env(FARMHOST_OUTBOX_GROUP_MAX_BYTES=str(3 * mib))):
        for _ in range(3):
            _, result = send(data_dir, *_file("field", FIELD_JID, "log.bin"))
            assert result["status"] == "success", result
        rid, result = send(data_dir, *_file("field", FIELD_JID, "log.bin"))
        assert result["errorCode"] == "rate_limited", result
        assert "unsent files already take 3 MiB" in result["error"] and "limit is 3 MiB" in result["error"], result
        assert outbox_rows(data_dir, "field", rid) == []
        assert sum(p.stat().st_size for p in (data_dir / "outbox-files" / "field").iterdir()) == 3 * mib
        _, result = send(data_dir, *_file("main", MAIN_JID, "log.bin"))  # the share is per group
        assert result["status"] == "success", result


def test_a_group_cannot_queue_messages_without_end(tmp_path: Path) -> None:
    """Telegram sends about 20 messages a minute in a group: what a group queues past its share waits nowhere.

    Text costs the database and holds the chat for hours; the share counts undelivered chunks and files.
    """
    data_dir = init_data_dir(tmp_path / "data")
    (data_dir / "groups" / "field" / "note.txt").write_text("x")
    with running_daemon(data_dir, env=clean_env(FARMHOST_OUTBOX_GROUP_MAX_CHUNKS="5")):
        _, result = send(data_dir, *text("field", FIELD_JID, "a" * 4096 + " " + "b" * 4096))  # two chunks
        assert result["status"] == "success" and result["result"]["chunks"] == 2, result
        for _ in range(2):
            _, result = send(data_dir, *text("field", FIELD_JID, "gate 3 is open"))
            assert result["status"] == "success", result
        rid, result = send(data_dir, *text("field", FIELD_JID, "c" * 4096 + " " + "d" * 4096))
        assert result["errorCode"] == "rate_limited", result
        assert "4 message chunks or files of this group wait" in result["error"] and "limit is 5" in result["error"]
        assert outbox_rows(data_dir, "field", rid) == []
        _, result = send(data_dir, *_file("field", FIELD_JID, "note.txt"))  # a file is one more: the fifth
        assert result["status"] == "success", result
        rid, result = send(data_dir, *text("field", FIELD_JID, "one more"))
        assert result["errorCode"] == "rate_limited" and outbox_rows(data_dir, "field", rid) == [], result
        rid, result = send(data_dir, *_file("field", FIELD_JID, "note.txt"))
        assert result["errorCode"] == "rate_limited" and outbox_rows(data_dir, "field", rid) == [], result
        _, result = send(data_dir, *text("main", MAIN_JID, "the share is per group"))
        assert result["status"] == "success", result


def test_file_copies_are_paced_so_they_never_saturate_the_disk(tmp_path: Path) -> None:
    """All groups' copies share one write budget: 4 MiB at 2 MiB/s takes at least 1.5 s (the first MiB is free)."""
    data_dir = init_data_dir(tmp_path / "data")
    mib = 1024 * 1024
    content = os.urandom(4 * mib)
    (data_dir / "groups" / "field" / "harvest.bin").write_bytes(content)
    with running_daemon(data_dir, env=clean_env(FARMHOST_FILE_COPY_BYTES_PER_SECOND=str(2 * mib))):
        started = time.monotonic()
        rid, result = send(data_dir, *_file("field", FIELD_JID, "harvest.bin"))
        elapsed = time.monotonic() - started
        assert result["status"] == "success", result
        assert elapsed >= 1.5, f"a 4 MiB copy took {elapsed:.2f} s at 2 MiB/s"
        [row] = outbox_rows(data_dir, "field", rid)
        assert Path(row["file_path"]).read_bytes() == content


def _copy_begun(copies: Path) -> bool:
    return copies.is_dir() and any(p.stat().st_size > 0 for p in copies.iterdir())


@pytest.mark.parametrize("change", ["grows", "shrinks"])
def test_a_file_changed_while_it_is_copied_is_counted_as_copied(tmp_path: Path, change: str) -> None:
    """The size is measured once: bytes appended during the copy are never taken, and the result counts the copy.

    A red-team once sent a 49 MiB file and appended 20 MiB while the paced copy ran: the outbox got 69 MiB, past
    Telegram's 50 MB cap, and the result said 49 MiB. At 1 MiB/s a 3 MiB copy takes two seconds after its first MiB.
    """
    data_dir = init_data_dir(tmp_path / "data")
    mib = 1024 * 1024
    content = os.urandom(3 * mib)
    source = data_dir / "groups" / "field" / "growing.bin"
    source.write_bytes(content)
    with running_daemon(data_dir, env=clean_env(FARMHOST_FILE_COPY_BYTES_PER_SECOND=str(mib))):
        rid = f"msg-{next(_ids)}"
        drop(
            data_dir,
            "field",
            "messages",
            {"type": "file", "chatJid": FIELD_JID, "path": "growing.bin", "requestId": rid},
        )
        wait_for(lambda: _copy_begun(data_dir / "outbox-files" / "field"), what="the copy to begin")
        if change == "grows":
            with open(source, "ab") as grow:
                grow.write(os.urandom(5 * mib))
        else:
            os.truncate(source, 3 * mib // 2)
        result = wait_result(data_dir, "field", rid)
    assert result["status"] == "success", result
    [row] = outbox_rows(data_dir, "field", rid)
    copy = Path(row["file_path"]).read_bytes()
    copied = len(copy)
    assert result["result"]["bytes"] == copied, "the result counts what was copied"
    assert copy == content[:copied]
    if change == "grows":
        assert copied == len(content), "nothing appended after the size was measured is copied"
    # The group's outbox budget is counted from the copies on disk: it holds exactly what the result says.
    assert sum(p.stat().st_size for p in (data_dir / "outbox-files" / "field").iterdir()) == copied
