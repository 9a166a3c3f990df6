"""`farmhost doctor`: each part of the appliance as ok / warn / off / broken, with the fix.

The checks run at once in background threads and are printed in a fixed order as soon as each is known; a check
still going after a second says on stderr what it waits for, and none waits longer than its own limit.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import pwd
import shutil
import sqlite3
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Final, cast

from farmhost.agents.launch import sealed_memfd
from farmhost.agents.limits import LimitsFile, default_limits, explain
from farmhost.agents.sandbox.backends.base import SandboxError
from farmhost.agents.sandbox.backends.host_paths import PYTHON_PROBE_TIMEOUT, find_python_install_sync
from farmhost.agents.sandbox.cgroups import CgroupSupport, detect_sync
from farmhost.agents.sandbox.identity import describe_ids
from farmhost.agents.sandbox.seccomp import SeccompMode, SeccompUnavailable, build_filter_sync
from farmhost.cli import safety_checks, voice_check
from farmhost.cli.hostchecks import (
    Check,
    State,
    clock_check,
    daemon_pid,
    data_dir_check,
    disk_check,
    inotify_check,
    inotify_in_use,
    python_check,
    running_walls,
    timezone_check,
)
from farmhost.config import AgentSettings, Config, LlmEndpoint, SandboxSettings, Settings, build_config
from farmhost.farm.control import rules
from farmhost.farm.control.policy import load_profile, profile_report
from farmhost.layout import DataLayout
from farmhost.store import groups, host_state, outbox
from farmhost.store.db import Database, SchemaTooNew, now_utc
from farmhost.terminal import for_terminal

__all__ = ["Check", "State", "doctor"]

# Reachability checks must not make the doctor hang on a dead host.
PROBE_TIMEOUT: Final = 5.0
CONTEXT_TIMEOUT: Final = 2.0  # an LLM server's context question, after its /models answered
# A check still running after this long says on stderr what it waits for.
SAY_WAITING_AFTER: Final = 1.0
# A local check (files, the database) that takes longer than this is reported broken instead of waited for.
LOCAL_LIMIT: Final = 15.0
# Run by the agent interpreter under bwrap and the filter: what two calls the filter refuses give back there.
SECCOMP_TRIAL: Final = """
import ctypes, errno, platform
libc = ctypes.CDLL(None, use_errno=True)
calls = {"x86_64": ((272, 0x10000000, 0), (101, 0, 0), (41, 16, 3)),
         "aarch64": ((97, 0x10000000, 0), (117, 0, 0), (198, 16, 3))}[platform.machine()]
out = []
for nr, first, second in calls:  # unshare(CLONE_NEWUSER), ptrace(PTRACE_TRACEME), socket(AF_NETLINK, SOCK_RAW)
    ret = libc.syscall(ctypes.c_long(nr), ctypes.c_long(first), ctypes.c_long(second), ctypes.c_long(0),
                       ctypes.c_long(0))
    out.append("ok" if ret >= 0 else errno.errorcode.get(ctypes.get_errno(), "?"))
print(" ".join(out))
"""
# A healthy outbox sends within seconds and retries within 5 minutes; older pending chunks mean nothing gets through.
OUTBOX_STALE_AFTER: Final = timedelta(minutes=10)


@dataclass(frozen=True)
class Probe:
    """One check to run in the background: what it is, what it waits for, and how long it may take."""

    part: str
    run: Callable[[], list[Check]]
    waits_for: str
    limit: float = LOCAL_LIMIT
    fix: str = ""


class _Running:
    """A probe in a daemon thread (a hung DNS lookup must not keep the command from exiting)."""

    def __init__(self, probe: Probe) -> None:
        self.probe = probe
        self.result: list[Check] | None = None
        self._thread = threading.Thread(target=self._run, name=f"doctor:{probe.part}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.result = self.probe.run()
        except Exception as err:  # noqa: BLE001 - a doctor reports, it does not crash
            detail = f"the check itself failed: {type(err).__name__}: {err}"
            self.result = [Check(self.probe.part, "broken", detail, "a doctor bug: please report this line")]

    def wait(self) -> list[Check]:
        self._thread.join(SAY_WAITING_AFTER)
        if self._thread.is_alive():
            print(f"doctor: waiting for {self.probe.waits_for} (at most {self.probe.limit:g} s)", file=sys.stderr)
            self._thread.join(self.probe.limit - SAY_WAITING_AFTER)
        if self.result is not None:
            return self.result
        detail = f"no answer from {self.probe.waits_for} in {self.probe.limit:g} s"
        return [Check(self.probe.part, "broken", detail, self.probe.fix or "see the daemon log and try again")]


def doctor(args: argparse.Namespace, settings: Settings) -> int:
    """Run every check; exit 1 when anything is broken."""
    running = [_Running(probe) for probe in _probes(build_config(settings), settings)]
    checks: list[Check] = []
    for item in running:
        found = item.wait()
        checks.extend(found)
        if not args.json:
            for c in found:
                print(f"{c.part:<16} {c.state:<7} {for_terminal(c.detail, keep_lines=True)}", flush=True)
                if c.fix:
                    print(f"{'':<16} {'':<7} fix: {for_terminal(c.fix, keep_lines=True)}", flush=True)
    if args.json:
        print(json.dumps([asdict(c) for c in checks], indent=2))
    return 1 if any(c.state == "broken" for c in checks) else 0


def _probes(config: Config, settings: Settings) -> list[Probe]:
    root = config.data_dir
    db_path = DataLayout(root).db_path
    return [
        Probe("python", lambda: [python_check()], "the Python check"),
        Probe("data dir", lambda: [data_dir_check(root)], f"the data dir {root}"),
        Probe("database", lambda: _database(config), f"{db_path} (locked by a stuck writer?)"),
        Probe("live view", lambda: [safety_checks.live_view(config)], "the daemon's live view of Home Assistant"),
        Probe("disk", lambda: [disk_check(root)], f"the filesystem of {root}"),
        Probe("inotify", lambda: [_inotify(config)], "the inotify limits"),
        Probe("clock", lambda: [clock_check(db_path)], "timedatectl and the clock"),
        Probe("timezone", lambda: [timezone_check(config.tz, config.zone)], "the time zone"),
        Probe(
            "home assistant",
            lambda: [ha := _home_assistant(config), *_ha_user(config, ha)],
            f"Home Assistant at {_safe_url(config.ha.url or '')}",
            PROBE_TIMEOUT + 2,
            "check HA_URL and that Home Assistant runs",
        ),
        Probe(
            "telegram",
            lambda: [_telegram(config)],
            "the Telegram Bot API (getMe)",
            PROBE_TIMEOUT + 2,
            "check the network (DNS, firewall) and TELEGRAM_API_BASE_URL",
        ),
        Probe(
            "voice",
            lambda: [voice_check.voice(config.voice)],
            "the speech-to-text engine (loading the model, or the Wyoming server)",
            voice_check.VOICE_LIMIT,
            "check FARMHOST_STT_MODEL or FARMHOST_STT_URL (docs/voice.md)",
        ),
        *_llm_probes(config, settings),
        Probe(
            "sandbox",
            lambda: _runtime(config),
            f"the {config.agents.sandbox.runtime} sandbox trial",
            PYTHON_PROBE_TIMEOUT + PROBE_TIMEOUT + 2,
        ),
        Probe("agent limits", lambda: [_agent_limits(config)], "agent-limits.json"),
        Probe("farm profile", lambda: [_farm_profile(config), _actuator_rules(config)], "the farm profile"),
        Probe(
            "guarded",
            lambda: [safety_checks.guarded_entities(config)],
            "the guarded entities in Home Assistant",
            safety_checks.STATES_TIMEOUT + 2,
        ),
        Probe("mqtt", lambda: [Check("mqtt", *_mqtt_state(config))], "the MQTT broker", PROBE_TIMEOUT + 2),
    ]


def _inotify(config: Config) -> Check:
    root = config.data_dir
    count = _registered_groups(DataLayout(root).db_path)
    in_use = None
    if config.ipc.mode == "inotify":  # what the user's other processes hold; the running daemon is part of the need
        pid = daemon_pid(root)
        in_use = inotify_in_use(os.getuid(), exclude={os.getpid(), *([pid] if pid else [])})
    return inotify_check(
        groups=count,
        max_agents=config.agents.max_agents,
        ipc_mode=config.ipc.mode,
        poll_seconds=config.ipc.poll_seconds,
        in_use=in_use,
    )


def _registered_groups(db_path: Path) -> int:
    """How many groups are registered (read-only; 0 without a database)."""
    if not db_path.is_file():
        return 0
    try:
        conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=2)
        try:
            return groups.count_groups(conn)
        finally:
            conn.close()
    except sqlite3.Error:
        return 0


def _safe_url(url: str) -> str:
    """`url` without any user:password part."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"***@{host}" + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def _database(config: Config) -> list[Check]:
    if not DataLayout(config.data_dir).db_path.exists():
        fix = f"farmhost init --data-dir {config.data_dir}"
        return [
            Check("database", "broken", "farmhost.db is missing", fix),
            Check("groups", "broken", "no registry without farmhost.db", fix),
        ]
    try:
        db = Database.open(config.data_dir)
    except SchemaTooNew as err:
        detail = (
            f"farmhost.db has schema v{err.found}, newer than this farmhost knows (v{err.known}): "
            "it was not used and not changed"
        )
        fix = "run the newer farmhost again, or restore the backup taken before the upgrade (docs/operations.md)"
        return [Check("database", "broken", detail, fix), Check("groups", "broken", "registry not read", fix)]
    except (sqlite3.Error, OSError) as err:
        fix = "restore the data dir from a backup"
        return [
            Check("database", "broken", f"cannot open farmhost.db: {err}", fix),
            Check("groups", "broken", "registry not read", fix),
        ]
    try:
        registered = groups.list_groups(db.conn)
        box = outbox.count_by_status(db.conn)
        stale = outbox.count_pending_since(db.conn, now_utc() - OUTBOX_STALE_AFTER)
        version = db.schema_version()
        paused = host_state.get(db.conn, host_state.AGENTS_PAUSED)
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
        checks.append(_stale_outbox(config, stale))
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
    if paused is not None:
        fix = "send /resume in the main chat (or switch `Agents paused` off in Home Assistant) when it is safe"
        checks.append(Check("agents", "warn", f"agent runs are paused: {paused}", fix))
    return checks


def _stale_outbox(config: Config, stale: int) -> Check:
    minutes = int(OUTBOX_STALE_AFTER.total_seconds() // 60)
    detail = f"{stale} chunk(s) still pending after {minutes} minutes"
    if not config.telegram.enabled:
        return Check("outbox", "broken", detail, "Telegram is off: set TELEGRAM_BOT_TOKEN to deliver them")
    fix = "see the telegram check and the daemon log; `farmhost outbox list --status pending` shows each last error"
    return Check("outbox", "broken", detail, fix)


def _http_check(part: str, url: str, headers: dict[str, str], fix: str, *, where: str = "") -> Check:
    """GET `url`; `where` names it in the report (the URL itself may hold a token and is never printed)."""
    request = urllib.request.Request(url, headers=headers)
    prefix = f"{where} " if where else ""
    try:
        with urllib.request.urlopen(request, timeout=PROBE_TIMEOUT) as response:
            return Check(part, "ok", f"{prefix}reachable (HTTP {response.status})")
    except urllib.error.HTTPError as err:
        return Check(part, "broken", f"{prefix}HTTP {err.code} {err.reason}", fix)
    except (urllib.error.URLError, OSError) as err:
        return Check(part, "broken", f"{prefix}{_unreachable(err)}", fix)


def _unreachable(err: OSError) -> str:
    """`unreachable: <reason>`, or `gave no answer within 5 s` for a server that accepted the connection and hung."""
    reason = getattr(err, "reason", err)
    if isinstance(reason, TimeoutError) or "timed out" in str(reason):
        return f"gave no answer within {PROBE_TIMEOUT:g} s"
    return f"unreachable: {reason}"


def _home_assistant(config: Config) -> Check:
    url, token = config.ha.url, config.ha.token
    if not (url and token):
        missing = " and ".join(name for name, value in (("HA_URL", url), ("HA_TOKEN", token)) if not value)
        return Check("home assistant", "off", f"{missing} not set", "set HA_URL and HA_TOKEN (a long-lived token)")
    return _http_check(
        "home assistant",
        f"{url}/api/",
        {"Authorization": f"Bearer {token}"},
        "check HA_URL and that HA_TOKEN is a valid long-lived access token",
        where=_safe_url(url),
    )


def _ha_user(config: Config, reached: Check) -> list[Check]:
    """Whose token HA_TOKEN is: farmhost's own user, or (a warning) the owner's, whose people would count as agents."""
    url, token = config.ha.url, config.ha.token
    if reached.state != "ok" or url is None or token is None:
        return []
    from farmhost.farm.homeassistant.live_view import current_user  # aiohttp only when the check runs

    ws_url = ("wss" if url.startswith("https") else "ws") + "://" + url.split("://", 1)[1]
    try:
        user = asyncio.run(current_user(ws_url.rstrip("/") + "/api/websocket", token, timeout=PROBE_TIMEOUT))
    except (OSError, TimeoutError, ValueError) as err:
        return [Check("ha user", "warn", f"whose token HA_TOKEN is could not be told ({err})", _OWN_USER_FIX)]
    name = user.get("name") or "?"
    if user.get("is_owner"):
        detail = (
            f"HA_TOKEN is the owner's ({name}): whatever people do in HA with that account counts as the agents' "
            "and is undone when a rule would have held it"
        )
        return [Check("ha user", "warn", detail, _OWN_USER_FIX)]
    return [Check("ha user", "ok", f"farmhost acts as its own HA user {name!r} (not the owner)")]


_OWN_USER_FIX: Final = (
    "create an HA user for farmhost alone (an administrator, not the owner), make a long-lived token as that user "
    "and set it as HA_TOKEN (docs/configuration.md)"
)


def _farm_profile(config: Config) -> Check:
    state, detail, fix = profile_report(load_profile(config.farm.profile_path), farm_mode=config.farm.mode)
    if state == "off" and not fix:
        fix = f"optional: write {config.farm.profile_path} to narrow the policy (docs/farm-actions.md)"
    return Check("farm profile", cast(State, state), detail, fix)


def _mqtt_state(config: Config) -> tuple[State, str, str]:
    from farmhost.mqtt.probe import check_broker  # paho-mqtt only when the check runs

    state, detail, fix = check_broker(config.site, timeout=PROBE_TIMEOUT)
    return cast(State, state), detail, fix


def _actuator_rules(config: Config) -> Check:
    loaded = load_profile(config.farm.profile_path)
    if not loaded.rules:
        fix = "optional: add policy.rules (approval, automatic off, rate limits; docs/farm-actions.md)"
        return Check("actuator rules", "off", "none: control actions run at once, with no limit on time or rate", fix)
    described = "; ".join(f"{n}. {rules.describe(rule)}" for n, rule in enumerate(loaded.rules, start=1))
    return Check("actuator rules", "ok", f"{len(loaded.rules)} rule(s): {described}")


def _telegram(config: Config) -> Check:
    telegram = config.telegram
    if not telegram.enabled:
        return Check("telegram", "off", "TELEGRAM_BOT_TOKEN not set", "create a bot with @BotFather and set the token")
    base = telegram.api_base_url or "https://api.telegram.org"
    return _http_check(
        "telegram", f"{base}/bot{telegram.bot_token}/getMe", {}, "check TELEGRAM_BOT_TOKEN and the network"
    )


def _runtime(config: Config) -> list[Check]:
    runtime = config.agents.sandbox.runtime
    if runtime == "process":
        return [Check("sandbox", "ok", "process runtime: NO isolation (development only)", "use bwrap or docker")]
    binary = shutil.which(runtime)
    if binary is None:
        fix = "apt-get install bubblewrap" if runtime == "bwrap" else f"install {runtime} or set FARMHOST_AGENT_RUNTIME"
        return [Check("sandbox", "broken", f"{runtime} not found on PATH", fix)]
    if runtime == "bwrap":
        return _bwrap(binary, config.agents.sandbox)
    return [_engine(runtime, binary)]


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


def _bwrap(binary: str, sandbox: SandboxSettings) -> list[Check]:
    """Check that bwrap can make its namespaces here, that the agent interpreter imports farmagent, and the filter."""
    try:
        python = find_python_install_sync(sandbox.python)
    except SandboxError as err:
        fix = "set FARMHOST_AGENT_PYTHON to a Python 3.11+ with farmagent"
        return [Check("sandbox", "broken", err.message, fix)]
    if python.farmagent is None:
        detail = f"the agent interpreter {python.executable} cannot import farmagent"
        return [Check("sandbox", "broken", detail, "install farmagent into it (uv sync) or set FARMHOST_AGENT_PYTHON")]
    trial = [binary, "--unshare-all", "--unshare-user", "--die-with-parent", "--ro-bind", "/", "/", "true"]
    try:
        done = subprocess.run(trial, capture_output=True, text=True, timeout=PROBE_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return [Check("sandbox", "broken", f"bwrap does not run: {err}", "apt-get install --reinstall bubblewrap")]
    if done.returncode != 0:
        detail = f"bwrap cannot create its namespaces: {done.stderr.strip()}"
        fix = "allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1) or use docker"
        return [Check("sandbox", "broken", detail, fix)]
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        detail = "setpriv is not installed: a root daemon's runs drop to their group's uid with it, so all are refused"
        return [Check("sandbox", "broken", detail, "apt-get install util-linux (it ships setpriv)")]
    trial_check = Check("sandbox", "ok", f"bwrap ({binary}), agent interpreter {python.executable}")
    checks = [trial_check, _seccomp(binary, str(python.executable), sandbox.seccomp)]
    if sandbox.proc == "container":
        detail = (
            "FARMHOST_SANDBOX_PROC=container: runs see this container's /proc read-only (its process list and "
            "command lines, not the host's; other uids' environments and memory stay closed), and a run's share of "
            "inotify instances is not capped (the container's /proc/sys is read-only)"
        )
        fix = "where the kernel lets bwrap mount a new /proc (outside a container), unset FARMHOST_SANDBOX_PROC"
        checks.append(Check("sandbox", "warn", detail, fix))
    return checks


def _seccomp(binary: str, python: str, mode: SeccompMode) -> Check:
    """Build the agents' seccomp filter and check in a trial run under bwrap that it refuses what it should."""
    if mode == "off":
        detail = (
            "FARMHOST_SANDBOX_SECCOMP=off: bwrap runs have no seccomp filter (agents can create user namespaces, "
            "ptrace, use io_uring, bpf and keyrings)"
        )
        return Check("seccomp", "warn", detail, "remove FARMHOST_SANDBOX_SECCOMP=off (the default is required)")
    fix = "apt-get install libseccomp2 (and `uv sync` for pyseccomp), or set FARMHOST_SANDBOX_SECCOMP=off"
    try:
        built = build_filter_sync()
    except SeccompUnavailable as err:
        return Check("seccomp", "broken", f"{err.message}: bwrap agent runs are refused", fix)
    fd = sealed_memfd(built.bpf)
    trial = [binary, "--unshare-all", "--unshare-user", "--die-with-parent", "--ro-bind", "/", "/"]
    trial += ["--seccomp", str(fd), python, "-I", "-c", SECCOMP_TRIAL]
    try:
        done = subprocess.run(trial, capture_output=True, text=True, timeout=PROBE_TIMEOUT, check=False, pass_fds=(fd,))
    except (OSError, subprocess.TimeoutExpired) as err:
        return Check("seccomp", "broken", f"the filter's trial run did not finish: {err}", fix)
    finally:
        os.close(fd)
    answer = done.stdout.strip()
    if done.returncode != 0 or answer != "EPERM EPERM EAFNOSUPPORT":
        got = answer or done.stderr.strip() or f"exit {done.returncode}"
        detail = (
            "the filter does not hold: in a trial run unshare(CLONE_NEWUSER), ptrace(PTRACE_TRACEME), "
            f"socket(AF_NETLINK) gave {got}"
        )
        return Check("seccomp", "broken", detail, "upgrade bubblewrap (0.3 or newer loads --seccomp) and libseccomp2")
    detail = (
        f"{built.describe()}; a trial run got EPERM for unshare(CLONE_NEWUSER) and ptrace(PTRACE_TRACEME), "
        "EAFNOSUPPORT for socket(AF_NETLINK)"
    )
    if built.unknown:
        return Check("seccomp", "warn", detail, "upgrade libseccomp2 so that it knows every call of the list")
    return Check("seccomp", "ok", detail)


def _agent_limits(config: Config) -> Check:
    path = DataLayout(config.data_dir).agent_limits
    limits = default_limits(config.agents.limits)
    defaults = f"{limits.timeout_seconds:g} s, {limits.memory_mb} MB, {limits.pids} processes, {limits.max_turns} turns"
    try:
        parsed = LimitsFile.model_validate(json.loads(path.read_bytes()))
    except FileNotFoundError:
        return _enforcement(
            config.agents, Check("agent limits", "ok", f"every group: {defaults} (no {path.name})"), config.data_dir
        )
    except (OSError, ValueError) as err:
        fix = f"correct {path} (docs/agent-runtime.md); until then every group runs with the defaults"
        return Check("agent limits", "broken", f"{path}: {explain(err)}", fix)
    detail = f"defaults {defaults}; {len(parsed.groups)} group override(s) in {path.name}"
    return _enforcement(config.agents, Check("agent limits", "ok", detail), config.data_dir)


def _enforcement(agents: AgentSettings, check: Check, data_dir: Path) -> Check:
    """Say which of the limits the kernel holds on this host and which it does not (docs/agent-runtime.md).

    While a daemon runs, what it found at its start (an operator's doctor is another user in another cgroup);
    otherwise what this command finds, changing nothing.
    """
    runtime = agents.sandbox.runtime
    walls = running_walls(data_dir)
    ids = walls.ids if walls is not None else describe_ids(agents.sandbox)
    if runtime in ("docker", "podman"):
        return Check(check.part, check.state, f"{check.detail}; {ids}; {_disk_watched(agents)}")
    if runtime != "bwrap":
        return check
    if walls is not None:
        support = CgroupSupport(version=walls.cgroup_version, reason=walls.cgroup_reason)
    else:
        support = detect_sync(enable=False)
    whose = f"the running daemon (pid {walls.pid})" if walls is not None else _this_command()
    held = f"{whose}: {ids}; held: wall time, /tmp and /dev/shm sizes"
    watched = _disk_watched(agents)
    if support.available:
        cgroup = (
            f"memory summed over a run's processes and its tmpfs, processes and CPU share per run (cgroup "
            f"v{support.version}; no RLIMIT_AS, so an agent starts as many threads as its process limit allows)"
        )
        return Check(check.part, "ok", f"{check.detail}; {held}, {cgroup}; {watched}")
    if agents.unenforced_limits == "allow":
        held += ", memory per process (RLIMIT_AS: at 256 MB a Python agent starts about 6 threads)"
        missing = f"not held: memory summed over a run's processes, processes per run, CPU share ({support.reason})"
        fix = "delegate cgroups to farmhost (docs/agent-runtime.md#limits); runs start anyway (FARMHOST_AGENT_UNENFORCED_LIMITS=allow)"
        return Check(check.part, "warn", f"{check.detail}; {held}; {watched}; {missing}", fix)
    refused = f"agent runs are refused: no cgroup for them ({support.reason})"
    fix = "delegate cgroups to farmhost (docs/agent-runtime.md#limits), or set FARMHOST_AGENT_UNENFORCED_LIMITS=allow"
    return Check(check.part, "broken", f"{check.detail}; {whose}: {refused}; {ids}", fix)


def _disk_watched(agents: AgentSettings) -> str:
    """What farmhost itself, not the kernel, holds of a run's disk (farmhost/agents/disk_watch.py)."""
    reserve = agents.disk_reserve_mb
    free = f", and {reserve} MB left free on the data directory's disk" if reserve else ""
    return (
        "not by the kernel but by farmhost, which ends a run within seconds of passing them: "
        f"workspace size (checked before each run and watched during it){free}"
    )


def _this_command() -> str:
    try:
        user = pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        user = f"uid {os.geteuid()}"
    return f"no daemon is running, so as this command ({user}) finds it"


def _llm_probes(config: Config, settings: Settings) -> list[Probe]:
    """One probe per LLM endpoint of the chain ("llm", then "llm 2", "llm 3"); one "llm" line when none is set."""
    endpoints = config.agents.llm.endpoints
    if not endpoints:
        return [Probe("llm", lambda: [_llm_off(settings)], "the LLM settings")]
    return [
        Probe(
            _llm_part(endpoint),
            functools.partial(_one_llm, endpoint),
            f"the LLM endpoint {_safe_url(endpoint.base_url)}/models",
            PROBE_TIMEOUT + CONTEXT_TIMEOUT + 2,
            f"check {endpoint.env_prefix}_BASE_URL and the network",
        )
        for endpoint in endpoints
    ]


def _one_llm(endpoint: LlmEndpoint) -> list[Check]:
    check = _llm(endpoint, fallback=endpoint.number > 1)
    if check.state != "ok":
        return [check]
    return [Check(check.part, check.state, check.detail + _context(endpoint))]


def _context(endpoint: LlmEndpoint) -> str:
    """The context the server says it has, as the daemon will learn it (nothing when it does not say)."""
    from farmhost.agents.proxy.context import said_by  # aiohttp only when the check runs

    size = asyncio.run(said_by(endpoint, timeout=CONTEXT_TIMEOUT))
    return f", context {size.tokens:,} tokens ({size.source})" if size is not None else ""


def _llm_part(endpoint: LlmEndpoint) -> str:
    return "llm" if endpoint.number == 1 else f"llm {endpoint.number}"


def _llm_off(settings: Settings) -> Check:
    """Which of the variables of the first endpoint are missing (the parser's fields: they are what is written)."""
    missing = [
        n
        for n, v in (("FARMHOST_LLM_BASE_URL", settings.llm_base_url), ("FARMHOST_LLM_MODEL", settings.llm_model))
        if not v
    ]
    fix = (
        "set FARMHOST_LLM_BASE_URL, FARMHOST_LLM_MODEL (and FARMHOST_LLM_API_KEY) in .env; until then chat messages "
        "are answered by Home Assistant's Assist and scheduled agent runs are refused"
    )
    return Check("llm", "off", f"{' and '.join(missing)} not set", fix)


def _llm(endpoint: LlmEndpoint, *, fallback: bool) -> Check:
    """One OpenAI-compatible endpoint: reachable (GET /models with its key) and offering its model."""
    part, env = _llm_part(endpoint), endpoint.env_prefix
    lead = f"fallback {endpoint.number}: " if fallback else ""
    url = _safe_url(endpoint.base_url)
    where = f"{lead}{url}"
    headers = {"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
    request = urllib.request.Request(f"{endpoint.base_url}/models", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=PROBE_TIMEOUT) as response:
            body = response.read(1 << 20)
    except urllib.error.HTTPError as err:
        if err.code in (401, 403):
            fix = f"check {env}_API_KEY (the endpoint refused it)"
            return Check(part, "broken", f"{where}: HTTP {err.code} {err.reason}: the key was refused", fix)
        if err.code == 404:
            fix = f"{env}_BASE_URL must be the URL that /chat/completions hangs off, e.g. https://api.openai.com/v1"
            return Check(part, "warn", f"{where}: GET /models answered HTTP 404 (is /v1 missing?)", fix)
        return Check(
            part, "broken", f"{where}: HTTP {err.code} {err.reason}", "check the endpoint's status and the key"
        )
    except (urllib.error.URLError, OSError) as err:
        return Check(part, "broken", f"{where} {_unreachable(err)}", f"check {env}_BASE_URL and the network")
    offered = _model_ids(body)
    model = endpoint.model
    if offered and model not in offered:
        listed = ", ".join(sorted(offered)[:8]) + (", ..." if len(offered) > 8 else "")
        fix = f"set {env}_MODEL to a model the endpoint offers"
        return Check(part, "warn", f"{where} does not list model {model!r} (it offers {listed})", fix)
    listed = f", {len(offered)} model(s) offered" if offered else ""
    return Check(part, "ok", f"{lead}model {model!r} at {url}, reachable{listed}")


def _model_ids(body: bytes) -> set[str]:
    """The model ids of an OpenAI `GET /models` answer (empty when it is not one)."""
    try:
        document = json.loads(body)
        return {str(m["id"]) for m in document["data"] if isinstance(m, dict) and "id" in m}
    except (ValueError, KeyError, TypeError):
        return set()
