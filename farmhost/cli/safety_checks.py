"""`farmhost doctor`'s safety lines: the guarded entities in Home Assistant, and whether the live view follows HA."""

from __future__ import annotations

import json
import sqlite3
import urllib.error
import urllib.request
from contextlib import closing
from typing import Final

from farmhost.cli.health import lock_holder
from farmhost.cli.hostchecks import Check
from farmhost.config import Config
from farmhost.farm.control import policy
from farmhost.farm.control.effects import guarded
from farmhost.farm.control.safe_state import guarded_patterns, matches_any, safe_target
from farmhost.layout import DataLayout
from farmhost.store import host_state

# A doctor answers in seconds; HA's /api/states is the largest read (about 1 MB on a big install).
STATES_TIMEOUT: Final = 5.0
SHOWN: Final = 12
_FIX_RULES: Final = "optional: name the actuators in policy.rules (docs/farm-actions.md) and set HA_URL and HA_TOKEN"
_FIX_OFF: Final = "`farmhost run` follows Home Assistant's events while it runs (HA_URL and HA_TOKEN set)"


def guarded_entities(config: Config) -> Check:
    """Which entities the profile's rules guard (name, or cover by service), as HA knows them now, with safe states.

    The same entities `/stop` puts in their safe state (farm/control/effects.py `guarded`).
    """
    loaded = policy.load_profile(config.farm.profile_path)
    url, token = config.ha.url, config.ha.token
    if not loaded.rules or not url or not token:
        return Check("guarded", "off", "no entity is guarded (no rules, or Home Assistant is off)", _FIX_RULES)
    patterns = guarded_patterns(loaded.rules)
    if not patterns and not any(rule.services for rule in loaded.rules):
        detail = "the rules name farm actions only: no entity is guarded"
        return Check("guarded", "off", detail, _FIX_RULES)
    request = urllib.request.Request(f"{url.rstrip('/')}/api/states", headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=STATES_TIMEOUT) as response:
            states = json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError) as err:
        detail = f"rules guard {', '.join(patterns) or 'entities by service'}; HA's states could not be read ({err})"
        return Check("guarded", "warn", detail, "see the home assistant line")
    by_id = {s["entity_id"]: s for s in states if isinstance(s, dict) and isinstance(s.get("entity_id"), str)}
    found = guarded(loaded.rules, by_id)
    if not found:
        fix = "check the entity ids and services of policy.rules against Home Assistant (Settings > Entities)"
        globs = ", ".join([*patterns, *(service for rule in loaded.rules for service in rule.services or ())])
        return Check("guarded", "warn", f"no entity of Home Assistant matches the rules' {globs}", fix)
    shown = []
    for entity_id in found[:SHOWN]:
        target = safe_target(entity_id, loaded.rules, by_id[entity_id].get("attributes"))
        if target is None:
            safe = "no safe state"
        else:
            safe = f"safe {target.state:g}" if isinstance(target.state, float) else f"safe {target.state}"
        shown.append(f"{entity_id} ({by_id[entity_id].get('state')}, {safe})")
    more = f" and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
    unmatched = [p for p in patterns if not any(matches_any(e, [p]) for e in by_id)]
    detail = f"{len(found)} guarded: {'; '.join(shown)}{more}"
    if unmatched:
        return Check("guarded", "warn", f"{detail}; nothing matches {', '.join(unmatched)}", "check those entity ids")
    return Check("guarded", "ok", detail)


def live_view(config: Config) -> Check:
    """Whether the running daemon follows HA's events now (what it recorded last; nothing while it is not running)."""
    if not config.ha.enabled:
        return Check("live view", "off", "Home Assistant is off: nothing to follow", "set HA_URL and HA_TOKEN")
    layout = DataLayout(config.data_dir)
    if not layout.db_path.is_file() or lock_holder(layout.lock_path) is None:
        return Check("live view", "off", "the daemon is not running", _FIX_OFF)
    try:
        with closing(sqlite3.connect(f"file:{layout.db_path}?mode=ro", uri=True, timeout=STATES_TIMEOUT)) as conn:
            recorded = host_state.get(conn, host_state.HA_LIVE_VIEW)
        record = json.loads(recorded) if recorded else None
    except (sqlite3.Error, ValueError):
        record = None
    if not isinstance(record, dict):
        return Check("live view", "warn", "the daemon has not connected to Home Assistant's events yet", _FIX_OFF)
    detail = f"{record.get('detail')} since {record.get('since')}"
    if record.get("connected") is True:
        return Check("live view", "ok", detail)
    fix = "rules on effects and the automatic off wait for it: check that Home Assistant runs and HA_URL"
    return Check("live view", "broken", f"not following Home Assistant: {detail}", fix)
