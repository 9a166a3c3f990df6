"""A real MQTT client for the tests, standing where Home Assistant's MQTT integration stands (paho-mqtt)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from farmhost_testing import wait_for
from paho.mqtt.enums import CallbackAPIVersion


@dataclass(frozen=True)
class Seen:
    topic: str
    payload: str
    retain: bool

    def json(self) -> Any:
        return json.loads(self.payload)


class Watcher:
    """Subscribes to `topics` and keeps every message; publishes like Home Assistant does."""

    def __init__(
        self,
        port: int,
        *topics: str,
        user: str | None = None,
        password: str | None = None,
        tls: tuple[Path, Path, Path] | None = None,
        client_id: str = "",
    ) -> None:
        """Connect to 127.0.0.1:`port` (with `tls` = (CA, client certificate, key): over TLS, logged in by it).

        `client_id` names the client in the broker's log (`Denied PUBLISH from <client id>`); a random one if empty.
        """
        self._lock = threading.Lock()
        self.seen: list[Seen] = []
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=True)
        if user:
            self.client.username_pw_set(user, password)
        if tls is not None:
            ca, cert, key = tls
            self.client.tls_set(ca_certs=str(ca), certfile=str(cert), keyfile=str(key))
        self.client.on_message = self._on_message
        self.client.on_subscribe = self._on_subscribe
        self._acked: set[int] = set()
        self.client.connect("127.0.0.1", port, keepalive=30)
        self.client.loop_start()
        asked = {self.client.subscribe(topic, qos=1)[1] for topic in topics}
        # subscribe() only queues the request: a message published before the broker's SUBACK is not delivered, so
        # a test that acts at once would miss it on a busy machine. Wait for every acknowledgement.
        wait_for(
            lambda: asked <= self._acked_mids(),
            timeout=10,
            what=f"the broker to acknowledge the subscriptions to {', '.join(topics)}",
            seen=lambda: sorted(self._acked_mids()),
        )

    def _on_subscribe(self, client: Any, userdata: Any, mid: int, reason_codes: Any, properties: Any) -> None:
        with self._lock:
            self._acked.add(mid)

    def _acked_mids(self) -> set[int]:
        with self._lock:
            return set(self._acked)

    def _on_message(self, client: Any, userdata: Any, message: mqtt.MQTTMessage) -> None:
        with self._lock:
            self.seen.append(Seen(message.topic, message.payload.decode(errors="replace"), bool(message.retain)))

    def on(self, topic: str) -> list[Seen]:
        """Every message seen on `topic`, oldest first."""
        with self._lock:
            return [s for s in self.seen if s.topic == topic]

    def wait(self, topic: str, count: int = 1, *, timeout: float = 20.0, where: Any = None) -> list[Seen]:
        """At least `count` messages on `topic` (and `where(message)` true for the last one, if given)."""

        def found() -> list[Seen] | None:
            got = self.on(topic)
            if len(got) < count or (where is not None and not where(got[-1])):
                return None
            return got

        result: list[Seen] = wait_for(
            found, timeout=timeout, what=f"{count} message(s) on {topic}", seen=lambda: self.on(topic)[-3:]
        )
        return result

    def publish(self, topic: str, payload: str, *, retain: bool = False) -> None:
        """Publish at QoS 1 and wait until the broker has it."""
        self.client.publish(topic, payload, qos=1, retain=retain).wait_for_publish(timeout=10)

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


@contextmanager
def watching(port: int, *topics: str) -> Iterator[Watcher]:
    """A Watcher of `topics` on the broker at `port`, closed afterwards."""
    watcher = Watcher(port, *topics)
    try:
        yield watcher
    finally:
        watcher.close()
