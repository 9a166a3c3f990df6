"""A fresh HA config directory: the farm configuration with its port, and the seeded users, tokens and onboarding."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

FARM_CONFIG: Final = Path(__file__).resolve().parent / "farm"  # configuration.yaml (+ dashboards/), copied per run
PORT_PLACEHOLDER: Final = "__HA_PORT__"  # where configuration.yaml says `server_port`

# The seeded owner and its long-lived token: fixed ids so the token is reproducible; the config dir is per run.
ADMIN_USERNAME: Final = "farmadmin"
# farmhost's own HA user (admin, not owner): its token is HA_TOKEN, so people's changes are told from its own.
FARMHOST_USER_NAME: Final = "farmhost"
TOKEN_LIFESPAN_S: Final = 10 * 365 * 86400  # ten years: a test or demo instance never sees its token expire


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def hs256_jwt(claims: dict[str, Any], key: str) -> str:
    """A JWT signed like homeassistant.auth.AuthManager.async_create_access_token does (HS256)."""
    header = _b64url(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
    body = _b64url(json.dumps(claims, separators=(",", ":")).encode())
    signature = hmac.new(key.encode(), f"{header}.{body}".encode(), hashlib.sha256).digest()
    return f"{header}.{body}.{_b64url(signature)}"


def _write_store(storage: Path, key: str, version: int, minor: int, data: dict[str, Any]) -> None:
    path = storage / key
    path.write_text(json.dumps({"version": version, "minor_version": minor, "key": key, "data": data}, indent=2))
    path.chmod(0o600)


@dataclass(frozen=True, kw_only=True)
class SeededAuth:
    """The two seeded users' long-lived tokens: the owner (a person at the farm) and farmhost's own user."""

    owner_token: str
    farmhost_token: str
    farmhost_user_id: str


def _user(user_id: str, name: str, *, owner: bool) -> dict[str, Any]:
    return {
        "id": user_id,
        "group_ids": ["system-admin"],
        "is_owner": owner,
        "is_active": True,
        "name": name,
        "system_generated": False,
        "local_only": False,
    }


def _refresh_token(token_id: str, user_id: str, client: str, jwt_key: str) -> dict[str, Any]:
    return {
        "id": token_id,
        "user_id": user_id,
        "client_id": None,
        "client_name": client,
        "client_icon": None,
        "token_type": "long_lived_access_token",
        "created_at": datetime.now(UTC).isoformat(),
        "access_token_expiration": float(TOKEN_LIFESPAN_S),
        "token": secrets.token_hex(64),
        "jwt_key": jwt_key,
        "last_used_at": None,
        "last_used_ip": None,
        "expire_at": None,
        "credential_id": None,
        "version": None,
    }


def seed_auth(config_dir: Path) -> SeededAuth:
    """Pre-seed `.storage` with an owner, farmhost's own admin user, a long-lived token each and finished onboarding.

    The owner stands for the people of the farm (the tests' `call_service`, the demo's browser); farmhost gets a
    user of its own, as docs/security.md asks of every install, so that HA's contexts tell its changes from theirs.
    The storage layout is HA's internal one (auth 1.1, onboarding 4.1) as of 2025.4.4: with it the tokens work on
    the first request, with no onboarding round trips and none of onboarding's side effects (met, radio_browser...).
    """
    storage = config_dir / ".storage"
    storage.mkdir(parents=True, exist_ok=True)
    user_id, credential_id, token_id = secrets.token_hex(16), secrets.token_hex(16), secrets.token_hex(16)
    farmhost_id, farmhost_token_id = secrets.token_hex(16), secrets.token_hex(16)
    jwt_key, farmhost_key = secrets.token_hex(64), secrets.token_hex(64)
    auth = {
        "users": [_user(user_id, "Farm admin", owner=True), _user(farmhost_id, FARMHOST_USER_NAME, owner=False)],
        "groups": [
            {"id": "system-admin", "name": "Administrators"},
            {"id": "system-users", "name": "Users"},
            {"id": "system-read-only", "name": "Read Only"},
        ],
        "credentials": [
            {
                "id": credential_id,
                "user_id": user_id,
                "auth_provider_type": "homeassistant",
                "auth_provider_id": None,
                "data": {"username": ADMIN_USERNAME},
            }
        ],
        "refresh_tokens": [
            _refresh_token(token_id, user_id, "farmhost-tests", jwt_key),
            _refresh_token(farmhost_token_id, farmhost_id, "farmhost", farmhost_key),
        ],
    }
    _write_store(storage, "auth", 1, 1, auth)
    _write_store(storage, "onboarding", 4, 1, {"done": ["user", "core_config", "analytics", "integration"]})
    issued = int(time.time()) - 60

    def jwt(token_id: str, key: str) -> str:
        return hs256_jwt({"iss": token_id, "iat": issued, "exp": issued + TOKEN_LIFESPAN_S}, key)

    return SeededAuth(
        owner_token=jwt(token_id, jwt_key),
        farmhost_token=jwt(farmhost_token_id, farmhost_key),
        farmhost_user_id=farmhost_id,
    )


def write_config(config_dir: Path, port: int) -> None:
    """Copy the farm configuration (farmhost/localha/farm/) into `config_dir`, with the HTTP port filled in."""
    for src in sorted(FARM_CONFIG.rglob("*")):
        dst = config_dir / src.relative_to(FARM_CONFIG)
        if src.is_dir():
            dst.mkdir(parents=True, exist_ok=True)
        elif src.suffix in (".yaml", ".yml"):
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_text(src.read_text().replace(PORT_PLACEHOLDER, str(port)))
