"""Issue 32, the call side: the closed service surface, its order before the rules, the safe direction, bounded approvals.

The real daemon, the real Home Assistant test instance and the fake Bot API, on a profile that puts the pump under
approval, the valves under a rate and the irrigation duration under a range, and opens the control actions to the
non-main group `field` too. Every attack of the issue that worked once is a row here, run from `main` and `field`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from farm_daemon import audit, db_rows, farm_daemon, sent_with, wait_counted
from farmhost_testing import MAIN_JID, drop, refused, wait_for, wait_result
from ha_fixture import HaInstance
from telegram_stub import FakeTelegram

pytestmark = pytest.mark.slow  # end to end, seconds each

MAIN_CHAT = int(MAIN_JID.removeprefix("telegram:"))
PUMP = "switch.irrigation_pump"
VALVE_1 = "switch.field_1_valve"
VALVE_2 = "switch.field_2_valve"
DURATION = "number.irrigation_duration"
PROGRAM = "select.fertigation_program"
OPEN = {"ha_call_service": ["main", "field"], "ha_set_entity": ["main", "field"]}
RULES: list[dict[str, Any]] = [
    {"entities": [PUMP], "requireApproval": True},
    {"entities": ["switch.field_*_valve"], "maxCallsPerHour": 4},
    {"entities": [DURATION], "valueRange": [0, 120]},
]
FOLDERS = ["main", "field"]


def _profile(data_dir: Path, rules: list[dict[str, Any]], **policy: Any) -> None:
    document = {"policy": {"actionGroups": OPEN, "rules": rules, **policy}}
    (data_dir / "farm-profile.json").write_text(json.dumps(document))


def _act(data_dir: Path, folder: str, rid: str, params: dict[str, Any], action: str) -> dict[str, Any]:
    """Drop a farm action the way an agent does and wait for its result."""
    drop(data_dir, folder, "actions", {"type": "farm_action", "action": action, "requestId": rid, "params": params})
    return wait_result(data_dir, folder, rid, timeout=20)


def _run(data_dir: Path, folder: str, rid: str, call: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    action, params = call
    return _act(data_dir, folder, rid, params, action)


def _call(domain: str, service: str, **parts: Any) -> tuple[str, dict[str, Any]]:
    return "ha_call_service", {"domain": domain, "service": service, **parts}


def _set(entity_id: str, value: Any) -> tuple[str, dict[str, Any]]:
    return "ha_set_entity", {"entityId": entity_id, "value": value}


def _asked_texts(tg: FakeTelegram) -> list[str]:
    return sent_with(tg, MAIN_CHAT, "Approval needed")


def _notifications(ha: HaInstance) -> list[Any]:
    with ha.ws() as ws:
        answer = ws.command("persistent_notification/get")
    found = answer["result"]
    return list(found.values()) if isinstance(found, dict) else list(found)


# -------------------------------------------------------------------------------- the closed surface, first

# (label, (action, params), words of the refusal): findings 1, 2, 7 and 9 of issue 32.
OUTSIDE: list[tuple[str, tuple[str, dict[str, Any]], tuple[str, ...]]] = [
    ("assist by a service call", _call("conversation", "process", data={"text": "turn on the irrigation pump"}), ("ha_assist",)),
    ("a delayed assist command", _call("conversation", "process", data={"text": "in 2 hours turn on the pump"}), ("ha_assist",)),
    ("scene.apply on the pump", _call("scene", "apply", data={"entities": {PUMP: "on"}}), ("scene.apply", "policy.allowServices")),
    ("scene.apply past a range", _call("scene", "apply", data={"entities": {DURATION: {"state": 230}}}), ("scene.apply",)),
    ("scene.apply on a valve", _call("scene", "apply", data={"entities": {VALVE_1: "on"}}), ("scene.apply",)),
    ("scene.create", _call("scene", "create", data={"scene_id": "pump_on", "entities": {PUMP: "on"}}), ("scene.create",)),
    ("scene.turn_on", _call("scene", "turn_on", target={"entity_id": "scene.pump_on"}), ("scene.turn_on",)),
    ("homeassistant.turn_on on the pump", _call("homeassistant", "turn_on", target={"entity_id": PUMP}), ("never allowed",)),
    ("logger level", _call("logger", "set_default_level", data={"level": "debug"}), ("logger.set_default_level",)),
    ("a notification", _call("persistent_notification", "create", data={"message": "Pump approval is not needed today"}), ("persistent_notification.create",)),
    ("an interlock off", _call("automation", "turn_off", target={"entity_id": "automation.pump_interlock"}), ("automation.turn_off",)),
    ("template.reload", _call("template", "reload"), ("template.reload", "allowServices")),
    ("a helper reload", _call("input_boolean", "reload"), ("input_boolean.reload",)),
    ("a script", _call("script", "turn_on", target={"entity_id": "script.water_all"}), ("script.turn_on",)),
    ("notify", _call("notify", "notify", data={"message": "x"}), ("notify.notify",)),
    ("an untargeted switch call", _call("switch", "turn_on"), ("addressed to entities",)),
]  # fmt: skip


@pytest.mark.parametrize("folder", FOLDERS)
def test_a_service_outside_the_closed_surface_is_not_allowed_and_asks_nobody(
    folder: str, data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    _profile(data_dir, RULES)
    duration = ha_reset.get_state(DURATION)["state"]
    notifications = _notifications(ha_reset)
    answers: dict[str, dict[str, Any]] = {}
    with farm_daemon(data_dir, ha_env, fake_telegram):
        for index, (label, (action, params), _) in enumerate(OUTSIDE):
            answers[label] = _act(data_dir, folder, f"r-out-{index}", params, action)
        # the same pump, through a service the surface has: asked for approval (the control of the test)
        pending = _run(data_dir, folder, "r-in", _call("switch", "turn_on", target={"entity_id": PUMP}))
        wait_for(lambda: _asked_texts(fake_telegram), timeout=15, what="the one approval message")

    for label, _, words in OUTSIDE:
        refused(answers[label], "not_allowed", *words)
    refused(pending, "pending_approval")
    (asked,) = _asked_texts(fake_telegram)
    assert pending["result"]["approvalId"] in asked  # the only one: nothing refused asked anybody first
    assert len(db_rows(data_dir, "SELECT id FROM approvals")) == 1
    assert [line["errorCode"] for line in audit(data_dir) if line["requestId"].startswith("r-out-")] == [
        "not_allowed"
    ] * len(OUTSIDE)
    assert ha_reset.get_state(PUMP)["state"] == "off"
    assert ha_reset.get_state(VALVE_1)["state"] == "off"
    assert ha_reset.get_state(DURATION)["state"] == duration
    assert _notifications(ha_reset) == notifications


@pytest.mark.parametrize("folder", FOLDERS)
def test_allow_services_opens_what_it_lists_and_never_a_denied_domain_or_assist(
    folder: str, data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    opened = ["persistent_notification.create", "homeassistant.*", "conversation.*", "switch.*"]
    _profile(data_dir, RULES, allowServices=opened)
    message = f"a note from {folder}"
    with farm_daemon(data_dir, ha_env, fake_telegram):
        note = _run(data_dir, folder, "r-note", _call("persistent_notification", "create", data={"message": message}))
        denied = _run(data_dir, folder, "r-ha", _call("homeassistant", "turn_on", target={"entity_id": PUMP}))
        assist = _run(
            data_dir, folder, "r-conv", _call("conversation", "process", data={"text": "turn on the irrigation pump"})
        )
        unknown = _run(data_dir, folder, "r-unknown", _call("switch", "no_such_service", target={"entity_id": VALVE_1}))
        logger = _run(data_dir, folder, "r-logger", _call("logger", "set_default_level", data={"level": "info"}))

    assert note["status"] == "success", note
    assert [n for n in _notifications(ha_reset) if n.get("message") == message]
    refused(denied, "not_allowed", "never allowed")
    refused(assist, "not_allowed", "ha_assist")
    refused(unknown, "not_found", "switch.no_such_service")  # opened by the glob: Home Assistant answers
    refused(logger, "not_allowed", "logger.set_default_level")  # not listed
    assert ha_reset.get_state(PUMP)["state"] == "off"
    assert not db_rows(data_dir, "SELECT id FROM approvals")


# -------------------------------------------------------------------------------- the safe direction


@pytest.mark.parametrize("folder", FOLDERS)
def test_the_safe_direction_is_never_held_by_a_spent_rate_or_an_approval(
    folder: str, data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    rules = [
        *RULES,
        {"entities": [DURATION], "requireApproval": True, "valueRange": [10, 120]},
        {"entities": [PROGRAM], "requireApproval": True, "safeState": "none"},
    ]
    _profile(data_dir, rules)
    ha_reset.set_state(PUMP, "on")  # a person turned it on
    ha_reset.set_state(PROGRAM, "bloom")
    ha_reset.set_state(DURATION, 60)
    valve_on = [
        _set(VALVE_1, "on"),
        _call("switch", "turn_on", target={"entity_id": VALVE_1}),
        _set(VALVE_1, True),
        _call("switch", "turn_on", data={"entity_id": VALVE_1}),
    ]
    with farm_daemon(data_dir, ha_env, fake_telegram):
        spent = []
        for i, call in enumerate(valve_on):  # rates count effects: an "on" of a valve that is off, counted once seen
            spent.append(_run(data_dir, folder, f"r-spend-{i}", call))
            wait_counted(data_dir, VALVE_1, i + 1)
            if i < len(valve_on) - 1:
                assert _run(data_dir, folder, f"r-spend-off-{i}", _call("switch", "turn_off", target={"entity_id": VALVE_1}))["status"] == "success"  # fmt: skip
        over = _run(data_dir, folder, "r-over", _set(VALVE_1, "on"))
        toggle = _run(data_dir, folder, "r-toggle", _call("switch", "toggle", target={"entity_id": VALVE_1}))  # fmt: skip
        off = _run(data_dir, folder, "r-off", _call("switch", "turn_off", target={"entity_id": VALVE_1}))
        valve_after_off = ha_reset.get_state(VALVE_1)["state"]
        again = _run(data_dir, folder, "r-on-again", _set(VALVE_1, "on"))
        set_off = _run(data_dir, folder, "r-set-off", _set(VALVE_1, "off"))
        pump_off = _run(data_dir, folder, "r-pump-off", _set(PUMP, "off"))
        pump_on = _run(data_dir, folder, "r-pump-on", _set(PUMP, "on"))
        low = _run(data_dir, folder, "r-low", _set(DURATION, 10))
        higher = _run(data_dir, folder, "r-higher", _set(DURATION, 11))
        program = _run(data_dir, folder, "r-program", _call("select", "select_option", target={"entity_id": PROGRAM}, data={"option": "none"}))  # fmt: skip
        other_program = _run(data_dir, folder, "r-grow", _set(PROGRAM, "grow"))

    assert [answer["status"] for answer in spent] == ["success"] * 4
    refused(over, "rate_limited", "the limit is 4")
    refused(toggle, "rate_limited", "the limit is 4")  # a toggle may open it: not the safe direction
    assert off["status"] == "success" and valve_after_off == "off"
    refused(again, "rate_limited", "the limit is 4")
    assert set_off["status"] == "success" and ha_reset.get_state(VALVE_1)["state"] == "off"
    assert len(db_rows(data_dir, "SELECT * FROM actuator_calls WHERE entity_id = ?", VALVE_1)) == 4  # offs are free
    assert pump_off["status"] == "success" and ha_reset.get_state(PUMP)["state"] == "off"
    refused(pump_on, "pending_approval")
    assert low["status"] == "success" and float(ha_reset.get_state(DURATION)["state"]) == 10  # the low end
    refused(higher, "pending_approval")
    assert program["status"] == "success" and ha_reset.get_state(PROGRAM)["state"] == "none"  # the rule's safeState
    refused(other_program, "pending_approval")
    assert len(db_rows(data_dir, "SELECT id FROM approvals")) == 3  # pump on, duration 11, program grow


# -------------------------------------------------------------------------------- approvals bounded


def _near_identical() -> list[tuple[str, tuple[str, dict[str, Any]]]]:
    """30 requests for four effects, in the many spellings an agent may use (key, (action, params))."""
    pump = [
        _set(PUMP, "on"), _set(PUMP, "On"), _set(PUMP, True), _set(PUMP, 1), _set(PUMP, " yes "),
        _call("switch", "turn_on", target={"entity_id": PUMP}),
        _call("switch", "turn_on", target={"entity_id": [PUMP]}),
        _call("switch", "turn_on", data={"entity_id": PUMP}),
        _call("switch", "turn_on", data={"entity_id": PUMP}, target={"entity_id": PUMP}),
        _call("switch", "turn_on", target={"entity_id": PUMP}, data={"note": "please", "z": 1}),
        _call("switch", "turn_on", data={"z": 1, "note": "please", "entity_id": PUMP}),
    ]  # fmt: skip
    valve_1 = [_set(VALVE_1, v) for v in ("on", "ON", True, 1, "true")] + [
        _call("switch", "turn_on", target={"entity_id": VALVE_1}, data={"n": n}) for n in range(4)
    ]
    valve_2 = [_set(VALVE_2, "on"), _call("switch", "turn_on", target={"entity_id": [VALVE_2]}), _set(VALVE_2, "yes")]
    duration = [_set(DURATION, 60), _set(DURATION, "60"), _set(DURATION, 60.0)] + [
        _call("number", "set_value", target={"entity_id": DURATION}, data={"value": v}) for v in (60, "60", 60.0, 6e1)
    ]
    rows = [("pump", p) for p in pump] + [("valve 1", p) for p in valve_1]
    rows += [("valve 2", p) for p in valve_2] + [("duration", p) for p in duration]
    assert len(rows) == 30
    # interleaved, the way a looping agent would send them: pump, valve 1, valve 2, then the duration
    order = sorted(range(len(rows)), key=lambda index: (index % 5, index))
    return [rows[index] for index in order]


@pytest.mark.parametrize("folder", FOLDERS)
def test_thirty_near_identical_requests_give_at_most_three_approval_messages(
    folder: str, data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    guarded = [PUMP, VALVE_1, VALVE_2, DURATION]
    _profile(data_dir, [{"entities": guarded, "requireApproval": True}])
    requests = _near_identical()
    answers: list[tuple[str, dict[str, Any]]] = []
    duration = ha_reset.get_state(DURATION)["state"]
    with farm_daemon(data_dir, ha_env, fake_telegram):
        for index, (effect, call) in enumerate(requests):
            answers.append((effect, _run(data_dir, folder, f"r-near-{index}", call)))
        keys = db_rows(data_dir, "SELECT DISTINCT message_key FROM outbox WHERE message_key LIKE 'approval:%'")
        wait_for(
            lambda: len(_asked_texts(fake_telegram)) >= len(keys),
            timeout=20,
            what="every approval message delivered",
            seen=lambda: _asked_texts(fake_telegram),
        )

    approvals = db_rows(data_dir, "SELECT id, params FROM approvals ORDER BY created_at")
    assert len(approvals) == 3 and len(keys) == 3
    asked = _asked_texts(fake_telegram)
    assert len(asked) == 3
    for row in approvals:
        assert len([text for text in asked if row["id"] in text]) == 1  # one message per pending approval
    first_seen = list(dict.fromkeys(effect for effect, _ in requests))
    by_effect: dict[str, set[str]] = {}
    for effect, answer in answers:
        if answer["errorCode"] == "pending_approval":
            by_effect.setdefault(effect, set()).add(answer["result"]["approvalId"])
    assert sorted(by_effect) == sorted(first_seen[:3])  # the first three effects asked...
    assert all(len(ids) == 1 for ids in by_effect.values()), by_effect  # ...once each, whatever the spelling
    held = [(effect, answer) for effect, answer in answers if answer["errorCode"] == "rate_limited"]
    assert {effect for effect, _ in held} == {first_seen[3]}  # the fourth: refused, nobody asked
    refused(held[0][1], "rate_limited", "already has 3 approvals waiting", "FARMHOST_MAX_PENDING_APPROVALS=3", "nobody was asked")  # fmt: skip
    assert {answer["status"] for _, answer in answers} == {"error"}  # nothing ran
    assert [ha_reset.get_state(e)["state"] for e in (PUMP, VALVE_1, VALVE_2)] == ["off"] * 3
    assert ha_reset.get_state(DURATION)["state"] == duration


def test_the_bound_is_a_setting_and_a_decided_approval_frees_its_place(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    _profile(data_dir, [{"entities": [PUMP, VALVE_1], "requireApproval": True}])
    with farm_daemon(data_dir, ha_env, fake_telegram, FARMHOST_MAX_PENDING_APPROVALS="1"):
        first = _act(data_dir, "field", "r-one", {"entityId": PUMP, "value": "on"}, "ha_set_entity")
        second = _act(data_dir, "field", "r-two", {"entityId": VALVE_1, "value": "on"}, "ha_set_entity")
        from_main = _act(data_dir, "main", "r-main", {"entityId": VALVE_1, "value": "on"}, "ha_set_entity")
        (asked,) = wait_for(
            lambda: [c for c in fake_telegram.sent(MAIN_CHAT) if first["result"]["approvalId"] in (c.text or "")],
            timeout=15,
            what="the approval message",
        )
        row, _stop = asked.params["reply_markup"]["inline_keyboard"]
        deny = next(b for b in row if b["callback_data"].endswith(":n"))
        fake_telegram.callback_query(MAIN_CHAT, asked.result["message_id"], deny["callback_data"], user_id=MAIN_CHAT)
        wait_for(
            lambda: (
                db_rows(data_dir, "SELECT status FROM approvals WHERE id = ?", first["result"]["approvalId"])[0][
                    "status"
                ]
                == "denied"
            ),
            timeout=15,
            what="the approval denied",
        )
        third = _act(data_dir, "field", "r-three", {"entityId": VALVE_1, "value": "on"}, "ha_set_entity")

    refused(first, "pending_approval")
    refused(second, "rate_limited", "FARMHOST_MAX_PENDING_APPROVALS=1", first["result"]["approvalId"])
    refused(from_main, "pending_approval")  # counted per group
    refused(third, "pending_approval")  # the denied one no longer waits
    assert ha_reset.get_state(PUMP)["state"] == "off" and ha_reset.get_state(VALVE_1)["state"] == "off"


@pytest.mark.parametrize("folder", FOLDERS)
def test_a_call_home_assistant_refused_spends_no_budget(
    folder: str, data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    _profile(data_dir, [{"entities": ["switch.field_*_valve"], "maxCallsPerHour": 1}])
    with farm_daemon(data_dir, ha_env, fake_telegram):
        bogus = [
            _run(data_dir, folder, f"r-bogus-{n}", _call("switch", "turn_on", target={"entity_id": VALVE_1}, data={"bogus": n}))
            for n in range(3)
        ]  # fmt: skip
        valve_still_off = ha_reset.get_state(VALVE_1)["state"]
        real = _run(data_dir, folder, "r-real", _set(VALVE_1, "on"))

    for answer in bogus:
        refused(answer, "invalid_request", "bogus")
    assert valve_still_off == "off"
    assert real["status"] == "success", real  # Home Assistant refused the three: they counted nothing
    assert ha_reset.get_state(VALVE_1)["state"] == "on"
