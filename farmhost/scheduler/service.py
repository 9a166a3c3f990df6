"""SchedulerService: fires each active task once per due time, on APScheduler in the daemon's event loop.

The tasks table is the source of truth. APScheduler only holds one DateTrigger job per active task, at its
next_run, rebuilt from the table at start and by `sync()`: after every task change an IPC request commits, when
another process committed (the daemon's one `CommitWatcher`, `farmhost/store/commits.py`, calls it), and every
`SYNC_SECONDS` anyway. When a job fires, the due time is
claimed in the database first (`claims.claim_due`), then dispatched; the run's end is recorded afterwards.

Decisions (see docs/scheduler.md):
- A task has at most one run in flight. While it runs it has no job; a due time that passes meanwhile is
  recorded `skipped` ("previous run still running") when the run ends, and next_run moves on.
- Due times missed while the host was down (or asleep) fire once, late, if within the grace
  (`FARMHOST_TASK_GRACE_SECONDS`); later ones are recorded `skipped`. Either way next_run moves to the first
  grid time after now: one run or one skipped row, never a burst of catch-up runs.
- A run left `running` by a crash is marked `interrupted` at start and not repeated; so is a run in flight when
  the daemon stops.
- A task fires at most once a second (`claims.MIN_SPACING`), whatever interval an agent asked for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any, Final

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.date import DateTrigger

from farmhost.config import SchedulerSettings
from farmhost.handling import Change
from farmhost.scheduler import claims
from farmhost.scheduler.runs import Dispatch, RunReport, TaskRun
from farmhost.store import tasks
from farmhost.store.db import Database, iso, now_utc, parse_iso

logger = logging.getLogger(__name__)

# A full re-read of the tasks table even when nothing announced a change: repairs anything a lost event missed.
SYNC_SECONDS: Final = 30.0
# How often APScheduler is woken to look at the wall clock again while it holds a job (see `_tick`).
TICK_SECONDS: Final = 1.0
_JOB_PREFIX: Final = "task:"
# The job coroutine only claims and spawns the run, so one instance at a time is plenty; a few spare slots keep
# APScheduler from dropping a fire (it would log a warning and the next sync would re-add it anyway).
_JOB_INSTANCES: Final = 4


class SchedulerService:
    """Fires scheduled tasks exactly once per due time and records every run in task_runs."""

    def __init__(
        self,
        *,
        db: Database,
        settings: SchedulerSettings,
        dispatch: Dispatch,
        on_tasks_changed: Callable[[], None],
        clock: Callable[[], datetime] = now_utc,
        on_sync: Callable[[], None] | None = None,
    ) -> None:
        """Build the service; nothing runs before `start()`.

        Args:
            db: The daemon's database (used on the event loop's thread only).
            settings: Timezone, grace and failure alert threshold.
            dispatch: Runs a claimed task and reports how it ended (the agent runtime, in the daemon).
            on_tasks_changed: Called after the scheduler changed a task (next_run, last_run, status), so the
                `current_tasks.json` snapshots are rewritten.
            clock: The current time (aware); tests inject one to walk across DST changes.
            on_sync: Called at each sync, after the jobs match the table (the when watcher re-reads its tasks).
        """
        self._db = db
        self._settings = settings
        self._zone = settings.zone
        self._dispatch = dispatch
        self._on_tasks_changed = on_tasks_changed
        self._clock = clock
        self._on_sync = on_sync
        self._scheduler: AsyncIOScheduler | None = None
        self._inflight: dict[str, tuple[TaskRun, asyncio.Task[None]]] = {}  # task id -> its run in flight
        self._poller: asyncio.Task[None] | None = None
        self._first_job = asyncio.Event()  # set when a sync adds a job while the tick waits for the next sync only
        self._ticking = False  # the tick wakes every TICK_SECONDS (there were jobs when it last looked)

    # lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        """Mark runs a crash left `running` as interrupted, then schedule every active task from the table."""
        # APScheduler logs every job added, run and removed at INFO; farmhost logs the runs itself.
        logging.getLogger("apscheduler").setLevel(logging.WARNING)
        with self._db.tx() as conn:
            interrupted = claims.recover(conn, now=self._clock())
        for record in interrupted:
            logger.warning(
                "task %s: the run due %s was interrupted by a host crash; it is not repeated",
                record.task_id,
                iso(record.due_at),
            )
        self._scheduler = AsyncIOScheduler(timezone=self._zone)
        self._scheduler.start()
        self.sync()
        self._poller = asyncio.create_task(self._tick(), name="scheduler:tick")
        logger.info("scheduler started: %d task job(s), zone %s, grace %g s", len(self._jobs()), self._zone, self.grace)

    async def stop(self) -> None:
        """Stop firing; runs in flight are cancelled and recorded `interrupted` (not repeated)."""
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
            self._poller = None
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=False)
            self._scheduler = None
            await asyncio.sleep(0)  # AsyncIOScheduler shuts down in a loop callback
        inflight = list(self._inflight.values())
        for _, running in inflight:
            running.cancel()
        await asyncio.gather(*(running for _, running in inflight), return_exceptions=True)
        # Recorded here, not in the run: a run cancelled before its first step never sees its cancellation.
        if inflight:
            with self._db.tx() as conn:
                for run, _ in inflight:
                    if claims.record_interrupted(conn, run, now=self._clock()):
                        logger.warning(
                            "task %s: run %d interrupted by the host stopping",
                            run.task.id,
                            run.run_id,
                            extra=_ids(run),
                        )
        self._inflight.clear()

    @property
    def grace(self) -> float:
        """How late (seconds) a missed run may still start."""
        return self._settings.grace_seconds

    # scheduling --------------------------------------------------------------------------------

    def sync(self) -> None:
        """Re-read the tasks table and make the jobs match it: one job per active task at its next_run.

        Also the daemon's CommitWatcher listener: another process committed, perhaps to the tasks table.
        """
        if self._scheduler is None:
            return
        wanted: dict[str, tuple[str, str]] = {}
        for task in tasks.list_tasks(self._db.conn):
            if task.status == "active" and task.next_run is not None and task.id not in self._inflight:
                wanted[_JOB_PREFIX + task.id] = (task.id, iso(task.next_run) or "")
        for job in self._jobs():
            if job.id not in wanted:
                job.remove()
        for job_id, (task_id, due) in wanted.items():
            job = self._scheduler.get_job(job_id)
            if job is not None and tuple(job.args) == (task_id, due):
                continue
            self._scheduler.add_job(
                self._fire,
                DateTrigger(run_date=parse_iso(due), timezone=self._zone),
                args=(task_id, due),
                id=job_id,
                name=f"task {task_id}",
                replace_existing=True,
                misfire_grace_time=None,  # lateness is judged by the claim against the task grace, not here
                coalesce=True,
                max_instances=_JOB_INSTANCES,
            )
        if wanted and not self._ticking:
            self._first_job.set()
        if self._on_sync is not None:
            try:
                self._on_sync()
            except Exception:
                logger.exception("the scheduler's sync listener failed")

    def ipc_changed(self, changes: set[Change]) -> None:
        """IpcService change listener: a request paused, resumed, cancelled or created a task."""
        if Change.TASKS in changes:
            self.sync()

    async def run_due(self) -> int:
        """Claim every due time that is due by the clock now, and wait for those runs to end (burst mode).

        Returns:
            How many due times were claimed or skipped.
        """
        now = self._clock()
        due = [
            t
            for t in tasks.list_tasks(self._db.conn)
            if t.status == "active" and t.next_run is not None and t.next_run <= now and t.id not in self._inflight
        ]
        for task in due:
            assert task.next_run is not None
            await self._fire(task.id, iso(task.next_run) or "")
        await asyncio.gather(*(running for _, running in self._inflight.values()), return_exceptions=True)
        return len(due)

    # firing ------------------------------------------------------------------------------------

    async def _fire(self, task_id: str, due: str) -> None:
        """A job fired: claim the due time; dispatch the run in the background (this job returns at once)."""
        if task_id in self._inflight:
            return
        due_at = parse_iso(due)
        assert due_at is not None
        try:
            with self._db.tx() as conn:
                claim = claims.claim_due(
                    conn, task_id=task_id, due_at=due_at, now=self._clock(), zone=self._zone, grace=self.grace
                )
        except Exception:
            logger.exception(
                "task %s: could not claim the run due %s; the next sync retries",
                task_id,
                due,
                extra={"taskId": task_id},
            )
            return
        if claim.run is not None:
            logger.info(
                "task %s (group %s): run %d due %s starts",
                task_id,
                claim.run.task.group_folder,
                claim.run.run_id,
                due,
                extra={**_ids(claim.run), "event": "task_run_start", "dueAt": due},
            )
            running = asyncio.create_task(self._run(claim.run), name=f"scheduler:run:{task_id}")
            self._inflight[task_id] = (claim.run, running)
        elif claim.task_changed:
            logger.warning("task %s: due %s skipped: %s", task_id, due, claim.note, extra={"taskId": task_id})
        else:
            logger.debug("task %s: due %s not fired: %s", task_id, due, claim.note, extra={"taskId": task_id})
        if claim.task_changed:
            self._tasks_changed()
        self.sync()

    async def _run(self, run: TaskRun) -> None:
        task_id = run.task.id
        try:
            report = await self._dispatch(run)
        except Exception as err:  # not CancelledError: stop() records that run as interrupted
            logger.exception("task %s: run %d failed in the dispatcher", task_id, run.run_id, extra=_ids(run))
            report = RunReport(status="error", summary=f"the host failed to run it: {type(err).__name__}: {err}")
        try:
            with self._db.tx() as conn:
                end = claims.record_end(
                    conn,
                    run,
                    report,
                    now=self._clock(),
                    zone=self._zone,
                    alert_after=self._settings.failure_alert_after,
                )
        except Exception:  # the row stays `running`; the next start marks it interrupted
            logger.exception(
                "task %s: could not record the end of run %d (%s)", task_id, run.run_id, report.status, extra=_ids(run)
            )
            return
        finally:
            self._inflight.pop(task_id, None)
        logger.info(
            "task %s: run %d ended %s",
            task_id,
            run.run_id,
            report.status,
            extra={**_ids(run), "event": "task_run_end", "status": report.status},
        )
        if end.note:
            logger.warning("task %s: %s", task_id, end.note, extra=_ids(run))
        if end.task_changed:
            self._tasks_changed()
        self.sync()

    def _tasks_changed(self) -> None:
        try:
            self._on_tasks_changed()
        except Exception:
            logger.exception("rewriting the task snapshots failed")

    async def _tick(self) -> None:
        """Wake APScheduler every TICK_SECONDS while it holds a job; sync every SYNC_SECONDS regardless of news.

        With no job (no task, or only `when` tasks) nothing can be due: the tick sleeps until the next sync, or until
        a sync adds a job, and an idle daemon is not woken every second for nothing.
        """
        loop = asyncio.get_running_loop()
        next_sync = loop.time() + SYNC_SECONDS
        while True:
            self._ticking = bool(self._jobs())
            wait = TICK_SECONDS if self._ticking else max(0.0, next_sync - loop.time())
            self._first_job.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._first_job.wait(), wait)
            try:
                if loop.time() >= next_sync:
                    next_sync = loop.time() + SYNC_SECONDS
                    self.sync()
                # APScheduler sleeps on the loop's monotonic clock until the next job's wall-clock time. A Pi has no
                # RTC: when NTP steps the wall clock forward after boot, due jobs would wait out the old delay.
                if self._scheduler is not None:
                    self._scheduler.wakeup()
            except Exception:
                logger.exception("scheduler sync failed")

    def _jobs(self) -> list[Any]:
        if self._scheduler is None:
            return []
        return [job for job in self._scheduler.get_jobs() if job.id.startswith(_JOB_PREFIX)]


def _ids(run: TaskRun) -> dict[str, object]:
    """The ids a log line about a task run carries as `extra` (JSON logs show them as fields)."""
    return {"taskId": run.task.id, "group": run.task.group_folder, "taskRunId": run.run_id}
