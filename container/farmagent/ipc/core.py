"""IpcCore: write a request, wait for its result, read the snapshots, and tell a dead host from a slow one."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

from farmagent.config import WAIT_MODES, WaitMode
from farmagent.errors import HostUnavailableError, InvalidRequestError, NoResultError, ProtocolError
from farmagent.ipc.files import read_json, remove, write_atomic
from farmagent.ipc.results import IpcResult, parse_result
from farmagent.ipc.waiting import ResultWatch
from farmagent.wire import (
    AVAILABLE_GROUPS,
    CURRENT_TASKS,
    DEFAULT_TIMEOUT,
    HOST_STATUS,
    QUEUE_DIRS,
    QUEUE_OF_TYPE,
    RESULTS_DIR,
    STALE_HEARTBEAT_SECONDS,
    request_id_problem,
)

# memory_get returns up to 2000 lines and ha_get_status up to 500 full states: a few MiB at most.
MAX_RESULT_BYTES: Final = 8 << 20
MAX_SNAPSHOT_BYTES: Final = 4 << 20
# While waiting, host_status.json is re-read this often, so a host that stops is noticed within a second.
HOST_CHECK_SECONDS: Final = 1.0


def new_request_id() -> str:
    """A fresh requestId: sortable (nanoseconds first, so queues run in write order) and unique (random tail)."""
    return f"{time.time_ns()}-{secrets.token_hex(4)}"


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _stamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


class IpcCore:
    """The request/result mechanics over one group's IPC directory (`/workspace/ipc` in the sandbox).

    Args:
        ipc_dir: the group's IPC directory (holds `messages/`, `tasks/`, `actions/`, `action_results/`).
        mode: `inotify` (default; falls back to polling when the directory cannot be watched) or `poll`.
        timeout: default seconds to wait for a result (a farm action whose tool table entry says more waits that).
        stale_after: a heartbeat older than this many seconds means the host is gone.
        clock: the current UTC time (heartbeat ages, `expiresAt`).
    """

    def __init__(
        self,
        ipc_dir: Path | str,
        *,
        mode: WaitMode = "inotify",
        timeout: float = DEFAULT_TIMEOUT,
        stale_after: float = STALE_HEARTBEAT_SECONDS,
        clock: Callable[[], datetime] = _utc_now,
    ) -> None:
        if mode not in WAIT_MODES:
            raise ValueError(f"mode must be one of {', '.join(WAIT_MODES)}, not {mode!r}")
        self.ipc_dir = Path(ipc_dir)
        self.mode: WaitMode = mode
        self.timeout = timeout
        self.stale_after = stale_after
        self._clock = clock
        self.last_wait_mode: WaitMode | None = None  # how the last wait actually slept (after any fallback)

    # Requests ------------------------------------------------------------------------------------

    def request(
        self,
        payload: Mapping[str, Any],
        *,
        request_id: str | None = None,
        timeout: float | None = None,
        ttl: float | None = None,
    ) -> IpcResult:
        """Write one request and wait for its result; an error *result* is returned, not raised.

        Args:
            payload: the request without `requestId` (its `type` picks the queue).
            request_id: the id to use (default: a new sortable one); must match the contract's pattern.
            timeout: seconds to wait (default: the client's). The request carries `expiresAt` = now + timeout,
                so the host never executes a request nobody waits for any more.
            ttl: optional `ttl` for the host (seconds from when it picks the file up).

        Raises:
            InvalidRequestError: bad requestId or unknown request type; nothing was written.
            HostUnavailableError: the host is stopped or gone; the request was withdrawn if still unclaimed.
            NoResultError: no result within `timeout`.
            ProtocolError: the result file is not a valid result.
        """
        wait = self.timeout if timeout is None else timeout
        rid = self.submit(payload, request_id=request_id, expires_in=wait, ttl=ttl)
        return self.wait(rid, queue=QUEUE_OF_TYPE[str(payload["type"])].value, timeout=wait)

    def submit(
        self,
        payload: Mapping[str, Any],
        *,
        request_id: str | None = None,
        expires_in: float | None = None,
        ttl: float | None = None,
    ) -> str:
        """Write a request into its queue (atomically) without waiting; returns its requestId.

        Raises:
            InvalidRequestError: bad requestId or unknown request type.
            HostUnavailableError: the host is stopped or gone (checked first; nothing is written).
        """
        kind = payload.get("type")
        if kind not in QUEUE_OF_TYPE:
            raise InvalidRequestError(f"unknown request type {kind!r}; known: {', '.join(QUEUE_OF_TYPE)}")
        rid = new_request_id() if request_id is None else request_id
        problem = request_id_problem(rid)
        if problem:
            raise InvalidRequestError(problem)
        document = {**payload, "requestId": rid}
        if expires_in is not None:
            document["expiresAt"] = _stamp(self._clock() + timedelta(seconds=expires_in))
        if ttl is not None:
            document["ttl"] = ttl
        self.host_alive()
        return self.write(QUEUE_OF_TYPE[str(kind)].value, document)

    def write(self, queue: str, document: Mapping[str, Any]) -> str:
        """Write `document` into `queue` exactly as given (atomically), without checks of its content.

        The primitive under `submit`, for a caller that sends what someone else wrote (`farmhost ipc send`): the
        host is the one that judges the request. Returns the document's `requestId`, or a new one added to it.

        Raises:
            InvalidRequestError: not a queue of the contract, or a `requestId` the host would refuse as a name.
            HostUnavailableError: the queue directory cannot be written.
        """
        if queue not in QUEUE_DIRS:
            raise InvalidRequestError(f"unknown queue {queue!r}; queues: {', '.join(QUEUE_DIRS)}")
        rid = document.get("requestId")
        if rid is None:
            rid = new_request_id()
            document = {**document, "requestId": rid}
        problem = request_id_problem(rid)
        if problem:
            raise InvalidRequestError(problem)
        queue_dir = self.ipc_dir / queue
        data = json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        try:
            write_atomic(queue_dir, f"{rid}.json", data)
        except OSError as err:
            raise HostUnavailableError(f"cannot write into {queue_dir} ({err.strerror})") from None
        return str(rid)

    def wait(self, request_id: str, *, queue: str | None = None, timeout: float | None = None) -> IpcResult:
        """Wait for `action_results/<request_id>.json`, read it (no links, size-capped), delete it, parse it.

        Args:
            request_id: the request's id.
            queue: the queue it was written to; lets a timeout or a dead host withdraw it unexecuted.
            timeout: seconds (default: the client's).

        Raises:
            HostUnavailableError, NoResultError, ProtocolError: see `request`.
        """
        results = self.ipc_dir / RESULTS_DIR
        name = f"{request_id}.json"
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        next_check = time.monotonic() + HOST_CHECK_SECONDS
        with ResultWatch(results, mode=self.mode) as watch:
            self.last_wait_mode = watch.mode
            while True:
                found = self._take(results, name, request_id)
                if found is not None:
                    return found
                now = time.monotonic()
                if now >= deadline:
                    withdrawn = self._withdraw(queue, name)
                    raise NoResultError(self._late(request_id, withdrawn), request_id=request_id, withdrawn=withdrawn)
                if now >= next_check:
                    next_check = now + HOST_CHECK_SECONDS
                    self._check_while_waiting(results, name, request_id, queue)
                watch.sleep(min(deadline, next_check) - now)

    def _check_while_waiting(self, results: Path, name: str, request_id: str, queue: str | None) -> None:
        try:
            self.host_alive()
        except HostUnavailableError as err:
            if self._withdraw(queue, name):
                raise HostUnavailableError(
                    f"{err.message}; the request {request_id} was withdrawn unexecuted"
                ) from None
            raise HostUnavailableError(
                f"{err.message}; it had already picked up {request_id}, whose result may appear in {results}"
            ) from None

    def _take(self, results: Path, name: str, request_id: str) -> IpcResult | None:
        try:
            document = read_json(results, name, max_bytes=MAX_RESULT_BYTES)
        except ProtocolError:
            remove(results / name)  # a bad entry under our name must not answer the next wait either
            raise
        if document is None:
            return None
        remove(results / name)
        return parse_result(document, request_id=request_id)

    def _withdraw(self, queue: str | None, name: str) -> bool:
        # The host claims a request by renaming it away, so the unlink either wins (never executed) or finds nothing.
        return queue is not None and remove(self.ipc_dir / queue / name)

    def _late(self, request_id: str, withdrawn: bool) -> str:
        if withdrawn:
            return f"no result for {request_id} in time; the host had not picked it up, so it was withdrawn unexecuted"
        return (
            f"no result for {request_id} in time; the host is working on it and its result will still appear "
            f"in {self.ipc_dir / RESULTS_DIR} (check the state before retrying)"
        )

    # Snapshots and the heartbeat -----------------------------------------------------------------

    def host_status(self) -> dict[str, Any]:
        """`host_status.json`: `{status, pid, version, startedAt, heartbeatAt}`.

        Raises:
            HostUnavailableError: the file does not exist (no host ever served this group).
            ProtocolError: the file is not a JSON object.
        """
        document = self._snapshot(HOST_STATUS)
        if not isinstance(document, dict):
            raise ProtocolError(f"{self.ipc_dir / HOST_STATUS} is not a JSON object")
        return document

    def host_alive(self) -> dict[str, Any]:
        """Return `host_status.json` when the host is alive with a fresh heartbeat.

        Raises:
            HostUnavailableError: stopped, heartbeat older than `stale_after` (or unreadable), or no status file.
        """
        try:
            status = self.host_status()
        except ProtocolError as err:
            raise HostUnavailableError(f"farmhost is not available: {err.message}") from None
        beat = status.get("heartbeatAt")
        if status.get("status") != "alive":
            raise HostUnavailableError(f"farmhost is stopped (status {status.get('status')!r}, last heartbeat {beat})")
        try:
            at = datetime.fromisoformat(str(beat))
        except ValueError:
            raise HostUnavailableError(f"farmhost's heartbeat {beat!r} is not a timestamp") from None
        if at.tzinfo is None:
            at = at.replace(tzinfo=UTC)
        age = (self._clock() - at).total_seconds()
        if age > self.stale_after:
            raise HostUnavailableError(
                f"farmhost is gone: its last heartbeat ({beat}) is {age:.0f} s old (it beats every 5 s)"
            )
        return status

    def current_tasks(self) -> list[dict[str, Any]]:
        """`current_tasks.json`: the tasks this group may see (all of them from main).

        Raises:
            HostUnavailableError: not written yet. ProtocolError: not a list of objects.
        """
        document = self._snapshot(CURRENT_TASKS)
        if not isinstance(document, list) or not all(isinstance(item, dict) for item in document):
            raise ProtocolError(f"{self.ipc_dir / CURRENT_TASKS} is not a list of tasks")
        return document

    def available_groups(self) -> dict[str, Any]:
        """`available_groups.json`: `{groups: [...], lastSync}` (an empty list outside main).

        Raises:
            HostUnavailableError: not written yet. ProtocolError: not the documented shape.
        """
        document = self._snapshot(AVAILABLE_GROUPS)
        if not isinstance(document, dict) or not isinstance(document.get("groups"), list):
            raise ProtocolError(f"{self.ipc_dir / AVAILABLE_GROUPS} is not {{groups: [...], lastSync}}")
        return document

    def _snapshot(self, name: str) -> Any:
        document = read_json(self.ipc_dir, name, max_bytes=MAX_SNAPSHOT_BYTES)
        if document is None:
            where = self.ipc_dir / name
            raise HostUnavailableError(f"{where} does not exist: no farmhost has served this IPC directory yet")
        return document
