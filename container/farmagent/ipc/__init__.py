"""The in-sandbox IPC client: atomic request files in, result files out, snapshots and the host's heartbeat."""

from __future__ import annotations

from farmagent.ipc.client import IpcClient
from farmagent.ipc.core import IpcCore, new_request_id
from farmagent.ipc.results import IpcResult

__all__ = ["IpcClient", "IpcCore", "IpcResult", "new_request_id"]
