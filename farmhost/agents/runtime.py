"""AgentRuntime: queues agent runs per group and runs each one in its sandbox, with limits, logs and the LLM proxy."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any, Final

from farmhost.agents.disk_watch import DiskWatch
from farmhost.agents.fallback import (
    ASSISTANT_NAME,
    WHY_LLM_FAILED,
    WHY_NO_LLM,
    AssistFallback,
    AssistUnavailable,
)
from farmhost.agents.inputs import AgentResult, agent_input, parse_result, trim_memory, with_notes
from farmhost.agents.jobs import AgentJob, AgentOutcome, Status
from farmhost.agents.kinds import AgentKind, agent_kind
from farmhost.agents.launch import Exit, Launch, end_container
from farmhost.agents.limits import LimitsReader
from farmhost.agents.photos import PhotoError, PhotoPreparer, PreparedPhoto
from farmhost.agents.proxy.budget import REQUESTS_PER_TURN, ProxyUsage
from farmhost.agents.proxy.server import LlmProxy
from farmhost.agents.queue import CHAT, SCHEDULED, QueueClosed, RunQueue
from farmhost.agents.runlog import RunRecord, log_name, write_run_log_sync
from farmhost.agents.sandbox.backends import (
    SandboxBackend,
    SandboxError,
    cleanup_orphans,
    create_backend,
    ensure_no_secrets,
    for_identity,
    group_ids,
)
from farmhost.agents.sandbox.backends.base import LaunchPlan, SandboxSpec
from farmhost.agents.sandbox.backends.bwrap import BwrapBackend
from farmhost.agents.sandbox.backends.docker import DockerBackend
from farmhost.agents.sandbox.cgroups import CgroupSupport, detect_sync, open_run_cgroup_sync
from farmhost.agents.sandbox.group_trees import GroupTrees
from farmhost.agents.sandbox.identity import GroupIds, IdentityError
from farmhost.agents.sandbox.mounts import sandbox_spec
from farmhost.config import AgentSettings
from farmhost.farm.state.receipts import ReceiptBook
from farmhost.layout import DataLayout
from farmhost.store.db import now_utc
from farmhost.store.groups import Group

logger = logging.getLogger(__name__)

# SIGTERM first so an agent can save its conversation; this long later, SIGKILL.
TERM_GRACE: Final = 5.0
# On daemon stop the whole stop must fit in the contract's 10 s: a shorter grace for running agents.
STOP_GRACE: Final = 2.0
# The memory search takes the prompt as its query; past this the extra words only dilute the BM25 scores.
MEMORY_QUERY_CHARS: Final = 1000

BeforeRun = Callable[[str], Awaitable[None]]
MemorySnippets = Callable[[str, str], Awaitable[list[dict[str, Any]]]]
# `folder -> notes`: what the host has to tell the group's agent (approvals decided since its last run), each
# note given once; they come before the prompt.
HostNotes = Callable[[str], list[str]]
GroupLookup = Callable[[str], Group | None]


NO_LLM: Final = (
    "no LLM is configured: set FARMHOST_LLM_BASE_URL and FARMHOST_LLM_MODEL (and FARMHOST_LLM_API_KEY) "
    "in .env, see docs/configuration.md"
)


class AgentRuntime:
    """Runs agents: one run per group at a time, `max_agents` at once, scheduled jobs before chat jobs."""

    def __init__(
        self,
        *,
        settings: AgentSettings,
        layout: DataLayout,
        group: GroupLookup,
        before_run: BeforeRun,
        memory_snippets: MemorySnippets,
        command: Sequence[str] | None = None,
        backend: SandboxBackend | None = None,
        proxy: LlmProxy | None = None,
        term_grace: float = TERM_GRACE,
        fallback: AssistFallback | None = None,
        host_notes: HostNotes | None = None,
        receipts: ReceiptBook | None = None,
    ) -> None:
        """Build the runtime; nothing starts before `start()`.

        Args:
            settings: the runtime's section: kind, limits, the LLM proxy's and the sandbox's sections, time zone.
            layout: the data directory.
            group: the registry lookup: the Group of a folder, None when it is not registered.
            before_run: awaited with the folder before each run (the app rewrites that group's snapshots).
            memory_snippets: `(folder, prompt) -> hits` (MemoryService.search); trimmed to memory_prompt_chars.
            command: argv inside the sandbox instead of `python -m farmagent.run` (tests run probe scripts).
            backend: a ready backend instead of the one `settings.sandbox.runtime` names.
            proxy: the LLM proxy to serve during runs (default: one built from the settings).
            term_grace: seconds between SIGTERM and SIGKILL when a run times out.
            fallback: who answers a chat message when no LLM is configured or none answers (the daemon gives
                Assist, run through the router's door; None: nobody, the run fails saying why).
            host_notes: what the host tells a group's agent before its prompt (approval outcomes), once each.
            receipts: what farmhost saw change in HA; each outcome carries its run's receipt (None: none).
        """
        self._settings = settings
        self._layout = layout
        self._group = group
        self._before_run = before_run
        self._memory_snippets = memory_snippets
        self._host_notes = host_notes
        self._receipts = receipts
        self._command = tuple(command) if command is not None else None
        self._backend = backend
        self._backend_error: str | None = None
        self._term_grace = term_grace
        self._fallback = fallback
        self._limits = LimitsReader.of(layout.agent_limits, settings)
        self._proxy = proxy or LlmProxy(settings=settings.llm, layout=layout, limits=self._limits)
        self._queue = RunQueue(settings.max_agents)
        self._photos = PhotoPreparer()
        self._active: dict[str, Launch] = {}
        self._finished: set[asyncio.Future[None]] = set()
        self._started = False
        self._stopping = False
        self._cgroups: CgroupSupport | None = None
        self._ids: GroupIds | None = None  # who each group's runs are (set up with the backend)
        # each group's writable trees as the last run left them (journals need runs refused hard links)
        self.trees = GroupTrees(journal=settings.sandbox.seccomp == "required")
        self._paused: str | None = None

    @property
    def backend(self) -> SandboxBackend | None:
        """The sandbox backend in use (None before `start()` or when it could not be set up)."""
        return self._backend

    @property
    def cgroups(self) -> CgroupSupport | None:
        """Where this daemon's bwrap runs get their cgroups, or why none (None: not bwrap, or not started)."""
        return self._cgroups

    async def start(self) -> None:
        """Set up the backend (an unusable one makes every run fail with the reason), clean up, open the proxy."""
        if self._backend is None:
            try:
                self._backend = await create_backend(self._settings.sandbox)
            except SandboxError as err:
                self._backend_error = err.message
                logger.error("agent runs are off: %s", err.message)
        if self._backend is not None:
            self._ids = group_ids(self._settings.sandbox, self._backend)
            await cleanup_orphans(self._backend)
        if isinstance(self._backend, BwrapBackend):  # docker and podman hold their limits themselves
            self._cgroups = await asyncio.to_thread(detect_sync)
            if self._cgroups.available:
                logger.info("agent runs get a cgroup v%d each (memory, processes, CPU)", self._cgroups.version)
            else:
                allowed = self._settings.unenforced_limits == "allow"
                logger.warning(
                    "agent runs cannot get a cgroup here: %s; %s",
                    self._cgroups.reason,
                    "they run with rlimits only (FARMHOST_AGENT_UNENFORCED_LIMITS=allow)"
                    if allowed
                    else "they are refused until cgroups are delegated or FARMHOST_AGENT_UNENFORCED_LIMITS=allow",
                )
        await self._proxy.start()
        self._photos.start()
        self._started = True
        logger.info(
            "agent runtime %s: up to %d run(s) at once, LLM %s",
            self._backend.name if self._backend is not None else "unavailable",
            self._settings.max_agents,
            "on" if self._settings.llm.enabled else "off (FARMHOST_LLM_BASE_URL/FARMHOST_LLM_MODEL not set)",
        )

    async def stop(self) -> None:
        """Cancel queued jobs, end running ones (SIGTERM, SIGKILL after STOP_GRACE) and wait for them."""
        self._stopping = True
        self._queue.close()
        for launch in self._active.values():
            launch.cancel(grace=STOP_GRACE)
        if self._finished:
            await asyncio.wait(self._finished)
        await self._proxy.stop()
        self._photos.stop()
        self.trees.close()
        self._started = False

    async def submit(self, job: AgentJob) -> AgentOutcome:
        """Queue `job` and wait until its run has ended; never raises for a failed run, the outcome says why."""
        if not self._started or self._stopping:
            return self._outcome(job, "cancelled", error="the agent runtime is not running", started=time.monotonic())
        try:
            async with self._queue.turn(job.folder, SCHEDULED if job.scheduled else CHAT):
                return await self._tracked(job)
        except QueueClosed:
            error = "the agent runtime stopped before the run started"
            return self._outcome(job, "cancelled", error=error, started=time.monotonic())

    @property
    def paused(self) -> str | None:
        """Why agent runs are paused (who paused them, when), or None while they run."""
        return self._paused

    def pause(self, reason: str) -> None:
        """Start no run until `resume`; the runs going on now are ended (SIGTERM, SIGKILL after STOP_GRACE)."""
        self._paused = reason
        for launch in self._active.values():
            launch.cancel(grace=STOP_GRACE)
        logger.warning("agent runs paused: %s", reason)

    def resume(self) -> None:
        """Runs start again (what arrived while paused was answered as paused, not kept)."""
        if self._paused is not None:
            logger.warning("agent runs resumed (were paused: %s)", self._paused)
        self._paused = None

    @property
    def running(self) -> list[str]:
        """The run ids of the runs going on now."""
        return list(self._active)

    def queued(self, folder: str) -> int:
        """How many jobs of `folder` wait behind its current run."""
        return self._queue.queued(folder)

    async def _tracked(self, job: AgentJob) -> AgentOutcome:
        finished = asyncio.get_running_loop().create_future()
        self._finished.add(finished)
        began = now_utc()
        try:
            outcome = await self._run(job)
            if self._receipts is None:
                return outcome
            receipt = self._receipts.receipt(group=job.folder, start=began, end=now_utc(), zone=self._settings.zone)
            return replace(outcome, receipt=receipt)
        finally:
            finished.set_result(None)
            self._finished.discard(finished)

    async def _run(self, job: AgentJob) -> AgentOutcome:
        started = time.monotonic()
        try:
            group = self._group(job.folder)
        except Exception as err:
            logger.exception("agent run %s: cannot look up group %s", job.run_id, job.folder, extra=_ids(job))
            return self._outcome(job, "error", error=f"cannot look up group {job.folder!r}: {err}", started=started)
        if group is None:
            logger.warning("agent run %s refused: group %s is not registered", job.run_id, job.folder, extra=_ids(job))
            return self._outcome(job, "error", error=f"group {job.folder!r} is not registered", started=started)
        if self._paused is not None:
            logger.warning("agent run %s for %s not started: paused", job.run_id, job.folder, extra=_ids(job))
            return self._outcome(
                job, "cancelled", error=f"agent runs are paused ({self._paused}); nothing was run", started=started
            )
        try:
            kind = self._kind(job.folder)
        except SandboxError as err:
            return self._outcome(job, "error", error=err.message, started=started)
        no_llm = kind.needs_llm and not self._settings.llm.enabled
        # The built-in runner needs a model: a chat message goes to Assist instead, which needs no sandbox either.
        if no_llm and (words := self._words(job)) is not None:
            return await self._assist(job, group, words, WHY_NO_LLM, NO_LLM, started)
        if self._backend is None:
            logger.warning("agent run %s for %s refused: agent runs are off", job.run_id, job.folder, extra=_ids(job))
            return self._outcome(job, "error", error=f"agent runs are off: {self._backend_error}", started=started)
        if no_llm:
            logger.warning("agent run %s for %s refused: no LLM is configured", job.run_id, job.folder, extra=_ids(job))
            return self._outcome(job, "error", error=NO_LLM, started=started)
        kind = await self._with_context(kind)
        limits = self._limits.limits(job.folder)
        await self._prepare(job.folder)
        hooked = time.monotonic()
        memory = await self._memory(job)
        searched = time.monotonic()
        photos, photo_note = await self._photo(job)
        prepared = time.monotonic()
        if self._stopping:
            error = "the agent runtime stopped before the run started"
            return self._outcome(job, "cancelled", error=error, started=started)
        spec = sandbox_spec(
            self._layout,
            folder=job.folder,
            run_id=job.run_id,
            is_main=group.is_main,
            limits=limits,
            timezone=self._settings.zone.key,
            kind=kind,
            cgroup_memory=self._cgroups is not None and self._cgroups.available,
        )
        document = agent_input(
            self._told(job, photos, photo_note),
            is_main=group.is_main,
            timezone=self._settings.zone.key,
            now=now_utc(),
            memory=memory,
            max_turns=limits.max_turns,
            model=self._settings.llm.model,
            images=photos,
        )
        record = RunRecord(job=job, group=group, limits=limits, backend=self._backend.name, memory=len(memory))
        record.phase("hook", started, hooked)
        since = _record_photo(record, photos, photo_note, record.phase("memory", hooked, searched), prepared)
        try:
            identity = await self._ids.identity(job.folder) if self._ids is not None else None
            plan = for_identity(self._backend, identity).plan(spec)
            ensure_no_secrets(plan, self._secrets())
            await asyncio.to_thread(self.trees.prepare_sync, spec, identity)
            allow = self._settings.unenforced_limits == "allow"
            cgroup = await asyncio.to_thread(
                open_run_cgroup_sync, self._cgroups, job.run_id, limits, allow_without=allow
            )
        except (SandboxError, IdentityError, OSError) as err:
            return await self._failed(record, started, f"cannot prepare the sandbox: {err}")
        record.command = plan.argv
        since = record.phase("sandbox", since)
        logger.info(
            "agent run %s for %s started (%s, %s)",
            job.run_id,
            job.folder,
            record.kind,
            self._backend.name,
            extra={**_ids(job), "event": "run_start", "backend": self._backend.name},
        )
        try:
            budget = REQUESTS_PER_TURN * limits.max_turns
            async with self._proxy.serve(job.folder, job.run_id, max_requests=budget, photos=photos) as usage:
                record.usage = usage
                procs = cgroup.procs_files if cgroup is not None else ()
                stdin = json.dumps(document).encode()
                run = await self._launch(spec, plan, stdin, procs)
        except OSError as err:
            return await self._failed(record, started, f"cannot start the agent: {err}")
        finally:
            since = record.phase("agent", since)
            if cgroup is not None:
                record.out_of_memory = cgroup.hit_memory_limit()
                await asyncio.to_thread(cgroup.close_sync)
            if plan.oom_argv is not None:  # a container: the engine held its cgroup
                record.out_of_memory = await end_container(plan) or record.out_of_memory
            await asyncio.to_thread(self.trees.after_run_sync, spec)
            record.phase("cleanup", since)
        outcome = await self._after_run(job, group, await self._finish(record, run, started), record.usage, started)
        return _with_photo_note(job, outcome, photo_note, record.usage)

    def _told(self, job: AgentJob, photos: tuple[PreparedPhoto, ...], photo_note: str | None) -> AgentJob:
        """The job as the agent is told it: the host's notes before the prompt; after it, why a photo is missing."""
        told = with_notes(job, self._host_notes(job.folder) if self._host_notes is not None else [])
        if job.photo is not None and not photos and self._settings.llm.vision:  # without vision: as ever
            told = replace(
                told, prompt=f"{told.prompt}\n[farmhost: the photo {job.photo} is not attached: {photo_note}]"
            )
        return told

    async def _photo(self, job: AgentJob) -> tuple[tuple[PreparedPhoto, ...], str | None]:
        """The job's photo as a model that can see gets it, or none and why the model gets no image."""
        if job.photo is None:
            return (), None
        if not self._settings.llm.vision:
            return (), "the farm's model cannot see photos"
        try:
            photo = await self._photos.prepare(self._layout.workspace(job.folder), job.photo)
        except PhotoError as err:
            logger.warning("agent run %s for %s: the photo %s is not shown to the model: %s", job.run_id, job.folder,
                           job.photo, err.message, extra=_ids(job))  # fmt: skip
            return (), err.message
        return (photo,), None

    def _words(self, job: AgentJob) -> str | None:
        """What Assist should hear of the job (None: no fallback, or the job is no chat message)."""
        return self._fallback.words(job) if self._fallback is not None else None

    async def _after_run(
        self, job: AgentJob, group: Group, outcome: AgentOutcome, usage: ProxyUsage | None, started: float
    ) -> AgentOutcome:
        """Assist when no LLM endpoint answered the run at all; the fallback endpoint named when one answered."""
        if usage is None:
            return outcome
        # Only a run that got no answer from any endpoint at all: one that failed later may have acted already.
        if outcome.status in ("error", "timeout") and usage.upstream_failures and not usage.upstream_answers:
            words = self._words(job)
            if words is not None:
                return await self._assist(job, group, words, WHY_LLM_FAILED, outcome.error or outcome.status, started)
        if outcome.status == "ok" and any(number != 1 for number in usage.answered_by):
            return self._by_fallback(outcome, usage.answered_by)
        return outcome

    def _by_fallback(self, outcome: AgentOutcome, answered_by: dict[int, str]) -> AgentOutcome:
        """The answer, saying which fallback LLM endpoint gave it (the farmer should know it is not the usual one)."""
        first = self._settings.llm.endpoints[0]
        used = [f"endpoint {n}, {label}" for n, label in sorted(answered_by.items()) if n != 1]
        some = "partly " if 1 in answered_by else ""
        note = f"({some}answered by the fallback LLM {' and '.join(used)}: endpoint 1, {first.label}, did not answer)"
        answer = f"{(outcome.answer or '').rstrip()}\n\n{note}".lstrip()
        return replace(outcome, answer=answer, answered_by=" and ".join(used))

    async def _assist(
        self, job: AgentJob, group: Group, words: str, why: str, llm_error: str, started: float
    ) -> AgentOutcome:
        """The outcome of asking Home Assistant's Assist instead (ok with its speech, or an error saying both)."""
        assert self._fallback is not None, "words come only from a fallback"
        try:
            speech = await self._fallback.answer(job, group, words)
        except AssistUnavailable as err:
            logger.warning("agent run %s for %s: %s, and Assist could not answer: %s", job.run_id, job.folder, why,
                           err.message, extra=_ids(job))  # fmt: skip
            error = f"{llm_error}; Home Assistant's Assist could not answer either: {err.message}"
            return self._outcome(job, "error", error=error, started=started)
        logger.info("agent run %s for %s answered by Home Assistant's Assist (%s)", job.run_id, job.folder, why,
                    extra={**_ids(job), "event": "run_end", "status": "ok", "answeredBy": ASSISTANT_NAME})  # fmt: skip
        outcome = self._outcome(job, "ok", answer=speech, started=started)
        return replace(outcome, answered_by=ASSISTANT_NAME, fallback_why=why)

    def _kind(self, folder: str) -> AgentKind:
        if self._command is not None:  # tests run their probes as a command
            return AgentKind(name="command", argv=self._command, needs_llm=False)
        name, command = self._limits.agent_choice(folder, self._settings.kind, self._settings.command)
        in_image = isinstance(self._backend, DockerBackend)
        return agent_kind(name, command, self._settings.opencode_bin, in_image=in_image)

    async def _with_context(self, kind: AgentKind) -> AgentKind:
        """The kind with the endpoints' context, for the runners that can use it.

        The built-in runner trims its prompt to it (budget.py); OpenCode gets it as the model's limit (opencode_run).
        """
        if kind.name not in ("farmagent", "opencode"):
            return kind
        context = await self._proxy.context_size()
        if context is None:
            return kind
        env = {"FARMAGENT_LLM_CONTEXT_TOKENS": str(context.tokens), "FARMAGENT_LLM_CONTEXT_SOURCE": context.source}
        return replace(kind, env={**kind.env, **env})

    async def _prepare(self, folder: str) -> None:
        try:
            await self._before_run(folder)
        except Exception:
            logger.exception("group %s: the pre-run hook failed; the agent may see stale snapshots", folder)

    async def _memory(self, job: AgentJob) -> list[dict[str, str]]:
        budget = self._settings.memory_prompt_chars
        if budget <= 0 or not job.prompt.strip():
            return []
        try:
            hits = await self._memory_snippets(job.folder, job.prompt[:MEMORY_QUERY_CHARS])
        except Exception:
            logger.exception("group %s: memory search for the run's prompt failed; running without memory", job.folder)
            return []
        return trim_memory(hits, budget)

    async def _launch(self, spec: SandboxSpec, plan: LaunchPlan, stdin: bytes, cgroup_procs: tuple[str, ...]) -> Exit:
        output = self._settings.output_bytes
        launch = Launch(plan, output_bytes=output, term_grace=self._term_grace, cgroup_procs=cgroup_procs)
        watch = DiskWatch(spec, reserve_mb=self._settings.disk_reserve_mb, end=launch.end)
        self._active[spec.run_id] = launch
        watching = asyncio.create_task(watch.run(), name="agent:disk")
        try:
            if self._stopping:
                launch.cancel(grace=STOP_GRACE)
            return await launch.run(stdin, timeout=spec.limits.timeout_seconds)
        finally:
            del self._active[spec.run_id]
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)

    async def _finish(self, record: RunRecord, run: Exit, started: float) -> AgentOutcome:
        job, log = record.job, log_name(record.job.run_id)
        answer: str | None = None
        error: str | None
        status: Status
        if run.cancelled:
            status, error = "cancelled", "the agent runtime stopped while the run was going on"
        elif run.ended is not None:
            status, error = "error", run.ended
        elif run.timed_out:
            status, error = "timeout", f"the run took longer than {record.limits.timeout_seconds:g} s and was stopped"
        else:
            result = parse_result(run.stdout.last_line())
            if isinstance(result, AgentResult):
                status, answer, error = result.status, result.answer, result.error
                if status == "error" and not error:
                    error = f"the agent reported an error without saying why (exit code {run.exit_code})"
                record.result = result
            else:
                status = "error"
                error = f"{result} (exit code {run.exit_code}); see logs/runs/{job.folder}/{log} in the data dir"
        if record.out_of_memory and status != "ok":
            killed = f"the run reached its memory limit ({record.limits.memory_mb} MB) and the kernel killed a process"
            error = f"{killed}; {error}" if error else killed
        record.exit = run
        outcome = self._outcome(job, status, answer=answer, error=error, started=started, exit_code=run.exit_code)
        outcome = replace(outcome, phases_ms=dict(record.phases_ms))
        logged = time.monotonic()
        await self._write_log(record, outcome)
        record.phase("log", logged)
        outcome = replace(outcome, phases_ms=record.phases_ms)
        usage = record.usage
        logger.info(
            "agent run %s for %s ended: %s%s, exit code %s, %.1f s, %d LLM request(s), %d+%d tokens",
            job.run_id,
            job.folder,
            status,
            f" ({error})" if error and status != "ok" else "",
            run.exit_code,
            outcome.duration_seconds,
            usage.requests if usage else 0,
            usage.prompt_tokens if usage else 0,
            usage.completion_tokens if usage else 0,
            extra={
                **_ids(job),
                "event": "run_end",
                "status": status,
                "exitCode": run.exit_code,
                "durationS": round(outcome.duration_seconds, 3),
                "phasesMs": outcome.phases_ms,
            },
        )
        return outcome

    async def _failed(self, record: RunRecord, started: float, error: str) -> AgentOutcome:
        logger.error(
            "agent run %s for %s: %s",
            record.job.run_id,
            record.job.folder,
            error,
            extra={**_ids(record.job), "event": "run_end", "status": "error"},
        )
        outcome = self._outcome(record.job, "error", error=error, started=started)
        await self._write_log(record, outcome)
        return outcome

    async def _write_log(self, record: RunRecord, outcome: AgentOutcome) -> None:
        try:
            await asyncio.to_thread(
                write_run_log_sync, self._layout.run_logs(record.job.folder), record.job.run_id, record.render(outcome)
            )
        except OSError as err:
            logger.error(
                "agent run %s for %s: cannot write its log: %s",
                record.job.run_id,
                record.job.folder,
                err,
                extra=_ids(record.job),
            )

    def _outcome(
        self,
        job: AgentJob,
        status: Status,
        *,
        started: float,
        answer: str | None = None,
        error: str | None = None,
        exit_code: int | None = None,
    ) -> AgentOutcome:
        return AgentOutcome(
            run_id=job.run_id,
            status=status,
            answer=answer,
            error=error,
            duration_seconds=time.monotonic() - started,
            exit_code=exit_code,
            log_path=self._layout.run_logs(job.folder) / log_name(job.run_id),
        )

    def _secrets(self) -> list[str | None]:
        return list(self._settings.secrets)


def _record_photo(
    record: RunRecord, photos: tuple[PreparedPhoto, ...], note: str | None, start: float, end: float
) -> float:
    """The run log's line and phase for the job's photo (none without one); returns when the next phase starts."""
    if record.job.photo is None:
        return start
    if photos:
        photo = photos[0]
        record.photo = f"{photo.path} attached as a {photo.width}x{photo.height} JPEG of {len(photo.jpeg) // 1024} KB"
    else:
        record.photo = f"{record.job.photo} not attached: {note}"
    return record.phase("photo", start, end)


def _with_photo_note(job: AgentJob, outcome: AgentOutcome, why: str | None, usage: ProxyUsage | None) -> AgentOutcome:
    """The outcome with the line the chat's reply ends with when the model did not see the message's photo.

    `why` is set when no image was attached; an attached one was still not seen by a fallback without vision.
    """
    if why is None and usage is not None and usage.unseen_by:
        why = f"an LLM that answered ({' and '.join(sorted(usage.unseen_by.values()))}) cannot see photos"
    if why is None:
        return outcome
    return replace(outcome, photo_note=f"(The model did not see your photo, saved as {job.photo}: {why}.)")


def _ids(job: AgentJob) -> dict[str, str]:
    """The ids a log line about `job` carries as `extra` (JSON logs show them as fields)."""
    ids = {"runId": job.run_id, "group": job.folder}
    if job.task_id:
        ids["taskId"] = job.task_id
    return ids
