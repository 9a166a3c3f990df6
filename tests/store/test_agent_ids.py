"""The agent_ids table on a real SQLite file: one uid per group, kept, never handed to another, never a host's id."""

from __future__ import annotations

import os
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest

from farmhost.agents.sandbox.identity import IdentityError, IdRange, allocate_sync, describe_ids, host_claim
from farmhost.config import AGENT_UID_BASE, Settings, build_config
from farmhost.store import agent_ids
from farmhost.store.db import Database

AT = datetime(2026, 12, 5, 8, 0, tzinfo=UTC)
BASE = AGENT_UID_BASE


def _free(number: int) -> bool:
    return False


def test_each_group_gets_its_own_id_and_keeps_it(tmp_path: Path) -> None:
    db = Database.open(tmp_path)
    with db.tx() as conn:
        main = agent_ids.allocate(conn, "main", base=BASE, count=10, taken=_free, now=AT)
        field = agent_ids.allocate(conn, "field", base=BASE, count=10, taken=_free, now=AT)
        assert (main, field) == (BASE, BASE + 1)
        assert agent_ids.allocate(conn, "main", base=BASE, count=10, taken=_free, now=AT) == main
        assert agent_ids.allocated(conn) == {"main": main, "field": field}
        # a group removed and a new one added: the old id stays the old group's (its files may still exist)
        conn.execute("DELETE FROM groups WHERE folder = 'field'")
        assert agent_ids.allocate(conn, "barn", base=BASE, count=10, taken=_free, now=AT) == BASE + 2
        with pytest.raises(sqlite3.IntegrityError):  # never two groups on one id, whoever writes the table
            conn.execute("INSERT INTO agent_ids VALUES ('shed', ?, '2026-12-05')", (main,))
    db.close()


def test_ids_the_host_holds_are_skipped_and_a_full_range_is_refused(tmp_path: Path) -> None:
    db = Database.open(tmp_path)
    with db.tx() as conn:
        taken = {BASE, BASE + 1}
        first = agent_ids.allocate(conn, "main", base=BASE, count=3, taken=taken.__contains__, now=AT)
        assert first == BASE + 2
        with pytest.raises(agent_ids.IdRangeExhausted, match=f"all 3 ids from {BASE} are allocated or used by"):
            agent_ids.allocate(conn, "field", base=BASE, count=3, taken=taken.__contains__, now=AT)
    db.close()


def test_a_recorded_id_a_host_user_took_since_refuses_the_run(tmp_path: Path) -> None:
    db = Database.open(tmp_path)
    with db.tx() as conn:  # recorded before the host's `nobody` (or whoever) came to hold the id
        conn.execute("INSERT INTO agent_ids VALUES ('field', 65534, '2026-12-05')")
    db.close()
    assert host_claim(65534, []) is not None
    with pytest.raises(IdentityError, match="group 'field''s agent uid 65534 is now held by (user|group) "):
        allocate_sync(tmp_path, "field", IdRange(base=BASE, count=10))
    identity = allocate_sync(tmp_path, "main", IdRange(base=BASE, count=10))
    assert (identity.uid, identity.gid, identity.switch) == (BASE, BASE, True)
    with pytest.raises(IdentityError, match="group 'barn' gets no uid of its own: all 1 ids from"):
        allocate_sync(tmp_path, "barn", IdRange(base=BASE, count=1))


def test_subordinate_ranges_hold_their_ids() -> None:
    ranges = [("/etc/subuid: podman", 100000, 165535)]
    assert host_claim(100000, ranges) == "the subordinate ids 100000-165535 of /etc/subuid: podman"
    assert host_claim(165536, ranges) is None


def test_the_doctor_sentence_says_which_holds(tmp_path: Path) -> None:
    settings = Settings(_env_file=None, FARMHOST_DATA_DIR=tmp_path, FARMHOST_AGENT_RUNTIME="bwrap")  # type: ignore[call-arg]
    said = describe_ids(build_config(settings).agents.sandbox)
    if os.geteuid() == 0:
        assert said.startswith(f"agents run as per-group uids {BASE}..{BASE + 65535} (root daemon, gid = uid)")
    else:
        assert said.startswith(f"agents share the daemon's uid {os.geteuid()} (")


def test_an_id_range_past_two_to_the_31_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="must stay below 2147483647"):
        Settings(_env_file=None, FARMHOST_DATA_DIR=tmp_path, FARMHOST_AGENT_UID_BASE=2**31 - 10)  # type: ignore[call-arg]
