"""`farmhost doctor`'s MQTT check: the broker answers a CONNECT with these credentials (blocking, bounded)."""

from __future__ import annotations

import os
import ssl
import time
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from farmhost.config import SiteSettings
from farmhost.errors import ConfigError


def check_broker(settings: SiteSettings, *, timeout: float = 5.0) -> tuple[str, str, str]:
    """(state ok/off/broken, detail, fix) for FARMHOST_MQTT_URL."""
    broker = settings.broker
    if broker is None:
        return "off", "FARMHOST_MQTT_URL not set", "optional: set it to show farmhost in Home Assistant (docs/mqtt.md)"
    answer: dict[str, Any] = {}
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"farmhost-doctor-{os.getpid()}")
    client.on_connect = lambda _c, _u, _f, code, _p: answer.setdefault("code", code)
    if broker.username:
        client.username_pw_set(broker.username, broker.password)
    fix = "check FARMHOST_MQTT_URL (host, port, user, password) and that the broker runs"
    try:
        context = broker.tls_context()
    except ConfigError as err:
        return "broken", err.message, "point the FARMHOST_MQTT_*_FILE settings at readable PEM files"
    if context is not None:
        client.tls_set_context(context)
    try:
        client.connect(broker.host, broker.port, keepalive=10)
        deadline = time.monotonic() + timeout
        while "code" not in answer and time.monotonic() < deadline:
            client.loop(timeout=0.2)
    except (OSError, ssl.SSLError) as err:
        return "broken", f"{broker.shown}: {err}", fix
    finally:
        client.disconnect()
    code = answer.get("code")
    if code is None:
        return "broken", f"{broker.shown} did not answer the MQTT CONNECT in {timeout:g} s", fix
    if code.is_failure:
        return "broken", f"{broker.shown} refused the login: {code}", fix
    trusted = ", ".join(sorted(settings.trusted))
    serves = f"serves the calls of {trusted}" if trusted else "serves no other site's calls (FARMHOST_SITES_TRUSTED)"
    return "ok", f"{broker.shown}, site {settings.name}; {serves}", ""
