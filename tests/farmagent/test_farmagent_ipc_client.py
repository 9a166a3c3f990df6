"""The in-sandbox IPC client against the real daemon: round trips, typed errors, dead hosts, safe files, polling."""

from __future__ import annotations

import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from agent_support import Farm, fake_ipc_dir, pending, write_status
from farmagent.errors import HostUnavailableError, InvalidRequestError, NoResultError, ProtocolError, RequestError
from farmagent.ipc import IpcClient, new_request_id
from farmagent.ipc.files import temp_name
from farmhost_testing import FIELD_JID, MAIN_JID, Daemon, wait_for

from farmhost.ipc.reader import is_request_name
from farmhost.protocol.codes import REQUEST_ID_RE as HOST_REQUEST_ID_RE
from farmhost.store import outbox
from farmhost.store.db import Database


def test_ping_round_trip_leaves_nothing_behind(farm: Farm) -> None:
    client = farm.client()
    answer = client.ping()
    assert answer["pong"] is True and answer["version"]
    assert client.last_wait_mode == "inotify"
    assert os.listdir(farm.ipc() / "action_results") == []  # the client deleted its result
    assert pending(farm.ipc()) == []


def test_request_returns_the_envelope_and_unwrap_raises_the_typed_error(farm: Farm) -> None:
    client = farm.client()
    rid = new_request_id()
    envelope = client.request(
        {"type": "memory_action", "action": "memory_get", "params": {"path": "memory/none.md"}}, request_id=rid
    )
    assert envelope.request_id == rid and not envelope.ok
    assert envelope.error_code == "not_found" and "memory/none.md" in (envelope.error or "")
    with pytest.raises(RequestError) as caught:
        envelope.unwrap()
    assert caught.value.code == "not_found" and caught.value.request_id == rid
    with pytest.raises(RequestError, match="not_found"):
        client.memory_get("memory/none.md")


def test_schedule_task_shows_in_the_snapshot_and_pause_resume_cancel_work(farm: Farm) -> None:
    client = farm.client()
    created = client.schedule_task("Check the greenhouse vents", "interval", 3_600_000, context_mode="group")
    task_id = created["taskId"]
    assert created["nextRun"]

    def status() -> str | None:
        return next((t["status"] for t in client.current_tasks() if t["id"] == task_id), None)

    assert status() == "active"
    (task,) = [t for t in client.current_tasks() if t["id"] == task_id]
    assert task["prompt"] == "Check the greenhouse vents" and task["context_mode"] == "group"
    client.pause_task(task_id)
    assert status() == "paused"
    with pytest.raises(RequestError) as caught:
        client.pause_task(task_id)
    assert caught.value.code == "conflict"
    client.resume_task(task_id)
    assert status() == "active"
    client.cancel_task(task_id)
    assert status() in (None, "cancelled")
    with pytest.raises(RequestError) as caught:
        farm.client("field").cancel_task("no-such-task")
    assert caught.value.code == "not_found"


def test_send_message_lands_in_the_outbox(farm: Farm) -> None:
    text = f"Pump 2 is back online ({new_request_id()})"
    answer = farm.client().send_message(FIELD_JID, text)
    assert answer == {"queued": True, "chatJid": FIELD_JID, "chunks": 1}
    db = Database.open(farm.data_dir)
    try:
        bodies = [(e.chat_jid, e.body, e.source_folder) for e in outbox.list_entries(db.conn, limit=100_000)]
    finally:
        db.close()
    assert (FIELD_JID, text, "main") in bodies


def test_a_non_main_group_gets_unauthorized_for_main_only_requests(farm: Farm) -> None:
    client = farm.client("field")
    for call in (
        lambda: client.ha_get_status(domains=["sensor"]),
        lambda: client.send_message(MAIN_JID, "hello main"),
        lambda: client.refresh_groups(),
    ):
        with pytest.raises(RequestError) as caught:
            call()
        assert caught.value.code == "unauthorized", caught.value


def test_memory_search_and_get_read_the_real_memory(farm: Farm) -> None:
    client = farm.client()
    hits = client.memory_search("tomatoes", top_k=3)["hits"]
    assert hits and hits[0]["groupFolder"] == "main" and "San Marzano" in hits[0]["snippet"]
    assert hits[0]["citation"].startswith("MEMORY.md#L")
    window = client.memory_get("MEMORY.md", lines=2)
    assert window["text"].startswith("# Farm notes") and window["totalLines"] == 3 and window["nextFrom"] == 3


def test_snapshots_are_readable(farm: Farm) -> None:
    client = farm.client()
    assert client.host_alive()["status"] == "alive"
    groups = {g["folder"] for g in client.available_groups()["groups"]}
    assert {"main", "field"} <= groups
    assert farm.client("field").available_groups()["groups"] == []


def test_polling_mode_gets_results_too(farm: Farm) -> None:
    client = farm.client(mode="poll")
    assert client.ping()["pong"] is True
    assert client.last_wait_mode == "poll"
    env_client = IpcClient.from_env({"FARMAGENT_IPC_DIR": str(farm.ipc()), "FARMAGENT_IPC_MODE": "poll"})
    assert env_client.mode == "poll" and env_client.memory_search("irrigation")["hits"]
    assert env_client.last_wait_mode == "poll"


def test_concurrent_requests_are_never_seen_half_written(farm: Farm) -> None:
    client = farm.client("field")
    big = "x" * 60_000  # large enough that a non-atomic write would be caught in the middle
    with ThreadPoolExecutor(max_workers=16) as pool:
        pings = [pool.submit(client.ping) for _ in range(24)]
        sends = [pool.submit(client.send_message, FIELD_JID, f"{i} {big}") for i in range(8)]
        assert all(f.result()["pong"] for f in pings)
        assert all(f.result()["queued"] for f in sends)
    assert farm.quarantine("field") == []
    assert pending(farm.ipc("field")) == []


@pytest.mark.parametrize("bad", ["", ".hidden", "../escape", "a b", "x" * 129, "ü-umlaut", "-leading", "a/b"])
def test_request_ids_the_host_would_refuse_are_refused_before_writing(farm: Farm, bad: str) -> None:
    assert HOST_REQUEST_ID_RE.fullmatch(bad) is None  # the host's own pattern agrees these are bad
    before = pending(farm.ipc())
    with pytest.raises(InvalidRequestError, match="requestId"):
        farm.client().request({"type": "ping"}, request_id=bad)
    assert pending(farm.ipc()) == before


def test_generated_request_ids_are_valid_unique_and_sortable() -> None:
    ids = [new_request_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    assert all(HOST_REQUEST_ID_RE.fullmatch(i) for i in ids)
    assert ids == sorted(ids, key=lambda i: int(i.split("-")[0]))


def test_a_stopped_host_is_reported_at_once_not_waited_for(data_dir: Path, daemon: Daemon) -> None:
    client = IpcClient(data_dir / "ipc" / "main", timeout=30)
    assert client.ping()["pong"] is True
    assert daemon.stop() == 0
    with pytest.raises(HostUnavailableError, match="stopped"):
        client.ping()  # a hang would end in NoResultError after 30 s instead
    assert pending(data_dir / "ipc" / "main") == []  # nothing was written for a host that is not there


def test_a_stale_heartbeat_means_the_host_is_gone(tmp_path: Path) -> None:
    ipc = fake_ipc_dir(tmp_path / "ipc", heartbeat_age=3600)
    # The age is read when the client runs, in whole seconds: 3600, or a little more on a machine that stalled it
    with pytest.raises(HostUnavailableError, match=r"heartbeat .* is 360[0-9] s old"):
        IpcClient(ipc, timeout=30).ping()
    assert pending(ipc) == []
    (ipc / "host_status.json").unlink()
    with pytest.raises(HostUnavailableError, match="no farmhost has served"):
        IpcClient(ipc, timeout=30).ping()


def test_a_host_that_stops_during_the_wait_ends_the_wait_and_withdraws_the_request(tmp_path: Path) -> None:
    ipc = fake_ipc_dir(tmp_path / "ipc")

    def stop_once_asked() -> None:  # the host stops while the client waits: after its request is there
        wait_for(
            lambda: [n for n in os.listdir(ipc / "actions") if is_request_name(n)], what="the request to be written"
        )
        write_status(ipc, status="stopped")

    with ThreadPoolExecutor(1) as pool:
        stopper = pool.submit(stop_once_asked)
        with pytest.raises(HostUnavailableError, match="withdrawn unexecuted"):
            IpcClient(ipc, timeout=30).ping()
        stopper.result()
    assert pending(ipc) == []


def test_no_result_in_time_withdraws_an_unclaimed_request(tmp_path: Path) -> None:
    ipc = fake_ipc_dir(tmp_path / "ipc")
    with pytest.raises(NoResultError) as caught:
        IpcClient(ipc, timeout=0.3).ping()
    assert caught.value.withdrawn and caught.value.code == "timeout"
    assert pending(ipc) == []


def test_requests_carry_an_expiry_so_a_late_host_never_runs_them(tmp_path: Path) -> None:
    ipc = fake_ipc_dir(tmp_path / "ipc")
    rid = IpcClient(ipc).submit({"type": "ping"}, expires_in=40, ttl=5)
    written = json.loads((ipc / "actions" / f"{rid}.json").read_text())
    assert written["requestId"] == rid and written["ttl"] == 5 and written["expiresAt"].endswith("Z")


def test_the_result_file_is_never_followed_through_a_link(tmp_path: Path) -> None:
    ipc = fake_ipc_dir(tmp_path / "ipc")
    secret = tmp_path / "secret.json"
    secret.write_text('{"requestId": "r-1", "status": "success"}')
    (ipc / "action_results" / "r-1.json").symlink_to(secret)
    with pytest.raises(ProtocolError, match="only regular files"):
        IpcClient(ipc).wait("r-1", timeout=2)
    assert not os.path.lexists(ipc / "action_results" / "r-1.json") and secret.exists()


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"{not json", "not valid JSON"),
        (b'{"requestId": "other", "type": "ping", "status": "success"}', "answers requestId 'other'"),
        (b'{"requestId": "r-2", "type": "ping", "status": "maybe"}', "status 'maybe'"),
        (b'{"requestId": "r-2", "type": "ping", "status": "error", "errorCode": "oops"}', "unknown errorCode"),
        (b"[1]", "not a JSON object"),
        (b" " * (9 << 20), "over the"),
    ],
)
def test_a_bad_result_file_is_a_protocol_error(tmp_path: Path, content: bytes, problem: str) -> None:
    ipc = fake_ipc_dir(tmp_path / "ipc")
    (ipc / "action_results" / "r-2.json").write_bytes(content)
    with pytest.raises(ProtocolError, match=problem):
        IpcClient(ipc).wait("r-2", timeout=2)


def test_unknown_request_types_and_farm_actions_are_refused(tmp_path: Path) -> None:
    client = IpcClient(fake_ipc_dir(tmp_path / "ipc"))
    with pytest.raises(InvalidRequestError, match="unknown request type"):
        client.request({"type": "shell"})
    with pytest.raises(InvalidRequestError, match="unknown farm action"):
        client.farm_action("ha_format_disk")
    assert pending(tmp_path / "ipc") == []


def test_the_wait_sees_a_result_written_while_it_sleeps(tmp_path: Path) -> None:
    ipc = fake_ipc_dir(tmp_path / "ipc")
    body = b'{"requestId": "r-3", "type": "ping", "action": null, "status": "success", "result": {"pong": true}}'

    def answer() -> None:
        time.sleep(0.3)
        tmp = ipc / "action_results" / ".r-3.tmp"
        tmp.write_bytes(body)
        os.rename(tmp, ipc / "action_results" / "r-3.json")

    for mode in ("inotify", "poll"):
        threading.Thread(target=answer).start()
        result = IpcClient(ipc, mode=mode).wait("r-3", timeout=5)  # type: ignore[arg-type]
        assert result.unwrap() == {"pong": True}


def test_temporary_names_are_ones_the_host_skips() -> None:
    assert is_request_name("1-ab.json")
    assert not is_request_name(temp_name("1-ab.json"))


def test_an_unwatchable_directory_falls_back_to_polling(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ipc = fake_ipc_dir(tmp_path / "ipc")
    (ipc / "action_results").rmdir()  # inotify cannot watch what is not there
    client = IpcClient(ipc, timeout=0.3)
    with pytest.raises(NoResultError):
        client.ping()
    assert client.last_wait_mode == "poll" and "polling instead" in capsys.readouterr().err
