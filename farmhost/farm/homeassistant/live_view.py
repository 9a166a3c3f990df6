"""The live view of Home Assistant: one WebSocket following `state_changed`, every entity's state and who changed it.

One connection authenticates with farmhost's token, learns farmhost's own HA user (`auth/current_user`),
subscribes to `state_changed` and loads every state (`get_states`) at start and after each reconnect, so a
change made while the socket was down is seen at the resync (states carry their context there too). Per entity
it keeps the state, the attributes, when farmhost first saw it in its current on/off state (an `unavailable`
blip, a reload or an HA restart that leaves it on does not move that moment) and the last change's context.

A change is the agents' when its context's user is farmhost's own HA user, or its parent context was the
agents' (an automation or script that an agent's change started). People's changes (another HA user, a wall
switch, an automation of the farmer's) are not. Listeners are called with every change, in order, on the loop.
Nothing is polled: a steady farm costs Home Assistant no request at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Final

import aiohttp

from farmhost.farm.control.safe_state import UNKNOWN_STATES, is_on
from farmhost.farm.homeassistant.names import friendly_name
from farmhost.store.db import now_utc

logger = logging.getLogger(__name__)

# Reconnect backoff: first retry soon (an HA restart takes ~7 s here, 30-90 s on a Pi), then at most every 10 s,
# so the view is back within seconds of HA and an HA that is away costs one connection attempt per 10 s.
BACKOFF_FIRST: Final = 0.5
BACKOFF_MAX: Final = 10.0
# A token HA refuses is not retried quickly: the operator must fix it, and HA bans an IP after repeated failures.
AUTH_RETRY_SECONDS: Final = 60.0
# Each command of the handshake answers within this (get_states of a large install is the slowest, ~1 MB).
COMMAND_TIMEOUT: Final = 30.0
# A ping this often: a half-open connection (HA's host lost power) is noticed within 2 heartbeats.
HEARTBEAT_SECONDS: Final = 15.0
# Contexts remembered for attribution: an automation fired by an agent's change follows it within seconds;
# 4096 contexts cover minutes of a busy install and cost well under 1 MB.
CONTEXTS_KEPT: Final = 4096


@dataclass(frozen=True, kw_only=True)
class Context:
    """A Home Assistant context: its id, the context that caused it and the HA user behind it."""

    id: str
    parent_id: str | None = None
    user_id: str | None = None

    @classmethod
    def of(cls, raw: object) -> Context:
        """The context of an event or state (an empty one when HA gave none)."""
        doc = raw if isinstance(raw, Mapping) else {}
        return cls(id=_str(doc.get("id")) or "", parent_id=_str(doc.get("parent_id")), user_id=_str(doc.get("user_id")))

    def to_json(self) -> dict[str, str | None]:
        """The context as the audit log and messages show it."""
        return {"id": self.id, "parentId": self.parent_id, "userId": self.user_id}


@dataclass(frozen=True, kw_only=True)
class EntityView:
    """What the view knows of one entity."""

    entity_id: str
    state: str
    attributes: Mapping[str, Any] = field(default_factory=dict)
    last_changed: datetime | None = None  # HA's
    last_updated: datetime | None = None  # HA's; orders a resync's states against events already seen
    on: bool | None = None  # the last known on/off (an unknown state keeps the one before)
    on_since: datetime | None = None  # when farmhost first saw it in `on` (HA's last_changed when it was away)
    after_off: bool = False  # farmhost saw it off before this on-period (not first seen on, after a start)
    known_state: str | None = None  # the last state that was not unavailable/unknown (kept over a blip)
    context: Context = field(default_factory=lambda: Context(id=""))

    @property
    def name(self) -> str:
        """The friendly name and id ("Irrigation pump (switch.irrigation_pump)"), or the id alone."""
        name = friendly_name(self.attributes)
        return f"{name} ({self.entity_id})" if name else self.entity_id


@dataclass(frozen=True, kw_only=True)
class StateChange:
    """One change of one entity, as the listeners get it."""

    entity_id: str
    old: EntityView | None  # None: the first time farmhost sees the entity (at start): nothing to compare
    new: EntityView
    context: Context
    agents: bool  # made by farmhost's HA user, or caused by a change that was
    seen_at: float  # time.monotonic() when the event arrived (the undo latency starts here)
    resync: bool = False  # found by a get_states after a (re)connect, not by an event


Listener = Callable[[StateChange], None]
# Told when the view starts or stops following HA: (following, a sentence: how many states, or what broke).
LinkWatcher = Callable[[bool, str], None]


class LiveView:
    """The one WebSocket to Home Assistant and what it shows; started by the app when HA is configured."""

    def __init__(
        self,
        *,
        ws_url: str,
        token: str,
        clock: Callable[[], datetime] = now_utc,
        backoff_first: float = BACKOFF_FIRST,
        backoff_max: float = BACKOFF_MAX,
        on_link: LinkWatcher | None = None,
    ) -> None:
        self.ws_url = ws_url
        self._on_link = on_link
        self._token = token.strip()
        self._clock = clock
        self._backoff = (backoff_first, backoff_max)
        self._entities: dict[str, EntityView] = {}
        self._contexts: OrderedDict[str, bool] = OrderedDict()
        self._origins: OrderedDict[str, str] = OrderedDict()  # context id -> the entity whose change first carried it
        self._drives: dict[str, set[str]] = {}  # entity -> the entities seen changing in its change's context
        self._listeners: list[Listener] = []
        self._task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._synced = asyncio.Event()
        self.user_id: str | None = None
        self.user_is_owner: bool | None = None
        self.syncs = 0  # completed get_states (1 + reconnects): tests and doctor read it
        self.commands = 0  # requests sent to HA (the benchmark compares it with polling)

    def __repr__(self) -> str:
        return f"LiveView({self.ws_url!r})"  # never the token

    # ---- lifecycle

    async def start(self) -> None:
        """Connect in the background (returns at once; HA may be away)."""
        if self._task is None:
            self._session = aiohttp.ClientSession()
            self._task = asyncio.create_task(self._run(), name="ha-live-view")

    async def stop(self) -> None:
        """Close the socket and stop reconnecting."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def drop(self) -> None:
        """Close the current socket as if the network had dropped it (it reconnects and resyncs)."""
        if self._ws is not None:
            await self._ws.close()

    # ---- what it shows

    @property
    def connected(self) -> bool:
        """Following HA's events now (connected and synced)."""
        return self._synced.is_set()

    async def wait_synced(self, timeout: float) -> bool:
        """Wait until the view is connected and synced; False when it is not within `timeout`."""
        try:
            async with asyncio.timeout(timeout):
                await self._synced.wait()
        except TimeoutError:
            return False
        return True

    def get(self, entity_id: str) -> EntityView | None:
        """The entity as last seen (None: never seen)."""
        return self._entities.get(entity_id)

    def entities(self) -> dict[str, EntityView]:
        """Every entity as last seen (a copy)."""
        return dict(self._entities)

    def drives(self) -> dict[str, frozenset[str]]:
        """Each entity seen driving others: their change came in its change's context (a template, an automation).

        Learned from the changes seen since farmhost started (HA does not say which helper a template follows).
        """
        return {entity: frozenset(driven) for entity, driven in self._drives.items()}

    def add_listener(self, listener: Listener) -> None:
        """Call `listener` with every change from now on (it must not block: it runs on the reader)."""
        self._listeners.append(listener)

    def is_agents(self, context: Context) -> bool:
        """The context is the agents': farmhost's HA user's, or caused by a context that was."""
        known = self._contexts.get(context.id) if context.id else None
        if known is not None:
            return known
        agents = bool(self.user_id and context.user_id == self.user_id)
        if not agents and context.parent_id:
            agents = self._contexts.get(context.parent_id, False)
        if context.id:
            self._contexts[context.id] = agents
            while len(self._contexts) > CONTEXTS_KEPT:
                self._contexts.popitem(last=False)
        return agents

    # ---- the connection

    async def _run(self) -> None:
        delay = self._backoff[0]
        lost_logged = False
        while True:
            started = time.monotonic()
            try:
                await self._session_once()
                problem = "the connection closed"
            except _AuthRefused:
                logger.error(
                    "live view: Home Assistant refused the token (HA_TOKEN); the live view tries again in 60 s"
                )
                self._lose()
                await asyncio.sleep(AUTH_RETRY_SECONDS)
                continue
            except (aiohttp.ClientError, OSError, TimeoutError, _Broken) as err:
                problem = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
            was_synced = self.connected
            self._lose()
            if was_synced or not lost_logged:
                logger.warning("live view: Home Assistant's event stream is lost (%s); reconnecting", problem)
                lost_logged = True
                self._tell(False, problem)
            if time.monotonic() - started > self._backoff[1]:
                delay = self._backoff[0]  # it was up for a while: this is a new outage
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._backoff[1])

    def _tell(self, following: bool, detail: str) -> None:
        if self._on_link is not None:
            self._on_link(following, detail)

    def _lose(self) -> None:
        self._synced.clear()
        self._ws = None
        self._fail_pending(_Broken("the connection closed"))

    def _fail_pending(self, cause: BaseException) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(cause)
        self._pending.clear()

    def _reader_ended(self, reader: asyncio.Task[None]) -> None:
        # A command of the handshake waits for the reader to hand it its answer: when HA closes the socket before
        # that (it stops or restarts just then), the command fails now instead of at COMMAND_TIMEOUT (30 s).
        cause = None if reader.cancelled() else reader.exception()
        self._fail_pending(cause if isinstance(cause, Exception) else _Broken("the connection closed"))

    async def _session_once(self) -> None:
        assert self._session is not None
        async with self._session.ws_connect(
            self.ws_url, heartbeat=HEARTBEAT_SECONDS, max_msg_size=0, autoping=True
        ) as ws:
            async with asyncio.timeout(COMMAND_TIMEOUT):
                await self._authenticate(ws)
            self._ws = ws
            reader = asyncio.create_task(self._read(ws), name="ha-live-view:read")
            reader.add_done_callback(self._reader_ended)
            try:
                async with asyncio.timeout(COMMAND_TIMEOUT):
                    user = await self._command(ws, "auth/current_user")
                    self.user_id = _str(user.get("id")) if isinstance(user, dict) else None
                    self.user_is_owner = bool(user.get("is_owner")) if isinstance(user, dict) else None
                    await self._command(ws, "subscribe_events", event_type="state_changed")
                    states = await self._command(ws, "get_states")
                self._resync(states if isinstance(states, list) else [])
                if self.syncs > 1:
                    logger.warning("live view: Home Assistant's event stream is back (resynced %d states)", len(states))
                else:
                    logger.info("live view: following Home Assistant's events (%d states)", len(states))
                self._synced.set()
                self._tell(True, f"following Home Assistant's events ({len(states)} states)")
                await reader
            finally:
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await reader

    async def _authenticate(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        first = await _receive(ws)
        if first.get("type") != "auth_required":
            raise _Broken(f"Home Assistant opened with {first.get('type')!r}, not auth_required")
        await ws.send_json({"type": "auth", "access_token": self._token})
        self.commands += 1
        answer = await _receive(ws)
        if answer.get("type") == "auth_invalid":
            raise _AuthRefused
        if answer.get("type") != "auth_ok":
            raise _Broken(f"Home Assistant answered the auth with {answer.get('type')!r}")

    async def _command(self, ws: aiohttp.ClientWebSocketResponse, kind: str, **payload: Any) -> Any:
        msg_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[msg_id] = future
        await ws.send_json({"id": msg_id, "type": kind, **payload})
        self.commands += 1
        return await future

    async def _read(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        async for message in ws:
            if message.type is not aiohttp.WSMsgType.TEXT:
                if message.type is aiohttp.WSMsgType.ERROR:
                    raise _Broken(str(ws.exception()))
                continue
            doc = _parsed(message)
            for item in doc if isinstance(doc, list) else [doc]:
                self._dispatch(item)
        raise _Broken("Home Assistant closed the connection")

    def _dispatch(self, item: dict[str, Any]) -> None:
        if item.get("type") == "event":
            event = item.get("event") or {}
            if event.get("event_type") == "state_changed":
                self._event(event)
            return
        future = self._pending.pop(item.get("id", -1), None)
        if future is None or future.done():
            return
        if item.get("success", True):
            future.set_result(item.get("result"))
        else:
            error = item.get("error") or {}
            future.set_exception(_Broken(f"{error.get('code')}: {error.get('message')}"))

    # ---- the states

    def _event(self, event: Mapping[str, Any]) -> None:
        seen_at = time.monotonic()
        data = event.get("data") or {}
        entity_id, new_state = data.get("entity_id"), data.get("new_state")
        if not isinstance(entity_id, str):
            return
        if not isinstance(new_state, Mapping):
            # Removed (a reload removes and re-adds every template entity): kept as unavailable, so that its
            # return is not a first sight and its on-time goes on counting.
            known = self._entities.get(entity_id)
            if known is not None:
                self._entities[entity_id] = replace(known, state="unavailable")
            return
        self._apply(entity_id, new_state, Context.of(event.get("context")), seen_at, resync=False)

    def _resync(self, states: list[Any]) -> None:
        self.syncs += 1
        seen_at = time.monotonic()
        for raw in states:
            if not isinstance(raw, Mapping) or not isinstance(raw.get("entity_id"), str):
                continue
            entity_id: str = raw["entity_id"]
            known = self._entities.get(entity_id)
            updated = _time(raw.get("last_updated"))
            if known is not None and known.last_updated and updated is not None and updated <= known.last_updated:
                continue  # unchanged, or an event of this socket was already newer
            self._apply(entity_id, raw, Context.of(raw.get("context")), seen_at, resync=True)

    def _apply(self, entity_id: str, raw: Mapping[str, Any], context: Context, seen_at: float, *, resync: bool) -> None:
        old = self._entities.get(entity_id)
        state = str(raw.get("state"))
        last_changed = _time(raw.get("last_changed"))
        now = self._clock()
        on = is_on(entity_id, state)
        on_since = old.on_since if old is not None else None
        after_off = old.after_off if old is not None else False
        if on is None:
            on = old.on if old is not None else None  # unavailable/unknown: a blip, not an off
        elif old is None or old.on is None or old.on != on:
            # First sight, or a change found at a resync: HA's last_changed at most; else the moment farmhost saw it.
            first = last_changed if last_changed is not None and last_changed < now else now
            on_since = first if (old is None or old.on is None or resync) else now
            after_off = on and old is not None and old.on is False
        attributes = raw.get("attributes")
        new = EntityView(
            entity_id=entity_id,
            state=state,
            attributes=dict(attributes) if isinstance(attributes, Mapping) else {},
            last_changed=last_changed,
            last_updated=_time(raw.get("last_updated")),
            on=on,
            on_since=on_since,
            after_off=after_off,
            known_state=state if state not in UNKNOWN_STATES else (old.known_state if old is not None else None),
            context=context,
        )
        self._entities[entity_id] = new
        if old is not None and old.state == state:
            return  # attributes only, or a re-stamp (reload, restart): not a change of state
        self._learn(entity_id, context)
        change = StateChange(
            entity_id=entity_id,
            old=old,
            new=new,
            context=context,
            agents=self.is_agents(context),
            seen_at=seen_at,
            resync=resync,
        )
        for listener in list(self._listeners):
            try:
                listener(change)
            except Exception:  # one listener's bug must not stop the others or the stream
                logger.exception("live view: a listener failed on %s", entity_id)

    def _learn(self, entity_id: str, context: Context) -> None:
        """A change in the context of another entity's change (or caused by it): that entity drives this one."""
        for known in (context.id, context.parent_id):
            origin = self._origins.get(known) if known else None
            if origin is not None and origin != entity_id:
                self._drives.setdefault(origin, set()).add(entity_id)
                return
        if context.id and context.id not in self._origins:
            self._origins[context.id] = entity_id
            while len(self._origins) > CONTEXTS_KEPT:
                self._origins.popitem(last=False)


class _Broken(Exception):
    """The connection is unusable (closed, an error frame, a refused command)."""


async def _receive(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
    """The next message, a JSON object; `_Broken` when the socket closes or fails instead.

    HA closes the socket while it stops or restarts, also in the middle of the handshake: aiohttp's `receive_json`
    raises a TypeError for that close frame, which is neither a connection error nor a reason to stop reconnecting.
    """
    message = await ws.receive()
    if message.type is not aiohttp.WSMsgType.TEXT:
        raise _Broken(f"Home Assistant closed the connection ({message.type.name})")
    doc = _parsed(message)
    if not isinstance(doc, dict):
        raise _Broken(f"Home Assistant sent {type(doc).__name__}, not a JSON object")
    return doc


def _parsed(message: aiohttp.WSMessage) -> Any:
    """A text frame's JSON; `_Broken` for one that is not JSON (reconnect, as for any broken stream)."""
    try:
        return message.json()
    except ValueError as err:
        raise _Broken(f"Home Assistant sent a frame that is not JSON: {err}") from None


class _AuthRefused(Exception):
    """HA refused the token."""


def _str(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _time(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


async def current_user(ws_url: str, token: str, *, timeout: float) -> dict[str, Any]:
    """The HA user a token belongs to (`auth/current_user`: id, name, is_owner, is_admin), over one short WebSocket.

    Raises:
        OSError: HA cannot be reached. TimeoutError: it did not answer in time.
        ValueError: HA refused the token or the command.
    """
    try:
        return await _current_user(ws_url, token, timeout=timeout)
    except (aiohttp.ClientError, _Broken) as err:
        raise OSError(str(err) or type(err).__name__) from None


async def _current_user(ws_url: str, token: str, *, timeout: float) -> dict[str, Any]:
    async with asyncio.timeout(timeout), aiohttp.ClientSession() as session, session.ws_connect(ws_url) as ws:
        await _receive(ws)  # auth_required
        await ws.send_json({"type": "auth", "access_token": token.strip()})
        if (await _receive(ws)).get("type") != "auth_ok":
            raise ValueError("Home Assistant refused the token")
        await ws.send_json({"id": 1, "type": "auth/current_user"})
        answer = await _receive(ws)
        result = answer.get("result")
        if not answer.get("success") or not isinstance(result, dict):
            raise ValueError(f"Home Assistant refused auth/current_user: {answer.get('error')}")
        return result
