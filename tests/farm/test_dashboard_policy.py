"""The dashboard content policy on its own: every hostile shape and spelling refused at its place, good ones kept."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from dashboard_attacks import GUARDED_SHAPES, PROFILE, SCRIPT_URLS, SHAPES, view

from farmhost.errors import NotAllowed
from farmhost.farm.control.policy import LoadedProfile, ProfileInvalid, load_profile, parse_profile
from farmhost.farm.dashboards import lovelace as dash
from farmhost.farm.dashboards.policy import ContentRules, enforce, rules_for, url_problem, violations

SHIPPED = Path(__file__).resolve().parents[2] / "dashboards"


def rules(profile: dict[str, Any] | None = None) -> ContentRules:
    import json

    if profile is None:
        return rules_for(LoadedProfile(path=Path("farm-profile.json")))
    return rules_for(LoadedProfile(path=Path("farm-profile.json"), profile=parse_profile(json.dumps(profile))))


@pytest.mark.parametrize(("name", "config", "where", "words"), SHAPES, ids=[s[0] for s in SHAPES])
def test_each_hostile_shape_is_refused_at_its_place(
    name: str, config: dict[str, Any], where: str, words: tuple[str, ...]
) -> None:
    found = violations(config, rules())
    assert [v.where for v in found] == [where], found
    for word in words:
        assert word in found[0].rule, found[0].rule
    with pytest.raises(NotAllowed) as err:
        enforce(config, rules(), what="dashboard 'x'")
    assert err.value.code == "not_allowed" and where in err.value.message and "dashboard 'x'" in err.value.message


@pytest.mark.parametrize("url", SCRIPT_URLS, ids=range(len(SCRIPT_URLS)))
@pytest.mark.parametrize("key", ["url_path", "image", "navigation_path"])
def test_every_spelling_of_a_script_url_is_refused_in_every_url_key(url: str, key: str) -> None:
    assert url_problem(url) is not None
    action = {"action": "url" if key == "url_path" else "navigate", key: url}
    card = {"type": "picture", "image": url} if key == "image" else {"type": "button", "tap_action": action}
    found = violations(view(card), rules())
    assert found and found[0].where.endswith(key), found


@pytest.mark.parametrize("url", SCRIPT_URLS, ids=range(len(SCRIPT_URLS)))
def test_every_spelling_is_refused_in_an_iframe_even_on_a_listed_origin(url: str) -> None:
    listed = rules({"policy": {"dashboards": {"iframeOrigins": ["http://127.0.0.1:8123"]}}})
    assert violations(view({"type": "iframe", "url": url}), listed)


@pytest.mark.parametrize(("name", "config", "where", "words"), GUARDED_SHAPES, ids=[s[0] for s in GUARDED_SHAPES])
def test_a_button_acting_on_a_guarded_entity_is_refused_at_its_place(
    name: str, config: dict[str, Any], where: str, words: tuple[str, ...]
) -> None:
    assert violations(config, rules()) == []  # without the profile's rules nothing guards these entities
    found = violations(config, rules(PROFILE))
    assert [v.where for v in found] == [where], found
    for word in words:
        assert word in found[0].rule, found[0].rule


def test_a_button_on_an_entity_no_rule_names_is_allowed_under_the_rules() -> None:
    lamp = {"action": "perform-action", "perform_action": "light.turn_on", "target": {"entity_id": "light.barn_light"}}
    assert violations(view({"type": "button", "tap_action": lamp}), rules(PROFILE)) == []
    opened = {"policy": {**PROFILE["policy"], "allowServices": ["scene.turn_on"]}}
    scene = {"action": "perform-action", "perform_action": "scene.turn_on", "target": {"entity_id": "scene.evening"}}
    assert violations(view({"type": "button", "tap_action": scene}), rules(opened)) == []


def test_what_a_farm_dashboard_uses_is_allowed() -> None:
    good = view(
        {"type": "tile", "entity": "switch.irrigation_pump", "tap_action": {"action": "toggle"}},
        {"type": "button", "entity": "switch.irrigation_pump", "hold_action": {"action": "more-info"}},
        {"type": "button", "tap_action": {"action": "navigate", "navigation_path": "/farmhost-farm/fields"}},
        {"type": "button", "tap_action": {"action": "url", "url_path": "https://www.example.org/weather"}},
        {
            "type": "button",
            "tap_action": {
                "action": "perform-action",
                "perform_action": "switch.turn_on",
                "target": {"entity_id": "switch.irrigation_pump"},
            },
        },
        {"type": "picture", "image": "/local/farm.png"},
        {
            "type": "markdown",
            "content": "**Field 1** is dry: see [the forecast](https://www.example.org/) <ha-icon icon='mdi:water'></ha-icon>",
        },
        {
            "type": "entities",
            "entities": ["sensor.field_1_soil_moisture", {"type": "weblink", "name": "HA", "url": "/config"}],
        },
        {"type": "gauge", "entity": "sensor.field_1_soil_moisture", "name": "Sensor data: 5 on = running"},
        background="center / cover no-repeat url('/local/barn.jpg') fixed",
    )
    assert violations(good, rules()) == []


def test_the_shipped_dashboards_pass() -> None:
    for path in SHIPPED.glob("*.yaml"):
        config, check = dash.validate_text(path.read_text())
        assert check.valid and violations(config, rules()) == [], path


def test_the_profile_opens_listed_origins_and_custom_cards_only() -> None:
    opened = rules(
        {
            "policy": {
                "dashboards": {
                    "iframeOrigins": ["https://Weather.Example.org:443"],
                    "customCards": ["custom:mushroom-entity-card"],
                }
            }
        }
    )
    assert opened.iframe_origins == {"https://weather.example.org"}
    assert violations(view({"type": "iframe", "url": "https://weather.example.org/radar?x=1"}), opened) == []
    assert violations(view({"type": "iframe", "url": "HTTPS://WEATHER.example.org:443/"}), opened) == []
    assert violations(view({"type": "custom:mushroom-entity-card", "entity": "switch.irrigation_pump"}), opened) == []
    for other in (
        "https://weather.example.org:8443/",
        "http://weather.example.org/",
        "https://weather.example.org.evil.example/",
    ):
        assert violations(view({"type": "iframe", "url": other}), opened), other
    assert violations(view({"type": "custom:mushroom-light-card"}), opened)
    assert violations(view({"type": "Custom:mushroom-entity-card"}), opened)  # the frontend's prefix is case-sensitive


def test_button_services_follow_the_profile_narrowing() -> None:
    narrowed = rules({"policy": {"allowedDomains": ["switch"], "allowedEntities": ["switch.irrigation_pump"]}})
    light = {"action": "perform-action", "perform_action": "light.turn_on", "target": {"entity_id": "light.barn"}}
    assert "allowed" in violations(view({"type": "button", "tap_action": light}), narrowed)[0].rule
    other = {"action": "perform-action", "perform_action": "switch.turn_on", "data": {"entity_id": "switch.valve_2"}}
    assert violations(view({"type": "button", "tap_action": other}), narrowed)


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"iframeOrigins": ["javascript:alert(1)"]}, "policy.dashboards.iframeOrigins.0"),
        ({"iframeOrigins": ["https://x.example/path"]}, "policy.dashboards.iframeOrigins.0"),
        ({"customCards": ["evil-card"]}, "policy.dashboards.customCards.0"),
        ({"customOrigins": []}, "policy.dashboards.customOrigins: unknown key"),
    ],
)
def test_a_bad_dashboards_section_is_a_broken_profile(section: dict[str, Any], message: str, tmp_path: Path) -> None:
    import json

    with pytest.raises(ProfileInvalid) as err:
        parse_profile(json.dumps({"policy": {"dashboards": section}}))
    assert message in str(err.value)
    path = tmp_path / "farm-profile.json"
    path.write_text(json.dumps({"policy": {"dashboards": section}}))
    assert load_profile(path).problem is not None


def test_the_check_is_linear_on_hostile_text() -> None:
    big = {"views": [{"path": "a", "cards": [{"type": "markdown", "content": "<" * 200_000 + " on" * 10_000}]}]}
    started = time.process_time()
    violations(big, rules())
    assert time.process_time() - started < 2.0  # quadratic scanning would take minutes
