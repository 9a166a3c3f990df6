"""The dashboard actions through IPC files against the real Home Assistant: get, validate, patch, apply, backups."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from farmhost_testing import Daemon, clean_env, drop, ok, refused, wait_result
from ha_core_support import FarmHost, farm_host, make_data_dir
from ha_fixture import HaInstance

from farmhost.farm.dashboards import lovelace as dash
from farmhost.farm.dashboards.actions import ha_dashboard_patch
from farmhost.farm.dashboards.files import shipped_dashboards
from farmhost.farm.deps import FarmDeps
from farmhost.layout import DataLayout
from farmhost.protocol.params import HaDashboardPatchParams

SHIPPED = Path(__file__).resolve().parents[2] / "dashboards" / "farm.yaml"

SMALL = """\
# a small test dashboard
title: Small
views:
  # the only view
  - title: Field
    path: field
    cards:
      - type: tile
        id: pump
        entity: switch.irrigation_pump
"""


@pytest.fixture
async def host(tmp_path: Path, ha_env: dict[str, str]) -> AsyncIterator[FarmHost]:
    """The IPC engine with the farm handlers, pointed at the session's HA; 3 backups kept per dashboard."""
    async with farm_host(make_data_dir(tmp_path / "data"), ha_env=ha_env, dashboard_backups=3) as farm:
        yield farm


def stage(host: FarmHost, text: str, name: str | None = None) -> str:
    """Write a staged dashboard under a fresh name (HA's dashboards live for the whole session)."""
    name = name or f"t-{secrets.token_hex(4)}"
    folder = host.data_dir / "dashboards"
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.yaml").write_text(text)
    return name


def ha_config(ha: HaInstance, url: str) -> dict[str, Any]:
    with ha.ws() as ws:
        answer = ws.command("lovelace/config", url_path=url)
    assert answer["success"], answer
    config: dict[str, Any] = answer["result"]
    return config


def ha_dashboards(ha: HaInstance) -> dict[str, dict[str, Any]]:
    with ha.ws() as ws:
        answer = ws.command("lovelace/dashboards/list")
    return {item["url_path"]: item for item in answer["result"]}


# apply -----------------------------------------------------------------------------------------------


async def test_the_shipped_dashboard_applies_cleanly_and_reads_back_the_same(host: FarmHost, ha: HaInstance) -> None:
    assert shipped_dashboards() == SHIPPED.parent
    checked = ok(await host.ask("main", "ha_dashboard_validate", {"checkEntities": True}))
    assert checked["valid"] and checked["errors"] == [] and checked["warnings"] == []
    assert checked["unknownEntities"] == []  # every entity of dashboards/farm.yaml exists in the test farm
    assert (host.data_dir / "dashboards" / "farm.yaml").read_bytes() == SHIPPED.read_bytes()  # seeded on first use

    applied = ok(await host.ask("main", "ha_apply_dashboard", {}))
    assert applied["dashboard"] == "farm" and applied["urlPath"] == "farmhost-farm"
    assert applied["views"] == 3 and applied["cards"] == 18 and applied["warnings"] == []
    assert ha_config(ha, "farmhost-farm") == dash.to_plain(dash.load(SHIPPED.read_text()))
    listed = ha_dashboards(ha)["farmhost-farm"]
    assert listed["mode"] == "storage" and listed["title"] == "Farm" and listed["show_in_sidebar"] is True


async def test_a_second_apply_backs_up_the_first_and_backups_rotate(host: FarmHost, ha: HaInstance) -> None:
    name = stage(host, SMALL)
    url = f"farmhost-{name}"
    first = ok(await host.ask("main", "ha_apply_dashboard", {"dashboard": name}))
    assert first["created"] is True and first["backup"] is None and first["urlPath"] == url
    assert ha_dashboards(ha)[url]["title"] == "Small"
    before = ha_config(ha, url)

    ok(await host.ask("main", "ha_dashboard_patch", {"dashboard": name, "operations": [
        {"op": "update_card", "id": "pump", "changes": {"name": "Pump"}},
        {"op": "update_view", "path": "field", "changes": {"title": "Field 1"}},
    ]}))  # fmt: skip
    second = ok(await host.ask("main", "ha_apply_dashboard", {"dashboard": name}))
    assert second["created"] is False and second["backup"].startswith(f"backups/{name}/")
    backup = host.data_dir / "dashboards" / second["backup"]
    assert json.loads(backup.read_text()) == before  # what HA had before this apply
    assert ha_config(ha, url)["views"][0] == {
        "title": "Field 1",
        "path": "field",
        "cards": [{"type": "tile", "id": "pump", "entity": "switch.irrigation_pump", "name": "Pump"}],
    }

    names = [second["backup"]]
    for _ in range(3):
        names.append(ok(await host.ask("main", "ha_apply_dashboard", {"dashboard": name}))["backup"])
    kept = sorted(p.name for p in (host.data_dir / "dashboards" / "backups" / name).iterdir())
    assert kept == sorted(Path(n).name for n in names[-3:])  # dashboard_backups=3: the newest three
    assert len(set(names)) == 4

    skipped = ok(await host.ask("main", "ha_apply_dashboard", {"dashboard": name, "backup": False}))
    assert skipped["backup"] is None
    assert sorted(p.name for p in (host.data_dir / "dashboards" / "backups" / name).iterdir()) == kept


async def test_the_hub_title_follows_the_staged_title(host: FarmHost, ha: HaInstance) -> None:
    name = stage(host, SMALL)
    ok(await host.ask("main", "ha_apply_dashboard", {"dashboard": name}))
    stage(host, SMALL.replace("title: Small", "title: Renamed"), name)
    ok(await host.ask("main", "ha_apply_dashboard", {"dashboard": name}))
    assert ha_dashboards(ha)[f"farmhost-{name}"]["title"] == "Renamed"


async def test_an_invalid_dashboard_is_not_applied(host: FarmHost, ha: HaInstance) -> None:
    name = stage(host, SMALL.replace("      - type: tile\n", "      - kind: tile\n"))
    refused(
        await host.ask("main", "ha_apply_dashboard", {"dashboard": name}),
        "invalid_request",
        f"dashboard {name!r} is not valid, nothing was applied",
        "views[0] ('field').cards[0]: a card needs a `type`",
    )
    assert f"farmhost-{name}" not in ha_dashboards(ha)
    broken = stage(host, "views: [\n")
    refused(
        await host.ask("main", "ha_apply_dashboard", {"dashboard": broken}), "invalid_request", "YAML error at line 2"
    )


async def test_home_assistant_down_is_upstream_unavailable(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port nothing listens on: HA is down
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {"HA_URL": f"http://127.0.0.1:{port}", "HA_TOKEN": "not-used"}
    async with farm_host(make_data_dir(tmp_path / "data"), ha_env=env) as host:
        refused(await host.ask("main", "ha_apply_dashboard", {}), "upstream_unavailable", "unreachable")
        refused(
            await host.ask("main", "ha_dashboard_validate", {"checkEntities": True}),
            "upstream_unavailable",
            "unreachable",
        )
        assert ok(await host.ask("main", "ha_dashboard_validate", {}))["valid"]  # no HA needed without checkEntities
        assert not (host.data_dir / "dashboards" / "backups").exists()


async def test_apply_while_home_assistant_is_stopped_then_again_once_it_is_back(host: FarmHost, ha: HaInstance) -> None:
    name = stage(host, SMALL)
    ok(await host.ask("main", "ha_apply_dashboard", {"dashboard": name}))
    await asyncio.to_thread(ha.take_down)
    try:
        refused(await host.ask("main", "ha_apply_dashboard", {"dashboard": name}), "upstream_unavailable")
        refused(
            await host.ask("main", "ha_dashboard_validate", {"dashboard": name, "checkEntities": True}),
            "upstream_unavailable",
        )
    finally:
        await asyncio.to_thread(ha.ensure_running)
    again = ok(await host.ask("main", "ha_apply_dashboard", {"dashboard": name}))  # same farmhost, no restart
    assert again["created"] is False and again["backup"] is not None  # HA kept the first apply


async def test_without_home_assistant_apply_is_unavailable_and_files_still_work(tmp_path: Path) -> None:
    async with farm_host(make_data_dir(tmp_path / "data"), ha_env=None) as host:
        refused(await host.ask("main", "ha_apply_dashboard", {}), "upstream_unavailable", "not configured")
        assert ok(await host.ask("main", "ha_dashboard_get", {}))["title"] == "Farm"


# validate --------------------------------------------------------------------------------------------


async def test_validate_finds_a_bogus_entity(host: FarmHost) -> None:
    content = SMALL + "      - type: gauge\n        id: probe\n        entity: sensor.bogus_probe_7\n"
    checked = ok(await host.ask("main", "ha_dashboard_validate", {"content": content, "checkEntities": True}))
    assert checked["valid"] is True and checked["errors"] == []
    assert checked["unknownEntities"] == ["sensor.bogus_probe_7"]
    assert checked["warnings"] == ["Home Assistant does not know 1 entity: sensor.bogus_probe_7"]
    assert checked["entities"] == ["sensor.bogus_probe_7", "switch.irrigation_pump"]
    unchecked = ok(await host.ask("main", "ha_dashboard_validate", {"content": content}))
    assert unchecked["unknownEntities"] == [] and unchecked["warnings"] == []


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"content": "views: []\n", "dashboard": "farm"}, "give either dashboard (a staged dashboard) or content"),
        ({"content": 3}, "'content' must be text"),
        ({"content": "x" * (256 * 1024 + 1)}, "'content' must have at most 262144 characters"),
        ({"checkEntities": "yes"}, "'checkEntities' must be true or false"),
        ({"path": "/etc/passwd"}, "unknown param 'path'"),
    ],
)
async def test_validate_refuses_bad_params(host: FarmHost, params: dict[str, Any], message: str) -> None:
    refused(await host.ask("main", "ha_dashboard_validate", params), "invalid_request", message)


async def test_validate_reports_structure_errors_as_data(host: FarmHost) -> None:
    checked = ok(await host.ask("main", "ha_dashboard_validate", {"content": "views:\n  - {path: a}\n  - {path: a}\n"}))
    assert checked["valid"] is False
    assert checked["errors"] == ["views[1] ('a'): path 'a' is already used by views[0] ('a')"]
    assert checked["warnings"] == ["views[0] ('a') has no cards", "views[1] ('a') has no cards"]


# get -------------------------------------------------------------------------------------------------


async def test_get_the_dashboard_or_one_view(host: FarmHost) -> None:
    whole = ok(await host.ask("main", "ha_dashboard_get", {}))
    assert whole["dashboard"] == "farm" and whole["urlPath"] == "farmhost-farm" and whole["file"] == "farm.yaml"
    assert whole["yaml"] == SHIPPED.read_text()
    assert [v["path"] for v in whole["views"]] == ["overview", "irrigation", "alerts"]
    assert whole["config"] == dash.to_plain(dash.load(SHIPPED.read_text()))

    one = ok(await host.ask("main", "ha_dashboard_get", {"viewPath": "alerts"}))
    assert one["index"] == 2 and one["view"]["title"] == "Alerts" and one["view"]["cards"][0]["id"] == "alert-frost"
    assert one["yaml"].startswith("title: Alerts\npath: alerts\n")
    refused(
        await host.ask("main", "ha_dashboard_get", {"viewPath": "nope"}),
        "not_found",
        "dashboard 'farm' has no view with path 'nope' (views: overview, irrigation, alerts)",
    )
    traversal = await host.ask("main", "ha_dashboard_get", {"viewPath": "../x"})
    refused(traversal, "invalid_request", "'viewPath'", "a view path or a group folder, never a path or URL")


async def test_a_dashboard_that_is_neither_staged_nor_shipped_is_not_found(host: FarmHost) -> None:
    for action in ("ha_dashboard_get", "ha_dashboard_validate", "ha_apply_dashboard"):
        refused(
            await host.ask("main", action, {"dashboard": "greenhouse"}),
            "not_found",
            "there is no dashboard 'greenhouse': no staged copy greenhouse.yaml and farmhost ships no",
        )
    assert not (host.data_dir / "dashboards" / "greenhouse.yaml").exists()


# patch -----------------------------------------------------------------------------------------------


async def test_patch_writes_atomically_and_keeps_comments(host: FarmHost) -> None:
    name = stage(host, SMALL)
    path = host.data_dir / "dashboards" / f"{name}.yaml"
    ops = [
        {
            "op": "add_card",
            "viewPath": "field",
            "card": {"type": "gauge", "id": "moist", "entity": "sensor.air_humidity"},
        },
        {"op": "set_theme", "theme": "farm"},
    ]
    dry = ok(await host.ask("main", "ha_dashboard_patch", {"dashboard": name, "operations": ops, "dryRun": True}))
    assert dry["dryRun"] is True and dry["written"] is False and path.read_text() == SMALL
    assert "+      - type: gauge\n" in dry["diff"] and "+    theme: farm\n" in dry["diff"]

    done = ok(await host.ask("main", "ha_dashboard_patch", {"dashboard": name, "operations": ops}))
    assert done["written"] is True and done["diff"] == dry["diff"]
    assert done["changes"] == ["added card 'moist' to view 'field' at index 1", "set theme 'farm' on view 'field'"]
    assert done["validation"] == {"valid": True, "errors": [], "warnings": []}
    text = path.read_text()
    assert "# a small test dashboard\n" in text and "  # the only view\n" in text
    assert text.endswith("        entity: sensor.air_humidity\n    theme: farm\n")
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".")] == []  # no temp file left


async def test_a_failing_operation_changes_nothing(host: FarmHost) -> None:
    name = stage(host, SMALL)
    path = host.data_dir / "dashboards" / f"{name}.yaml"
    before = os.stat(path)
    refused(
        await host.ask(
            "main",
            "ha_dashboard_patch",
            {
                "dashboard": name,
                "operations": [
                    {"op": "update_view", "path": "field", "changes": {"title": "Changed"}},
                    {"op": "remove_card", "id": "no-such-card"},
                ],
            },
        ),
        "invalid_request",
        "operations[1] (remove_card): no card with id 'no-such-card'",
    )
    refused(
        await host.ask(
            "main",
            "ha_dashboard_patch",
            {
                "dashboard": name,
                "operations": [
                    {"op": "update_view", "path": "field", "changes": {"cards": "not a list"}},
                ],
            },
        ),
        "invalid_request",
        f"the patch would leave dashboard {name!r} invalid, nothing was changed: views[0] ('field').cards must be",
    )
    after = os.stat(path)
    assert path.read_text() == SMALL and (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


async def test_patch_creates_a_new_dashboard_from_views(host: FarmHost) -> None:
    params = {"dashboard": "barn", "operations": [{"op": "add_view", "view": {"title": "Barn", "path": "barn"}}]}
    done = ok(await host.ask("main", "ha_dashboard_patch", params))
    assert done["created"] is True and done["written"] is True
    assert (
        host.data_dir / "dashboards" / "barn.yaml"
    ).read_text() == "title: barn\nviews:\n  - title: Barn\n    path: barn\n"
    refused(
        await host.ask(
            "main", "ha_dashboard_patch", {"dashboard": "silo", "operations": [{"op": "set_theme", "theme": "x"}]}
        ),
        "invalid_request",
        "the patch would leave dashboard 'silo' invalid",
    )
    assert not (host.data_dir / "dashboards" / "silo.yaml").exists()


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({}, "missing param 'operations'"),
        ({"operations": []}, "'operations' must be a non-empty list"),
        ({"operations": [{"op": "set_theme", "theme": "x"}], "dryRun": 1}, "'dryRun' must be true or false"),
        ({"operations": [{"op": "set_theme", "theme": "x"}], "file": "x"}, "unknown param 'file'"),
    ],
)
async def test_patch_refuses_bad_params(host: FarmHost, params: dict[str, Any], message: str) -> None:
    refused(await host.ask("main", "ha_dashboard_patch", params), "invalid_request", message)


async def test_concurrent_patches_lose_no_update(host: FarmHost) -> None:
    name = stage(host, SMALL)
    deps = _deps(host)
    await asyncio.gather(*(
        ha_dashboard_patch(deps, None, HaDashboardPatchParams(dashboard=name, operations=[  # type: ignore[arg-type]
            {"op": "add_card", "viewPath": "field", "card": {"type": "markdown", "id": f"note-{n}"}},
        ]))
        for n in range(8)
    ))  # fmt: skip
    config = dash.to_plain(dash.load((host.data_dir / "dashboards" / f"{name}.yaml").read_text()))
    assert sorted(c["id"] for c in config["views"][0]["cards"]) == [
        "note-0",
        *(f"note-{n}" for n in range(1, 8)),
        "pump",
    ]


def _deps(host: FarmHost) -> FarmDeps:
    return FarmDeps(
        settings=host.settings, layout=DataLayout(host.data_dir), ha=None, dashboards_dir=host.data_dir / "dashboards"
    )


# names and links -------------------------------------------------------------------------------------

BAD_NAMES = [
    "../x",
    "farm/../../etc",
    "FARM",
    "a b",
    "",
    "a" * 65,
    "farm\x00",
    "/etc/passwd",
    "farm.yaml",
    7,
]  # null is the default dashboard


async def test_names_that_are_not_names_are_refused(host: FarmHost) -> None:
    ops = [{"op": "add_view", "view": {"path": "x"}}]
    for name in BAD_NAMES:
        for action, params in (
            ("ha_dashboard_get", {"dashboard": name}),
            ("ha_dashboard_validate", {"dashboard": name}),
            ("ha_dashboard_patch", {"dashboard": name, "operations": ops}),
            ("ha_apply_dashboard", {"dashboard": name}),
        ):
            # NUL is refused in any params before a handler sees them
            why = "NUL character" if isinstance(name, str) and "\x00" in name else "'dashboard' must be"
            refused(await host.ask("main", action, params), "invalid_request", why)
    assert not (host.data_dir / "dashboards").exists() or list((host.data_dir / "dashboards").iterdir()) == []
    assert not (host.data_dir.parent / "x.yaml").exists() and not (host.data_dir / "x.yaml").exists()


async def test_a_symlinked_staged_file_is_refused(host: FarmHost, tmp_path: Path) -> None:
    secret = tmp_path / "secret.yaml"
    secret.write_text(SMALL)
    folder = host.data_dir / "dashboards"
    folder.mkdir(exist_ok=True)
    (folder / "farm.yaml").symlink_to(secret)
    for action, params in (
        ("ha_dashboard_get", {}),
        ("ha_dashboard_validate", {}),
        ("ha_dashboard_patch", {"operations": [{"op": "set_theme", "theme": "x"}]}),
        ("ha_apply_dashboard", {}),
    ):
        refused(await host.ask("main", action, params), "not_allowed", "farm.yaml is a symbolic link")
    assert secret.read_text() == SMALL and (folder / "farm.yaml").is_symlink()


async def test_a_symlinked_backups_folder_is_refused_before_anything_is_saved(
    host: FarmHost, ha: HaInstance, tmp_path: Path
) -> None:
    name = stage(host, SMALL)
    ok(await host.ask("main", "ha_apply_dashboard", {"dashboard": name}))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (host.data_dir / "dashboards" / "backups").symlink_to(elsewhere)
    stage(host, SMALL.replace("title: Field", "title: Changed"), name)
    refused(await host.ask("main", "ha_apply_dashboard", {"dashboard": name}), "not_allowed", "dashboards/backups")
    assert list(elsewhere.iterdir()) == []
    assert ha_config(ha, f"farmhost-{name}")["views"][0]["title"] == "Field"  # HA still has the first apply


async def test_dashboard_actions_are_main_only(host: FarmHost) -> None:
    refused(await host.ask("field", "ha_dashboard_get", {}), "unauthorized")


async def test_the_daemon_serves_the_dashboard_actions(tmp_path: Path, ha_env: dict[str, str]) -> None:
    data_dir = make_data_dir(tmp_path / "data")
    daemon = Daemon(data_dir, env=clean_env(**ha_env)).start()
    try:
        rid = drop(
            data_dir, "main", "actions", {"type": "farm_action", "requestId": "d-1", "action": "ha_dashboard_get"}
        )
        got = await asyncio.to_thread(wait_result, data_dir, "main", rid, timeout=20)
        assert ok(got)["urlPath"] == "farmhost-farm"
        assert (data_dir / "dashboards" / "farm.yaml").read_bytes() == SHIPPED.read_bytes()  # the data dir's copy
    finally:
        assert daemon.stop() == 0, daemon.log()
