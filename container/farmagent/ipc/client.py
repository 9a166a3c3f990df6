"""IpcClient: one typed method per request of the contract (SPEC section 5), on top of IpcCore.

Every method writes one request, waits for its result and returns the result's `result` object; an error
result raises `RequestError` (its `code` is the host's `errorCode`, its `message` the host's sentence).
Use `IpcCore.request` for the raw envelope without raising. Optional arguments left at None are not sent,
so the host applies its documented defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from farmagent.config import AgentSettings
from farmagent.errors import InvalidRequestError, ProtocolError
from farmagent.ipc.core import IpcCore
from farmagent.tool_schemas import farm_actions
from farmagent.wire import SITE_RE, SITE_TIMEOUT

ContextMode = Literal["isolated", "group"]
ScheduleType = Literal["cron", "interval", "once", "when"]
MemorySources = Literal["memory", "sessions", "all"]


def _present(**fields: Any) -> dict[str, Any]:
    return {key: value for key, value in fields.items() if value is not None}


class IpcClient(IpcCore):
    """The agent's IPC client (see IpcCore for the constructor)."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> IpcClient:
        """A client on FARMAGENT_IPC_DIR (default `/workspace/ipc`) in FARMAGENT_IPC_MODE."""
        settings = AgentSettings.from_env(environ)
        return cls(settings.ipc_dir, mode=settings.ipc_mode)

    def call(self, payload: Mapping[str, Any], *, timeout: float | None = None) -> Any:
        """`request(payload).unwrap()`: the `result` of a success, `RequestError` for an error result."""
        return self.request(payload, timeout=timeout).unwrap()

    def _obj(self, payload: Mapping[str, Any], *, timeout: float | None = None) -> dict[str, Any]:
        result = self.call(payload, timeout=timeout)
        if not isinstance(result, dict):
            raise ProtocolError(f"the result of a {payload['type']} request is not a JSON object")
        return result

    # messages/ -----------------------------------------------------------------------------------

    def send_message(self, chat_jid: str, text: str) -> dict[str, Any]:
        """Queue a text message for a chat (split at 4096 characters by the host); `{queued, chatJid, chunks}`."""
        return self._obj({"type": "message", "chatJid": chat_jid, "text": text})

    def send_file(self, chat_jid: str, path: str, caption: str | None = None) -> dict[str, Any]:
        """Send a file of the group's workspace (path relative to it) to a chat."""
        return self._obj({"type": "file", "chatJid": chat_jid, "path": path, **_present(caption=caption)})

    # tasks/ --------------------------------------------------------------------------------------

    def schedule_task(
        self,
        prompt: str,
        schedule_type: ScheduleType,
        schedule_value: str | int | dict[str, Any],
        *,
        context_mode: ContextMode | None = None,
        group_folder: str | None = None,
        task_id: str | None = None,
    ) -> dict[str, Any]:
        """Create a cron / interval (ms) / once (ISO-8601) / when (a condition object) task; `{taskId, nextRun}`."""
        payload = {
            "type": "schedule_task",
            "prompt": prompt,
            "schedule_type": schedule_type,
            "schedule_value": schedule_value,
            **_present(context_mode=context_mode, groupFolder=group_folder, taskId=task_id),
        }
        return self._obj(payload)

    def pause_task(self, task_id: str) -> dict[str, Any]:
        """Pause a task (own tasks, any from main)."""
        return self._obj({"type": "pause_task", "taskId": task_id})

    def resume_task(self, task_id: str) -> dict[str, Any]:
        """Resume a paused task; a next run that passed while paused is recomputed."""
        return self._obj({"type": "resume_task", "taskId": task_id})

    def cancel_task(self, task_id: str) -> dict[str, Any]:
        """Cancel a task for good."""
        return self._obj({"type": "cancel_task", "taskId": task_id})

    def refresh_groups(self) -> dict[str, Any]:
        """Re-read the chats and rewrite `available_groups.json` (main only)."""
        return self._obj({"type": "refresh_groups"})

    def register_group(
        self, jid: str, name: str, folder: str, trigger: str | None = None, requires_trigger: bool | None = None
    ) -> dict[str, Any]:
        """Register a chat as a group with its own workspace (main only; never sets isMain)."""
        payload = {
            "type": "register_group",
            "jid": jid,
            "name": name,
            "folder": folder,
            **_present(trigger=trigger, requiresTrigger=requires_trigger),
        }
        return self._obj(payload)

    # actions/ ------------------------------------------------------------------------------------

    def ping(self) -> dict[str, Any]:
        """The cheapest round trip: `{pong: true, version, startedAt}`."""
        return self._obj({"type": "ping"})

    def memory_search(
        self,
        query: str,
        *,
        top_k: int | None = None,
        sources: MemorySources | None = None,
        group_folder: str | None = None,
    ) -> dict[str, Any]:
        """BM25 over the group's and the global memory (and chat transcripts); `{hits: [...]}`."""
        params = {"query": query, **_present(topK=top_k, sources=sources, groupFolder=group_folder)}
        return self.memory_action("memory_search", params)

    def memory_get(
        self, path: str, *, group_folder: str | None = None, from_line: int | None = None, lines: int | None = None
    ) -> dict[str, Any]:
        """A window of lines of `MEMORY.md` or `memory/**/*.md`; `{text, from, lines, totalLines, nextFrom, ...}`."""
        params = {"path": path, **_present(groupFolder=group_folder, **{"from": from_line}, lines=lines)}
        return self.memory_action("memory_get", params)

    def memory_action(self, action: str, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Any memory action by name, its params as the contract names them; memory_search/memory_get are shortcuts."""
        return self._obj({"type": "memory_action", "action": action, "params": dict(params or {})})

    def send_request(self, kind: str, fields: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Any request of type `kind` with these fields, as the contract names them; the methods above are shortcuts."""
        return self._obj({"type": kind, **(fields or {})})

    def farm_action(
        self,
        action: str,
        params: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
        site: str | None = None,
    ) -> dict[str, Any]:
        """Any farm action by name (docs/farm-actions.md); the ha_* methods below are typed shortcuts.

        `site` names another farmhost on the same MQTT broker to run it (main group only; docs/mqtt.md): the host
        waits for that site up to two minutes, so this waits as long.

        Raises:
            InvalidRequestError: `action` is not a farm action of the contract, or `site` is not a site name.
            RequestError: the host refused or the action failed.
        """
        known = farm_actions()
        if action not in known:
            raise InvalidRequestError(f"unknown farm action {action!r}; known: {', '.join(known)}")
        wait = timeout if timeout is not None else (known[action] or self.timeout)
        payload: dict[str, Any] = {"type": "farm_action", "action": action, "params": dict(params or {})}
        if site is not None:
            if not SITE_RE.fullmatch(site):
                raise InvalidRequestError(f"{site!r} is not a site name (lower-case letters, digits, - and _)")
            payload["site"] = site
            wait = max(wait, SITE_TIMEOUT)
        return self._obj(payload, timeout=wait)

    def ha_get_status(self, entity_ids: list[str] | None = None, domains: list[str] | None = None) -> dict[str, Any]:
        """Current states, filtered by entity ids and/or domains; `{states, count, missing}`."""
        return self.farm_action("ha_get_status", _present(entityIds=entity_ids, domains=domains))

    def ha_history(self, entity_ids: list[str], start: str | None = None, end: str | None = None) -> dict[str, Any]:
        """What the entities did over a period (at most 31 days; default the last 24 h); `{start, end, entities, missing}`."""
        return self.farm_action("ha_history", _present(entityIds=entity_ids, start=start, end=end))

    def ha_call_service(
        self,
        domain: str,
        service: str,
        data: Mapping[str, Any] | None = None,
        target: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Call `domain.service` (service policy applies); `{service, changedStates}`."""
        return self.farm_action(
            "ha_call_service", {"domain": domain, "service": service, **_present(data=data, target=target)}
        )

    def ha_set_entity(self, entity_id: str, value: Any) -> dict[str, Any]:
        """Set a number, switch-like or select entity; the state read back and `confirmed`."""
        return self.farm_action("ha_set_entity", {"entityId": entity_id, "value": value})

    def ha_restart(self) -> dict[str, Any]:
        """Restart Home Assistant and wait until it runs again; `{restarted, seconds}`."""
        return self.farm_action("ha_restart")

    def ha_dashboard_get(self, dashboard: str | None = None, view_path: str | None = None) -> dict[str, Any]:
        """The staged dashboard (or one view) as data and YAML."""
        return self.farm_action("ha_dashboard_get", _present(dashboard=dashboard, viewPath=view_path))

    def ha_dashboard_validate(
        self, dashboard: str | None = None, content: str | None = None, check_entities: bool | None = None
    ) -> dict[str, Any]:
        """Check a staged dashboard or YAML `content`; `{valid, errors, warnings, unknownEntities, ...}`."""
        params = _present(dashboard=dashboard, content=content, checkEntities=check_entities)
        return self.farm_action("ha_dashboard_validate", params)

    def ha_dashboard_patch(
        self, operations: list[Mapping[str, Any]], dashboard: str | None = None, dry_run: bool | None = None
    ) -> dict[str, Any]:
        """Apply view/card operations to the staged dashboard, all or nothing; `{changes, diff, written, ...}`."""
        params = {"operations": [dict(op) for op in operations], **_present(dashboard=dashboard, dryRun=dry_run)}
        return self.farm_action("ha_dashboard_patch", params)

    def ha_apply_dashboard(self, dashboard: str | None = None, backup: bool | None = None) -> dict[str, Any]:
        """Validate and push the staged dashboard to Home Assistant (with a backup of what HA had)."""
        return self.farm_action("ha_apply_dashboard", _present(dashboard=dashboard, backup=backup))

    def ha_capture_screenshot(
        self,
        dashboard: str | None = None,
        view: str | None = None,
        width: int | None = None,
        height: int | None = None,
        zoom: float | None = None,
        wait_ms: int | None = None,
        selector: str | None = None,
    ) -> dict[str, Any]:
        """A PNG of a dashboard view into the workspace's `screenshots/`; `{path, width, height, bytes, ...}`."""
        params = _present(
            dashboard=dashboard, view=view, width=width, height=height, zoom=zoom, waitMs=wait_ms, selector=selector
        )
        return self.farm_action("ha_capture_screenshot", params)

    def farm_state_refresh(self) -> dict[str, Any]:
        """Poll Home Assistant now and rewrite `farm-state/*.json`."""
        return self.farm_action("farm_state_refresh")
