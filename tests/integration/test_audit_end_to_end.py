"""SPEC section 5: every farm action, accepted or refused, appends one line to farm-state/audit.ndjson.

The real daemon and Home Assistant's test instance; requests are dropped into the main group's queue the way the
in-sandbox client writes them. A request refused before its handler runs (expired, params that are no object or of
the wrong type, an action of a name the host does not know) is a farm action refused all the same: it is audited
with its code, and nothing reaches Home Assistant.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from farm_daemon import audit, farm_daemon
from farmhost_testing import drop, refused, wait_result
from ha_fixture import HaInstance
from telegram_stub import FakeTelegram

pytestmark = pytest.mark.slow  # end to end, seconds each

VALVE = "switch.field_2_valve"
VALVE_ON = {"domain": "switch", "service": "turn_on", "target": {"entity_id": VALVE}}
REFUSED_EARLY = [
    ("r-past", VALVE_ON, {"expiresAt": "2020-01-01T00:00:00Z"}, "expired"),
    ("r-ttl", VALVE_ON, {"ttl": 0.0001}, "expired"),
    ("r-list", [], {}, "invalid_request"),
    ("r-type", {**VALVE_ON, "domain": 5}, {}, "invalid_request"),  # a param of the wrong type: quarantined too
    ("r-name", VALVE_ON, {"action": "ha_call_any_service"}, "invalid_request"),  # no such action: quarantined
]


@pytest.mark.parametrize(("rid", "params", "envelope", "code"), REFUSED_EARLY)
def test_a_farm_action_refused_before_its_handler_is_audited(
    rid: str,
    params: Any,
    envelope: dict[str, Any],
    code: str,
    data_dir: Path,
    fake_telegram: FakeTelegram,
    ha_reset: HaInstance,
    ha_env: dict[str, str],
) -> None:
    with farm_daemon(data_dir, ha_env, fake_telegram):
        request = {"type": "farm_action", "action": "ha_call_service", "requestId": rid, "params": params}
        drop(data_dir, "main", "actions", {**request, **envelope})
        result = wait_result(data_dir, "main", rid, timeout=20)

    refused(result, code)
    (line,) = audit(data_dir, rid)
    assert (line["group"], line["action"], line["params"]) == ("main", {**request, **envelope}["action"], params), line
    assert (line["status"], line["errorCode"]) == ("error", code), line
    assert line["durationMs"] >= 0 and line["ts"]
    assert ha_reset.get_state(VALVE)["state"] == "off"
