"""What the screenshot page may say to Home Assistant over its WebSocket: read commands only.

Pure: one text frame from the page in, what goes on to HA and what the page is answered instead out. The
allowlist is what HA 2025.4's frontend sends to show a dashboard (logged from a real capture, see
docs/screenshots.md) plus the read commands of HA's built-in cards; everything else (call_service,
execute_script, fire_event, config/*/create|update|delete, lovelace/config/save, auth/*token*, ...) never
leaves the browser. The page's `auth` message is rewritten to carry the screenshot user's token, so no other
token a page script may have found is ever presented to HA.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Final

# Sent by HA 2025.4.4's frontend for a dashboard with entities, gauge, markdown, tile, glance, weather and
# history cards (a real capture, every page -> server message logged).
SEEN_ON_A_DASHBOARD: Final = frozenset(
    {
        "supported_features",
        "subscribe_entities",
        "subscribe_events",
        "unsubscribe_events",
        "config/entity_registry/list_for_display",
        "config/device_registry/list",
        "config/area_registry/list",
        "config/floor_registry/list",
        "get_config",
        "get_services",
        "get_panels",
        "frontend/get_themes",
        "frontend/get_user_data",
        "frontend/get_translations",
        "frontend/get_icons",
        "auth/current_user",
        "repairs/list_issues",
        "recorder/info",
        "sensor/numeric_device_classes",
        "persistent_notification/subscribe",
        "lovelace/resources",
        "lovelace/config",
        "render_template",  # the markdown card's content; templates cannot call services (HA's sandbox)
    }
)
# Read commands of HA's other built-in cards (history, statistics, logbook, weather, energy, todo, calendar).
OTHER_CARD_READS: Final = frozenset(
    {
        "ping",
        "get_states",
        "frontend/subscribe_user_data",
        "frontend/subscribe_system_data",
        "config/label_registry/list",
        "history/stream",
        "history/history_during_period",
        "recorder/statistics_during_period",
        "recorder/get_statistics_metadata",
        "recorder/list_statistic_ids",
        "logbook/event_stream",
        "logbook/get_events",
        "weather/subscribe_forecast",
        "todo/item/subscribe",
        "calendar/event/subscribe",
        "energy/get_prefs",
        "energy/info",
        "energy/fossil_energy_consumption",
        "entity/source",
        "manifest/list",
        "integration/descriptions",
    }
)
ALLOWED: Final = SEEN_ON_A_DASHBOARD | OTHER_CARD_READS
MAX_SHOWN: Final = 80  # characters of a refused command's type kept for the log


@dataclass
class Filtered:
    """The outcome for one frame: `forward` (None: nothing for HA), the answers for the page, what was refused."""

    forward: str | None = None
    answers: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)


def filter_from_page(frame: str | bytes, *, token: str) -> Filtered:
    """Split one page -> HA frame (one message or HA's coalesced JSON array) into what HA gets and the refusals.

    A refused message with an id is answered as HA answers an unauthorized command, so the page's promise
    settles; one without an id is dropped. A frame that is not JSON text goes nowhere.
    """
    if isinstance(frame, bytes):
        return Filtered(refused=["(a binary frame)"])
    try:
        data = json.loads(frame)
    except ValueError:
        return Filtered(refused=["(a frame that is not JSON)"])
    messages = data if isinstance(data, list) else [data]
    out = Filtered()
    kept: list[dict[str, Any]] = []
    for message in messages:
        kind = message.get("type") if isinstance(message, dict) else None
        if not isinstance(kind, str):
            out.refused.append("(a message without a type)")
        elif kind == "auth":
            kept.append({"type": "auth", "access_token": token})
        elif kind in ALLOWED:
            kept.append(message)
        else:
            assert isinstance(message, dict)
            out.refused.append(kind[:MAX_SHOWN])
            if isinstance(message.get("id"), int):
                out.answers.append(refusal(message["id"], kind))
    if kept:
        out.forward = json.dumps(kept if isinstance(data, list) else kept[0])
    return out


def refusal(msg_id: int, kind: str) -> str:
    """HA's own shape for a refused command, so the frontend shows an error instead of waiting for ever."""
    message = f"farmhost's screenshot browser only reads from Home Assistant; {kind[:MAX_SHOWN]!r} was not sent"
    return json.dumps(
        {"id": msg_id, "type": "result", "success": False, "error": {"code": "unauthorized", "message": message}}
    )
