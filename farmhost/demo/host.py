"""farmhost inside the demo: its settings, the local main group, and farm actions run as that group.

The demo runs the ordinary App (farmhost/app.py) in-process, on the demo's data dir and the demo's Home
Assistant. Telegram is off (the terminal chat stands in for it: see console.py) and FARM_MODE is `demo` whatever
`.env` says; the LLM and every other setting come from `.env` and the environment as usual.

The dashboard and the screenshot are not special-cased: the demo runs `farm_action` requests as the main group
through the App's router door (`Router.run_as`), so they go through the same ledger, policy, audit line, request
log and action code (`ha_apply_dashboard`, `ha_capture_screenshot`) as any agent's.
"""

from __future__ import annotations

import fcntl
import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from farmhost.config import Settings
from farmhost.errors import ConfigError, FarmhostError
from farmhost.farm.control import policy
from farmhost.groups.registry import new_group, register
from farmhost.layout import DataLayout
from farmhost.protocol.requests import FarmActionRequest
from farmhost.store import groups
from farmhost.store.db import Database, now_utc

if TYPE_CHECKING:
    from farmhost.app import App

MAIN_JID: Final = "local:main"
MAIN_FOLDER: Final = "main"
MAIN_NAME: Final = "Farm office"
DASHBOARD: Final = "farm"
# The demo farm's safe profile (docs/farm-actions.md, "Actuator rules"): the pump off after 30 min, the valves
# rate-limited, the irrigation duration kept in range. Copied to the data dir unless one is there.
DEMO_PROFILE: Final = Path(__file__).resolve().parent.parent / "localha" / "farm" / "farm-profile.json"
SHOT_SIZE: Final = (1280, 800)
DEMO_DAILY_REPORT: Final = "07:00"  # the farmer's usual morning; FARMHOST_DAILY_REPORT in .env moves it

# A farm hour passes in 10 s: a 15 min reminder or a 10 min flap window would never show in a demo. A reminder
# every minute (six farm hours) and a resolution line 30 s (three farm hours) after the frost ends do.
DEMO_ALERT_TIMINGS: Final = {"alert_repeat_minutes": 1.0, "alert_flap_minutes": 0.5}


def demo_settings(base: Settings, *, data_dir: Path, ha_url: str, ha_token: str) -> Settings:
    """The App's settings: `.env`/environment, with the demo's data dir and HA, Telegram off, FARM_MODE demo.

    The morning report is on (FARMHOST_DAILY_REPORT, else 07:00). The alerts' reminders and flap window follow the
    simulator's compressed day (DEMO_ALERT_TIMINGS) unless the operator set them.
    """
    timings = {name: value for name, value in DEMO_ALERT_TIMINGS.items() if name not in base.model_fields_set}
    return base.model_copy(
        update={
            "data_dir": data_dir,
            "ha_url": ha_url,
            "ha_token": ha_token,
            "telegram_bot_token": None,
            "farm_mode": "demo",
            # On in the demo: started after 07:00, the console shows today's morning report at once (once a day).
            "daily_report": base.daily_report or DEMO_DAILY_REPORT,
            **timings,
        }
    )


def install_profile(target: Path) -> bool:
    """Copy the demo farm's profile to `target` (the farm profile's place) unless one is there; True when copied now."""
    if target.exists():
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_bytes(DEMO_PROFILE.read_bytes())
    os.replace(tmp, target)
    return True


def kept_from_assist(profile_path: Path, exposed: list[str]) -> list[str]:
    """The exposed entities the profile's rules hold Assist away from (approval, a rate, a range): to un-expose."""
    loaded = policy.load_profile(profile_path)
    return sorted({e for e in exposed for rule in loaded.rules if policy.assist_cannot_keep(rule, e)})


def check_not_running(data_dir: Path) -> None:
    """Refuse early (before Home Assistant starts) when a farmhost daemon already holds this data dir.

    Raises:
        ConfigError: naming the pid that holds the lock.
    """
    lock = DataLayout(data_dir).lock_path
    if not lock.exists():
        return
    fd = os.open(lock, os.O_RDONLY | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            raise ConfigError(
                f"a farmhost daemon (pid {holder}) is running on {data_dir}; stop it or give the demo another --data-dir"
            ) from None
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def ensure_main_group(data_dir: Path) -> bool:
    """Register `local:main` (folder `main`) as the main group unless it is; True when it was created now.

    Raises:
        ConfigError: another chat is the main group of this data dir (the demo needs its own data dir).
    """
    layout = DataLayout(data_dir)
    layout.create()
    db = Database.open(data_dir)
    try:
        with db.tx() as conn:
            existing = groups.find_by_jid(conn, MAIN_JID)
            if existing is not None:
                if not existing.is_main:
                    raise ConfigError(f"{MAIN_JID} is registered in {data_dir} but is not the main group")
                return False
            current = groups.main_group(conn)
            if current is not None:
                raise ConfigError(
                    f"{data_dir} already has a main group ({current.jid}, folder {current.folder!r}); "
                    "the demo needs a data dir of its own (--data-dir)"
                )
            group = new_group(
                conn,
                jid=MAIN_JID,
                name=MAIN_NAME,
                folder=MAIN_FOLDER,
                trigger=None,
                requires_trigger=False,
                is_main=True,
                at=now_utc(),
            )
            register(conn, layout, group, reuse=True)  # the operator's own command, as `group add`
    finally:
        db.close()
    return True


async def farm_action(app: App, action: str, params: dict[str, Any]) -> dict[str, Any]:
    """Run one farm action as the main group through the App's router door and return its result.

    Each gets a fresh id (`demo:<action>:<random>`): a demo started again on the same data dir runs it again.

    Raises:
        FarmhostError: the App is not running, the main group is missing, or the action answered with an error.
    """
    if app.ipc is None or app.db is None:
        raise FarmhostError(f"{action}: farmhost is not running")
    with app.db.tx() as conn:
        group = groups.get_group(conn, MAIN_FOLDER)
    if group is None:
        raise FarmhostError(f"{action}: the demo's main group {MAIN_FOLDER!r} is not registered")
    request = FarmActionRequest.model_validate({"type": "farm_action", "action": action, "params": params})
    answer = await app.ipc.router.run_as(
        group, request, request_id=f"demo:{action}:{uuid.uuid4().hex[:12]}", via="demo"
    )
    document = answer.document
    if document["status"] != "success":
        raise FarmhostError(f"{action} failed: {document['error']} ({document['errorCode']})")
    result = document["result"]
    return result if isinstance(result, dict) else {}


async def apply_dashboard(app: App) -> dict[str, Any]:
    """`ha_apply_dashboard` of the farm dashboard (staged from the repository's dashboards/farm.yaml)."""
    return await farm_action(app, "ha_apply_dashboard", {"dashboard": DASHBOARD})


async def capture_screenshot(app: App) -> tuple[Path, dict[str, Any]]:
    """`ha_capture_screenshot` of the farm dashboard; the PNG's absolute path and the action's result."""
    width, height = SHOT_SIZE
    result = await farm_action(app, "ha_capture_screenshot", {"dashboard": DASHBOARD, "width": width, "height": height})
    return app.layout.workspace(MAIN_FOLDER) / str(result["path"]), result
