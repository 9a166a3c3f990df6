"""Hostile dashboards through IPC files against the real Home Assistant: refused at validate, patch and apply.

Nothing of a refused dashboard is written to the staged copy, and nothing of it ever reaches HA's stored configs.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from dashboard_attacks import GUARDED_SHAPES, PROFILE, SHAPES
from farmhost_testing import Daemon, clean_env, drop, ok, refused, wait_for, wait_result
from ha_core_support import FarmHost, farm_host, make_data_dir
from ha_fixture import HaInstance

from farmhost.farm.dashboards import lovelace as dash

PUMP_RELAY = "input_boolean.pump_relay"
BARN_LIGHT = "light.barn_light"
BARN_RELAY = "input_boolean.barn_light_relay"
BASE = "title: Base\nviews:\n  - title: Field\n    path: field\n    cards:\n      - type: tile\n        entity: switch.irrigation_pump\n"
# What must never be stored in HA, in any dashboard, after the attacks.
MARKERS = ("javascript", "vbscript", "data:text", "custom:evil", "onerror", "<script", "evil.example", "fire-dom-event")


@pytest.fixture
async def host(tmp_path: Path, ha_env: dict[str, str]) -> AsyncIterator[FarmHost]:
    async with farm_host(make_data_dir(tmp_path / "data"), ha_env=ha_env) as farm:
        yield farm


def stage(host: FarmHost, text: str) -> tuple[str, Path]:
    name = f"atk-{secrets.token_hex(4)}"
    folder = host.data_dir / "dashboards"
    folder.mkdir(exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(text)
    return name, path


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def stored_in_ha(ha: HaInstance) -> str:
    """Every config HA holds for dashboards farmhost names (other tests plant hostile ones of their own in HA)."""
    texts = []
    with ha.ws() as ws:
        for item in ws.command("lovelace/dashboards/list")["result"]:
            if not (item["url_path"] == "farmhost-farm" or item["url_path"].startswith("farmhost-atk-")):
                continue
            answer = ws.command("lovelace/config", url_path=item["url_path"])
            if answer["success"]:
                texts.append(json.dumps(answer["result"]))
    return "\n".join(texts)


async def test_every_hostile_shape_is_refused_by_validate_patch_and_apply(host: FarmHost, ha: HaInstance) -> None:
    name, path = stage(host, BASE)
    ok(await host.ask("main", "ha_apply_dashboard", {"dashboard": name}))  # HA holds the clean base
    before_file, before_ha = digest(path), stored_in_ha(ha)
    for label, config, where, words in SHAPES:
        content = dash.dump(dash.to_yaml_node(config))
        refused(await host.ask("main", "ha_dashboard_validate", {"content": content}), "not_allowed", where, *words)
        if where.startswith("views[0]"):
            patch_where = where.replace("views[0]", "views[1]", 1)
            for dry_run in (True, False):
                operations = [{"op": "add_view", "view": config["views"][0]}]
                answer = await host.ask(
                    "main", "ha_dashboard_patch", {"dashboard": name, "operations": operations, "dryRun": dry_run}
                )
                refused(answer, "not_allowed", patch_where, "nothing was changed")
        assert digest(path) == before_file, f"{label}: the staged copy changed"
        # A copy edited by hand (the main agent can write /workspace/dashboard) is refused at apply.
        hostile, hostile_path = stage(host, content)
        refused(await host.ask("main", "ha_dashboard_validate", {"dashboard": hostile}), "not_allowed", where)
        refused(await host.ask("main", "ha_apply_dashboard", {"dashboard": hostile}), "not_allowed", where)
        hostile_path.unlink()
    assert stored_in_ha(ha) == before_ha
    for marker in MARKERS:
        assert marker not in stored_in_ha(ha).lower()
    audit = [line for line in host.audit() if line["action"] == "ha_apply_dashboard"]
    assert sum(line["errorCode"] == "not_allowed" for line in audit) == len(SHAPES)


@pytest.mark.parametrize("folder", ["main", "field"])
async def test_a_button_on_a_guarded_entity_is_refused_by_validate_patch_and_apply(
    folder: str, host: FarmHost, ha: HaInstance
) -> None:
    both = ["main", "field"]
    actions = ("ha_dashboard_validate", "ha_dashboard_patch", "ha_apply_dashboard")
    host.profile({"policy": {**PROFILE["policy"], "actionGroups": dict.fromkeys(actions, both)}})
    name, path = stage(host, BASE)
    ok(await host.ask(folder, "ha_apply_dashboard", {"dashboard": name}))
    before_file, before_ha = digest(path), stored_in_ha(ha)
    for label, config, where, words in GUARDED_SHAPES:
        content = dash.dump(dash.to_yaml_node(config))
        refused(await host.ask(folder, "ha_dashboard_validate", {"content": content}), "not_allowed", where, *words)
        operations = [{"op": "add_view", "view": config["views"][0]}]
        answer = await host.ask(folder, "ha_dashboard_patch", {"dashboard": name, "operations": operations})
        refused(answer, "not_allowed", where.replace("views[0]", "views[1]", 1), "nothing was changed")
        hostile, hostile_path = stage(host, content)
        refused(await host.ask(folder, "ha_apply_dashboard", {"dashboard": hostile}), "not_allowed", where)
        hostile_path.unlink()
        assert digest(path) == before_file, f"{label}: the staged copy changed"
    assert stored_in_ha(ha) == before_ha
    assert "perform-action" not in before_ha and "call-service" not in before_ha


async def test_a_hostile_update_of_an_existing_card_is_refused_and_get_names_a_bad_copy(host: FarmHost) -> None:
    name, path = stage(host, BASE.replace("      - type: tile\n", "      - type: tile\n        id: pump\n"))
    before = digest(path)
    change = {
        "op": "update_card",
        "id": "pump",
        "changes": {"tap_action": {"action": "url", "url_path": "JaVaScRiPt:x"}},
    }
    answer = await host.ask("main", "ha_dashboard_patch", {"dashboard": name, "operations": [change]})
    refused(answer, "not_allowed", "views[0].cards[0].tap_action.url_path", "'javascript'")
    assert digest(path) == before
    path.write_text(BASE.replace("type: tile", "type: custom:evil-card"))
    got = ok(await host.ask("main", "ha_dashboard_get", {"dashboard": name}))
    assert got["policyViolations"] and "views[0].cards[0].type" in got["policyViolations"][0]
    # Fixing it by patch is allowed: the result is what the policy checks.
    fix = {
        "op": "update_view",
        "path": "field",
        "changes": {"cards": [{"type": "tile", "entity": "switch.irrigation_pump"}]},
    }
    ok(await host.ask("main", "ha_dashboard_patch", {"dashboard": name, "operations": [fix]}))
    assert ok(await host.ask("main", "ha_dashboard_get", {"dashboard": name}))["policyViolations"] == []


async def test_what_the_profile_lists_is_applied_to_ha(host: FarmHost, ha: HaInstance) -> None:
    host.profile(
        {
            "policy": {
                "dashboards": {"iframeOrigins": ["https://weather.example.org"], "customCards": ["custom:farm-card"]}
            }
        }
    )
    cards = [{"type": "iframe", "url": "https://weather.example.org/radar"}, {"type": "custom:farm-card"}]
    name, _ = stage(host, BASE)
    ops = [{"op": "add_card", "viewPath": "field", "card": card} for card in cards]
    ok(await host.ask("main", "ha_dashboard_patch", {"dashboard": name, "operations": ops}))
    ok(await host.ask("main", "ha_apply_dashboard", {"dashboard": name}))
    with ha.ws() as ws:
        stored = ws.command("lovelace/config", url_path=f"farmhost-{name}")["result"]
    assert stored["views"][0]["cards"][1:] == cards
    host.profile(None)  # the operator takes the origin back: the staged copy is refused from now on
    refused(await host.ask("main", "ha_apply_dashboard", {"dashboard": name}), "not_allowed", "iframeOrigins")


def test_through_the_daemon_the_reported_attack_is_refused(
    tmp_path: Path, ha_env: dict[str, str], ha: HaInstance
) -> None:
    data_dir = make_data_dir(tmp_path / "data")
    daemon = Daemon(data_dir, env=clean_env(**ha_env)).start()
    try:
        card = {"type": "iframe", "url": "javascript:fetch('/api/services/homeassistant/turn_on',{method:'POST'})"}
        operations = [{"op": "add_card", "viewPath": "overview", "card": card}]
        for rid, action, params in (
            (
                "v1",
                "ha_dashboard_validate",
                {"content": dash.dump(dash.to_yaml_node({"views": [{"path": "x", "cards": [card]}]}))},
            ),
            ("p1", "ha_dashboard_patch", {"operations": operations, "dryRun": True}),
            ("p2", "ha_dashboard_patch", {"operations": operations}),
        ):
            drop(
                data_dir,
                "main",
                "actions",
                {"type": "farm_action", "requestId": rid, "action": action, "params": params},
            )
            refused(wait_result(data_dir, "main", rid, timeout=30), "not_allowed", "url", "'javascript'")
        drop(
            data_dir,
            "main",
            "actions",
            {"type": "farm_action", "requestId": "a1", "action": "ha_apply_dashboard", "params": {}},
        )
        ok(wait_result(data_dir, "main", "a1", timeout=30))  # the shipped farm dashboard, unchanged, applies
    finally:
        daemon.stop()
    assert "javascript" not in stored_in_ha(ha)


def test_a_button_on_the_helper_that_drives_a_guarded_entity_is_refused(
    tmp_path: Path, ha_env: dict[str, str], ha_reset: HaInstance
) -> None:
    # input_boolean.pump_relay drives the approval-guarded pump (its template switch follows it): a tap on a
    # button acting on the relay would turn the pump on with no approval.
    data_dir = make_data_dir(tmp_path / "data")
    (data_dir / "farm-profile.json").write_text(
        json.dumps({"policy": {"rules": [{"entities": ["switch.irrigation_pump"], "requireApproval": True}]}})
    )
    relay_on = {"action": "perform-action", "perform_action": "input_boolean.turn_on"}
    card = {"type": "button", "name": "Check status", "tap_action": {**relay_on, "target": {"entity_id": PUMP_RELAY}}}
    operations = [{"op": "add_card", "viewPath": "overview", "card": card}]
    daemon = Daemon(data_dir, env=clean_env(**ha_env)).start()
    try:
        wait_for(lambda: "following Home Assistant" in daemon.log(), timeout=20, what="the live view")
        ha_reset.call_service("input_boolean", "turn_on", {"entity_id": PUMP_RELAY})  # the farmer, at the farm
        wait_for(lambda: ha_reset.get_state("switch.irrigation_pump")["state"] == "on", timeout=10, what="pump on")
        ha_reset.call_service("input_boolean", "turn_off", {"entity_id": PUMP_RELAY})
        request = {"type": "farm_action", "requestId": "p-relay", "action": "ha_dashboard_patch"}
        drop(data_dir, "main", "actions", {**request, "params": {"operations": operations}})
        result = wait_result(data_dir, "main", "p-relay", timeout=30)
    finally:
        daemon.stop()
    refused(result, "not_allowed", "input_boolean.pump_relay, which drives switch.irrigation_pump")
    assert "pump_relay" not in (data_dir / "dashboards" / "farm.yaml").read_text()


def test_a_button_whose_call_a_rule_written_by_service_holds_is_refused(
    tmp_path: Path, ha_env: dict[str, str], ha_reset: HaInstance
) -> None:
    # The rule names no entity, only light.turn_on: the gate holds a light.toggle as a light.turn_on (the same
    # effect), and so does the dashboard policy; a light.turn_off button (the safe direction) stays allowed.
    data_dir = make_data_dir(tmp_path / "data")
    rule = {"services": ["light.turn_on"], "requireApproval": True}
    (data_dir / "farm-profile.json").write_text(json.dumps({"policy": {"rules": [rule]}}))

    def button(service: str, target: dict[str, str]) -> list[dict[str, object]]:
        tap = {"action": "perform-action", "perform_action": service, "target": target}
        card = {"type": "button", "name": "Barn", "tap_action": tap}
        return [{"op": "add_card", "viewPath": "overview", "card": card}]

    barn = {"entity_id": BARN_LIGHT}
    asked = {
        "toggle": button("light.toggle", barn),
        "turn-on": button("light.turn_on", barn),
        "all": button("light.turn_on", {"entity_id": "all"}),
        "relay": button("input_boolean.turn_on", {"entity_id": BARN_RELAY}),
        "turn-off": button("light.turn_off", barn),
    }
    daemon = Daemon(data_dir, env=clean_env(**ha_env)).start()
    try:
        wait_for(lambda: "following Home Assistant" in daemon.log(), timeout=20, what="the live view")
        ha_reset.call_service("input_boolean", "turn_on", {"entity_id": BARN_RELAY})  # the farmer, at the farm
        wait_for(lambda: ha_reset.get_state(BARN_LIGHT)["state"] == "on", timeout=10, what="barn light on")
        ha_reset.call_service("input_boolean", "turn_off", {"entity_id": BARN_RELAY})
        results = {}
        for label, operations in asked.items():
            request = {"type": "farm_action", "requestId": f"b-{label}", "action": "ha_dashboard_patch"}
            drop(data_dir, "main", "actions", {**request, "params": {"operations": operations}})
            results[label] = wait_result(data_dir, "main", f"b-{label}", timeout=30)
    finally:
        daemon.stop()
    refused(results["toggle"], "not_allowed", f"light.toggle on {BARN_LIGHT}, which the farm profile's rules guard")
    refused(results["turn-on"], "not_allowed", f"light.turn_on on {BARN_LIGHT}, which the farm profile's rules guard")
    refused(results["all"], "not_allowed", "light.turn_on on a device, area, floor or label")
    refused(results["relay"], "not_allowed", f"{BARN_RELAY}, which drives {BARN_LIGHT}")
    ok(results["turn-off"])
    staged = (data_dir / "dashboards" / "farm.yaml").read_text()
    assert "light.turn_off" in staged
    assert "light.toggle" not in staged and "light.turn_on" not in staged and BARN_RELAY not in staged


def test_a_button_on_a_group_holding_a_guarded_entity_is_refused(
    tmp_path: Path, ha_env: dict[str, str], ha_reset: HaInstance
) -> None:
    # Home Assistant turns on a group's members: a button on a `group.*` entity holding the approval-guarded pump
    # (nested in another group) would turn the pump on with no approval, as the gate holds an agent's call.
    data_dir = make_data_dir(tmp_path / "data")
    (data_dir / "farm-profile.json").write_text(
        json.dumps({"policy": {"rules": [{"entities": ["switch.irrigation_pump"], "requireApproval": True}]}})
    )
    inner, outer = "group.dash_attack_water", "group.dash_attack_outer"
    tap = {"action": "perform-action", "perform_action": "switch.turn_on", "target": {"entity_id": outer}}
    card = {"type": "button", "name": "Water", "tap_action": tap}
    operations = [{"op": "add_card", "viewPath": "overview", "card": card}]
    ha_reset.write_state(inner, "off", {"entity_id": ["switch.irrigation_pump", "switch.field_1_valve"]})
    ha_reset.write_state(outer, "off", {"entity_id": [inner, "light.barn_light"]})
    daemon = Daemon(data_dir, env=clean_env(**ha_env)).start()
    try:
        wait_for(lambda: "following Home Assistant" in daemon.log(), timeout=20, what="the live view")
        request = {"type": "farm_action", "requestId": "p-group", "action": "ha_dashboard_patch"}
        drop(data_dir, "main", "actions", {**request, "params": {"operations": operations}})
        result = wait_result(data_dir, "main", "p-group", timeout=30)
    finally:
        daemon.stop()
        for entity_id in (outer, inner):
            ha_reset.api("DELETE", f"/api/states/{entity_id}")
    refused(result, "not_allowed", "switch.irrigation_pump, which the farm profile's rules guard")
    assert outer not in (data_dir / "dashboards" / "farm.yaml").read_text()
