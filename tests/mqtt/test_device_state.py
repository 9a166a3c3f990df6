"""The device's counters on a real database: agent runs counted per farm day, the days gone by forgotten."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

from farmhost.mqtt.device import RUNS_KEY, count_run
from farmhost.store import host_state
from farmhost.store.db import Database

LISBON = ZoneInfo("Europe/Lisbon")


def test_runs_are_counted_on_the_farms_date_and_older_days_are_dropped(tmp_path: Path) -> None:
    db = Database.open(tmp_path)
    evening = datetime(2026, 6, 1, 22, 30, tzinfo=UTC)  # 23:30 in Lisbon: still June 1st there
    count_run(db, LISBON, evening)
    count_run(db, LISBON, evening + timedelta(minutes=10))
    with db.tx() as conn:
        assert host_state.get(conn, RUNS_KEY + "2026-06-01") == "2"
    count_run(db, LISBON, evening + timedelta(hours=1))  # 00:30 on June 2nd in Lisbon
    with db.tx() as conn:
        assert host_state.get(conn, RUNS_KEY + "2026-06-02") == "1"
        assert host_state.get(conn, RUNS_KEY + "2026-06-01") is None
        keys = [row[0] for row in conn.execute("SELECT key FROM host_state WHERE key LIKE 'agent_runs:%'")]
    assert keys == [RUNS_KEY + "2026-06-02"]
    db.close()
