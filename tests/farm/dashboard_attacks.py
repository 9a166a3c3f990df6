"""Hostile dashboard shapes and spellings: each card, view or badge carries script or leaves Home Assistant.

Shared by the pure policy tests and the end-to-end ones (IPC -> farmhost -> real HA), so every attack that is
refused in one is refused in the other. Each entry: a name, a view (the place of the attack inside it) and the
words the refusal must contain.
"""

from __future__ import annotations

from typing import Any

# Script schemes in the spellings browsers accept: case, blanks, controls, entities, percent-escapes.
SCRIPT_URLS: tuple[str, ...] = (
    "javascript:alert(document.domain)",
    "JaVaScRiPt:alert(1)",
    "  javascript:alert(1)",
    "java\tscript:alert(1)",
    "java\nscript:alert(1)",
    "\x01javascript:alert(1)",
    "java\u200bscript:alert(1)",
    "&#106;avascript:alert(1)",
    "&#x6A;&#x61;vascript:alert(1)",
    "javascript&colon;alert(1)",
    "%6Aavascript:alert(1)",
    "%256Aavascript:alert(1)",
    "vbscript:msgbox(1)",
    "data:text/html,<script>alert(1)</script>",
    "DATA:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==",
    "blob:http://127.0.0.1:8123/1234",
    "file:///etc/passwd",
    "\\\\evil.example\\x",
)


def view(*cards: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A dashboard with one view holding `cards`."""
    return {"title": "Attack", "views": [{"title": "A", "path": "a", "cards": list(cards), **extra}]}


def _stack(card: dict[str, Any]) -> dict[str, Any]:
    inner = {"type": "horizontal-stack", "cards": [{"type": "conditional", "conditions": [], "card": card}]}
    return {"type": "vertical-stack", "cards": [{"type": "markdown", "content": "ok"}, inner]}


# (name, dashboard, where, words the refusal names)
SHAPES: list[tuple[str, dict[str, Any], str, tuple[str, ...]]] = [
    ("iframe javascript", view({"type": "iframe", "url": "javascript:alert(1)"}), "views[0].cards[0].url", ("'javascript'",)),
    ("iframe unlisted origin", view({"type": "iframe", "url": "https://evil.example/"}), "views[0].cards[0].url", ("iframeOrigins", "https://evil.example")),
    ("iframe relative page", view({"type": "iframe", "url": "/local/page.html"}), "views[0].cards[0].url", ("absolute",)),
    ("iframe protocol-relative", view({"type": "iframe", "url": "//evil.example/x"}), "views[0].cards[0].url", ("'//'",)),
    ("nested iframe", view(_stack({"type": "iframe", "url": "javascript:alert(1)"})), "views[0].cards[0].cards[1].cards[0].card.url", ("'javascript'",)),
    ("section iframe", {"views": [{"path": "s", "type": "sections", "sections": [{"type": "grid", "cards": [{"type": "iframe", "url": "data:text/html,x"}]}]}]}, "views[0].sections[0].cards[0].url", ("'data'",)),
    ("picture image", view({"type": "picture", "image": "javascript:alert(1)"}), "views[0].cards[0].image", ("javascript",)),
    ("picture-entity state image", view({"type": "picture-entity", "entity": "switch.irrigation_pump", "state_image": {"on": "data:image/svg+xml,<svg onload=alert(1)>"}}), "views[0].cards[0].state_image.on", ("'data'",)),
    ("picture-elements image", view({"type": "picture-elements", "image": "/local/farm.png", "elements": [{"type": "image", "image": "vbscript:x", "style": {"left": "1%"}}]}), "views[0].cards[0].elements[0].image", ("'vbscript'",)),
    ("tap url", view({"type": "button", "entity": "switch.irrigation_pump", "tap_action": {"action": "url", "url_path": "javascript:alert(1)"}}), "views[0].cards[0].tap_action.url_path", ("'javascript'",)),
    ("hold navigate away", view({"type": "button", "hold_action": {"action": "navigate", "navigation_path": "https://evil.example/"}}), "views[0].cards[0].hold_action.navigation_path", ("inside Home Assistant",)),
    ("double tap navigate script", view({"type": "tile", "entity": "switch.irrigation_pump", "double_tap_action": {"action": "navigate", "navigation_path": "&#106;avascript:alert(1)"}}), "views[0].cards[0].double_tap_action.navigation_path", ("'javascript'",)),
    ("weblink row", view({"type": "entities", "entities": [{"type": "weblink", "name": "x", "url": "java\tscript:alert(1)"}]}), "views[0].cards[0].entities[0].url", ("control",)),
    ("view background", view({"type": "markdown", "content": "x"}, background="center / cover url('javascript:alert(1)')"), "views[0].background", ("script",)),
    ("view background data", view({"type": "markdown", "content": "x"}, background={"image": "data:image/png;base64,AAAA"}), "views[0].background.image", ("'data'",)),
    ("custom card", view({"type": "custom:evil-card"}), "views[0].cards[0].type", ("customCards", "custom:evil-card")),
    ("custom view", {"views": [{"path": "v", "type": "custom:evil-view", "cards": []}]}, "views[0].type", ("customCards",)),
    ("custom badge", view({"type": "markdown", "content": "x"}, badges=[{"type": "custom:evil-badge"}]), "views[0].badges[0].type", ("customCards",)),
    ("custom row", view({"type": "entities", "entities": [{"type": "custom:evil-row"}]}), "views[0].cards[0].entities[0].type", ("customCards",)),
    ("custom tile feature", view({"type": "tile", "entity": "switch.irrigation_pump", "features": [{"type": "custom:evil-feature"}]}), "views[0].cards[0].features[0].type", ("customCards",)),
    ("unknown card type", view({"type": "evil"}), "views[0].cards[0].type", ("built-in card",)),
    ("markdown script tag", view({"type": "markdown", "content": "<script>fetch('//x')</script>"}), "views[0].cards[0].content", ("<script>",)),
    ("markdown handler", view({"type": "markdown", "content": "<img src=x onerror=alert(1)>"}), "views[0].cards[0].content", ("event handler",)),
    ("markdown encoded handler", view({"type": "markdown", "content": "&lt;img src=x onerror=alert(1)&gt;"}), "views[0].cards[0].content", ("event handler",)),
    ("markdown link", view({"type": "markdown", "content": "[pump](javascript:alert(1))"}), "views[0].cards[0].content", ("script",)),
    ("markdown data link", view({"type": "markdown", "content": "[pump](data:text/html,x)"}), "views[0].cards[0].content", ("'data'",)),
    ("title script", {"title": "<svg/onload=alert(1)>", "views": [{"path": "t", "cards": []}]}, "title", ("<svg>",)),
    ("card name script", view({"type": "tile", "entity": "switch.irrigation_pump", "name": "<iframe src=x>"}), "views[0].cards[0].name", ("<iframe>",)),
    ("denied service button", view({"type": "button", "tap_action": {"action": "perform-action", "perform_action": "homeassistant.restart"}}), "views[0].cards[0].tap_action.perform_action", ("homeassistant",)),
    ("legacy service row", view({"type": "entities", "entities": [{"type": "call-service", "name": "x", "service": "shell_command.reboot"}]}), "views[0].cards[0].entities[0].service", ("shell_command",)),
    # issue 32, finding 8: a tap runs whatever the button names, with the farmer's rights
    ("scene button", view({"type": "button", "name": "Status", "tap_action": {"action": "perform-action", "perform_action": "scene.apply", "data": {"entities": {"switch.irrigation_pump": "on"}}}}), "views[0].cards[0].tap_action.perform_action", ("scene.apply", "policy.allowServices")),
    ("assist hold", view({"type": "button", "hold_action": {"action": "perform-action", "perform_action": "conversation.process", "data": {"text": "turn on the irrigation pump"}}}), "views[0].cards[0].hold_action.perform_action", ("conversation.process", "ha_assist")),
    ("nested call-service double tap", view(_stack({"type": "button", "double_tap_action": {"action": "call-service", "service": "logger.set_default_level", "data": {"level": "debug"}}})), "views[0].cards[0].cards[1].cards[0].card.double_tap_action.service", ("logger.set_default_level",)),
    ("tile icon tap", view({"type": "tile", "entity": "sensor.air_temperature", "icon_tap_action": {"action": "perform-action", "perform_action": "automation.turn_off", "target": {"entity_id": "automation.pump_interlock"}}}), "views[0].cards[0].icon_tap_action.perform_action", ("automation.turn_off",)),
    ("picture element reload", view({"type": "picture-elements", "image": "/local/farm.png", "elements": [{"type": "icon", "icon": "mdi:leaf", "style": {"left": "1%"}, "tap_action": {"action": "perform-action", "perform_action": "template.reload"}}]}), "views[0].cards[0].elements[0].tap_action.perform_action", ("template.reload",)),
    ("fire dom event", view({"type": "button", "tap_action": {"action": "fire-dom-event", "browser_mod": {}}}), "views[0].cards[0].tap_action.action", ("fire-dom-event",)),
    ("strategy view", {"views": [{"path": "s", "strategy": {"type": "iframe", "url": "https://evil.example"}}]}, "views[0].strategy", ("strateg",)),
]  # fmt: skip

# Issue 32, finding 8: under PROFILE, a button that acts on an entity a rule guards (the farmer's tap would skip the
# approval, the rate or the range), whatever the spelling. (name, dashboard, where, words the refusal names)
PUMP = "switch.irrigation_pump"
PROFILE: dict[str, Any] = {
    "policy": {
        "rules": [
            {"entities": [PUMP], "requireApproval": True},
            {"entities": ["switch.field_*_valve"], "maxCallsPerHour": 4},
            {"entities": ["number.irrigation_duration"], "valueRange": [0, 120]},
        ]
    }
}
GUARDED_SHAPES: list[tuple[str, dict[str, Any], str, tuple[str, ...]]] = [
    ("pump button", view({"type": "button", "name": "Weather", "tap_action": {"action": "perform-action", "perform_action": "switch.turn_on", "target": {"entity_id": PUMP}}}), "views[0].cards[0].tap_action.perform_action", (PUMP, "guard")),
    ("legacy call-service hold", view({"type": "button", "hold_action": {"action": "call-service", "service": "switch.turn_on", "service_data": {"entity_id": PUMP}}}), "views[0].cards[0].hold_action.service", (PUMP,)),
    ("nested range", view(_stack({"type": "button", "tap_action": {"action": "perform-action", "perform_action": "number.set_value", "data": {"entity_id": "number.irrigation_duration", "value": 230}}})), "views[0].cards[0].cards[1].cards[0].card.tap_action.perform_action", ("number.irrigation_duration",)),
    ("case and blanks", view({"type": "button", "tap_action": {"action": "perform-action", "perform_action": "switch.turn_on", "target": {"entity_id": " Switch.Irrigation_Pump "}}}), "views[0].cards[0].tap_action.perform_action", (PUMP,)),
    ("comma list", view({"type": "button", "tap_action": {"action": "perform-action", "perform_action": "switch.turn_on", "target": {"entity_id": "switch.barn_light, switch.field_2_valve"}}}), "views[0].cards[0].tap_action.perform_action", ("switch.field_2_valve",)),
    ("by area", view({"type": "button", "tap_action": {"action": "perform-action", "perform_action": "switch.turn_on", "target": {"area_id": "field"}}}), "views[0].cards[0].tap_action.perform_action", ("area",)),
    ("entities row button", view({"type": "entities", "entities": [{"type": "button", "name": "Go", "tap_action": {"action": "perform-action", "perform_action": "switch.toggle", "target": {"entity_id": [PUMP]}}}]}), "views[0].cards[0].entities[0].tap_action.perform_action", (PUMP,)),
]  # fmt: skip
