"""App: builds each service from its own section of the Config, starts and stops them in order, owns signals.

It also wires the two pieces of state every service shares: the group registry (`GroupRegistry`, the one copy of the
registered groups in memory, whose announcements the IPC service follows) and the one watch for other processes'
commits (`CommitWatcher`, which tells the registry and the scheduler to re-read).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import resource
import signal
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

from farmhost import __version__
from farmhost.agents.fallback import AssistFallback
from farmhost.agents.jobs import AgentJob
from farmhost.agents.limits import LimitsReader
from farmhost.agents.pause import restore_pause
from farmhost.agents.runtime import AgentRuntime
from farmhost.agents.sandbox.identity import describe_ids
from farmhost.config import Config, Settings, build_config
from farmhost.emergency_stop import EmergencyStop
from farmhost.errors import ConfigError
from farmhost.farm.actions import farm_handlers
from farmhost.farm.audit import AuditLog
from farmhost.farm.control.approval_desk import ApprovalDesk
from farmhost.farm.control.auto_off import AutoOff
from farmhost.farm.control.effect_rules import EffectRules
from farmhost.farm.deps import FarmDeps
from farmhost.farm.homeassistant.client import HAClient
from farmhost.farm.homeassistant.live_view import LiveView
from farmhost.farm.state.alert_notifier import SUBSCRIPTIONS_FILE, AlertNotifier
from farmhost.farm.state.collector import StateCollector
from farmhost.farm.state.receipts import ReceiptBook
from farmhost.groups.handlers import HANDLERS as GROUP_HANDLERS
from farmhost.groups.live import GroupRegistry
from farmhost.handling import Change, Handlers
from farmhost.ipc.ping import ping_handlers
from farmhost.ipc.service import IpcService
from farmhost.ipc.snapshots import HostIdentity
from farmhost.layout import DataLayout
from farmhost.loop_monitor import LoopMonitor
from farmhost.memory.search import MemoryService, memory_handlers
from farmhost.mqtt import device
from farmhost.mqtt.service import MqttService
from farmhost.outbox.handlers import outbox_handlers
from farmhost.scheduler.daily_report import DailyReport
from farmhost.scheduler.handlers import task_handlers
from farmhost.scheduler.runs import RunReport, TaskRun
from farmhost.scheduler.service import SchedulerService
from farmhost.scheduler.watcher import WhenWatcher, event_prompt
from farmhost.scheduler.when import ConditionError, load_condition
from farmhost.sites.caller import SiteCaller
from farmhost.store import host_state, when_state
from farmhost.store.commits import CommitWatcher
from farmhost.store.db import Database, iso, now_utc
from farmhost.store.groups import Group
from farmhost.voice import SpeechToText, speech_to_text

if TYPE_CHECKING:
    from farmhost.telegram.service import TelegramService

logger = logging.getLogger(__name__)

# The contract allows 10 s for a clean stop; leave headroom for closing the database.
STOP_TIMEOUT: Final = 8.0
# Memory hits offered to each agent run with its prompt (then trimmed to FARMHOST_MEMORY_PROMPT_CHARS).
MEMORY_HITS_PER_RUN: Final = 8
# The kernel's default ceiling for one process's descriptors (fs.nr_open); an unlimited hard limit is raised to this.
NOFILE_CEILING: Final = 1 << 20


def raise_nofile_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit (the soft default, 1024, is what a flood exhausts first).

    Returns:
        the soft limit before and after.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = NOFILE_CEILING if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as err:
            logger.warning("cannot raise the descriptor limit from %d to %d: %s", soft, target, err)
            return soft, soft
        return soft, target
    return soft, soft


def build_handlers(
    config: Config,
    identity: HostIdentity,
    farm: FarmDeps,
    memory: MemoryService | None = None,
    audit: AuditLog | None = None,
    sites: SiteCaller | None = None,
) -> Handlers:
    """The full handler table, assembled from every capability's own table, each bound to its own section."""
    return {
        **(sites.handlers() if sites is not None else {}),
        **ping_handlers(identity),
        **outbox_handlers(config.outbox),
        **task_handlers(farm.ha, config.scheduler),
        **GROUP_HANDLERS,
        **farm_handlers(farm, audit=audit),
        **memory_handlers(memory or MemoryService(farm.layout)),
    }


# How long a start waits for the lock of a daemon that is gone (its pid no longer runs) to be let go.
LOCK_WAIT_SECONDS: Final = 5.0
LOCK_RETRY_SECONDS: Final = 0.02


def _alive(pid: str) -> bool:
    """Whether the pid written in the lock file runs (a pid we may not signal runs too)."""
    if not pid.isdigit():
        return True  # unreadable: say what the lock file says
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process
    return True


class App:
    """The daemon of one data directory."""

    def __init__(self, settings: Settings | Config, *, started_at: datetime | None = None) -> None:
        """The daemon of `settings` (built into their sections here) or of a Config already built from them."""
        # build_config is the one look at the host's time zone, agent runtime and name
        self.config = config = settings if isinstance(settings, Config) else build_config(settings)
        self.layout = DataLayout(config.data_dir)
        self.identity = HostIdentity(pid=os.getpid(), version=__version__, started_at=started_at or now_utc())
        self._lock_fd = -1
        self.db: Database | None = None
        self.commits: CommitWatcher | None = None  # other processes' commits (the CLI's group add/remove)
        self.groups: GroupRegistry | None = None
        self.ipc: IpcService | None = None
        self.ha: HAClient | None = None
        self.collector: StateCollector | None = None
        self.daily_report: DailyReport | None = None
        self.scheduler: SchedulerService | None = None
        self.runtime: AgentRuntime | None = None
        self.telegram: TelegramService | None = None  # set in start() when TELEGRAM_BOT_TOKEN is set
        self.desk: ApprovalDesk | None = None
        self.emergency_stop: EmergencyStop | None = None  # /stop and /resume in the main chat
        self.auto_off: AutoOff | None = None
        self.live_view: LiveView | None = None
        self.when: WhenWatcher | None = None  # farm events that wake `when` tasks
        self.alerts: AlertNotifier | None = None  # farm alerts told to the chats
        self.effects: EffectRules | None = None
        self.sites: SiteCaller | None = None
        self.mqtt: MqttService | None = None
        self.memory: MemoryService | None = None
        # Voice notes' speech-to-text (Config.voice): made in start() before Telegram, which hands it the notes;
        # None when FARMHOST_STT_MODEL and FARMHOST_STT_URL are unset. Its worker starts with the first note.
        self.stt: SpeechToText | None = None
        self.loop_monitor = LoopMonitor(self.layout.logs)

    async def start(self) -> None:
        """Take the data-dir lock, open the store, start IPC, the agent runtime, Telegram and the scheduler."""
        self.layout.create()
        await self._take_lock()
        if seeded := self.layout.seed_global_memory():
            logger.info("global memory: copied %d starting file(s) into %s", seeded, self.layout.workspace("global"))
        self.db = Database.open(self.config.data_dir)
        # The watcher first: a commit after it takes its baseline, even one before the registry's first read, is told.
        self.commits = CommitWatcher(self.db, inotify=self.config.ipc.mode == "inotify")
        self.groups = GroupRegistry(self.db)
        self.commits.subscribe(self.groups.reload)
        self.commits.start()
        self.loop_monitor.start()
        receipts = ReceiptBook()
        farm = FarmDeps(
            settings=self.config.farm,
            layout=self.layout,
            ha=None,
            dashboards_dir=self.layout.dashboards,
            receipts=receipts,
        )
        ha_url, ha_token = self.config.ha.url, self.config.ha.token
        if ha_url and ha_token:
            self.ha = HAClient(url=ha_url, token=ha_token)
            await self.ha.start()  # never waits for HA: actions answer upstream_unavailable until it is up
            farm = replace(farm, ha=self.ha)
            self.collector = StateCollector.from_deps(farm)
            farm = replace(farm, state=self.collector)
            self.alerts = AlertNotifier(
                db=self.db,
                settings=self.config.alerts,
                subscriptions_path=self.config.data_dir / SUBSCRIPTIONS_FILE,
                wake_outbox=self._wake_outbox,
            )
            self.live_view = LiveView(ws_url=self.ha.ws_url, token=ha_token, on_link=self._live_link)
            self.collector.attach(notifier=self.alerts, view=self.live_view)
            await self.alerts.start()
            await self.collector.start()  # returns at once; the first poll runs in the background
        memory = self.memory = MemoryService(self.layout)
        audit = AuditLog(self.layout.farm_state, max_bytes=self.config.farm.audit_max_bytes)
        if self.ha is not None and self.live_view is not None:
            self.effects = EffectRules(
                ha=self.ha,
                view=self.live_view,
                db=self.db,
                profile_path=self.config.farm.profile_path,
                audit=audit,
                started_at=self.identity.started_at,
                wake_outbox=self._wake_outbox,
                on_violation=self.collector.raise_violation if self.collector is not None else None,
                alerts=self.alerts,
            )
            self.effects.start()
            receipts.follow(self.live_view)
            farm = replace(farm, effects=self.effects, view=self.live_view)
        self.sites = SiteCaller(db=self.db, settings=self.config.site, audit=audit)
        handlers = build_handlers(self.config, self.identity, farm, memory, audit, self.sites)
        # The watcher knows each when task before its schedule_task is answered (and before the live view's first
        # sync): an event right after the answer must find its task, even while the rest of the host starts.
        self.when = when = WhenWatcher(
            db=self.db, zone=self.config.zone, view=self.live_view, wake=self._wake_scheduler
        )
        when.start()
        if self.collector is not None:
            self.collector.add_raised_listener(when.alert_raised)
        self.ipc = IpcService(
            settings=self.config.ipc,
            layout=self.layout,
            db=self.db,
            registry=self.groups,
            handlers=handlers,
            identity=self.identity,
        )
        self.ipc.add_change_listener(lambda changes: when.refresh() if Change.TASKS in changes else None)
        await self.ipc.start()
        self.desk = desk = ApprovalDesk(
            db=self.db,
            audit=audit,
            door=self.ipc.router,
            wake_outbox=self._wake_outbox,
        )
        await desk.start()
        # Asking an approval posts the approvers' message (an outbox change); the desk then times its expiry.
        self.ipc.add_change_listener(lambda changes: desk.approvals_changed() if Change.OUTBOX in changes else None)
        self.commits.subscribe(desk.approvals_changed)
        if self.ha is not None and self.live_view is not None:
            self.auto_off = AutoOff(
                ha=self.ha,
                view=self.live_view,
                db=self.db,
                profile_path=self.config.farm.profile_path,
                audit=audit,
                started_at=self.identity.started_at,
                wake_outbox=self._wake_outbox,
            )
            await self.auto_off.start()
        if self.live_view is not None:
            await self.live_view.start()  # returns at once; listeners are in place before the first sync
        self.runtime = AgentRuntime(
            settings=self.config.agents,
            layout=self.layout,
            group=self._group,
            before_run=self._before_run,
            memory_snippets=lambda folder, prompt: memory.search(
                folder, prompt, top_k=MEMORY_HITS_PER_RUN, sources="memory", db=self.db
            ),
            host_notes=self.desk.notes,
            receipts=receipts,
            fallback=AssistFallback(self.ipc.router),
        )
        await self.runtime.start()
        self._record_walls(self.runtime)
        restore_pause(self.db, self.runtime)
        self.emergency_stop = EmergencyStop(
            db=self.db,
            runtime=self.runtime,
            ha=self.ha,
            profile_path=self.config.farm.profile_path,
            audit=audit,
            wake_outbox=self._wake_outbox,
        )
        if self.config.site.broker is not None:
            self.mqtt = MqttService(
                settings=self.config.site,
                db=self.db,
                runtime=self.runtime,
                alerts=self.collector,
                caller=self.sites,
                router=self.ipc.router,
                audit=audit,
                main_group=self._main_group,
            )
            await self.mqtt.start()
        self.stt = speech_to_text(self.config.voice)
        if self.stt is not None:
            logger.info("voice notes: %s", self.stt.description)
        if self.config.telegram.enabled:
            # Imported here: python-telegram-bot and httpx cost ~20 MB of RSS a daemon without Telegram never needs.
            from farmhost.telegram.service import TelegramService

            self.telegram = TelegramService(
                db=self.db,
                settings=self.config.telegram,
                layout=self.layout,
                runtime=self.runtime,
                status=self._status,
                on_groups_changed=self.groups.reload,
                desk=self.desk,
                stop=self.emergency_stop,
                alerts=self.alerts,
                stt=self.stt,
            )
            self.ipc.add_change_listener(self.telegram.ipc_changed)
            await self.telegram.start()
        self.scheduler = SchedulerService(
            db=self.db,
            settings=self.config.scheduler,
            dispatch=self._dispatch_task,
            on_tasks_changed=self._tasks_changed,
            on_sync=self.when.refresh,
        )
        self.ipc.add_change_listener(self.scheduler.ipc_changed)
        self.commits.subscribe(self.scheduler.sync)
        await self.scheduler.start()
        self.daily_report = DailyReport(
            db=self.db,
            layout=self.layout,
            settings=self.config.report,
            ha=self.ha,
            limits=LimitsReader.of(self.layout.agent_limits, self.config.agents),
            wake_outbox=self._wake_outbox,
            runtime=self.runtime,
        )
        await self.daily_report.start()  # nothing unless FARMHOST_DAILY_REPORT is set
        logger.info(
            "farmhost %s started: data dir %s, ipc mode %s, %d group(s); Home Assistant %s, Telegram %s",
            __version__,
            self.config.data_dir,
            self.config.ipc.mode,
            len(self.groups.groups),
            "on" if self.config.ha.enabled else "off",
            "on" if self.config.telegram.enabled else "off",
        )

    async def stop(self) -> None:
        """Stop in reverse order; `host_status.json` says `stopped` afterwards."""
        await self._stop_starters()
        self.emergency_stop = None
        if self.stt is not None:  # after Telegram: no note comes any more
            await self.stt.aclose()
            self.stt = None
        if self.runtime is not None:
            await self.runtime.stop()
            self.runtime = None
        await self._stop_watchers()
        if self.desk is not None:
            await self.desk.stop()
            self.desk = None
        if self.ipc is not None:
            await self.ipc.stop()
            self.ipc = None
        if self.memory is not None:  # after the IPC handlers and agent runs that search it
            await self.memory.close()
            self.memory = None
        if self.collector is not None:
            await self.collector.stop()
            self.collector = None
        if self.alerts is not None:  # after the collector that feeds it
            await self.alerts.stop()
            self.alerts = None
        if self.ha is not None:
            await self.ha.close()
            self.ha = None
        if self.commits is not None:
            await self.commits.stop()
            self.commits = None
        self.groups = None
        if self.db is not None:
            self.db.close()
            self.db = None
        await self.loop_monitor.stop()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1
        logger.info("farmhost stopped")

    async def _stop_starters(self) -> None:
        """What starts agent runs or talks to the outside: MQTT, the morning report, the scheduler, Telegram."""
        if self.mqtt is not None:
            await self.mqtt.stop()
            self.mqtt = None
        if self.daily_report is not None:
            await self.daily_report.stop()
            self.daily_report = None
        if self.scheduler is not None:
            await self.scheduler.stop()
            self.scheduler = None
        if self.telegram is not None:
            await self.telegram.stop()
            self.telegram = None

    async def _stop_watchers(self) -> None:
        """The automatic off, the live view of HA and the rules on effects (undos in flight finish)."""
        if self.auto_off is not None:
            await self.auto_off.stop()
            self.auto_off = None
        if self.when is not None:
            self.when.stop()
            self.when = None
        if self.live_view is not None:
            await self.live_view.stop()
            self.live_view = None
            self._live_link(False, "farmhost is not running")
        if self.effects is not None:
            await self.effects.stop()
            self.effects = None

    async def run(self, *, handle_signals: bool = True) -> None:
        """Run until SIGTERM/SIGINT (or cancellation), then stop cleanly."""
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
        before, after = raise_nofile_limit()
        if after != before:
            logger.info("descriptor limit raised from %d to %d", before, after)
        await self.start()
        try:
            await stop.wait()
            logger.info("stop requested")
        finally:
            await asyncio.wait_for(self.stop(), STOP_TIMEOUT)

    async def _dispatch_task(self, run: TaskRun) -> RunReport:
        """Run a claimed scheduled task as an agent run of its group and report how it ended."""
        if self.runtime is None:
            return RunReport(status="interrupted", summary="farmhost is stopping")
        task = run.task
        job = AgentJob(
            folder=task.group_folder,
            prompt=self._task_prompt(run),
            scheduled=True,
            task_id=task.id,
            context_mode=task.context_mode,
        )
        outcome = await self.runtime.submit(job)
        status = "interrupted" if outcome.status == "cancelled" else outcome.status
        return RunReport(status=status, summary=outcome.answer if outcome.status == "ok" else outcome.error)

    def _task_prompt(self, run: TaskRun) -> str:
        """A task's prompt; a when task's run gets the event that woke it first."""
        task = run.task
        if task.schedule_type != "when" or self.db is None:
            return task.prompt
        event = when_state.event_for(self.db.conn, task.id, run.due_at)
        if event is None:
            return task.prompt
        try:
            condition = load_condition(task.schedule_value).describe()
        except ConditionError:
            condition = task.schedule_value
        return f"{event_prompt(event, condition)}\n\n{task.prompt}"

    def _wake_scheduler(self) -> None:
        """A when event set a task's next run: the scheduler fires it now (it starts after the watcher)."""
        if self.scheduler is not None:
            self.scheduler.sync()

    async def _status(self) -> dict[str, Any]:
        """The app's part of `/status` (the Telegram side adds agents, outbox and tasks)."""
        if self.ha is None:
            home_assistant = "off (HA_URL/HA_TOKEN not set)"
        else:
            home_assistant = "up" if await self.ha.is_running() else "down"
        return {"version": __version__, "started_at": self.identity.started_at, "home_assistant": home_assistant}

    def _main_group(self) -> Group | None:
        return self.groups.main() if self.groups is not None else None

    def _group(self, folder: str) -> Group | None:
        """The registered group of `folder` (None when it is not registered)."""
        return self.groups.get(folder) if self.groups is not None else None

    async def _before_run(self, folder: str) -> None:
        """Rewrite the snapshots so the agent starts from the current tasks and groups (SPEC section 6)."""
        if self.ipc is not None:
            await self.ipc.refresh_snapshots(folder)
        if self.db is not None:
            device.count_run(self.db, self.config.zone, now_utc())

    def _tasks_changed(self) -> None:
        """The scheduler moved a task on (next_run, last_run, status): agents see it in current_tasks.json."""
        if self.ipc is not None:
            self.ipc.write_snapshots({Change.TASKS})

    def _live_link(self, following: bool, detail: str) -> None:
        """Keep the live view's state where `farmhost doctor` reads it (written only when it changes)."""
        if self.db is None:
            return
        record = {"connected": following, "since": iso(now_utc()), "detail": detail}
        with self.db.tx() as conn:
            host_state.put(conn, host_state.HA_LIVE_VIEW, json.dumps(record))

    def _record_walls(self, runtime: AgentRuntime) -> None:
        """Keep what this daemon found of its agents' walls where `farmhost doctor` reads it (host_state)."""
        if self.db is None:
            return
        support = runtime.cgroups
        cgroup = None if support is None else {"version": support.version, "reason": support.reason}
        ids = describe_ids(self.config.agents.sandbox)
        record = {"pid": self.identity.pid, "ids": ids, "cgroup": cgroup}
        with self.db.tx() as conn:
            host_state.put(conn, host_state.AGENT_WALLS, json.dumps(record))

    def _wake_outbox(self) -> None:
        if self.telegram is not None:
            self.telegram.delivery.wake()

    async def _take_lock(self) -> None:
        fd = os.open(self.layout.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + LOCK_WAIT_SECONDS
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                # A daemon killed (kill -9, a crash) while a process it was starting had not yet exec'd leaves that
                # child holding the lock for a moment: wait for it while the daemon that wrote its pid is gone.
                if _alive(holder):
                    os.close(fd)
                    raise ConfigError(
                        f"another farmhost daemon (pid {holder}) is already running on {self.config.data_dir}; "
                        "stop it first or use another --data-dir"
                    ) from None
                if loop.time() >= deadline:
                    os.close(fd)
                    raise ConfigError(
                        f"the lock of {self.config.data_dir} is still held by a process that farmhost daemon "
                        f"(pid {holder}, gone) started; stop that process first (fuser {self.layout.lock_path})"
                    ) from None
                await asyncio.sleep(LOCK_RETRY_SECONDS)
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock_fd = fd
