"""What the Supervisor tells an add-on: where Home Assistant is (its proxy) and the MQTT broker's credentials.

An add-on with `homeassistant_api: true` reaches Home Assistant at `http://supervisor/core/api/...` and
`/core/api/websocket` with its SUPERVISOR_TOKEN, which the Supervisor swaps for its own (supervisor/api/proxy.py);
one with `services: [mqtt:want]` reads the broker from GET `/services/mqtt` (supervisor/api/services.py).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from farmhost.errors import FarmhostError

SUPERVISOR_URL: Final = "http://supervisor"
# The Supervisor answers from memory on the add-on network; 10 s covers a Pi busy starting every add-on at boot.
REQUEST_TIMEOUT: Final = 10.0


class SupervisorError(FarmhostError):
    """The Supervisor did not answer, or answered with an error."""


@dataclass(frozen=True, kw_only=True)
class Supervisor:
    """The Supervisor's API as this add-on sees it: its URL and the add-on's token."""

    url: str = SUPERVISOR_URL
    token: str = field(repr=False)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Supervisor | None:
        """The Supervisor of SUPERVISOR_TOKEN (FARMHOST_SUPERVISOR_URL overrides its URL); None outside an add-on."""
        token = environ.get("SUPERVISOR_TOKEN", "").strip()
        if not token:
            return None
        return cls(url=environ.get("FARMHOST_SUPERVISOR_URL", SUPERVISOR_URL).rstrip("/"), token=token)

    @property
    def ha_url(self) -> str:
        """Home Assistant behind the Supervisor's proxy: `<this>/api/...` and `<this>/api/websocket`."""
        return f"{self.url}/core"

    def mqtt(self) -> MqttService | None:
        """The broker the Supervisor knows of (the Mosquitto add-on), or None when no add-on provides one.

        Raises:
            SupervisorError: the Supervisor did not answer, or refused (the add-on lacks `services: mqtt:want`).
        """
        request = urllib.request.Request(f"{self.url}/services/mqtt", headers={"Authorization": f"Bearer {self.token}"})
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as err:
            message = _error_message(err)
            if err.code == 400 and "not enabled" in message.lower():
                return None  # no add-on provides MQTT (Mosquitto is not installed or not started)
            raise SupervisorError(f"the Supervisor refused GET /services/mqtt: {err.code} {message}") from err
        except (OSError, ValueError) as err:
            raise SupervisorError(f"the Supervisor at {self.url} did not answer GET /services/mqtt: {err}") from err
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, dict) or "host" not in data or "port" not in data:
            raise SupervisorError(f"the Supervisor's /services/mqtt answer has no host and port: {str(body)[:200]}")
        return MqttService(
            host=str(data["host"]),
            port=int(data["port"]),
            ssl=bool(data.get("ssl", False)),
            username=_text(data.get("username")),
            password=_text(data.get("password")),
        )


@dataclass(frozen=True, kw_only=True)
class MqttService:
    """The broker of the Supervisor's `mqtt` service."""

    host: str
    port: int
    ssl: bool
    username: str | None
    password: str | None = field(repr=False)

    @property
    def url(self) -> str:
        """As FARMHOST_MQTT_URL takes it: `mqtt[s]://user:password@host:port`."""
        scheme = "mqtts" if self.ssl else "mqtt"
        login = ""
        if self.username:
            login = urllib.parse.quote(self.username, safe="")
            if self.password:
                login += ":" + urllib.parse.quote(self.password, safe="")
            login += "@"
        return f"{scheme}://{login}{self.host}:{self.port}"


def _text(value: object) -> str | None:
    return str(value) if value not in (None, "") else None


def _error_message(err: urllib.error.HTTPError) -> str:
    """The `message` of the Supervisor's error body ({"result": "error", "message": ...}), else the reason."""
    try:
        body = json.loads(err.read())
    except (OSError, ValueError):
        return str(err.reason)
    return str(body.get("message", err.reason)) if isinstance(body, dict) else str(err.reason)
