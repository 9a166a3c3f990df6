"""The screenshot user: a non-admin, read-only Home Assistant user whose token is all the screenshot browser holds.

Created by farmhost on first need with the operator's admin token (HA_TOKEN), over HA's own APIs: a user
"farmhost screenshots" in the `system-read-only` group, local only, with homeassistant-provider credentials
(a random username suffix and password that nobody keeps); farmhost logs in as it once (the HTTP login flow)
and asks HA, on a connection authenticated as that user, for a long-lived token. The token is kept in the
daemon's SQLite database (`host_state`, never mounted into an agent's sandbox), reused by every capture and
recreated when HA refuses it (revoked, user deleted) or HA_URL changes. Removing it: delete the user in HA
(Settings > People > Users); farmhost creates a new one at the next capture.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Final

from farmhost.errors import FarmhostError
from farmhost.farm.homeassistant.client import REQUEST_TIMEOUT, HAClient
from farmhost.farm.homeassistant.errors import HaError, HaUnavailable
from farmhost.store import host_state

if TYPE_CHECKING:
    from farmhost.store.db import Database

log = logging.getLogger(__name__)

USER_NAME: Final = "farmhost screenshots"
USERNAME_PREFIX: Final = "farmhost-screenshots-"  # + random hex: HA usernames are unique, a stale one may linger
GROUP: Final = "system-read-only"
STATE_KEY: Final = "screenshot_user"
LIFESPAN_DAYS: Final = 3650


@dataclass(frozen=True)
class Account:
    """The stored screenshot user: for which HA, its id, and its long-lived token."""

    ha_url: str
    user_id: str
    token: str


class ScreenshotUser:
    """The screenshot user's token for captures: stored, checked, (re)created under one lock."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()  # two captures at once must not each create a user

    async def token(self, *, ha: HAClient, db: Database, base_url: str) -> str:
        """The token HA accepts for the screenshot user, creating the user (again) when needed.

        Raises:
            FarmhostError: HA refused to create the user (HA_TOKEN is not an administrator's) or to log it in;
                HaUnavailable / HaTimeout when HA does not answer.
        """
        base_url = base_url.rstrip("/")
        async with self._lock:
            stored = load(db)
            if stored is not None and stored.ha_url == base_url:
                if await token_accepted(base_url, stored.token):
                    return stored.token
                log.warning("Home Assistant refused the screenshot user's token; creating the user again")
            try:
                account = await create(ha, base_url)
            except HaError as err:
                raise FarmhostError(
                    f"farmhost could not set up its read-only screenshot user in Home Assistant: {err.message}",
                    code=err.code,
                ) from None
            save(db, account)
            log.info("created the Home Assistant user %r (%s) for screenshots", USER_NAME, account.user_id)
            return account.token


def load(db: Database) -> Account | None:
    """The stored account, or None (none yet, or a row farmhost cannot read)."""
    with db.tx(durable=False) as conn:
        stored = host_state.get(conn, STATE_KEY)
    try:
        data = json.loads(stored) if stored is not None else None
        return Account(ha_url=data["haUrl"], user_id=data["userId"], token=data["token"]) if data else None
    except (ValueError, KeyError, TypeError):
        return None


def save(db: Database, account: Account) -> None:
    """Store (replace) the account."""
    value = json.dumps({"haUrl": account.ha_url, "userId": account.user_id, "token": account.token})
    with db.tx() as conn:
        host_state.put(conn, STATE_KEY, value)


async def create(ha: HAClient, base_url: str) -> Account:
    """Replace any earlier screenshot user with a new one and return its long-lived token."""
    for user in await ha.ws_command("config/auth/list"):
        if is_screenshot_user(user):
            await ha.ws_command("config/auth/delete", user_id=user["id"])
    created = await ha.ws_command("config/auth/create", name=USER_NAME, group_ids=[GROUP], local_only=True)
    user_id = str(created["user"]["id"])
    username, password = USERNAME_PREFIX + secrets.token_hex(4), secrets.token_urlsafe(32)
    await ha.ws_command(
        "config/auth_provider/homeassistant/create", user_id=user_id, username=username, password=password
    )
    access, refresh = await _log_in(base_url, username, password)
    try:
        async with HAClient(url=base_url, token=access) as as_user:
            token = await as_user.ws_command(
                "auth/long_lived_access_token", client_name=USER_NAME, lifespan=LIFESPAN_DAYS
            )
    finally:
        await _http(base_url, "/auth/revoke", {"token": refresh})  # the login's own session is not needed
    if not isinstance(token, str) or not token:
        raise HaError("Home Assistant did not return a long-lived token for the screenshot user")
    return Account(ha_url=base_url, user_id=user_id, token=token)


def is_screenshot_user(user: Any) -> bool:
    """A user farmhost made for screenshots (its username prefix), never an owner or an administrator."""
    return (
        isinstance(user, dict)
        and str(user.get("username") or "").startswith(USERNAME_PREFIX)
        and not user.get("is_owner")
        and "system-admin" not in (user.get("group_ids") or [])
    )


async def token_accepted(base_url: str, token: str) -> bool:
    """True when HA answers GET /api/ with this token; False when it refuses it (401/403)."""
    status, _ = await _http(base_url, "/api/", None, token=token)
    if status in (HTTPStatus.UNAUTHORIZED, HTTPStatus.FORBIDDEN):
        return False
    if status != HTTPStatus.OK:
        raise HaError(f"Home Assistant answered HTTP {status} to the screenshot user's token check")
    return True


async def _log_in(base_url: str, username: str, password: str) -> tuple[str, str]:
    """HA's login flow as its frontend runs it: flow, credentials, code -> (access token, refresh token)."""
    client_id = f"{base_url}/"
    flow_start = {"client_id": client_id, "handler": ["homeassistant", None], "redirect_uri": client_id}
    _, flow = await _http(base_url, "/auth/login_flow", flow_start, as_json=True)
    step = {"client_id": client_id, "username": username, "password": password}
    _, done = await _http(base_url, f"/auth/login_flow/{flow.get('flow_id', '')}", step, as_json=True)
    if done.get("type") != "create_entry":
        raise HaError(f"Home Assistant did not log the screenshot user in ({done.get('errors') or done.get('type')})")
    grant = {"grant_type": "authorization_code", "code": str(done.get("result", "")), "client_id": client_id}
    _, tokens = await _http(base_url, "/auth/token", grant)
    if not (isinstance(tokens.get("access_token"), str) and isinstance(tokens.get("refresh_token"), str)):
        raise HaError("Home Assistant's login of the screenshot user returned no tokens")
    return tokens["access_token"], tokens["refresh_token"]


async def _http(
    base_url: str, path: str, body: dict[str, Any] | None, *, as_json: bool = False, token: str | None = None
) -> tuple[int, dict[str, Any]]:
    """One request: GET without a body, else POST as JSON or as a form; (status, the JSON object answered or {})."""
    import niquests  # here: niquests takes ~0.3 s to import (see ha_transport)

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        async with niquests.AsyncSession(retries=0, disable_http3=True) as session:
            if body is None:
                response = await session.get(base_url + path, headers=headers, timeout=REQUEST_TIMEOUT)
            elif as_json:
                response = await session.post(base_url + path, json=body, headers=headers, timeout=REQUEST_TIMEOUT)
            else:
                response = await session.post(base_url + path, data=body, headers=headers, timeout=REQUEST_TIMEOUT)
    except niquests.exceptions.RequestException as err:
        raise HaUnavailable(f"Home Assistant did not answer ({type(err).__name__})") from None
    status = response.status_code or 0
    if path != "/api/" and status >= HTTPStatus.BAD_REQUEST:
        shown = "/auth/login_flow/<flow>" if path.startswith("/auth/login_flow/") else path
        raise HaError(f"Home Assistant refused {shown} for the screenshot user (HTTP {status})")
    try:
        data = response.json() if response.content else {}
    except ValueError:
        data = {}
    return status, data if isinstance(data, dict) else {}
