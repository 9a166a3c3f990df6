"""`farmhost doctor`: each part of the appliance as ok / off / broken, with the fix."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Final, Literal, cast

from farmhost.agents.backends.base import SandboxError
from farmhost.agents.backends.host import find_python_install_sync
from farmhost.agents.limits import LimitsFile, default_limits, explain
from farmhost.config import Settings
from farmhost.farm.policy import load_profile, profile_report
from farmhost.layout import DataLayout
from farmhost.store import groups, outbox
from farmhost.store.db import Database, now_utc

# Reachability checks must not make the doctor hang on a dead host.
PROBE_TIMEOUT: Final = 5.0
MIN_FREE_BYTES: Final = 512 * 1024 * 1024
# A healthy outbox sends within seconds and retries within 5 minutes; older pending chunks mean nothing gets through.
OUTBOX_STALE_AFTER: Final = timedelta(minutes=10)

State = Literal["ok", "off", "broken"]


@dataclass(frozen=True)
class Check:
    """One line of the report."""

    part: str
    state: State
    detail: str
    fix: str = ""


def doctor(args: argparse.Namespace, settings: Settings) -> int:
    """Run every check; exit 1 when anything is broken."""
    checks = [
        _data_dir(settings),
        *_database(settings),
        _inotify(settings),
        _home_assistant(settings),
        _telegram(settings),
        _runtime(settings),
        _agent_limits(settings),
        _llm(settings),
        _farm_profile(settings),
        _disk(settings),
        Check("timezone", "ok", f"{settings.zone.key}" + ("" if settings.tz else " (system zone; set TZ to pin it)")),
    ]
    if args.json:
        print(json.dumps([asdict(c) for c in checks], indent=2))
    else:
        for c in checks:
            print(f"{c.part:<16} {c.state:<7} {c.detail}")
            if c.fix:
                print(f"{'':<16} {'':<7} fix: {c.fix}")
    return 1 if any(c.state == "broken" for c in checks) else 0


def _data_dir(settings: Settings) -> Check:
    root = settings.data_dir
    if not root.is_dir():
        return Check("data dir", "broken", f"{root} does not exist", f"farmhost init --data-dir {root}")
    if not os.access(root, os.W_OK):
        return Check("data dir", "broken", f"{root} is not writable", "chown the directory to the farmhost user")
    return Check("data dir", "ok", str(root))


def _database(settings: Settings) -> list[Check]:
    if not DataLayout(settings.data_dir).db_path.exists():
        fix = f"farmhost init --data-dir {settings.data_dir}"
        return [
            Check("database", "broken", "farmhost.db is missing", fix),
            Check("groups", "broken", "no registry without farmhost.db", fix),
        ]
    try:
        db = Database.open(settings.data_dir)
    except (sqlite3.Error, OSError) as err:
        return [Check("database", "broken", f"cannot open farmhost.db: {err}", "restore the data dir from a backup")]
    try:
        registered = groups.list_groups(db.conn)
        box = outbox.count_by_status(db.conn)
        stale = outbox.count_pending_since(db.conn, now_utc() - OUTBOX_STALE_AFTER)
        version = db.schema_version()
    finally:
        db.close()
    checks = [Check("database", "ok", f"schema v{version}, WAL, outbox {box or 'empty'}")]
    if box.get("failed"):
        checks.append(
            Check(
                "outbox",
                "broken",
                f"{box['failed']} chunk(s) failed to deliver",
                "farmhost outbox list --status failed",
            )
        )
    if stale:
        checks.append(_stale_outbox(settings, stale))
    main = next((g for g in registered if g.is_main), None)
    if main is None:
        checks.append(
            Check(
                "groups",
                "off",
                f"{len(registered)} group(s), no main group",
                "farmhost group add --jid telegram:<chat id> --name <name> --folder main --main",
            )
        )
    else:
        checks.append(Check("groups", "ok", f"{len(registered)} group(s), main is {main.folder!r}"))
    return checks


def _stale_outbox(settings: Settings, stale: int) -> Check:
    minutes = int(OUTBOX_STALE_AFTER.total_seconds() // 60)
    detail = f"{stale} chunk(s) still pending after {minutes} minutes"
    if not settings.telegram_enabled:
        return Check("outbox", "broken", detail, "Telegram is off: set TELEGRAM_BOT_TOKEN to deliver them")
    fix = "see the telegram check and the daemon log; `farmhost outbox list --status pending` shows each last error"
    return Check("outbox", "broken", detail, fix)


def _inotify(settings: Settings) -> Check:
    if settings.ipc_mode == "poll":
        return Check("inotify", "off", f"FARMHOST_IPC_MODE=poll (every {settings.ipc_poll_seconds:g} s)")
    try:
        from inotify_simple import INotify

        INotify().close()
        with open("/proc/sys/fs/inotify/max_user_watches") as limit:
            watches = int(limit.read())
    except OSError as err:
        return Check("inotify", "broken", f"inotify unavailable: {err}", "set FARMHOST_IPC_MODE=poll")
    return Check("inotify", "ok", f"max_user_watches={watches} (farmhost uses 4 per group)")


def _http_check(part: str, url: str, headers: dict[str, str], fix: str) -> Check:
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=PROBE_TIMEOUT) as response:
            return Check(part, "ok", f"reachable (HTTP {response.status})")
    except urllib.error.HTTPError as err:
        return Check(part, "broken", f"HTTP {err.code} {err.reason}", fix)
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        return Check(part, "broken", f"unreachable: {reason}", fix)


def _home_assistant(settings: Settings) -> Check:
    if not settings.ha_enabled:
        missing = " and ".join(
            name for name, value in (("HA_URL", settings.ha_url), ("HA_TOKEN", settings.ha_token)) if not value
        )
        return Check("home assistant", "off", f"{missing} not set", "set HA_URL and HA_TOKEN (a long-lived token)")
    assert settings.ha_url is not None
    return _http_check(
        "home assistant",
        f"{settings.ha_url}/api/",
        {"Authorization": f"Bearer {settings.ha_token}"},
        "check HA_URL and that HA_TOKEN is a valid long-lived access token",
    )


def _farm_profile(settings: Settings) -> Check:
    state, detail, fix = profile_report(load_profile(settings.profile_path), farm_mode=settings.farm_mode)
    if state == "off" and not fix:
        fix = f"optional: write {settings.profile_path} to narrow the policy (docs/farm-actions.md)"
    return Check("farm profile", cast(State, state), detail, fix)


def _telegram(settings: Settings) -> Check:
    if not settings.telegram_enabled:
        return Check("telegram", "off", "TELEGRAM_BOT_TOKEN not set", "create a bot with @BotFather and set the token")
    base = settings.telegram_api_base_url or "https://api.telegram.org"
    return _http_check(
        "telegram", f"{base}/bot{settings.telegram_bot_token}/getMe", {}, "check TELEGRAM_BOT_TOKEN and the network"
    )


def _runtime(settings: Settings) -> Check:
    runtime = settings.runtime
    if runtime == "process":
        return Check("sandbox", "ok", "process runtime: NO isolation (development only)", "use bwrap or docker")
    binary = shutil.which(runtime)
    if binary is None:
        fix = "apt-get install bubblewrap" if runtime == "bwrap" else f"install {runtime} or set FARMHOST_AGENT_RUNTIME"
        return Check("sandbox", "broken", f"{runtime} not found on PATH", fix)
    if runtime == "bwrap":
        return _bwrap(binary, settings)
    return _engine(runtime, binary)


def _engine(runtime: str, binary: str) -> Check:
    """Check that the docker/podman CLI reaches its engine."""
    try:
        done = subprocess.run([binary, "info"], capture_output=True, text=True, timeout=PROBE_TIMEOUT, check=False)
        reason = None if done.returncode == 0 else (done.stderr.strip().splitlines() or ["no answer"])[-1]
    except (OSError, subprocess.TimeoutExpired) as err:
        reason = str(err)
    if reason is not None:
        fix = f"start the {runtime} engine, or set FARMHOST_AGENT_RUNTIME=bwrap"
        return Check("sandbox", "broken", f"{runtime} ({binary}) cannot reach its engine: {reason}", fix)
    return Check("sandbox", "ok", f"{runtime} ({binary}), engine running")


def _bwrap(binary: str, settings: Settings) -> Check:
    """Check that bwrap can make its namespaces here and that the agent interpreter can import farmagent."""
    try:
        python = find_python_install_sync(settings.agent_python)
    except SandboxError as err:
        return Check("sandbox", "broken", err.message, "set FARMHOST_AGENT_PYTHON to a Python 3.11+ with farmagent")
    if python.farmagent is None:
        detail = f"the agent interpreter {python.executable} cannot import farmagent"
        return Check("sandbox", "broken", detail, "install farmagent into it (uv sync) or set FARMHOST_AGENT_PYTHON")
    trial = [binary, "--unshare-all", "--unshare-user", "--die-with-parent", "--ro-bind", "/", "/", "true"]
    try:
        done = subprocess.run(trial, capture_output=True, text=True, timeout=PROBE_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return Check("sandbox", "broken", f"bwrap does not run: {err}", "apt-get install --reinstall bubblewrap")
    if done.returncode != 0:
        return Check(
            "sandbox",
            "broken",
            f"bwrap cannot create its namespaces: {done.stderr.strip()}",
            "allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1) or use docker",
        )
    return Check("sandbox", "ok", f"bwrap ({binary}), agent interpreter {python.executable}")


def _agent_limits(settings: Settings) -> Check:
    path = DataLayout(settings.data_dir).agent_limits
    limits = default_limits(settings)
    defaults = f"{limits.timeout_seconds:g} s, {limits.memory_mb} MB, {limits.pids} processes, {limits.max_turns} turns"
    try:
        parsed = LimitsFile.model_validate(json.loads(path.read_bytes()))
    except FileNotFoundError:
        return Check("agent limits", "ok", f"every group: {defaults} (no {path.name})")
    except (OSError, ValueError) as err:
        fix = f"correct {path} (docs/agent-runtime.md); until then every group runs with the defaults"
        return Check("agent limits", "broken", f"{path}: {explain(err)}", fix)
    return Check("agent limits", "ok", f"defaults {defaults}; {len(parsed.groups)} group override(s) in {path.name}")


def _llm(settings: Settings) -> Check:
    if not settings.llm_enabled:
        return Check("llm", "off", "FARMHOST_LLM_BASE_URL/FARMHOST_LLM_MODEL not set", "set them in .env")
    return Check("llm", "ok", f"{settings.llm_model} at {settings.llm_base_url}")


def _disk(settings: Settings) -> Check:
    target = settings.data_dir
    while not target.exists() and target != target.parent:  # report the filesystem the data dir will live on
        target = target.parent
    free = shutil.disk_usage(target).free
    if free < MIN_FREE_BYTES:
        return Check("disk", "broken", f"{free // 2**20} MiB free", "free space on the data dir's filesystem")
    return Check("disk", "ok", f"{free // 2**30} GiB free")
