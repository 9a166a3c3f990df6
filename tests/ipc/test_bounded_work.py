"""CPU and file work an agent can trigger stays bounded and off the event loop: other groups keep being answered."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

from farmhost_testing import (
    FIELD_JID,
    drop,
    read_result,
    register_in_process,
    running_daemon,
    scaled,
    wait_for_async,
    wait_result,
)
from ipc_support import uid

from farmhost.app import build_handlers
from farmhost.config import build_config, load_settings
from farmhost.farm.deps import FarmDeps
from farmhost.groups.live import GroupRegistry
from farmhost.handling import Handlers
from farmhost.ipc.service import IpcService
from farmhost.ipc.snapshots import HostIdentity
from farmhost.layout import DataLayout
from farmhost.store.db import Database, now_utc

NEVER_FIRES = "0 0 31 2,4,6,9,11 *"  # the 31st of months that have 30 days or fewer
# Seconds a request may take beyond the same daemon's baseline (measured in the test, under the same load) on an
# idle machine, scaled on a busy one. The bugs these tests are about cost far more: work that blocks the loop for as
# long as it runs, every group waiting.
PROMPT_WAIT = 3.0


def _ping_wait(data_dir: Path, folder: str = "main") -> float:
    """Seconds from dropping a ping to its result."""
    rid = uid("ping")
    sent = time.monotonic()
    drop(data_dir, folder, "actions", {"type": "ping", "requestId": rid})
    assert wait_result(data_dir, folder, rid)["status"] == "success"
    return time.monotonic() - sent


def test_never_firing_crons_from_many_groups_do_not_stall_main(data_dir: Path) -> None:
    folders = ["field"] + [f"crop{i}" for i in range(7)]
    for i, folder in enumerate(folders[1:]):
        register_in_process(data_dir, jid=f"telegram:{300 + i}", name=folder, folder=folder)
    with running_daemon(data_dir):
        quiet = max(_ping_wait(data_dir) for _ in range(5))  # the baseline: nothing else to do
        crons: list[tuple[str, str]] = []
        for folder in folders:
            for _ in range(3):
                rid = uid("never")
                payload = {"type": "schedule_task", "prompt": "p", "schedule_type": "cron"}
                drop(data_dir, folder, "tasks", {**payload, "schedule_value": NEVER_FIRES, "requestId": rid})
                crons.append((folder, rid))
        waits = [_ping_wait(data_dir) for _ in range(10)]
        assert max(waits) < quiet + scaled(PROMPT_WAIT), (quiet, waits)
        for folder, rid in crons:
            result = wait_result(data_dir, folder, rid)
            assert result["errorCode"] == "invalid_request", result
            assert "never fires" in result["error"] and "day 31" in result["error"], result


def test_deeply_nested_json_is_refused_quickly(data_dir: Path) -> None:
    with running_daemon(data_dir):
        depth = 400_000  # under the 1 MiB size limit
        start = b'{"type":"farm_action","action":"ha_get_status","params":{"a":'
        # The baseline: a flat request of the same size, refused too (an unknown parameter), under the same load.
        rid = uid("flat")
        drop(data_dir, "main", "actions", start + b'"' + b"x" * (2 * depth - 2) + b'"}}', name=f"{rid}.json")
        sent = time.monotonic()
        assert wait_result(data_dir, "main", rid)["errorCode"] == "invalid_request"
        flat = time.monotonic() - sent
        rid = uid("deep")
        drop(data_dir, "main", "actions", start + b"[" * depth + b"]" * depth + b"}}", name=f"{rid}.json")
        sent = time.monotonic()
        result = wait_result(data_dir, "main", rid)
        deep = time.monotonic() - sent
        assert result["errorCode"] == "invalid_request" and "nested too deeply" in result["error"], result
        assert deep < flat + scaled(PROMPT_WAIT), (flat, deep)


# the real IpcService in-process, so the test can watch its event loop -----------------------------------------


def _handlers(data_dir: Path) -> Handlers:
    settings = load_settings(data_dir=data_dir, env_file=None).model_copy(update={"ha_url": None, "ha_token": None})
    config = build_config(settings)
    layout = DataLayout(data_dir)
    farm = FarmDeps(settings=config.farm, layout=layout, ha=None, dashboards_dir=layout.dashboards)
    return build_handlers(config, HostIdentity(pid=os.getpid(), version="test", started_at=now_utc()), farm)


@contextlib.asynccontextmanager
async def _service(data_dir: Path) -> AsyncIterator[IpcService]:
    db = Database.open(data_dir)
    service = IpcService(
        settings=build_config(load_settings(data_dir=data_dir, env_file=None)).ipc,
        layout=DataLayout(data_dir),
        db=db,
        registry=GroupRegistry(db),
        handlers=_handlers(data_dir),
        identity=HostIdentity(pid=os.getpid(), version="test", started_at=now_utc()),
    )
    await service.start()
    try:
        yield service
    finally:
        await service.stop()
        db.close()


def _loop_thread_io() -> int:
    """Bytes the calling thread (the event loop's) has read and written so far, from the kernel's accounting."""
    fields = dict(line.split(": ") for line in Path("/proc/thread-self/io").read_text().splitlines())
    return int(fields["rchar"]) + int(fields["wchar"])


def _write_random(path: Path, size: int) -> None:
    with open(path, "wb") as out:
        out.writelines(os.urandom(1024 * 1024) for _ in range(size // (1024 * 1024)))


async def test_large_file_message_is_copied_off_the_event_loop(data_dir: Path) -> None:
    _write_random(data_dir / "groups" / "field" / "harvest.bin", 47 * 1024 * 1024)
    async with _service(data_dir):
        rids = [uid("big") for _ in range(3)]
        before = _loop_thread_io()
        for rid in rids:
            payload = {"type": "file", "chatJid": FIELD_JID, "path": "harvest.bin", "requestId": rid}
            drop(data_dir, "field", "messages", payload)
        for rid in rids:
            result = await wait_for_async(lambda r=rid: read_result(data_dir, "field", r), what=f"result {rid}")
            assert result["status"] == "success" and result["result"]["bytes"] == 47 * 1024 * 1024, result
        on_loop = _loop_thread_io() - before
    # A 47 MiB copy takes a few hundred ms (far more on an SD card); on the loop, every group would wait for it.
    # The loop thread may read requests and write results and the database, a few KiB each: nowhere near a copy.
    assert on_loop < 2 * 1024 * 1024, f"the event loop's thread itself read/wrote {on_loop} bytes"
