"""The MQTT broker the sites share: FARMHOST_MQTT_URL parsed (host, port, login, TLS), the availability payloads."""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final
from urllib.parse import unquote, urlsplit

from farmhost.errors import ConfigError
from farmhost.protocol.codes import SITE_RE

DEFAULT_PORTS: Final = {"mqtt": 1883, "mqtts": 8883}
# A site's availability topic holds one of these (retained; the broker publishes OFFLINE as the link's will).
ONLINE: Final = "online"
OFFLINE: Final = "offline"
_FORM: Final = "mqtt://user:password@host:1883"


@dataclass(frozen=True, kw_only=True)
class Broker:
    """Where the broker is and how to log in (`password` is never shown)."""

    host: str
    port: int
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: bool = False
    ca_file: Path | None = None  # the CA of the broker's certificate (default: the system's CAs)
    cert_file: Path | None = None  # a client certificate: the broker may log the site in by it
    key_file: Path | None = None

    @property
    def shown(self) -> str:
        """`mqtt://user@host:port`, without the password: for logs and doctor."""
        user = f"{self.username}@" if self.username else ""
        return f"{'mqtts' if self.tls else 'mqtt'}://{user}{self.host}:{self.port}"

    def tls_context(self) -> ssl.SSLContext | None:
        """The TLS context of an mqtts:// broker (None for mqtt://).

        Raises:
            ConfigError: a CA, certificate or key file cannot be read.
        """
        if not self.tls:
            return None
        try:
            context = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)
            if self.cert_file is not None:
                context.load_cert_chain(str(self.cert_file), str(self.key_file) if self.key_file else None)
        except (OSError, ssl.SSLError) as err:
            raise ConfigError(
                f"cannot use the MQTT TLS files ({err}); check FARMHOST_MQTT_CA_FILE, FARMHOST_MQTT_CERT_FILE "
                "and FARMHOST_MQTT_KEY_FILE"
            ) from None
        return context


def parse_broker(url: str) -> Broker:
    """`mqtt://user:pass@host:1883` or `mqtts://…` (TLS, port 8883 by default).

    Raises:
        ConfigError: naming what is wrong with the URL.
    """
    # The URL may hold the broker's password: no sentence here repeats it, only the scheme it starts with.
    try:
        parts = urlsplit(url)
    except ValueError as err:  # an unclosed [ of an IPv6 address
        raise ConfigError(f"FARMHOST_MQTT_URL cannot be read ({err}); write it as {_FORM}") from None
    if parts.scheme not in DEFAULT_PORTS or not url.lower().startswith(f"{parts.scheme}://"):
        started = f", not {parts.scheme}://" if parts.scheme and "://" in url else ""
        raise ConfigError(f"FARMHOST_MQTT_URL must start with mqtt:// or mqtts://{started}, e.g. {_FORM}")
    if not parts.hostname:
        raise ConfigError(f"FARMHOST_MQTT_URL has no host ({_FORM})")
    try:
        port = parts.port or DEFAULT_PORTS[parts.scheme]
    except ValueError:
        raise ConfigError("FARMHOST_MQTT_URL has a port that is not a number from 1 to 65535") from None
    return Broker(
        host=parts.hostname,
        port=port,
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password else None,
        tls=parts.scheme == "mqtts",
    )


def site_name(raw: str) -> str:
    """A host name or FARMHOST_SITE made a site name: lower case, other characters as `-`.

    Raises:
        ConfigError: nothing usable is left.
    """
    name = re.sub(r"[^a-z0-9_-]+", "-", raw.strip().lower().split(".", 1)[0]).strip("-_")[:63]
    if not SITE_RE.fullmatch(name):
        raise ConfigError(f"FARMHOST_SITE {raw!r} is not a usable site name (letters, digits, - and _)")
    return name
