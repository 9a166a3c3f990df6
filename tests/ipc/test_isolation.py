"""Group identity and isolation: swapped directories, unregistered folders, registry changes, a slow handler."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from farmhost_testing import (
    Daemon,
    clean_env,
    drop,
    farmhost,
    init_data_dir_in_process,
    quarantined,
    read_result,
    wait_for,
    wait_for_async,
    wait_result,
)
from ipc_support import (
    Env,
    logged,
    make_data_dir,
    ping_ok,
    quarantined_entry,
    uid,
    wait_logged,
    wait_note,
    write_raw,
)

from farmhost.app import build_handlers
from farmhost.config import build_config, load_settings
from farmhost.farm.deps import FarmDeps
from farmhost.groups.live import GroupRegistry
from farmhost.handling import Effect, Handlers, HandlerSpec, RequestContext
from farmhost.ipc.service import IpcService
from farmhost.ipc.snapshots import HostIdentity
from farmhost.layout import DataLayout
from farmhost.protocol.codes import Queue
from farmhost.protocol.envelope import Outcome
from farmhost.protocol.requests import AnyRequest
from farmhost.store.db import Database, now_utc

FARM = {"type": "farm_action", "action": "ha_get_status", "params": {}}
# The periodic rescan of this module's `env` daemon: the most the setting allows, so none runs while the module does
# and what its tests wait for can only have been delivered by inotify, however long a loaded machine takes.
RESCAN_SECONDS = 3600
INOTIFY_DEADLINE = 20.0  # how long (scaled) such a test waits: generous, and far below RESCAN_SECONDS


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    """The IPC tests' shared daemon (see conftest.py), but one that never rescans while this module runs."""
    data_dir = make_data_dir(tmp_path_factory.mktemp("ipc") / "data")
    daemon = Daemon(data_dir, env=clean_env(FARMHOST_IPC_RESCAN_SECONDS=str(RESCAN_SECONDS))).start()
    yield Env(data_dir=data_dir, daemon=daemon)
    assert daemon.stop() == 0, daemon.log()
    assert "Traceback" not in daemon.log(), daemon.log()


@pytest.fixture(scope="module")
def fast(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    """A daemon whose periodic rescan runs every 0.2 s, so a test can wait for one to have happened."""
    data_dir = make_data_dir(tmp_path_factory.mktemp("isolation") / "data")
    daemon = Daemon(data_dir, env=clean_env(FARMHOST_IPC_RESCAN_SECONDS="0.2")).start()
    yield Env(data_dir=data_dir, daemon=daemon)
    assert daemon.stop() == 0, daemon.log()
    assert "Traceback" not in daemon.log(), daemon.log()


def _after_a_rescan(env: Env) -> None:
    """Return once a periodic rescan has run after this call: it logs a fresh unregistered folder once."""
    marker = f"marker-{secrets.token_hex(4)}"
    (env.data_dir / "ipc" / marker).mkdir()
    line = f"ipc/{marker} is not a registered group folder; ignoring it"
    wait_for(lambda: line in env.daemon.log(), what=line)


def _swap_for_symlink(path: Path, target: str) -> None:
    """Replace the directory `path` with a symlink, racing the host, which recreates missing directories."""
    os.rename(path, path.with_name(f"{path.name}-old-{secrets.token_hex(3)}"))
    for _ in range(100):
        try:
            os.symlink(target, path)
            return
        except FileExistsError:  # the host was quicker; take its fresh (empty) directory away again
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                os.rmdir(path)
    raise AssertionError(f"could not replace {path} with a symlink")


def _answered_without_a_rescan(data_dir: Path, folder: str) -> None:
    """A ping is answered without a periodic rescan (`env` runs none): the (recreated) queue directory is watched."""
    rid = uid("watched")
    drop(data_dir, folder, "actions", {"type": "ping", "requestId": rid})
    assert wait_result(data_dir, folder, rid, timeout=INOTIFY_DEADLINE)["status"] == "success"


# the directory is the identity -----------------------------------------------------------------------------------


def test_queue_directory_swapped_for_a_symlink_to_main(env: Env) -> None:
    data_dir = env.data_dir
    field_actions, main_actions = data_dir / "ipc" / "field" / "actions", data_dir / "ipc" / "main" / "actions"
    _swap_for_symlink(field_actions, "../main/actions")
    # main's agent goes on writing its own requests; field's link points at them
    rids = [uid("main-own") for _ in range(20)]
    for rid in rids:
        write_raw(main_actions, f"{rid}.json", json.dumps({**FARM, "requestId": rid}).encode())

    note = wait_note(data_dir, "field", "actions", reason="actions/ was replaced by a symlink")
    assert note["reason"] == "actions/ was replaced by a symlink; the host recreated the directory"
    link = quarantined_entry(data_dir, "field", "actions", "actions")
    assert link.is_symlink() and os.readlink(link) == "../main/actions"
    wait_for(lambda: field_actions.is_dir() and not field_actions.is_symlink(), what="field/actions recreated")
    for rid in rids:
        result = wait_result(data_dir, "main", rid)
        assert result["errorCode"] == "upstream_unavailable", "main's request must be run as main's"
        assert read_result(data_dir, "field", rid) is None, "main's result must never land in field's directory"
    assert {r["group"] for r in wait_logged(data_dir, count=len(rids), action="ha_get_status")} == {"main"}
    assert main_actions.is_dir() and not main_actions.is_symlink()
    _answered_without_a_rescan(data_dir, "field")
    ping_ok(data_dir, "main")
    line = "group field: actions/ was a symlink; moved it to quarantine and recreated it"
    assert line in env.daemon.log()


def test_results_directory_swapped_for_a_symlink_outside(env: Env, tmp_path: Path) -> None:
    data_dir = env.data_dir
    outside = tmp_path / "outside"
    outside.mkdir()
    results = data_dir / "ipc" / "field" / "action_results"
    _swap_for_symlink(results, str(outside))
    rid = uid("through-link")
    drop(data_dir, "field", "actions", {"type": "ping", "requestId": rid})

    assert wait_result(data_dir, "field", rid, timeout=INOTIFY_DEADLINE)["status"] == "success"  # no rescan: inotify
    assert results.is_dir() and not results.is_symlink()
    assert os.listdir(outside) == [], "no result may be written through the link"
    note = wait_note(data_dir, "field", "action_results", queue="action_results", reason="symlink")
    assert note["reason"] == "action_results/ was replaced by a symlink; the host recreated the directory"
    assert os.readlink(quarantined_entry(data_dir, "field", "action_results", "action_results")) == str(outside)


def test_result_file_planted_as_a_symlink_is_replaced_not_followed(fast: Env, tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    rid = uid("planted")
    planted = fast.data_dir / "ipc" / "field" / "action_results" / f"{rid}.json"
    os.symlink(victim, planted)
    drop(fast.data_dir, "field", "actions", {"type": "ping", "requestId": rid})
    wait_for(lambda: not planted.is_symlink(), what="the planted link replaced by the result")
    assert json.loads(planted.read_bytes())["status"] == "success"
    assert victim.read_text() == "precious"


def test_payload_fields_never_establish_identity(fast: Env) -> None:
    data_dir = fast.data_dir
    sent = {
        uid("farm-as-main"): ("actions", {**FARM, "groupFolder": "main"}, "unauthorized"),
        uid("task-for-main"): (
            "tasks",
            {"type": "schedule_task", "prompt": "p", "schedule_type": "once", "schedule_value": "2999-01-01T00:00:00Z"}
            | {"groupFolder": "main"},
            "unauthorized",
        ),
        uid("refresh-as-main"): ("tasks", {"type": "refresh_groups", "groupFolder": "main"}, "unauthorized"),
        uid("ping-as-main"): ("actions", {"type": "ping", "groupFolder": "main"}, None),
        uid("register-main"): (
            "tasks",
            {"type": "register_group", "jid": "telegram:-77", "name": "x", "folder": "x77", "isMain": True},
            "invalid_request",
        ),
    }
    for rid, (queue, payload, _) in sent.items():
        drop(data_dir, "field", queue, {**payload, "requestId": rid})
    for rid, (_, _, code) in sent.items():
        assert wait_result(data_dir, "field", rid)["errorCode"] == code
        assert read_result(data_dir, "main", rid) is None
    assert {r["group"] for r in logged(data_dir) if r["requestId"] in sent} == {"field"}
    done = farmhost("group", "list", "--json", data_dir=data_dir)
    assert [g["folder"] for g in json.loads(done.stdout) if g["isMain"]] == ["main"]


def test_unregistered_directory_is_never_processed_and_logged_once(fast: Env) -> None:
    stranger = fast.data_dir / "ipc" / "stranger"
    (stranger / "actions").mkdir(parents=True)
    write_raw(stranger / "actions", "x.json", b'{"type": "ping", "requestId": "x"}')
    line = "ipc/stranger is not a registered group folder; ignoring it"
    wait_for(lambda: line in fast.daemon.log(), what=line)
    for _ in range(3):
        _after_a_rescan(fast)
    write_raw(stranger / "actions", "y.json", b'{"type": "ping", "requestId": "y"}')
    _after_a_rescan(fast)

    assert fast.daemon.log().count(line) == 1
    assert sorted(os.listdir(stranger / "actions")) == ["x.json", "y.json"]
    assert sorted(os.listdir(stranger)) == ["actions"], "nothing may be created for an unregistered folder"
    assert not (fast.data_dir / "ipc" / "errors" / "stranger").exists()
    assert not logged(fast.data_dir, group="stranger")


def test_group_add_and_remove_while_running(fast: Env) -> None:
    data_dir, daemon = fast.data_dir, fast.daemon
    done = farmhost("group", "add", "--jid", "telegram:300", "--name", "Barn", "--folder", "barn", data_dir=data_dir)
    assert done.returncode == 0, done.stderr
    rid = uid("barn")
    drop(data_dir, "barn", "actions", {"type": "ping", "requestId": rid})
    # The commit watcher sees the CLI's commit at once ("within a second"); the slack is for a loaded CI machine.
    assert wait_result(data_dir, "barn", rid, timeout=10.0)["status"] == "success"
    assert "serving group barn (telegram:300)" in daemon.log()

    done = farmhost("group", "remove", "barn", data_dir=data_dir)
    assert done.returncode == 0, done.stderr
    status = data_dir / "ipc" / "barn" / "host_status.json"
    wait_for(lambda: json.loads(status.read_bytes())["status"] == "stopped", timeout=10.0, what="barn stopped")
    # "stopped" is written first, then the directories are closed and the line logged.
    wait_for(lambda: "stopped serving group barn" in daemon.log(), timeout=10.0, what="barn's stop logged")
    late = uid("late")
    drop(data_dir, "barn", "actions", {"type": "ping", "requestId": late})
    _after_a_rescan(fast)
    assert read_result(data_dir, "barn", late) is None
    assert (data_dir / "ipc" / "barn" / "actions" / f"{late}.json").exists()
    assert "ipc/barn is not a registered group folder; ignoring it" in daemon.log()
    ping_ok(data_dir, "field")


def test_broken_queue_directories_do_not_stop_the_daemon_from_starting(data_dir: Path) -> None:
    """An agent may leave its queues as a dangling link, a file or a link out while the host is down."""
    ipc = data_dir / "ipc" / "field"
    os.rmdir(ipc / "messages")
    os.symlink("/nonexistent/anywhere", ipc / "messages")
    os.rmdir(ipc / "actions")
    (ipc / "actions").write_text("not a directory")
    os.rmdir(ipc / "tasks")
    os.symlink("../main/tasks", ipc / "tasks")
    daemon = Daemon(data_dir).start()
    try:
        for queue in ("messages", "actions", "tasks"):
            note = wait_note(data_dir, "field", queue, queue=queue)
            assert note["reason"].startswith(f"{queue}/ was replaced by a ")
            assert (ipc / queue).is_dir() and not (ipc / queue).is_symlink()
        assert (ipc / "actions").is_dir()
        ping_ok(data_dir, "field")
        ping_ok(data_dir, "main")
    finally:
        assert daemon.stop() == 0, daemon.log()
    assert (data_dir / "ipc" / "main" / "tasks").is_dir()
    assert "Traceback" not in daemon.log()


def test_polling_mode_serves_and_defends_the_same(data_dir: Path) -> None:
    """FARMHOST_IPC_MODE=poll (no inotify): requests are still answered and hostile entries still quarantined."""
    env = clean_env(FARMHOST_IPC_MODE="poll", FARMHOST_IPC_POLL_SECONDS="0.1")
    daemon = Daemon(data_dir, env=env).start()
    try:
        ping_ok(data_dir, "main")
        queue = data_dir / "ipc" / "field" / "actions"
        os.mkfifo(queue / "fifo.json")
        os.symlink("/etc/passwd", queue / "link.json")
        _swap_for_symlink(data_dir / "ipc" / "field" / "messages", "../main/messages")
        assert "a FIFO" in wait_note(data_dir, "field", "fifo.json")["reason"]
        assert "a symlink" in wait_note(data_dir, "field", "link.json")["reason"]
        assert "replaced by a symlink" in wait_note(data_dir, "field", "messages", queue="messages")["reason"]
        ping_ok(data_dir, "field")
        # Logged once the whole app has started, which may be after IPC answered (a loaded run saw it missing).
        wait_for(lambda: "ipc mode poll" in daemon.log(), what="the start line naming the ipc mode")
    finally:
        assert daemon.stop() == 0, daemon.log()
    assert "Traceback" not in daemon.log()


# a slow handler stalls only its own queue (the real IpcService, in-process) ---------------------------------------


async def _until(condition: Callable[[], Any], what: str, timeout: float = 10.0) -> Any:
    return await wait_for_async(condition, timeout=timeout, interval=0.005, what=what)


@contextlib.asynccontextmanager
async def _service(data_dir: Path, handlers: Handlers, **settings: Any) -> AsyncIterator[IpcService]:
    """The real IpcService on `data_dir` with a special handler table, started and stopped around the block."""
    identity = HostIdentity(pid=os.getpid(), version="test", started_at=now_utc())
    db = Database.open(data_dir)
    service = IpcService(
        settings=build_config(load_settings(data_dir=data_dir, env_file=None).model_copy(update=settings)).ipc,
        layout=DataLayout(data_dir),
        db=db,
        registry=GroupRegistry(db),
        handlers=handlers,
        identity=identity,
    )
    await service.start()
    try:
        yield service
    finally:
        await service.stop()
        db.close()


@pytest.fixture
def quick_data_dir(tmp_path: Path) -> Path:
    """The `data_dir` layout (main and field) made in-process through the registry, without three CLI runs."""
    return init_data_dir_in_process(tmp_path / "data")


def _table(data_dir: Path | None = None) -> Handlers:
    root = data_dir or Path("/nonexistent-farmhost-test-data")
    settings = load_settings(data_dir=root, env_file=None).model_copy(update={"ha_url": None, "ha_token": None})
    config = build_config(settings)
    layout = DataLayout(root)
    farm = FarmDeps(settings=config.farm, layout=layout, ha=None, dashboards_dir=layout.dashboards)
    return build_handlers(config, HostIdentity(pid=os.getpid(), version="test", started_at=now_utc()), farm)


async def test_slow_handler_stalls_only_its_own_queue(quick_data_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    data_dir = quick_data_dir
    started, release = asyncio.Event(), asyncio.Event()

    async def slow_status(ctx: RequestContext, request: AnyRequest) -> Outcome:
        started.set()
        await release.wait()
        return Outcome(result={"slow": True, "group": ctx.group.folder})

    handlers = _table()
    handlers["farm_action:ha_get_status"] = HandlerSpec(effect=Effect.READ, run=slow_status, main_only=True)
    async with _service(data_dir, handlers):
        try:
            drop(data_dir, "main", "actions", {**FARM, "requestId": "slow"})
            await _until(started.is_set, "the slow handler to start")
            drop(data_dir, "main", "actions", {"type": "ping", "requestId": "behind-slow"})
            drop(data_dir, "field", "actions", {"type": "ping", "requestId": "other-group"})
            message = {"type": "message", "chatJid": "telegram:100", "text": "hi", "requestId": "m"}
            drop(data_dir, "main", "messages", message)
            schedule = {"type": "schedule_task", "prompt": "p", "schedule_type": "interval", "schedule_value": 60_000}
            drop(data_dir, "main", "tasks", {**schedule, "requestId": "t"})

            for folder, rid in (("field", "other-group"), ("main", "m"), ("main", "t")):
                result = await _until(lambda f=folder, r=rid: read_result(data_dir, f, r), f"result {rid}")
                assert result["status"] == "success", result
            assert read_result(data_dir, "main", "slow") is None
            assert read_result(data_dir, "main", "behind-slow") is None, "a queue runs in file-name order"
            assert (data_dir / "ipc" / "main" / "actions" / "behind-slow.json").exists()
        finally:
            release.set()
        slow = await _until(lambda: read_result(data_dir, "main", "slow"), "the slow result")
        assert slow["status"] == "success" and slow["result"] == {"slow": True, "group": "main"}
        behind = await _until(lambda: read_result(data_dir, "main", "behind-slow"), "the queued ping")
        assert behind["status"] == "success"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


async def test_handler_over_its_timeout_is_answered_timeout(quick_data_dir: Path) -> None:
    data_dir = quick_data_dir

    async def hang(ctx: RequestContext, request: AnyRequest) -> Outcome:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    handlers = _table()
    handlers["farm_action:ha_get_status"] = HandlerSpec(effect=Effect.READ, run=hang, main_only=True, timeout=0.2)
    async with _service(data_dir, handlers):
        drop(data_dir, "main", "actions", {**FARM, "requestId": "hang"})
        result = await _until(lambda: read_result(data_dir, "main", "hang"), "the timeout result")
        assert result["status"] == "error" and result["errorCode"] == "timeout"
        assert "0.2 s" in result["error"]
        drop(data_dir, "main", "actions", {"type": "ping", "requestId": "after"})
        assert (await _until(lambda: read_result(data_dir, "main", "after"), "ping"))["status"] == "success"


class _BrokenTable(dict[str, HandlerSpec]):
    """A handler table whose lookup fails for one action: stands for any bug inside the host."""

    def get(self, key: str, default: Any = None) -> Any:
        if key == "farm_action:ha_restart":
            raise RuntimeError("a bug inside the host")
        return super().get(key, default)


async def test_request_that_breaks_the_host_does_not_block_its_queue(
    quick_data_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data_dir = quick_data_dir
    async with _service(data_dir, _BrokenTable(_table()), ipc_rescan_seconds=0.05):
        drop(data_dir, "main", "actions", {"type": "farm_action", "action": "ha_restart", "requestId": "a-poison"})
        drop(data_dir, "main", "actions", {"type": "ping", "requestId": "b-behind"})
        behind = await _until(lambda: read_result(data_dir, "main", "b-behind"), "the request behind the poison")
        assert behind["status"] == "success"
        poisoned = await _until(lambda: read_result(data_dir, "main", "a-poison"), "the poison's answer")
        assert poisoned["status"] == "error" and poisoned["errorCode"] == "internal"
        assert "failed 3 times" in poisoned["error"]
        # The answer comes first, then the file leaves the spool for the quarantine, then its note is written.
        notes = await _until(
            lambda: [n for n in quarantined(data_dir, "main") if n["file"] == "a-poison.json"], "the poison's note"
        )
        assert len(notes) == 1 and notes[0]["errorCode"] == "internal"
        assert not (data_dir / "ipc" / ".spool" / "main" / "actions" / "a-poison.json").exists()
        assert "main: actions/a-poison.json failed inside the host 3 times; quarantining it" in caplog.text
        drop(data_dir, "main", "actions", {"type": "ping", "requestId": "c-later"})
        assert (await _until(lambda: read_result(data_dir, "main", "c-later"), "a later ping"))["status"] == "success"


async def test_queue_directory_reopened_by_a_worker_first_is_still_watched(quick_data_dir: Path) -> None:
    """A swap seen first by a worker (it re-opens its queue while draining) must still get an inotify watch."""
    data_dir = quick_data_dir
    # No periodic rescan within the test: only inotify on the new directory can wake the worker.
    async with _service(data_dir, _table(), ipc_rescan_seconds=3600) as service:
        drop(data_dir, "field", "actions", {"type": "ping", "requestId": "before"})
        await _until(lambda: read_result(data_dir, "field", "before"), "the first ping")
        actions = data_dir / "ipc" / "field" / "actions"
        watcher = service._watcher
        assert watcher is not None
        old_watch = watcher._by_target[("field", "actions")]
        os.rename(actions, actions.with_name("actions-away"))
        os.mkdir(actions)
        with service._groups["field"].gdir.lease(Queue.ACTIONS):  # what a draining worker does before the event
            pass
        # The group-directory events handled: the new directory has a watch of its own (a new watch descriptor).
        await _until(
            lambda: watcher._by_target.get(("field", "actions")) not in (None, old_watch), "the new directory watched"
        )
        drop(data_dir, "field", "actions", {"type": "ping", "requestId": "after"})
        answered = await _until(lambda: read_result(data_dir, "field", "after"), "the ping (woken by inotify)")
        assert answered["status"] == "success"


async def test_reads_listed_together_run_side_by_side_and_a_change_keeps_its_place(quick_data_dir: Path) -> None:
    """Reads found in one listing are answered side by side; a change between them keeps its place.

    The change waits for the reads before it and runs before the reads after it: file-name order holds for
    everything that changes something.
    """
    data_dir = quick_data_dir
    events: list[str] = []
    second_pair_started = asyncio.Event()

    async def read(ctx: RequestContext, request: AnyRequest) -> Outcome:
        events.append(f"start {ctx.request_id}")
        if ctx.request_id == "r-4":
            # Answered one after the other, r-5 would start only after r-4 is answered: this would time out.
            await second_pair_started.wait()
        if ctx.request_id == "r-5":
            second_pair_started.set()
        events.append(f"end {ctx.request_id}")
        return Outcome(result={"read": ctx.request_id})

    def change(ctx: RequestContext, request: AnyRequest, conn: Any) -> Outcome:
        published = sorted(p.name for p in (data_dir / "ipc" / "main" / "action_results").glob("r-*.json"))
        events.append(f"change {ctx.request_id} after {','.join(published)}")
        return Outcome(result={"changed": True})

    handlers = _table()
    handlers["farm_action:ha_get_status"] = HandlerSpec(effect=Effect.READ, run=read, main_only=True, timeout=5)
    handlers["farm_action:ha_restart"] = HandlerSpec(effect=Effect.STATE, apply=change, main_only=True)
    for rid in ("r-1", "r-2", "r-4", "r-5"):
        drop(data_dir, "main", "actions", {**FARM, "requestId": rid})
    drop(data_dir, "main", "actions", {**FARM, "action": "ha_restart", "requestId": "r-3"})
    async with _service(data_dir, handlers):
        results = [await _until(lambda r=rid: read_result(data_dir, "main", r), rid) for rid in ("r-4", "r-5", "r-3")]
    assert all(r["status"] == "success" for r in results), results
    assert events[:5] == ["start r-1", "end r-1", "start r-2", "end r-2", "change r-3 after r-1.json,r-2.json"]
    assert events[5:] == ["start r-4", "start r-5", "end r-5", "end r-4"]


# a drain does only the listings a request needs ---------------------------------------------------------------------


async def test_a_lone_request_lists_its_queue_once_and_a_clean_spool_not_at_all(quick_data_dir: Path) -> None:
    """Woken by inotify, a worker lists its queue once per request arriving alone, and its empty spool never.

    The queue's listing after the request's own found nothing on every ping (the next arrival wakes the worker
    anyway), and so did the spool's, which holds something only after a request could not be answered.
    """
    data_dir = quick_data_dir
    async with _service(data_dir, _table(), ipc_rescan_seconds=3600) as service:
        worker = service._groups["field"].workers[Queue.ACTIONS]
        drop(data_dir, "field", "actions", {"type": "ping", "requestId": "first"})
        await _until(lambda: read_result(data_dir, "field", "first"), "the first ping")
        spooled, listed = worker.spool_listings, worker.queue_listings
        for n in range(5):
            drop(data_dir, "field", "actions", {"type": "ping", "requestId": f"lone-{n}"})
            await _until(lambda n=n: read_result(data_dir, "field", f"lone-{n}"), f"ping {n}")
            await _until(lambda: not worker._lock.locked(), "the drain to end")
        assert (worker.spool_listings - spooled, worker.queue_listings - listed) == (0, 5)


class _BrokenUntilFixed(_BrokenTable):
    """`_BrokenTable` until `fixed` is set: a request the host fails on, then answers."""

    fixed = False

    def get(self, key: str, default: Any = None) -> Any:
        return dict.get(self, key, default) if self.fixed else super().get(key, default)


async def test_a_request_left_in_the_spool_is_answered_at_the_next_drain(quick_data_dir: Path) -> None:
    """A request the host failed on stays in the spool; the next drain (here woken by the next request) lists it."""
    data_dir = quick_data_dir
    table = _BrokenUntilFixed(_table())
    async with _service(data_dir, table, ipc_rescan_seconds=3600) as service:
        worker = service._groups["main"].workers[Queue.ACTIONS]
        drop(data_dir, "main", "actions", {"type": "farm_action", "action": "ha_restart", "requestId": "a-fails"})
        await _until(lambda: worker._failures.get("a-fails.json") == 1, "the failure counted")
        assert (data_dir / "ipc" / ".spool" / "main" / "actions" / "a-fails.json").exists()
        table.fixed = True
        drop(data_dir, "main", "actions", {"type": "ping", "requestId": "b-wakes"})
        retried = await _until(lambda: read_result(data_dir, "main", "a-fails"), "the retried request's answer")
        assert retried["requestId"] == "a-fails"
        assert (await _until(lambda: read_result(data_dir, "main", "b-wakes"), "the ping"))["status"] == "success"


async def test_a_request_arriving_while_another_is_answered_is_found_without_a_rescan(quick_data_dir: Path) -> None:
    data_dir = quick_data_dir
    started, release = asyncio.Event(), asyncio.Event()

    async def slow(ctx: RequestContext, request: AnyRequest) -> Outcome:
        started.set()
        await release.wait()
        return Outcome(result={"slow": True})

    handlers = _table()
    handlers["farm_action:ha_get_status"] = HandlerSpec(effect=Effect.READ, run=slow, main_only=True)
    async with _service(data_dir, handlers, ipc_rescan_seconds=3600):
        drop(data_dir, "main", "actions", {**FARM, "requestId": "a-slow"})
        await _until(started.is_set, "the slow handler to start")
        drop(data_dir, "main", "actions", {"type": "ping", "requestId": "b-meanwhile"})
        await asyncio.sleep(0)  # the loop reads the arrival's event while the first request is in progress
        release.set()
        assert (await _until(lambda: read_result(data_dir, "main", "b-meanwhile"), "the ping"))["status"] == "success"
