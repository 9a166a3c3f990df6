"""Dashboards without I/O: names, url paths, YAML round trip, structural validation, entity ids, patch operations."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from farmhost.errors import InvalidRequest
from farmhost.farm.dashboards import lovelace as dash
from farmhost.farm.dashboards.patch import OPERATIONS, OperationError, apply_operations
from farmhost.protocol.params import MAX_DASHBOARD_BYTES, MAX_OPERATIONS

SHIPPED = Path(__file__).resolve().parents[2] / "dashboards" / "farm.yaml"

BASE = """\
# farm
title: Test
views:
  # first view
  - title: One
    path: one
    cards:
      # pump card
      - type: tile
        id: pump
        entity: switch.irrigation_pump  # the pump
      # moisture card
      - type: gauge
        id: moisture
        entity: sensor.field_1_soil_moisture
  # second view
  - title: Two
    path: two
    type: sections
    sections:
      - type: grid
        cards:
          - type: heading
            id: heading
            heading: Field
  - title: Three
    path: three
    cards: []
"""


def patch(ops: list[Any], text: str = BASE) -> tuple[str, list[str], Any]:
    doc = dash.load(text)
    changes = apply_operations(doc, ops)
    new = dash.dump(doc)
    config = dash.to_plain(dash.load(new))
    return new, changes, config


def cards(config: Any, path: str, section: int | None = None) -> list[str]:
    view = next(v for v in config["views"] if v["path"] == path)
    listed = view["cards"] if section is None else view["sections"][section]["cards"]
    return [c.get("id", c["type"]) for c in listed]


# ------------------------------------------------------------------------------------------------ names


@pytest.mark.parametrize("name", ["farm", "a", "0", "field-1", "field_1", "a" * 64, "9lives-x_y"])
def test_valid_names(name: str) -> None:
    assert dash.check_name(name) == name
    assert dash.url_path(name) == f"farmhost-{name}"


@pytest.mark.parametrize(
    "name",
    [
        "../x",
        "farm/../../etc",
        "FARM",
        "a b",
        "",
        "a" * 65,
        "farm\x00",
        "-farm",
        "_farm",
        "farm.yaml",
        "/etc/x",
        None,
        3,
    ],
)
def test_invalid_names_are_refused(name: object) -> None:
    with pytest.raises(InvalidRequest, match="is not a valid name: use 1-64 lower-case letters"):
        dash.check_name(name)


def test_url_paths_are_injective_and_have_a_hyphen() -> None:
    names = ["a_b", "a-b", "ab", "a--b", "a__b", "farm", "farm-", "farm_"]
    paths = [dash.url_path(n) for n in names]
    assert len(set(paths)) == len(names)
    assert all("-" in p for p in paths)


# ------------------------------------------------------------------------------------------------ YAML


def test_shipped_dashboard_round_trips_byte_for_byte_and_is_valid() -> None:
    text = SHIPPED.read_text()
    assert dash.dump(dash.load(text)) == text
    config, check = dash.validate_text(text)
    assert check.as_dict() == {"valid": True, "errors": [], "warnings": []}
    assert [v["path"] for v in dash.summary(config)] == ["overview", "irrigation", "alerts"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("views: [\n", "YAML error at line 2, column 1: expected the node content, but found '<stream end>'"),
        ("a: 1\na: 2\n", 'YAML error at line 2, column 1: found duplicate key "a"'),
        ("views:\n  - x: !secret pw\n", "views[0].x: YAML tag !secret is not supported"),
        ("views:\n  - !custom {type: x}\n", "views[0]: YAML tag !custom is not supported"),
        ("views:\n  - {1: x}\n", "views[0]: key 1 is not a string"),
        ("views:\n  - {v: .nan}\n", "views[0].v: nan is not a number HA can store"),
        ("x: " + "[" * 40 + "]" * 40 + "\n", "is nested more than 32 levels deep"),
    ],
)
def test_unreadable_yaml_is_an_error_with_its_position(text: str, message: str) -> None:
    config, check = dash.validate_text(text)
    assert config is None
    assert len(check.errors) == 1
    assert message in check.errors[0]


def test_alias_bombs_are_bounded() -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}]" for i in range(1, 12)]
    _, check = dash.validate_text("\n".join(lines) + "\n")
    assert check.errors == ["the dashboard has more than 50000 values (after expanding YAML aliases)"]


def test_oversize_content_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="larger than 256 KiB"):
        dash.load("x: " + "y" * MAX_DASHBOARD_BYTES)


def test_timestamps_become_text() -> None:
    assert dash.to_plain(dash.load("d: 2026-05-17\nt: 2026-05-17 10:00:00\n")) == {
        "d": "2026-05-17",
        "t": "2026-05-17T10:00:00",
    }


# ------------------------------------------------------------------------------------------------ validation


def views(*items: str) -> str:
    return "views:\n" + "".join(items)


@pytest.mark.parametrize(
    ("text", "errors"),
    [
        ("- a\n", ["the dashboard must be a mapping with a `views` list"]),
        ("title: x\n", ["missing `views`: a dashboard is a mapping with a `views` list"]),
        ("views: {}\n", ["`views` must be a list of views"]),
        ("views: []\n", ["`views` is empty: a dashboard needs at least one view"]),
        ("title: [x]\nviews: [{path: a, cards: []}]\n", ["`title` must be text"]),
        (views("  - just text\n"), ["views[0]: a view must be a mapping (title, path, cards)"]),
        (
            views("  - {path: a b, cards: []}\n"),
            ["views[0] ('a b'): path 'a b' is not URL-safe: use 1-64 letters, digits, '_' or '-'"],
        ),
        (
            views("  - {path: a, cards: []}\n", "  - {path: a, cards: []}\n"),
            ["views[1] ('a'): path 'a' is already used by views[0] ('a')"],
        ),
        (views("  - {path: a, title: 3, cards: []}\n"), ["views[0] ('a'): `title` must be text"]),
        (views("  - {path: a, theme: [x], cards: []}\n"), ["views[0] ('a'): `theme` must be text"]),
        (views("  - {path: a, cards: {}}\n"), ["views[0] ('a').cards must be a list of cards"]),
        (views("  - {path: a, cards: [x]}\n"), ["views[0] ('a').cards[0]: a card must be a mapping with a `type`"]),
        (
            views("  - {path: a, cards: [{title: x}]}\n"),
            ["views[0] ('a').cards[0]: a card needs a `type` (e.g. entities, gauge, tile, markdown)"],
        ),
        (
            views("  - {path: a, cards: [{type: x, id: c}, {type: y, id: c}]}\n"),
            ["views[0] ('a').cards[1]: card id 'c' is already used by views[0] ('a').cards[0]"],
        ),
        (
            views(
                "  - {path: a, cards: [{type: x, id: c}]}\n", "  - {path: b, sections: [{cards: [{type: y, id: c}]}]}\n"
            ),
            ["views[1] ('b').sections[0].cards[0]: card id 'c' is already used by views[0] ('a').cards[0]"],
        ),
        (
            views("  - {path: a, cards: [{type: x, id: 'a b'}]}\n"),
            ["views[0] ('a').cards[0]: card id 'a b' is not valid: use letters, digits, '_', '-', '.', ':'"],
        ),
        (views("  - {path: a, sections: {}}\n"), ["views[0] ('a').sections must be a list of sections"]),
        (
            views("  - {path: a, sections: [x]}\n"),
            ["views[0] ('a').sections[0]: a section must be a mapping with `cards`"],
        ),
        (
            views("  - {path: a, cards: [{type: vertical-stack, cards: [{title: x}]}]}\n"),
            ["views[0] ('a').cards[0].cards[0]: a card needs a `type` (e.g. entities, gauge, tile, markdown)"],
        ),
        (
            views("  - {path: a, cards: [{type: conditional, card: [x]}]}\n"),
            ["views[0] ('a').cards[0].card: a card must be a mapping with a `type`"],
        ),
        (
            views("  - {path: a, cards: [{type: tile, entity: Pump}]}\n"),
            ["views[0] ('a').cards[0]: `entity` 'Pump' is not an entity id (domain.object_id)"],
        ),
        (
            views("  - {path: a, cards: [{type: entities, entities: [sensor.a, {entity: nope}, {type: divider}]}]}\n"),
            ["views[0] ('a').cards[0].entities[1]: 'nope' is not an entity id (domain.object_id)"],
        ),
        (
            views("  - {path: a, cards: [{type: entities, entities: sensor.a}]}\n"),
            ["views[0] ('a').cards[0].entities must be a list"],
        ),
        (
            views("  - {path: a, badges: [3], cards: []}\n"),
            ["views[0] ('a').badges[0]: 3 is not an entity id (domain.object_id)"],
        ),
    ],
)
def test_structure_errors(text: str, errors: list[str]) -> None:
    _, check = dash.validate_text(text)
    assert check.errors == errors
    assert not check.valid


@pytest.mark.parametrize(
    ("text", "warnings"),
    [
        (
            views("  - {title: x, cards: []}\n"),
            ["views[0] has no `path`; patch operations and screenshots cannot address it"],
        ),
        (views("  - {path: a}\n"), ["views[0] ('a') has no cards"]),
    ],
)
def test_structure_warnings_keep_a_dashboard_valid(text: str, warnings: list[str]) -> None:
    _, check = dash.validate_text(text)
    assert check.valid
    assert check.warnings == warnings


def test_entity_ids_are_found_everywhere() -> None:
    text = """\
views:
  - path: a
    badges: [person.me, {entity: sun.sun}]
    cards:
      - {type: tile, entity: switch.pump}
      - type: entities
        entities: [sensor.a, {entity: sensor.b, name: B}, {type: divider}, {type: section, label: not.an_entity}]
      - type: conditional
        conditions: [{condition: state, entity: binary_sensor.frost, state: "on"}]
        card: {type: markdown, content: "sensor.in_text is not a reference"}
      - type: button
        tap_action: {action: call-service, service: switch.toggle, target: {entity_id: [switch.valve]}}
      - {type: button, tap_action: {action: call-service, service_data: {entity_id: "light.a, light.b"}}}
"""
    assert dash.entity_ids(dash.to_plain(dash.load(text))) == [
        "binary_sensor.frost",
        "light.a",
        "light.b",
        "person.me",
        "sensor.a",
        "sensor.b",
        "sun.sun",
        "switch.pump",
        "switch.valve",
    ]


# ------------------------------------------------------------------------------------------------ patch


@pytest.mark.parametrize(
    ("ops", "changes", "expect"),
    [
        (
            [{"op": "add_view", "view": {"title": "Pumps", "path": "pumps", "cards": []}}],
            ["added view 'pumps' at index 3"],
            lambda c: [v["path"] for v in c["views"]] == ["one", "two", "three", "pumps"],
        ),
        (
            [{"op": "add_view", "view": {"path": "first"}, "index": 0}],
            ["added view 'first' at index 0"],
            lambda c: c["views"][0] == {"path": "first"},
        ),
        (
            [{"op": "update_view", "path": "one", "changes": {"title": "Uno", "icon": "mdi:one", "path": "uno"}}],
            ["updated view 'one': icon, path, title"],
            lambda c: (
                c["views"][0] == {"title": "Uno", "path": "uno", "cards": c["views"][0]["cards"], "icon": "mdi:one"}
            ),
        ),
        (
            [{"op": "update_view", "path": "two", "changes": {"type": None}}],
            ["updated view 'two': type"],
            lambda c: "type" not in c["views"][1],
        ),
        (
            [{"op": "remove_view", "path": "two"}],
            ["removed view 'two'"],
            lambda c: [v["path"] for v in c["views"]] == ["one", "three"],
        ),
        (
            [{"op": "move_view", "path": "three", "index": 0}],
            ["moved view 'three' from index 2 to 0"],
            lambda c: [v["path"] for v in c["views"]] == ["three", "one", "two"],
        ),
        (
            [{"op": "add_card", "viewPath": "three", "card": {"type": "markdown", "id": "note", "content": "hi"}}],
            ["added card 'note' to view 'three' at index 0"],
            lambda c: cards(c, "three") == ["note"],
        ),
        (
            [{"op": "add_card", "viewPath": "one", "card": {"type": "markdown"}, "index": 1}],
            ["added card (markdown) to view 'one' at index 1"],
            lambda c: cards(c, "one") == ["pump", "markdown", "moisture"],
        ),
        (
            [{"op": "add_card", "viewPath": "two", "section": 0, "card": {"type": "tile", "id": "t"}, "index": 0}],
            ["added card 't' to view 'two' section 0 at index 0"],
            lambda c: cards(c, "two", 0) == ["t", "heading"],
        ),
        (
            [{"op": "update_card", "id": "moisture", "changes": {"name": "Soil", "min": 0, "entity": "sensor.x_y"}}],
            ["updated card 'moisture': entity, min, name"],
            lambda c: (
                c["views"][0]["cards"][1]
                == {"type": "gauge", "id": "moisture", "entity": "sensor.x_y", "name": "Soil", "min": 0}
            ),
        ),
        (
            [{"op": "update_card", "id": "heading", "changes": {"id": "field-heading", "heading": None}}],
            ["updated card 'heading': heading, id"],
            lambda c: (
                cards(c, "two", 0) == ["field-heading"] and "heading" not in c["views"][1]["sections"][0]["cards"][0]
            ),
        ),
        (
            [{"op": "remove_card", "id": "pump"}],
            ["removed card 'pump' from view 'one'"],
            lambda c: cards(c, "one") == ["moisture"],
        ),
        (
            [{"op": "remove_card", "id": "heading"}],
            ["removed card 'heading' from view 'two' section 0"],
            lambda c: cards(c, "two", 0) == [],
        ),
        (
            [{"op": "move_card", "id": "pump", "toViewPath": "one"}],
            ["moved card 'pump' from view 'one' to view 'one' at index 1"],
            lambda c: cards(c, "one") == ["moisture", "pump"],
        ),
        (
            [{"op": "move_card", "id": "heading", "toViewPath": "three"}],
            ["moved card 'heading' from view 'two' section 0 to view 'three' at index 0"],
            lambda c: cards(c, "three") == ["heading"] and cards(c, "two", 0) == [],
        ),
        (
            [{"op": "move_card", "id": "moisture", "toViewPath": "two", "section": 0, "index": 0}],
            ["moved card 'moisture' from view 'one' to view 'two' section 0 at index 0"],
            lambda c: cards(c, "two", 0) == ["moisture", "heading"],
        ),
        (
            [{"op": "set_theme", "theme": "farm-dark"}],
            ["set theme 'farm-dark' on views 'one', 'two', 'three'"],
            lambda c: [v.get("theme") for v in c["views"]] == ["farm-dark"] * 3,
        ),
        (
            [{"op": "set_theme", "theme": "farm-dark", "viewPath": "two"}, {"op": "set_theme", "theme": None}],
            ["set theme 'farm-dark' on view 'two'", "removed the theme on views 'one', 'two', 'three'"],
            lambda c: all("theme" not in v for v in c["views"]),
        ),
    ],
)
def test_operations(ops: list[Any], changes: list[str], expect: Any) -> None:
    _, done, config = patch(ops)
    assert done == changes
    assert expect(config), config
    assert dash.validate(config).valid


def op_error(ops: list[Any], text: str = BASE) -> str:
    with pytest.raises(InvalidRequest) as caught:
        apply_operations(dash.load(text), ops)
    return caught.value.message


ADD = {"op": "add_card", "viewPath": "one", "card": {"type": "tile"}}


@pytest.mark.parametrize(
    ("ops", "message"),
    [
        ([], "`operations` must be a non-empty list of patch operations"),
        ({"op": "add_view"}, "`operations` must be a non-empty list of patch operations"),
        ([ADD] * (MAX_OPERATIONS + 1), f"a patch has at most {MAX_OPERATIONS} operations (got {MAX_OPERATIONS + 1})"),
        (
            ["add_view"],
            'operations[0]: an operation is a mapping such as {"op": "add_card", "viewPath": "...", "card": {...}}',
        ),
        (
            [{"view": {}}],
            (
                "operations[0]: unknown op None; use one of add_view, update_view, remove_view, move_view, "
                "add_card, update_card, remove_card, move_card, set_theme"
            ),
        ),
        ([{"op": ["x"]}], "operations[0]: unknown op ['x']; use one of add_view,"),
        ([ADD, {"op": "rename_view"}], "operations[1] (rename_view): unknown op 'rename_view'; use one of"),
        ([{"op": "add_view"}], "operations[0] (add_view): missing `view`"),
        ([{"op": "move_card", "id": "x"}], "operations[0] (move_card): missing `toViewPath`"),
        ([{"op": "remove_view", "path": "one", "force": True}], "operations[0] (remove_view): unknown field `force`"),
        ([{"op": "add_view", "view": []}], "operations[0] (add_view): `view` must be a mapping such as"),
        ([{"op": "add_view", "view": {"title": "x"}}], "operations[0] (add_view): `view` needs a `path`"),
        (
            [{"op": "add_view", "view": {"path": "one"}}],
            "operations[0] (add_view): a view with path 'one' already exists",
        ),
        ([{"op": "add_view", "view": {"path": "../x"}}], "operations[0] (add_view): view path '../x' is not valid"),
        (
            [{"op": "add_view", "view": {"path": "x"}, "index": 4}],
            "operations[0] (add_view): index 4 is out of range (0-3)",
        ),
        (
            [{"op": "add_view", "view": {"path": "x"}, "index": -1}],
            "operations[0] (add_view): index -1 is out of range",
        ),
        (
            [{"op": "add_view", "view": {"path": "x"}, "index": True}],
            "operations[0] (add_view): `index` must be an integer, not True",
        ),
        (
            [{"op": "add_view", "view": {"path": "x"}, "index": "1"}],
            "operations[0] (add_view): `index` must be an integer, not '1'",
        ),
        (
            [{"op": "update_view", "path": "nope", "changes": {"title": "x"}}],
            "operations[0] (update_view): no view with path 'nope' (views: one, two, three)",
        ),
        (
            [{"op": "update_view", "path": 1, "changes": {"title": "x"}}],
            "operations[0] (update_view): `path` must be a view path (text)",
        ),
        (
            [{"op": "update_view", "path": "one", "changes": {}}],
            "operations[0] (update_view): `changes` must be a non-empty mapping",
        ),
        (
            [{"op": "update_view", "path": "one", "changes": ["title"]}],
            "operations[0] (update_view): `changes` must be a non-empty mapping",
        ),
        (
            [{"op": "update_view", "path": "one", "changes": {"path": None}}],
            "operations[0] (update_view): `changes` cannot remove `path`",
        ),
        (
            [{"op": "update_view", "path": "one", "changes": {"path": "two"}}],
            "operations[0] (update_view): a view with path 'two' already exists",
        ),
        ([{"op": "remove_view", "path": "nope"}], "operations[0] (remove_view): no view with path 'nope'"),
        ([{"op": "move_view", "path": "one", "index": 3}], "operations[0] (move_view): index 3 is out of range (0-2)"),
        (
            [{"op": "add_card", "viewPath": "nope", "card": {"type": "x"}}],
            "operations[0] (add_card): no view with path 'nope'",
        ),
        (
            [{"op": "add_card", "viewPath": 3, "card": {"type": "x"}}],
            "operations[0] (add_card): `viewPath` must be a view path (text)",
        ),
        (
            [{"op": "add_card", "viewPath": "one", "card": {"title": "x"}}],
            "operations[0] (add_card): `card` must be a mapping with a `type`",
        ),
        (
            [{"op": "add_card", "viewPath": "one", "card": "tile"}],
            "operations[0] (add_card): `card` must be a mapping with a `type`",
        ),
        (
            [{"op": "add_card", "viewPath": "one", "card": {"type": "x", "id": "pump"}}],
            "operations[0] (add_card): card id 'pump' is already used (in view 'one')",
        ),
        (
            [{"op": "add_card", "viewPath": "one", "card": {"type": "x", "id": "a/b"}}],
            "operations[0] (add_card): card id 'a/b' is not valid",
        ),
        (
            [{"op": "add_card", "viewPath": "two", "card": {"type": "x"}}],
            "operations[0] (add_card): view 'two' arranges its cards in sections: give `section` (a section index)",
        ),
        (
            [{"op": "add_card", "viewPath": "two", "section": 1, "card": {"type": "x"}}],
            "operations[0] (add_card): view 'two' has no section 1 (it has 1: 0-0)",
        ),
        (
            [{"op": "add_card", "viewPath": "one", "section": 0, "card": {"type": "x"}}],
            "operations[0] (add_card): view 'one' has no sections",
        ),
        (
            [{"op": "add_card", "viewPath": "one", "card": {"type": "x"}, "index": 3}],
            "operations[0] (add_card): index 3 is out of range (0-2)",
        ),
        (
            [ADD, ADD, {"op": "update_card", "id": "nope", "changes": {"x": 1}}],
            "operations[2] (update_card): no card with id 'nope' (cards are found by `id` in views' cards and sections)",
        ),
        (
            [{"op": "update_card", "id": "", "changes": {"x": 1}}],
            "operations[0] (update_card): `id` must be a card id (text)",
        ),
        (
            [{"op": "update_card", "id": "pump", "changes": {"type": None}}],
            "operations[0] (update_card): `changes` cannot remove `type`",
        ),
        (
            [{"op": "update_card", "id": "pump", "changes": {"id": None}}],
            "operations[0] (update_card): `changes` cannot remove `id`",
        ),
        (
            [{"op": "update_card", "id": "pump", "changes": {"type": ""}}],
            "operations[0] (update_card): `type` must be a card type",
        ),
        (
            [{"op": "update_card", "id": "pump", "changes": {"id": "heading"}}],
            "operations[0] (update_card): card id 'heading' is already used (in view 'two')",
        ),
        ([{"op": "remove_card", "id": "nope"}], "operations[0] (remove_card): no card with id 'nope'"),
        (
            [{"op": "remove_card", "id": "pump"}, {"op": "remove_card", "id": "pump"}],
            "operations[1] (remove_card): no card with id 'pump'",
        ),
        (
            [{"op": "move_card", "id": "pump", "toViewPath": "nope"}],
            "operations[0] (move_card): no view with path 'nope'",
        ),
        (
            [{"op": "move_card", "id": "pump", "toViewPath": "one", "index": 2}],
            "operations[0] (move_card): index 2 is out of range (0-1)",
        ),
        (
            [{"op": "move_card", "id": "pump", "toViewPath": "two"}],
            "operations[0] (move_card): view 'two' arranges its cards in sections",
        ),
        ([{"op": "set_theme", "theme": 3}], "operations[0] (set_theme): `theme` must be a theme name, or null"),
        (
            [{"op": "set_theme", "theme": "x", "viewPath": "nope"}],
            "operations[0] (set_theme): no view with path 'nope'",
        ),
    ],
)
def test_operation_errors_name_the_operation(ops: Any, message: str) -> None:
    assert op_error(ops).startswith(message)


def test_operation_errors_are_operation_errors() -> None:
    with pytest.raises(OperationError):
        apply_operations(dash.load(BASE), [{"op": "remove_view", "path": "nope"}])


def test_a_dashboard_without_views_cannot_be_patched() -> None:
    assert op_error([ADD], "title: x\n") == "the staged dashboard has no `views` list to patch; fix its structure first"


# ------------------------------------------------------------------------------------------------ comments


def test_comments_and_key_order_survive_a_patch() -> None:
    new, _, _ = patch([{"op": "update_card", "id": "moisture", "changes": {"name": "Soil"}}])
    assert new == BASE.replace(
        "        entity: sensor.field_1_soil_moisture\n",
        "        entity: sensor.field_1_soil_moisture\n        name: Soil\n",
    )


def test_a_moved_card_takes_its_comment_along_and_leaves_the_others() -> None:
    new, _, _ = patch([{"op": "move_card", "id": "pump", "toViewPath": "two", "section": 0, "index": 0}])
    assert (
        new
        == """\
# farm
title: Test
views:
  # first view
  - title: One
    path: one
    cards:
      # moisture card
      - type: gauge
        id: moisture
        entity: sensor.field_1_soil_moisture
  # second view
  - title: Two
    path: two
    type: sections
    sections:
      - type: grid
        cards:
          # pump card
          - type: tile
            id: pump
            entity: switch.irrigation_pump # the pump
          - type: heading
            id: heading
            heading: Field
  - title: Three
    path: three
    cards: []
"""
    )


def test_a_removed_view_takes_its_comment_and_the_next_keeps_its_own() -> None:
    new, _, _ = patch([{"op": "remove_view", "path": "one"}])
    assert new.startswith("# farm\ntitle: Test\nviews:\n  # second view\n  - title: Two\n")
    assert "first view" not in new and "pump card" not in new


def test_a_moved_view_keeps_its_comments() -> None:
    new, _, _ = patch([{"op": "move_view", "path": "one", "index": 2}])
    assert new.endswith(
        "    cards: []\n  # first view\n  - title: One\n    path: one\n    cards:\n      # pump card\n"
        "      - type: tile\n        id: pump\n        entity: switch.irrigation_pump  # the pump\n"
        "      # moisture card\n      - type: gauge\n        id: moisture\n        entity: sensor.field_1_soil_moisture\n"
    )
    assert new.startswith("# farm\ntitle: Test\nviews:\n  # second view\n  - title: Two\n")


def test_a_card_added_at_the_end_goes_after_the_comment_of_the_next_view() -> None:
    new, _, _ = patch([{"op": "add_card", "viewPath": "one", "card": {"type": "markdown", "id": "note"}}])
    assert (
        "        entity: sensor.field_1_soil_moisture\n      - type: markdown\n        id: note\n  # second view\n"
        in new
    )


def test_a_patch_of_the_shipped_dashboard_changes_only_what_it_names() -> None:
    text = SHIPPED.read_text()
    new, _, config = patch([{"op": "update_card", "id": "field-1-moisture", "changes": {"max": 60}}], text)
    assert new == text.replace("            max: 100\n", "            max: 60\n", 1)
    assert dash.validate(config).valid


# ------------------------------------------------------------------------------------------------ docs


def test_every_operation_example_in_the_docs_applies_to_the_shipped_dashboard() -> None:
    docs = (SHIPPED.parents[1] / "docs" / "dashboards.md").read_text()
    blocks = [json.loads(block) for block in re.findall(r"```json\n(.*?)\n```", docs, re.DOTALL)]
    examples = [block for block in blocks if isinstance(block, dict) and "op" in block]
    assert {e["op"] for e in examples} == set(OPERATIONS)
    for example in examples:
        _, changes, config = patch([example], SHIPPED.read_text())
        assert len(changes) == 1 and dash.validate(config).valid, example
