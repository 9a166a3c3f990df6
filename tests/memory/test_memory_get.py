"""memory_get through the real daemon: line windows, the global memory, and every refusal an agent can try."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from farmhost_testing import drop, init_data_dir, ok, refused, running_daemon, wait_result

_ids = itertools.count()
LINES = [f"line {n}: field {n % 3} needs {n} mm" for n in range(1, 451)]


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = init_data_dir(tmp_path_factory.mktemp("memory") / "data")
    main, field = root / "groups" / "main", root / "groups" / "field"
    (main / "MEMORY.md").write_text("# Main\n\nThe office keeps the pump schedule.\n")
    (field / "memory" / "crops").mkdir(parents=True)
    (field / "MEMORY.md").write_text("\n".join(LINES) + "\n")
    (field / "memory" / "crops" / "tomatoes.md").write_text("# Tomatoes\n\nWater at 6.\n")
    (field / "memory" / "notes.txt").write_text("not markdown")
    (field / "memory" / "passwd.md").symlink_to("/etc/passwd")
    (field / "memory" / "other.md").symlink_to(main / "MEMORY.md")
    os.symlink(main, field / "memory" / "linked")
    (field / "memory" / "empty.md").write_text("")
    (field / "memory" / "50%.md").write_text("# Fertiliser\n\nHalf-strength zymurgite for seedlings.\n")
    (field / "memory" / "a\\b.md").write_text("# Backslash\n\nquokkaberry notes.\n")
    (field / "memory" / "%41.md").write_text("# Escaped\n\nquokkaberry notes.\n")
    (field / "memory" / "huge.md").write_text("# Huge\n\nquokkaberry\n" + "x" * (4 * 1024 * 1024))
    (field / "outside.txt").write_text("# Twin\n\nquokkaberry twin.\n")  # a hard link is the same file, anywhere
    os.link(field / "outside.txt", field / "memory" / "twin.md")
    with running_daemon(root):
        yield root


def get(data_dir: Path, folder: str, params: dict[str, Any]) -> dict[str, Any]:
    rid = f"mg-{next(_ids)}"
    drop(
        data_dir,
        folder,
        "actions",
        {"type": "memory_action", "action": "memory_get", "params": params, "requestId": rid},
    )
    return wait_result(data_dir, folder, rid)


def test_reads_a_window_with_truncation_and_next_from(farm: Path) -> None:
    first = ok(get(farm, "field", {"path": "MEMORY.md", "lines": 100}))
    assert first["text"].splitlines() == LINES[:100]
    assert (first["from"], first["lines"], first["totalLines"]) == (1, 100, 450)
    assert first["truncated"] is True and first["nextFrom"] == 101
    last = ok(get(farm, "field", {"path": "MEMORY.md", "from": 401, "lines": 100}))
    assert last["text"].splitlines() == LINES[400:] and last["truncated"] is False and last["nextFrom"] is None
    default = ok(get(farm, "field", {"path": "MEMORY.md"}))
    assert default["lines"] == 200 and default["nextFrom"] == 201


def test_reads_nested_memory_files_and_the_global_memory(farm: Path) -> None:
    nested = ok(get(farm, "field", {"path": "memory/crops/tomatoes.md"}))
    assert nested["text"] == "# Tomatoes\n\nWater at 6." and nested["groupFolder"] == "field"
    shipped = ok(get(farm, "field", {"path": "MEMORY.md", "groupFolder": "global"}))
    assert "How this appliance works" in shipped["text"], "the repo's memory/ is seeded as the global memory"
    assert ok(get(farm, "field", {"path": "memory/empty.md"}))["totalLines"] == 0


def test_main_reads_any_registered_group_and_others_only_their_own(farm: Path) -> None:
    assert "Water at 6." in ok(get(farm, "main", {"path": "memory/crops/tomatoes.md", "groupFolder": "field"}))["text"]
    refused(get(farm, "field", {"path": "MEMORY.md", "groupFolder": "main"}), "unauthorized", "its own memory")
    refused(get(farm, "main", {"path": "MEMORY.md", "groupFolder": "stranger"}), "not_found", "not a registered group")
    refused(get(farm, "main", {"path": "MEMORY.md", "groupFolder": "../field"}), "invalid_request", "never a path")


@pytest.mark.parametrize(
    ("path", "code", "words"),
    [
        # SPEC: "only MEMORY.md or memory/**/*.md inside the workspace ...; anything else not_allowed"
        ("../main/MEMORY.md", "not_allowed", ("'..'", "only MEMORY.md")),
        ("/etc/passwd", "not_allowed", ("absolute",)),
        ("memory/../../main/MEMORY.md", "not_allowed", ("'..'",)),
        ("memory/%2e%2e/%2e%2e/main/MEMORY.md", "not_allowed", ("URL-encoded",)),
        ("memory\\..\\..\\main\\MEMORY.md", "not_allowed", ("backslash",)),
        ("memory/a\\b.md", "not_allowed", ("backslash",)),
        ("memory/huge.md", "not_allowed", ("over the 4194304-byte limit",)),
        ("MEMORY.md\u0000.txt", "invalid_request", ("NUL character",)),  # refused with the request itself
        ("memory/passwd.md", "not_allowed", ("symlink",)),
        ("memory/twin.md", "not_allowed", ("single link",)),
        ("memory/other.md", "not_allowed", ("symlink",)),
        ("memory/linked/MEMORY.md", "not_allowed", ("symlink",)),
        ("memory/notes.txt", "not_allowed", ("only MEMORY.md or memory/**/*.md",)),
        ("farmhost.db", "not_allowed", ("only MEMORY.md",)),
        ("memory/missing.md", "not_found", ("no file at 'memory/missing.md'",)),
        ("", "invalid_request", ("non-empty",)),
    ],
)
def test_refusals(farm: Path, path: str, code: str, words: tuple[str, ...]) -> None:
    refused(get(farm, "field", {"path": path}), code, *words)


@pytest.mark.parametrize(
    ("params", "words"),
    [
        ({"path": "MEMORY.md", "from": 0}, ("'from' must be at least 1",)),
        ({"path": "MEMORY.md", "lines": 5000}, ("'lines' must be at most 2000",)),
        ({"path": "MEMORY.md", "lines": "10"}, ("'lines' must be a whole number",)),
        ({"path": 5}, ("'path' must be text",)),
        ({"path": "MEMORY.md", "offset": 3}, ("unknown param",)),
    ],
)
def test_bad_params(farm: Path, params: dict[str, Any], words: tuple[str, ...]) -> None:
    refused(get(farm, "field", params), "invalid_request", *words)


def test_every_file_search_cites_is_one_memory_get_opens(farm: Path) -> None:
    """A name with a bare `%` is a plain name; names and sizes memory_get refuses are never cited by the search."""
    (hit,) = ok(search(farm, "field", {"query": "zymurgite"}))["hits"]
    assert hit["path"] == "memory/50%.md"
    assert "zymurgite" in ok(get(farm, "field", {"path": hit["path"]}))["text"]
    assert ok(search(farm, "field", {"query": "quokkaberry"}))["hits"] == []  # a\b.md, %41.md, huge.md, twin.md


def search(data_dir: Path, folder: str, params: dict[str, Any]) -> dict[str, Any]:
    rid = f"ms-{next(_ids)}"
    payload = {"type": "memory_action", "action": "memory_search", "params": params, "requestId": rid}
    drop(data_dir, folder, "actions", payload)
    return wait_result(data_dir, folder, rid)


def test_search_finds_own_and_global_memory_with_line_ranges(farm: Path) -> None:
    hits = ok(search(farm, "field", {"query": "tomatoes water", "topK": 5}))["hits"]
    assert hits, "the tomatoes note must be found"
    first = hits[0]
    assert (first["source"], first["groupFolder"], first["path"]) == ("memory", "field", "memory/crops/tomatoes.md")
    lines = (farm / "groups" / "field" / first["path"]).read_text().splitlines()
    assert "Water at 6." in "\n".join(lines[first["startLine"] - 1 : first["endLine"]])
    assert first["score"] > 0 and len(hits) <= 5
    shared = ok(search(farm, "field", {"query": "sandbox IPC directory"}))["hits"]
    assert any(h["groupFolder"] == "global" for h in shared), "the global memory is searched too"
    assert all(h["groupFolder"] in ("field", "global") for h in shared), "never another group's memory"


def test_search_sees_an_edit_and_refuses_bad_requests(farm: Path) -> None:
    note = farm / "groups" / "field" / "memory" / "irrigação.md"
    note.write_text("# Rega\n\nA irrigação do campo 2 começa às 5h.\n")
    hits = ok(search(farm, "field", {"query": "irrigacao campo"}))["hits"]
    assert hits[0]["path"] == "memory/irrigação.md", "accents fold, and the new file is seen by the next search"
    refused(search(farm, "field", {"query": "x", "groupFolder": "main"}), "unauthorized")
    refused(search(farm, "field", {"query": "x", "topK": 65}), "invalid_request", "topK")
    refused(search(farm, "field", {"query": "  "}), "invalid_request", "query")
    refused(search(farm, "field", {"query": "x", "sources": "web"}), "invalid_request", "sources")
    assert ok(search(farm, "field", {"query": "tomatoes", "sources": "sessions"}))["hits"] == []


def test_sessions_from_the_groups_own_chat_are_searched_on_the_same_scale(farm: Path) -> None:
    from farmhost.store import transcripts
    from farmhost.store.db import Database, now_utc

    db = Database.open(farm)
    try:
        with db.tx() as conn:
            transcripts.append(
                conn,
                chat_jid="telegram:200",
                direction="in",
                sender="ana",
                text="a bomba do poço avariou",
                at=now_utc(),
            )
            transcripts.append(
                conn,
                chat_jid="telegram:100",
                direction="in",
                sender="rui",
                text="bomba nova no escritório",
                at=now_utc(),
            )
    finally:
        db.close()
    both = ok(search(farm, "field", {"query": "bomba poco", "sources": "all"}))["hits"]
    assert both[0]["source"] == "session" and both[0]["chatJid"] == "telegram:200" and both[0]["sender"] == "ana"
    assert all(h.get("chatJid") != "telegram:100" for h in both), "only the group's own chat"
    only = ok(search(farm, "field", {"query": "bomba", "sources": "sessions"}))["hits"]
    assert [h["source"] for h in only] == ["session"]
    assert ok(search(farm, "field", {"query": "bomba", "sources": "memory"}))["hits"] == []
    mixed = ok(search(farm, "field", {"query": "tomatoes bomba", "sources": "all"}))["hits"]
    assert {h["source"] for h in mixed} == {"memory", "session"}
    assert [h["score"] for h in mixed] == sorted((h["score"] for h in mixed), reverse=True), "one ordering"
