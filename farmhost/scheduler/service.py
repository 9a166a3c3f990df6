"""SchedulerService: fires each active task once per due time, in the daemon's event loop.

The tasks table is the source of truth. The service only holds one job per active task, its next_run (the fire
times come from `specs.py`, and from `cron.py` on APScheduler's CronTrigger for cron), rebuilt from the table at
start and by `sync()`: after every task change an IPC request commits, when another process committed (the
daemon's one `CommitWatcher`, `farmhost/store/commits.py`, calls it), and every `SYNC_SECONDS` anyway. One loop naps on the injected
`SchedulerClock` (`clock.py`: the wall clock in the daemon, a hand-stepped one in tests) until the earliest job
is due. When a job fires, the due time is claimed in the database first (`claims.claim_due`), then dispatched;
the run's end is recorded afterwards.

Decisions (see docs/scheduler.md):
- A task has at most one run in flight. While it runs it has no job; a due time that passes meanwhile is
  recorded `skipped` ("previous run still running") when the run ends, and next_run moves on; a when task's
  event that came meanwhile runs then instead.
- Due times missed while the host was down (or asleep) fire once, late, if within the grace
  (`FARMHOST_TASK_GRACE_SECONDS`); later ones are recorded `skipped`. Either way next_run moves to the first
  grid time after now: one run or one skipped row, never a burst of catch-up runs.
- A run left `running` by a crash is marked `interrupted` at start and not repeated; so is a run in flight when
  the daemon stops.
- A task fires at most once a second (`claims.MIN_SPACING`), whatever interval an agent asked for.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Final

from farmhost.config import SchedulerSettings
from farmhost.handling import Change
from farmhost.scheduler import claims
from farmhost.scheduler.clock import SchedulerClock, WallClock
from farmhost.scheduler.runs import Dispatch, RunReport, TaskRun
from farmhost.store import tasks
from farmhost.store.db import Database, iso, parse_iso

logger = logging.getLogger(__name__)

# A full re-read of the tasks table even when nothing announced a change: repairs anything a lost event missed.
SYNC_SECONDS: Final = 30.0


class SchedulerService:
    """Fires scheduled tasks exactly once per due time and records every run in task_runs."""

    def __init__(
        self,
        *,
        db: Database,
        settings: SchedulerSettings,
        dispatch: Dispatch,
        on_tasks_changed: Callable[[], None],
        clock: SchedulerClock | None = None,
        on_sync: Callable[[], None] | None = None,
    ) -> None:
        """Build the service; nothing runs before `start()`.

        Args:
            db: The daemon's database (used on the event loop's thread only).
            settings: Timezone, grace and failure alert threshold.
            dispatch: Runs a claimed task and reports how it ended (the agent runtime, in the daemon).
            on_tasks_changed: Called after the scheduler changed a task (next_run, last_run, status), so the
                `current_tasks.json` snapshots are rewritten.
            clock: The time it claims by and naps on (default: the wall clock); tests inject one they step.
            on_sync: Called at each sync, after the jobs match the table (the when watcher re-reads its tasks).
        """
        self._db = db
        self._settings = settings
        self._zone = settings.zone
        self._dispatch = dispatch
        self._on_tasks_changed = on_tasks_changed
        self._clock: SchedulerClock = clock or WallClock()
        self._on_sync = on_sync
        self._started = False
        self._jobs: dict[str, datetime] = {}  # task id -> the due time it fires next (active, not in flight)
        self._inflight: dict[str, tuple[TaskRun, asyncio.Task[None]]] = {}  # task id -> its run in flight
        self._loop: asyncio.Task[None] | None = None
        self._jobs_changed = asyncio.Event()  # a sync changed the jobs: the loop's nap is for the wrong time

    # lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        """Mark runs a crash left `running` as interrupted, then schedule every active task from the table."""
        with self._db.tx() as conn:
            interrupted = claims.recover(conn, now=self._clock.now())
        for record in interrupted:
            logger.warning(
                "task %s: the run due %s was interrupted by a host crash; it is not repeated",
                record.task_id,
                iso(record.due_at),
            )
        self._started = True
        self.sync()
        self._loop = asyncio.create_task(self._fire_loop(), name="scheduler:loop")
        logger.info("scheduler started: %d task job(s), zone %s, grace %g s", len(self._jobs), self._zone, self.grace)

    async def stop(self) -> None:
        """Stop firing; runs in flight are cancelled and recorded `interrupted` (not repeated)."""
        self._started = False
        if self._loop is not None:
            self._loop.cancel()
            await asyncio.gather(self._loop, return_exceptions=True)
            self._loop = None
        self._jobs.clear()
        inflight = list(self._inflight.values())
        for _, running in inflight:
            running.cancel()
        await asyncio.gather(*(running for _, running in inflight), return_exceptions=True)
        # Recorded here, not in the run: a run cancelled before its first step never sees its cancellation.
        if inflight:
            with self._db.tx() as conn:
                for run, _ in inflight:
                    if claims.record_interrupted(conn, run, now=self._clock.now()):
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
        if not self._started:
            return
        wanted = {
            task.id: task.next_run
            for task in tasks.list_tasks(self._db.conn)
            if task.status == "active" and task.next_run is not None and task.id not in self._inflight
        }
        if wanted != self._jobs:
            self._jobs = wanted
            self._jobs_changed.set()
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
        now = self._clock.now()
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
                    conn, task_id=task_id, due_at=due_at, now=self._clock.now(), zone=self._zone, grace=self.grace
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
                    now=self._clock.now(),
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

    async def _fire_loop(self) -> None:
        """Nap until the earliest job is due, then fire every job due by the clock; sync every SYNC_SECONDS.

        A sync that changes the jobs cuts the nap short (a new task may be due sooner). With no job (no task, or
        only `when` tasks) nothing can be due: the loop waits for the next sync or a sync's change only, and an
        idle daemon is not woken every second for nothing.
        """
        loop = asyncio.get_running_loop()
        next_sync = loop.time() + SYNC_SECONDS
        while True:
            self._jobs_changed.clear()
            nap = asyncio.ensure_future(self._clock.nap(min(self._jobs.values(), default=None)))
            changed = asyncio.ensure_future(self._jobs_changed.wait())
            try:
                await asyncio.wait(
                    (nap, changed), timeout=max(0.0, next_sync - loop.time()), return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                for waiting in (nap, changed):
                    waiting.cancel()
                await asyncio.gather(nap, changed, return_exceptions=True)
            try:
                if loop.time() >= next_sync:
                    next_sync = loop.time() + SYNC_SECONDS
                    self.sync()
                await self._fire_due()
            except Exception:
                logger.exception("the scheduler could not sync or fire its jobs")

    async def _fire_due(self) -> None:
        """Fire every job due by the clock now, earliest first (each fire re-syncs the jobs)."""
        now = self._clock.now()
        for task_id, due in sorted(self._jobs.items(), key=lambda job: job[1]):
            if due > now:
                break
            if self._jobs.get(task_id) == due:  # not moved by the fires before it
                del self._jobs[task_id]
                await self._fire(task_id, iso(due) or "")


def _ids(run: TaskRun) -> dict[str, object]:
    """The ids a log line about a task run carries as `extra` (JSON logs show them as fields)."""
    return {"taskId": run.task.id, "group": run.task.group_folder, "taskRunId": run.run_id}
