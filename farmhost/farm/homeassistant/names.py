"""friendly_name: an entity's name as farmhost shows it, always one line.

Whoever names a device in Home Assistant (a user, an integration, an MQTT discovery message) chooses its
friendly_name; farmhost puts names into agents' prompts (a when task's event, the daily report) and chat messages,
where a line break would let a name start a line that reads as the host's own ("[farmhost: ...]"). Flattened as
chat names are (outbox/text.py: control characters and every line break as one space, at most 200 characters).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from farmhost.outbox.text import one_line


def friendly_name(attributes: Mapping[str, Any]) -> str | None:
    """The entity's friendly_name on one line, or None when it has none (or only whitespace)."""
    name = attributes.get("friendly_name")
    return (one_line(name) or None) if isinstance(name, str) else None
