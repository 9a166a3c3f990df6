"""farmhost's MQTT topics and its Home Assistant discovery document (device-based discovery).

One retained config at `homeassistant/device/farmhost_<site>/config` declares the device and all its entities;
they read one retained JSON state topic, share one availability topic (the connection's last will says
`offline`), the alerts arrive on an event topic, and the `Agents paused` switch commands on a topic of its own.
Home Assistant's format: https://www.home-assistant.io/integrations/mqtt/#device-discovery-payload
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from farmhost import __version__
from farmhost.broker import OFFLINE, ONLINE
from farmhost.farm.state.alerts import Rule

DISCOVERY_PREFIX: Final = "homeassistant"
HA_STATUS: Final = f"{DISCOVERY_PREFIX}/status"  # HA's birth/will: `online` after it starts
ON: Final = "ON"
OFF: Final = "OFF"


@dataclass(frozen=True)
class Topics:
    """The topics of one site."""

    site: str

    @property
    def node(self) -> str:
        """The device's node id and the prefix of its entities' unique ids."""
        return f"farmhost_{self.site}"

    @property
    def base(self) -> str:
        """`farmhost/<site>`."""
        return f"farmhost/{self.site}"

    @property
    def config(self) -> str:
        """The retained discovery document."""
        return f"{DISCOVERY_PREFIX}/device/{self.node}/config"

    @property
    def availability(self) -> str:
        """`online` while connected; the last will says `offline`."""
        return f"{self.base}/availability"

    @property
    def state(self) -> str:
        """The retained JSON every sensor reads."""
        return f"{self.base}/state"

    @property
    def alerts(self) -> str:
        """One message per new farm alert (the event entity)."""
        return f"{self.base}/alert"

    @property
    def pause_command(self) -> str:
        """`ON` pauses every agent run, `OFF` resumes (the switch's command topic)."""
        return f"{self.base}/command/agents_paused"


# (key in the state JSON, name, extra options): the sensors.
_SENSORS: Final[tuple[tuple[str, str, dict[str, Any]], ...]] = (
    ("runs_running", "Agent runs running", {"state_class": "measurement", "icon": "mdi:robot"}),
    ("runs_today", "Agent runs today", {"state_class": "total_increasing", "icon": "mdi:robot-outline"}),
    ("last_task_status", "Last task run", {"icon": "mdi:calendar-check"}),
    ("last_task_at", "Last task run at", {"device_class": "timestamp"}),
    ("outbox_pending", "Outbox pending", {"state_class": "measurement", "icon": "mdi:message-arrow-right"}),
    ("outbox_failed", "Outbox failed", {"state_class": "measurement", "icon": "mdi:message-alert"}),
    ("approvals_pending", "Approvals pending", {"state_class": "measurement", "icon": "mdi:account-check"}),
    ("llm_requests_today", "LLM requests today", {"state_class": "total_increasing", "icon": "mdi:chat-processing"}),
    ("llm_tokens_today", "LLM tokens today", {"state_class": "total_increasing", "icon": "mdi:counter"}),
    ("heartbeat", "Heartbeat", {"device_class": "timestamp", "entity_category": "diagnostic"}),
)


def discovery_config(topics: Topics) -> dict[str, Any]:
    """The device-based discovery document of this site."""
    node = topics.node
    components: dict[str, dict[str, Any]] = {
        key: {
            "platform": "sensor",
            "name": name,
            "unique_id": f"{node}_{key}",
            "value_template": f"{{{{ value_json.{key} }}}}",
            **extra,
        }
        for key, name, extra in _SENSORS
    }
    components["connected"] = {
        "platform": "binary_sensor",
        "name": "Connected",
        "unique_id": f"{node}_connected",
        "device_class": "connectivity",
        "state_topic": topics.availability,
        "payload_on": ONLINE,
        "payload_off": OFFLINE,
        "entity_category": "diagnostic",
    }
    components["alert"] = {
        "platform": "event",
        "name": "Farm alert",
        "unique_id": f"{node}_alert",
        "state_topic": topics.alerts,
        "event_types": sorted(rule.value for rule in Rule),
    }
    components["agents_paused"] = {
        "platform": "switch",
        "name": "Agents paused",
        "unique_id": f"{node}_agents_paused",
        "command_topic": topics.pause_command,
        "value_template": "{{ value_json.agents_paused }}",
        "payload_on": ON,
        "payload_off": OFF,
        "state_on": ON,
        "state_off": OFF,
        "icon": "mdi:pause-octagon",
    }
    return {
        "device": {
            "identifiers": [node],
            "name": f"farmhost {topics.site}",
            "manufacturer": "farmhost",
            "model": "farm agent host",
            "sw_version": __version__,
        },
        "origin": {"name": "farmhost", "sw_version": __version__},
        "availability_topic": topics.availability,
        "state_topic": topics.state,
        "qos": 1,
        "components": components,
    }
