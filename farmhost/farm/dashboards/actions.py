"""The dashboard farm actions: read, validate, patch and apply staged Lovelace dashboards; owns their files.

A dashboard is a name, never a path. Its staged copy is `<dashboards_dir>/<name>.yaml`; a missing copy is
seeded from the repository's `dashboards/<name>.yaml` when one ships. In Home Assistant it is the storage-mode
dashboard at url path `farmhost-<name>`; `ha_apply_dashboard` keeps the previous HA config as timestamped
JSON files in `<dashboards_dir>/backups/<name>/`. The dashboards directory is visible to the main agent, so
every file in it is opened relative to a held directory descriptor without following links.
"""

from __future__ import annotations

import asyncio
import difflib
from typing import TYPE_CHECKING, Any, Final

from farmhost.errors import Conflict, InvalidRequest, NotFound, Unavailable
from farmhost.farm.control import policy
from farmhost.farm.dashboards import lovelace as dash
from farmhost.farm.dashboards import policy as dashboard_policy
from farmhost.farm.dashboards.files import BACKUPS_DIR, Staging
from farmhost.farm.dashboards.patch import apply_operations
from farmhost.farm.homeassistant.client import HaNotFound, HaRejected
from farmhost.protocol.params import (
    DEFAULT_DASHBOARD,
    MAX_DASHBOARD_BYTES,
    HaApplyDashboardParams,
    HaDashboardGetParams,
    HaDashboardPatchParams,
    HaDashboardValidateParams,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from farmhost.farm.deps import FarmDeps
    from farmhost.farm.homeassistant.client import HAClient
    from farmhost.handling import RequestContext

DASHBOARD_ICON: Final = "mdi:sprout"


# ------------------------------------------------------------------------------------------------ actions


async def ha_dashboard_get(deps: FarmDeps, ctx: RequestContext, p: HaDashboardGetParams) -> dict[str, Any]:
    """The staged dashboard as data and YAML text, or one of its views (`viewPath`)."""
    name, path = p.dashboard, p.viewPath
    # YAML work runs in a thread like the file I/O: a big dashboard takes ruamel a second to parse.
    return await asyncio.to_thread(_get, Staging(deps.dashboards_dir), name, path, _rules(deps))


async def ha_dashboard_validate(deps: FarmDeps, ctx: RequestContext, p: HaDashboardValidateParams) -> dict[str, Any]:
    """Check the staged dashboard (or YAML `content`): syntax, structure and, with `checkEntities`, entities."""
    check_entities = p.checkEntities
    if p.content is not None:
        if len(p.content.encode()) > MAX_DASHBOARD_BYTES:
            raise InvalidRequest(f"`content` is larger than {MAX_DASHBOARD_BYTES // 1024} KiB")
        name, text = None, p.content
    else:
        name = p.dashboard or DEFAULT_DASHBOARD
        text = await asyncio.to_thread(Staging(deps.dashboards_dir).read, name)
    rules = _rules(deps)
    config, check = await asyncio.to_thread(_validate_checked, text, rules, _what(name))
    unknown: list[str] = []
    if check_entities and config is not None:
        unknown = await _unknown_entities(_ha(deps), config)
        if unknown:
            noun = "entity" if len(unknown) == 1 else "entities"
            check.warnings.append(f"Home Assistant does not know {len(unknown)} {noun}: {', '.join(unknown)}")
    result: dict[str, Any] = {"dashboard": name, **check.as_dict(), "unknownEntities": unknown}
    if config is not None:
        result["views"] = dash.summary(config)
        result["entities"] = dash.entity_ids(config)
    return result


async def ha_dashboard_patch(deps: FarmDeps, ctx: RequestContext, p: HaDashboardPatchParams) -> dict[str, Any]:
    """Apply patch operations to the staged dashboard, all or nothing; `dryRun` shows the result unwritten."""
    rules = _rules(deps)
    staging = Staging(deps.dashboards_dir)
    return await asyncio.to_thread(_patch, staging, p.dashboard, list(p.operations), p.dryRun, rules)


async def ha_apply_dashboard(deps: FarmDeps, ctx: RequestContext, p: HaApplyDashboardParams) -> dict[str, Any]:
    """Validate the staged dashboard, back up what HA has, and save it as HA's storage-mode dashboard."""
    name, backup = p.dashboard, p.backup
    staging = Staging(deps.dashboards_dir)
    rules = _rules(deps)
    config, check = await asyncio.to_thread(lambda: _validate_checked(staging.read(name), rules, _what(name)))
    if config is None or not check.valid:
        raise InvalidRequest(f"dashboard {name!r} is not valid, nothing was applied: {'; '.join(check.errors)}")
    ha = _ha(deps)
    url = dash.url_path(name)
    title = config.get("title") if isinstance(config.get("title"), str) and config["title"].strip() else name
    created = await _ensure_dashboard(ha, url, title)
    backup_file = None
    if backup and not created:
        try:
            current = await ha.ws_command("lovelace/config", url_path=url)
        except HaNotFound:  # config_not_found: the dashboard exists but was never saved
            current = None
        if current is not None:
            kept = deps.settings.dashboard_backups
            backup_file = await asyncio.to_thread(staging.backup, name, current, ctx.now, kept)
    await ha.ws_command("lovelace/config/save", url_path=url, config=config)
    views = config["views"]
    return {
        "dashboard": name,
        "urlPath": url,
        "created": created,
        "backup": f"{BACKUPS_DIR}/{name}/{backup_file}" if backup_file else None,
        "views": len(views),
        "cards": sum(dash.count_cards(v) for v in views),
        "warnings": check.warnings,
    }


# ------------------------------------------------------------------------------------------------ helpers


def _rules(deps: FarmDeps) -> dashboard_policy.ContentRules:
    view = deps.view
    drives = view.drives() if view is not None else {}

    def attributes(entity: str) -> Mapping[str, Any] | None:
        seen = view.get(entity) if view is not None else None
        return seen.attributes if seen is not None else None

    following = view is not None and view.connected
    return dashboard_policy.rules_for(
        policy.load_profile(deps.settings.profile_path), drives=drives, attributes=attributes if following else None
    )


def _what(name: str | None) -> str:
    return f"dashboard {name!r}" if name is not None else "the dashboard `content`"


def _validate_checked(text: str, rules: dashboard_policy.ContentRules, what: str) -> tuple[Any, dash.Validation]:
    """Structure and content policy: a dashboard the policy refuses is `not_allowed`, not merely invalid."""
    config, check = dash.validate_text(text)
    if config is not None:
        dashboard_policy.enforce(config, rules, what=what)
    return config, check


def _get_key(config: Any, key: str) -> Any:
    return config.get(key) if isinstance(config, dict) else None


def _ha(deps: FarmDeps) -> HAClient:
    if deps.ha is None:
        raise Unavailable("Home Assistant is not configured on this host (the operator sets HA_URL and HA_TOKEN)")
    return deps.ha


async def _unknown_entities(ha: HAClient, config: Any) -> list[str]:
    known = {state.get("entity_id") for state in await ha.get_states()}
    return [entity for entity in dash.entity_ids(config) if entity not in known]


async def _ensure_dashboard(ha: HAClient, url: str, title: str) -> bool:
    """Make sure HA has a storage-mode dashboard at `url` with `title`; True when it was created now."""
    existing = await _find_dashboard(ha, url)
    if existing is None:
        try:
            await ha.ws_command(
                "lovelace/dashboards/create",
                url_path=url,
                title=title,
                icon=DASHBOARD_ICON,
                show_in_sidebar=True,
                require_admin=False,
                mode="storage",
            )
            return True
        except HaRejected:  # created by a concurrent apply, or the path is taken by something else
            existing = await _find_dashboard(ha, url)
            if existing is None:
                raise
    if existing.get("mode") != "storage":
        raise Conflict(
            f"Home Assistant's dashboard {url!r} is a {existing.get('mode')} dashboard (configured in YAML); "
            "farmhost only writes storage-mode dashboards: remove it from HA's configuration or rename the dashboard"
        )
    if existing.get("title") != title and isinstance(existing.get("id"), str):
        await ha.ws_command("lovelace/dashboards/update", dashboard_id=existing["id"], title=title)
    return False


async def _find_dashboard(ha: HAClient, url: str) -> dict[str, Any] | None:
    listed = await ha.ws_command("lovelace/dashboards/list")
    for item in listed if isinstance(listed, list) else []:
        if isinstance(item, dict) and item.get("url_path") == url:
            return item
    return None


def _get(staging: Staging, name: str, path: str | None, rules: dashboard_policy.ContentRules) -> dict[str, Any]:
    text = staging.read(name)
    doc = dash.load(text)
    config = dash.to_plain(doc)
    # Reading a copy the policy refuses is allowed (an agent may be fixing it); what it breaks is said.
    refused = [str(v) for v in dashboard_policy.violations(config, rules)]
    base = {"dashboard": name, "urlPath": dash.url_path(name), "file": f"{name}.yaml", "policyViolations": refused}
    if path is None:
        return {
            **base,
            "title": _get_key(config, "title"),
            "views": dash.summary(config),
            "config": config,
            "yaml": text,
        }
    views = _get_key(config, "views")
    for index, view in enumerate(views if isinstance(views, list) else []):
        if isinstance(view, dict) and view.get("path") == path:
            return {**base, "viewPath": path, "index": index, "view": view, "yaml": dash.dump(doc["views"][index])}
    known = [v["path"] for v in dash.summary(config) if isinstance(v["path"], str)]
    raise NotFound(f"dashboard {name!r} has no view with path {path!r} (views: {', '.join(known) or 'none'})")


def _patch(
    staging: Staging, name: str, operations: Any, dry_run: bool, rules: dashboard_policy.ContentRules
) -> dict[str, Any]:
    with staging.locked() as directory:
        old = staging.read_locked(directory, name, missing_ok=True)
        doc = dash.load(old if old is not None else f"title: {name}\nviews: []\n")
        changes = apply_operations(doc, operations)
        new = dash.dump(doc)
        config, check = dash.validate_text(new)
        if config is None or not check.valid:
            raise InvalidRequest(
                f"the patch would leave dashboard {name!r} invalid, nothing was changed: {'; '.join(check.errors)}"
            )
        dashboard_policy.enforce(config, rules, what=f"the patched dashboard {name!r} (nothing was changed)")
        written = not dry_run and new != old
        if written:
            staging.write_locked(directory, f"{name}.yaml", new.encode())
    diff = "".join(
        difflib.unified_diff(
            (old or "").splitlines(keepends=True), new.splitlines(keepends=True), f"a/{name}.yaml", f"b/{name}.yaml"
        )
    )
    return {
        "dashboard": name,
        "dryRun": dry_run,
        "written": written,
        "created": old is None and written,
        "changes": changes,
        "diff": diff,
        "validation": check.as_dict(),
        "views": dash.summary(config),
    }
