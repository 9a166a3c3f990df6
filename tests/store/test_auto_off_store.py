"""The auto_off table on a real SQLite file: one live row per entity, claimed once, released on failure."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from farmhost.store import auto_off
from farmhost.store.db import Database

ON = datetime(2026, 6, 1, 6, 0, tzinfo=UTC)
PUMP = "switch.irrigation_pump"


def test_an_on_period_is_armed_once_claimed_once_and_finished(tmp_path: Path) -> None:
    db = Database.open(tmp_path)
    with db.tx() as conn:
        assert auto_off.arm(conn, PUMP, on_since=ON, off_at=ON + timedelta(minutes=30), max_on=1800)
        assert not auto_off.arm(conn, PUMP, on_since=ON, off_at=ON + timedelta(minutes=60), max_on=3600)
        assert auto_off.claim_due(conn, {PUMP}, at=ON + timedelta(minutes=29)) == []
        (claimed,) = auto_off.claim_due(conn, {PUMP}, at=ON + timedelta(minutes=30))
        assert auto_off.claim_due(conn, {PUMP}, at=ON + timedelta(minutes=31)) == []  # claimed: nobody else
        auto_off.finish(conn, claimed, at=ON + timedelta(minutes=30), outcome="switch.turn_off")
        assert auto_off.live(conn) == {}
        # The same on-period is never armed again once done (an off that HA ignored does not loop).
        assert not auto_off.arm(conn, PUMP, on_since=ON, off_at=ON + timedelta(minutes=30), max_on=1800)
    db.close()


def test_a_failed_off_is_armed_again_and_a_stop_mid_off_is_released_at_start(tmp_path: Path) -> None:
    db = Database.open(tmp_path)
    with db.tx() as conn:
        auto_off.arm(conn, PUMP, on_since=ON, off_at=ON, max_on=1)
        (row,) = auto_off.claim_due(conn, {PUMP}, at=ON)
        auto_off.release(conn, row)
        assert auto_off.live(conn)[PUMP].status == "armed"
        auto_off.claim_due(conn, {PUMP}, at=ON)
        assert auto_off.live(conn)[PUMP].status == "claimed"
        assert auto_off.release_claims(conn) == 1
        assert auto_off.live(conn)[PUMP].status == "armed"
    db.close()


def test_off_times_only_move_forward_and_a_cancelled_entity_can_be_armed_anew(tmp_path: Path) -> None:
    db = Database.open(tmp_path)
    with db.tx() as conn:
        auto_off.arm(conn, PUMP, on_since=ON, off_at=ON + timedelta(minutes=30), max_on=1800)
        auto_off.tighten(conn, PUMP, off_at=ON + timedelta(minutes=60), max_on=3600)
        assert auto_off.live(conn)[PUMP].off_at == ON + timedelta(minutes=30)
        auto_off.tighten(conn, PUMP, off_at=ON + timedelta(minutes=10), max_on=600)
        assert auto_off.live(conn)[PUMP].off_at == ON + timedelta(minutes=10)
        auto_off.cancel(conn, PUMP, at=ON + timedelta(minutes=5), outcome="it was turned off before its time")
        assert auto_off.claim_due(conn, {PUMP}, at=ON + timedelta(hours=1)) == []
        later = ON + timedelta(hours=2)
        assert auto_off.arm(conn, PUMP, on_since=later, off_at=later + timedelta(minutes=30), max_on=1800)
        assert auto_off.live(conn)[PUMP].on_since == later
    db.close()
