"""A database migrated by a newer farmhost is refused by every command, clearly, and left untouched."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from farmhost_testing import clean_env, farmhost

from farmhost.store.migrations import MIGRATIONS


def _user_version(db: Path) -> int:
    conn = sqlite3.connect(db)
    try:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])
    finally:
        conn.close()


def test_a_newer_schema_is_refused_not_used(data_dir: Path) -> None:
    db = data_dir / "farmhost.db"
    newer = len(MIGRATIONS) + 1
    conn = sqlite3.connect(db)
    conn.execute(f"PRAGMA user_version = {newer}")
    conn.close()
    before = db.read_bytes()
    expected = (
        f"farmhost: error: {db} has schema version {newer}, but this farmhost only knows versions up to "
        f"{len(MIGRATIONS)}: a newer farmhost wrote it and farmhost never migrates a database backwards. Run the "
        "newer farmhost again, or restore the backup taken before the upgrade (docs/operations.md)"
    )
    for command in (("group", "list"), ("init",), ("run",)):
        done = farmhost(*command, data_dir=data_dir, timeout=30)
        assert done.returncode == 2, (command, done.stderr)
        assert done.stderr.strip().splitlines()[-1] == expected, (command, done.stderr)
        assert "Traceback" not in done.stderr
    assert not (data_dir / "ipc" / "main" / "host_status.json").exists(), "the daemon must not have started"
    assert _user_version(db) == newer and db.read_bytes() == before, "the newer database is left as it was"

    doctor = farmhost("doctor", "--json", data_dir=data_dir, env=clean_env(FARMHOST_AGENT_RUNTIME="process"))
    assert doctor.returncode == 1, doctor.stderr
    database = next(c for c in json.loads(doctor.stdout) if c["part"] == "database")
    assert database["state"] == "broken"
    assert database["detail"].startswith(f"farmhost.db has schema v{newer}, newer than this farmhost knows")
    assert "restore the backup" in database["fix"]
