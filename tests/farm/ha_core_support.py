"""Helpers of the core farm action tests: a data dir with main/field, and farmhost's real IPC engine serving it."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farmhost_testing import drop, init_data_dir_in_process, read_result, wait_for_async

from farmhost.app import build_handlers
from farmhost.config import FarmSettings, build_config, load_settings
from farmhost.farm.deps import FarmDeps
from farmhost.farm.homeassistant.client import HAClient
from farmhost.groups.live import GroupRegistry
from farmhost.ipc.service import IpcService
from farmhost.ipc.snapshots import HostIdentity
from farmhost.layout import DataLayout
from farmhost.store.db import Database, now_utc

make_data_dir = init_data_dir_in_process


def uid(prefix: str = "r") -> str:
    """A fresh valid requestId."""
    return f"{prefix}-{secrets.token_hex(5)}"


async def until(condition: Callable[[], Any], what: str, timeout: float = 15.0) -> Any:
    """Poll `condition` without blocking the event loop the engine runs on; fail after `timeout` (scaled) seconds."""
    return await wait_for_async(condition, timeout=timeout, what=what)


@dataclass
class FarmHost:
    """farmhost's IPC engine with the real farm handler table, in this process, on `data_dir`."""

    data_dir: Path
    settings: FarmSettings
    ha: HAClient | None

    async def ask(
        self, folder: str, action: str, params: dict[str, Any] | None = None, *, timeout: float = 15.0, **extra: Any
    ) -> dict[str, Any]:
        """Drop a farm_action request the way an agent does and wait for its result document."""
        rid = uid(action)
        payload: dict[str, Any] = {"type": "farm_action", "action": action, "requestId": rid, **extra}
        if params is not None:
            payload["params"] = params
        drop(self.data_dir, folder, "actions", payload)
        result: dict[str, Any] = await until(lambda: read_result(self.data_dir, folder, rid), f"result {rid}", timeout)
        return result

    async def ping(self, folder: str) -> dict[str, Any]:
        """A ping from `folder`, answered."""
        rid = uid("ping")
        drop(self.data_dir, folder, "actions", {"type": "ping", "requestId": rid})
        result: dict[str, Any] = await until(lambda: read_result(self.data_dir, folder, rid), f"ping {rid}")
        return result

    def audit(self) -> list[dict[str, Any]]:
        """Every complete line of farm-state/audit.ndjson."""
        path = self.data_dir / "farm-state" / "audit.ndjson"
        if not path.exists():
            return []
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        return [json.loads(line) for line in lines if line.endswith("\n")]

    def profile(self, document: dict[str, Any] | str | None) -> None:
        """Write (or with None remove) the farm profile at its default place; it is read at every request."""
        path = self.settings.profile_path
        if document is None:
            path.unlink(missing_ok=True)
            return
        text = document if isinstance(document, str) else json.dumps(document)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)


@contextlib.asynccontextmanager
async def farm_host(
    data_dir: Path, *, ha_env: dict[str, str] | None, request_timeout: float = 10.0, **settings: Any
) -> AsyncIterator[FarmHost]:
    """The real IpcService with the app's handler table (farm rows from farm_handlers(deps)) and a real HAClient."""
    update: dict[str, Any] = {"ha_url": None, "ha_token": None, "farm_profile_path": None, **settings}
    if ha_env is not None:
        update |= {"ha_url": ha_env["HA_URL"], "ha_token": ha_env["HA_TOKEN"]}
    settings = load_settings(data_dir=data_dir, env_file=None).model_copy(update=update)
    config = build_config(settings)
    layout = DataLayout(data_dir)
    identity = HostIdentity(pid=os.getpid(), version="test", started_at=now_utc())
    client = None
    if config.ha.url and config.ha.token:
        client = HAClient(url=config.ha.url, token=config.ha.token, request_timeout=request_timeout)
    deps = FarmDeps(settings=config.farm, layout=layout, ha=client, dashboards_dir=layout.dashboards)
    db = Database.open(data_dir)
    service = IpcService(
        settings=config.ipc,
        layout=layout,
        db=db,
        registry=GroupRegistry(db),
        handlers=build_handlers(config, identity, deps),
        identity=identity,
    )
    if client is not None:
        await client.start()
    await service.start()
    try:
        yield FarmHost(data_dir=data_dir, settings=config.farm, ha=client)
    finally:
        await service.stop()
        if client is not None:
            await client.close()
        db.close()
