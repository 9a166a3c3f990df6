"""The MQTT link: one connection to the broker, kept up in the background, that never blocks its callers.

`publish_*` only records what is to be sent (the latest payload per retained topic, a bounded queue of
events, messages keyed by their owner's id), so a broker that is down or slow costs the IPC engine nothing;
the writer sends it when connected.
On every (re)connection the link announces itself (`on_connect`: discovery, `online`), subscribes again and
the last will says `offline` if the connection is lost. Incoming messages go to the handler of their topic.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

import aiomqtt

from farmhost.background import cancel_and_wait
from farmhost.broker import Broker

logger = logging.getLogger(__name__)

# Seconds between tries while the broker is away: quick at first, then every 30 s.
BACKOFF: Final = (1.0, 2.0, 5.0, 10.0, 30.0)
KEEPALIVE: Final = 30
# Each message goes out at once: without TCP_NODELAY, Nagle's algorithm and the broker's delayed ACKs add ~40 ms
# per hop to a call between sites (bench/sites_roundtrip.py measured 72 ms -> 5 ms with the broker's too).
SOCKET_OPTIONS: Final = ((socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),)
# Events (alerts) kept while disconnected; older ones are dropped first (the state topics keep only the latest).
MAX_EVENTS: Final = 200


@dataclass(frozen=True)
class Incoming:
    """A message from the broker."""

    topic: str
    payload: bytes
    retain: bool


Handler = Callable[[Incoming], Awaitable[None]]


class MqttLink:
    """The connection, its subscriptions and what waits to be sent."""

    def __init__(
        self,
        broker: Broker,
        *,
        client_id: str,
        will_topic: str,
        will_payload: str,
        on_connect: Callable[[], None] = lambda: None,
    ) -> None:
        self.broker = broker
        self._tls = broker.tls_context()  # read once: a bad file is a ConfigError at start, not at every retry
        self._client_id = client_id
        self._will = aiomqtt.Will(will_topic, will_payload, qos=1, retain=True)
        self._on_connect = on_connect
        self._handlers: dict[str, Handler] = {}
        self._retained: dict[str, tuple[str, int]] = {}  # topic -> (payload, qos), the latest only
        self._events: deque[tuple[str, str]] = deque(maxlen=MAX_EVENTS)
        self._keyed: dict[str, tuple[str, str]] = {}  # key -> (topic, payload): sent once, unless given again
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.connected = False
        self.connected_since: float | None = None  # loop time of the current connection
        self.connections = 0  # how many times it connected (a test and doctor see reconnects)

    def subscribe(self, topic: str, handler: Handler) -> None:
        """Handle messages on `topic` (subscribed at QoS 1 at every connection)."""
        self._handlers[topic] = handler

    def publish_retained(self, topic: str, payload: str, *, qos: int = 1) -> None:
        """Send `payload` as the retained value of `topic` (only the latest is kept while disconnected)."""
        self._retained[topic] = (payload, qos)
        self._wake.set()

    def publish_event(self, topic: str, payload: str) -> None:
        """Send one message (not retained, QoS 1), kept in a bounded queue while disconnected."""
        self._events.append((topic, payload))
        self._wake.set()

    def publish_keyed(self, key: str, topic: str, payload: str) -> None:
        """Send one message (QoS 1, not retained) for `key`: given again before it went out, it goes out once.

        For messages whose owner keeps them durably and gives them again until answered (calls to other sites),
        so nothing is dropped however many wait while the broker is away.
        """
        self._keyed[key] = (topic, payload)
        self._wake.set()

    async def start(self) -> None:
        """Connect in the background (returns at once)."""
        _quiet_closed_socket_writes(asyncio.get_running_loop())
        self._task = asyncio.create_task(self._run(), name="mqtt:link")

    async def stop(self, *, goodbye: tuple[str, str] | None = None) -> None:
        """Say `goodbye` (topic, retained payload) if connected, then disconnect."""
        if goodbye is not None and self.connected:
            self.publish_retained(*goodbye)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2):
                    while goodbye[0] in self._retained and self.connected:
                        await asyncio.sleep(0.02)
        await cancel_and_wait(self._task)
        self._task = None

    async def _run(self) -> None:
        attempt = 0
        while True:
            try:
                async with self._client() as client:
                    attempt = 0
                    self.connected = True
                    self.connected_since = asyncio.get_running_loop().time()
                    self.connections += 1
                    logger.info("mqtt: connected to %s", self.broker.shown)
                    for topic in self._handlers:
                        await client.subscribe(topic, qos=1)
                    self._on_connect()
                    async with asyncio.TaskGroup() as group:
                        group.create_task(self._read(client))
                        group.create_task(self._write(client))
            except* aiomqtt.MqttError as errors:
                reason = "; ".join(str(err) for err in errors.exceptions)
                if self.connected or attempt == 0:
                    logger.warning("mqtt: %s: %s; trying again", self.broker.shown, reason)
            finally:
                self.connected = False
                self.connected_since = None
            await asyncio.sleep(BACKOFF[min(attempt, len(BACKOFF) - 1)])
            attempt += 1

    def _client(self) -> aiomqtt.Client:
        return aiomqtt.Client(
            self.broker.host,
            self.broker.port,
            username=self.broker.username,
            password=self.broker.password,
            identifier=self._client_id,
            will=self._will,
            clean_session=False,  # the broker keeps our subscriptions and QoS 1 messages across a reconnect
            keepalive=KEEPALIVE,
            timeout=10,
            tls_context=self._tls,
            socket_options=SOCKET_OPTIONS,
        )

    async def _read(self, client: aiomqtt.Client) -> None:
        async for message in client.messages:
            handler = next((h for t, h in self._handlers.items() if message.topic.matches(t)), None)
            if handler is None or not isinstance(message.payload, bytes | bytearray):
                continue
            try:
                await handler(Incoming(str(message.topic), bytes(message.payload), bool(message.retain)))
            except Exception:  # one bad message must not drop the connection
                logger.exception("mqtt: handling a message on %s failed", message.topic)

    async def _write(self, client: aiomqtt.Client) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._retained:
                topic, (payload, qos) = next(iter(self._retained.items()))
                await client.publish(topic, payload, qos=qos, retain=True)
                if self._retained.get(topic) == (payload, qos):  # not replaced meanwhile
                    del self._retained[topic]
            while self._events:
                topic, payload = self._events[0]
                await client.publish(topic, payload, qos=1, retain=False)
                self._events.popleft()
            while self._keyed:
                key, (topic, payload) = next(iter(self._keyed.items()))
                await client.publish(topic, payload, qos=1, retain=False)
                if self._keyed.get(key) == (topic, payload):
                    del self._keyed[key]


def _quiet_closed_socket_writes(loop: asyncio.AbstractEventLoop) -> None:
    """Log aiomqtt's write registration on a socket the broker just closed as one line, not a traceback.

    aiomqtt schedules `loop.add_writer(fd)` from paho's callback; when the connection drops before it runs, the
    loop reports EBADF for a callback nobody awaits. The link notices the drop itself and reconnects.
    """
    previous = loop.get_exception_handler()

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        error = context.get("exception")
        if isinstance(error, OSError) and error.errno == errno.EBADF and "add_writer" in repr(context.get("handle")):
            logger.info("mqtt: a write was due on a connection that had just closed; reconnecting")
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    if getattr(previous, "__qualname__", "") != handler.__qualname__:  # once per loop
        loop.set_exception_handler(handler)
