"""Input that used to end in `internal`, silence or a wrong reason gets a specific answer from the real daemon."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest
from farmhost_testing import FIELD_JID, MAIN_JID, drop, read_result, result_path, wait_for, wait_result
from inotify_simple import INotify, flags
from ipc_support import Env, outbox, ping_ok, uid, wait_note, write_raw

from farmhost.ipc.quarantine import NOTE_SUFFIX


def _ask(env: Env, folder: str, queue: str, payload: dict[str, Any]) -> dict[str, Any]:
    rid = uid()
    drop(env.data_dir, folder, queue, {**payload, "requestId": rid})
    result: dict[str, Any] = wait_result(env.data_dir, folder, rid)
    return result


def _refused(result: dict[str, Any], *words: str) -> str:
    assert (result["status"], result["errorCode"], result["result"]) == ("error", "invalid_request", None), result
    for word in words:
        assert word in result["error"], result
    return str(result["error"])


def _schedule(value: str | int, schedule_type: str = "once", **extra: Any) -> dict[str, Any]:
    return {"type": "schedule_task", "prompt": "p", "schedule_type": schedule_type, "schedule_value": value, **extra}


# schedules at the edges of the date range ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("0001-01-01T00:00:00+14:00", ("outside the supported date range",)),
        ("9999-12-31T23:59:59-14:00", ("outside the supported date range",)),
        ("0001-01-01T00:00:00", ("in the past",)),
        ("9999-12-31T23:59:59", ("too far in the future",)),
        ("9999-12-30T00:00:00Z", ("too far in the future",)),
    ],
)
def test_once_at_the_edges_of_the_date_range_is_refused_with_a_reason(
    env: Env, value: str, words: tuple[str, ...]
) -> None:
    _refused(_ask(env, "field", "tasks", _schedule(value)), *words)
    ping_ok(env.data_dir, "field")


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("0 0 30 2 *", ("never fires", "day 30", "month 2")),
        ("0 0 31 2,4,6,9,11 *", ("never fires", "day 31")),
        ("*/5 * 30-31 feb *", ("never fires",)),
    ],
)
def test_never_firing_cron_is_refused_with_a_reason(env: Env, value: str, words: tuple[str, ...]) -> None:
    _refused(_ask(env, "field", "tasks", _schedule(value, "cron")), *words)


def test_cron_on_february_29_is_accepted(env: Env) -> None:
    result = _ask(env, "field", "tasks", _schedule("0 6 29 2 *", "cron"))
    assert result["status"] == "success", result
    assert "-02-29T" in result["result"]["nextRun"]


# a file message whose name is long ------------------------------------------------------------------------------


def test_file_with_a_name_of_255_bytes_is_queued(env: Env) -> None:
    name = "n" * 251 + ".txt"
    (env.data_dir / "groups" / "main" / name).write_text("long-named report\n")
    result = _ask(env, "main", "messages", {"type": "file", "chatJid": MAIN_JID, "path": name})
    assert result["status"] == "success" and result["result"]["bytes"] == 18, result
    queued = [e for e in outbox(env.data_dir) if e["messageKey"].endswith(result["requestId"])]
    assert len(queued) == 1, queued


def test_path_with_a_component_over_255_bytes_is_refused(env: Env) -> None:
    result = _ask(env, "main", "messages", {"type": "file", "chatJid": MAIN_JID, "path": "x" * 300 + ".png"})
    _refused(result, "255")


# a malformed file reusing an answered id gets the earlier answer back ------------------------------------------


def test_malformed_file_reusing_an_answered_id_gets_the_stored_result(env: Env) -> None:
    rid = uid("reused")
    drop(env.data_dir, "field", "actions", {"type": "ping", "requestId": rid})
    first = wait_result(env.data_dir, "field", rid)
    assert first["status"] == "success", first
    result_path(env.data_dir, "field", rid).unlink()  # the agent collected it
    write_raw(env.data_dir / "ipc" / "field" / "actions", f"{rid}.json", b"{not json")
    assert "not valid JSON" in wait_note(env.data_dir, "field", f"{rid}.json")["reason"]
    assert wait_result(env.data_dir, "field", rid) == first


# old mtime on a file that arrives while the host runs -----------------------------------------------------------


def test_old_file_copied_in_while_running_is_executed(env: Env) -> None:
    rid = uid("copied")
    queue = env.data_dir / "ipc" / "field" / "actions"
    tmp = queue / f".{rid}.tmp"
    tmp.write_text(json.dumps({"type": "ping", "requestId": rid}))
    two_hours_ago = time.time() - 7200
    os.utime(tmp, (two_hours_ago, two_hours_ago))  # what `cp -p` of an old file does
    os.rename(tmp, queue / f"{rid}.json")
    result = wait_result(env.data_dir, "field", rid)
    assert result["status"] == "success", result


# NUL characters in text that goes to Telegram, the database or an agent's prompt --------------------------------

NUL_CASES = {
    "message": ("messages", {"type": "message", "chatJid": FIELD_JID, "text": "pump\x00on"}),
    "caption": ("messages", {"type": "file", "chatJid": FIELD_JID, "path": "note.txt", "caption": "a\x00b"}),
    "prompt": ("tasks", _schedule(60_000, "interval", prompt="check\x00 the tank")),
    "task-type": ("tasks", _schedule("2999-01-01T00:00\x00")),
}


@pytest.mark.parametrize("case", NUL_CASES)
def test_text_with_nul_characters_is_refused(env: Env, case: str) -> None:
    queue, payload = NUL_CASES[case]
    before = len(outbox(env.data_dir))
    _refused(_ask(env, "field", queue, payload), "NUL")
    assert len(outbox(env.data_dir)) == before, "nothing may reach the outbox"


def test_register_group_with_nul_in_its_name_is_refused(env: Env) -> None:
    payload = {"type": "register_group", "jid": "telegram:777", "name": "crew\x00", "folder": "crew777"}
    _refused(_ask(env, "main", "tasks", payload), "NUL")
    assert read_result(env.data_dir, "main", "never-written") is None
    wait_for(lambda: not (env.data_dir / "groups" / "crew777").exists(), what="no workspace for a refused group")


@pytest.mark.parametrize(
    "payload",
    [
        {"type": "farm_action", "action": "ha_call_service", "params": {"domain": "light", "service": "turn_on\x00"}},
        {"type": "memory_action", "action": "memory_search", "params": {"query": "pump\x00"}},
        {"type": "memory_action", "action": "memory_search", "params": {"query": "pump", "deep": [[{"k\x00": 1}]]}},
    ],
)
def test_params_with_nul_characters_are_refused(env: Env, payload: dict[str, Any]) -> None:
    _refused(_ask(env, "main", "actions", payload), "NUL")


@pytest.mark.parametrize(
    ("params", "sentence"),
    [
        ({"query": "pump", "topK": 1.5}, "memory_search: param 'topK' must be a whole number (got 1.5)"),
        (
            {"query": "pump", "sources": 5},
            "memory_search: param 'sources' must be 'memory', 'sessions' or 'all' (got 5)",
        ),
        ({"query": 5}, "memory_search: param 'query' must be text (got 5)"),
        (
            {"query": "pump", "groupFolder": "field\n"},
            "memory_search: param 'groupFolder' must be a name of 1-64 letters, digits, '_' or '-' (a view path or a group folder",
        ),
    ],
)
def test_params_refusals_name_the_param_as_the_agent_wrote_it(env: Env, params: dict[str, Any], sentence: str) -> None:
    """The sentence names the param, never pydantic's names for its validators or union branches."""
    payload = {"type": "memory_action", "action": "memory_search", "params": params}
    _refused(_ask(env, "field", "actions", payload), sentence)


# the reason note appears whole -----------------------------------------------------------------------------------


def test_a_quarantine_note_appears_whole_under_its_name(env: Env) -> None:
    """Whoever waits for `<entry>.reason.json` (the operator, `farmhost doctor`) never opens it empty."""
    errors = env.data_dir / "ipc" / "errors" / "field"
    errors.mkdir(parents=True, exist_ok=True)
    name = f"{uid('torn')}.json"
    with INotify() as watch:
        watch.add_watch(errors, flags.CREATE | flags.MODIFY | flags.CLOSE_WRITE | flags.MOVED_TO)
        write_raw(env.data_dir / "ipc" / "field" / "actions", name, b"{not json")
        note = wait_note(env.data_dir, "field", name)
        seen = [(event.name, [flag.name for flag in flags.from_mask(event.mask)]) for event in watch.read(timeout=0)]
    assert note["errorCode"] == "invalid_request" and "not valid JSON" in note["reason"], note
    notes = [flagged for event_name, flagged in seen if event_name.endswith(f"{name}{NOTE_SUFFIX}")]
    assert notes == [["MOVED_TO"]], seen
