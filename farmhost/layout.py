"""DataLayout: the only code that knows where things live inside the data directory."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from farmhost.protocol.codes import QUEUE_DIRS, RESULTS_DIR

# Where the shipped dashboards (`dashboards/`) and global memory (`memory/`) are found: in an installed wheel they
# are package data under `farmhost/shipped/` (put there by hatch_build.py); in a source checkout (an editable
# install, a development run) they are the top-level directories next to the `farmhost` package, their source.
PACKAGE_DIR = Path(__file__).resolve().parent
SHIPPED_PACKAGE_DIR = PACKAGE_DIR / "shipped"
REPO_ROOT = PACKAGE_DIR.parent  # the checkout's root when farmhost runs from one; only a development fallback
GLOBAL_MEMORY_FOLDER = "global"
# During a run an agent may leave a setuid copy of a program in its workspace (the host clears the bits after the
# run): no other local user may reach it meanwhile, so the parents of what agents write are the daemon's user's
# and group's only. Sandboxes never need them: bwrap (as root) and the engines bind the directories themselves.
AGENT_PARENTS_MODE: Final = 0o750


def shipped_dir(name: str) -> Path | None:
    """A directory that ships with farmhost (`dashboards`, `memory`): the wheel's package data, else the checkout's.

    None when neither exists (a wheel built without them, which hatch_build.py refuses to build).
    """
    packaged = SHIPPED_PACKAGE_DIR / name
    if packaged.is_dir():
        return packaged
    checkout = REPO_ROOT / name
    return checkout if (REPO_ROOT / "pyproject.toml").is_file() and checkout.is_dir() else None


@dataclass(frozen=True)
class DataLayout:
    """Paths of one data directory (SPEC section 2)."""

    root: Path

    @property
    def db_path(self) -> Path:
        """The SQLite database."""
        return self.root / "farmhost.db"

    @property
    def ipc(self) -> Path:
        """Parent of every group's IPC directory."""
        return self.root / "ipc"

    @property
    def errors(self) -> Path:
        """Quarantine for refused request files, one folder per group."""
        return self.ipc / "errors"

    @property
    def spool(self) -> Path:
        """Host-private spool: claimed requests live here while they run (same filesystem as ipc/)."""
        return self.ipc / ".spool"

    @property
    def groups(self) -> Path:
        """Parent of every group's workspace."""
        return self.root / "groups"

    @property
    def farm_state(self) -> Path:
        """Farm state files written by the host for agents to read."""
        return self.root / "farm-state"

    @property
    def dashboards(self) -> Path:
        """Working copies of the staged Lovelace dashboards (seeded from the shipped dashboards, `shipped_dir`)."""
        return self.root / "dashboards"

    @property
    def logs(self) -> Path:
        """Host logs (request log)."""
        return self.root / "logs"

    @property
    def outbox_files(self) -> Path:
        """Private copies of files accepted for sending, so an agent cannot change them afterwards."""
        return self.root / "outbox-files"

    @property
    def run(self) -> Path:
        """Host-made runtime files shared with sandboxes: one directory per group (its LLM proxy socket)."""
        return self.root / "run"

    @property
    def memory_index(self) -> Path:
        """Host-private (0700) persisted memory indexes, one `<folder>.sqlite` per searched folder."""
        return self.root / "memory-index"

    def create_memory_index(self) -> Path:
        """Create `memory-index/` (0700) if needed; returns it."""
        self.memory_index.mkdir(mode=0o700, exist_ok=True)
        os.chmod(self.memory_index, 0o700)
        return self.memory_index

    @property
    def agent_limits(self) -> Path:
        """Per-group overrides of the agent run limits (optional)."""
        return self.root / "agent-limits.json"

    @property
    def lock_path(self) -> Path:
        """Held by the running daemon so that a second one refuses to start."""
        return self.root / "farmhost.lock"

    def group_ipc(self, folder: str) -> Path:
        """A group's IPC directory."""
        return self.ipc / folder

    def workspace(self, folder: str) -> Path:
        """A group's workspace."""
        return self.groups / folder

    def group_run(self, folder: str) -> Path:
        """A group's runtime directory, mounted read-only at `/workspace/run` in its sandbox."""
        return self.run / folder

    def run_logs(self, folder: str) -> Path:
        """Where a group's agent run logs go (`run-<runId>.log`): the host's, outside every sandbox mount."""
        return self.logs / "runs" / folder

    def create_group_run(self, folder: str) -> Path:
        """Create `run/` (host-private, 0700) and the group's directory in it (0755: any sandbox uid may enter)."""
        self.run.mkdir(mode=0o700, exist_ok=True)
        os.chmod(self.run, 0o700)
        path = self.group_run(folder)
        path.mkdir(mode=0o755, exist_ok=True)
        os.chmod(path, 0o755)
        return path

    @property
    def agent_writable_parents(self) -> tuple[Path, ...]:
        """The directories holding what agents write (workspaces, IPC dirs, dashboards): closed to other users."""
        return (self.groups, self.ipc, self.dashboards)

    def create(self) -> None:
        """Create the top-level layout (idempotent); what agents write is reachable by the daemon's user only."""
        for path in (
            self.ipc,
            self.errors,
            self.spool,
            self.groups,
            self.farm_state,
            self.dashboards,
            self.logs,
            self.outbox_files,
        ):
            path.mkdir(parents=True, exist_ok=True)
        os.chmod(self.spool, 0o700)
        for path in self.agent_writable_parents:
            os.chmod(path, AGENT_PARENTS_MODE)

    def seed_global_memory(self) -> int:
        """Copy the shipped global memory (`memory/`) into `groups/global/`, never overwriting; returns the count."""
        source = shipped_dir("memory")
        if source is None:
            return 0
        target = self.workspace(GLOBAL_MEMORY_FOLDER)
        copied = 0
        for path in sorted(source.rglob("*.md")):
            if path.is_symlink() or not path.is_file():
                continue
            destination = target / path.relative_to(source)
            if destination.exists() or destination.is_symlink():
                continue
            destination.parent.mkdir(parents=True, exist_ok=True)
            destination.write_bytes(path.read_bytes())
            copied += 1
        return copied

    def create_group(self, folder: str) -> None:
        """Create a group's workspace and IPC queues (idempotent; the folder was validated)."""
        self.create()
        self.workspace(folder).mkdir(exist_ok=True)
        ipc = self.group_ipc(folder)
        ipc.mkdir(exist_ok=True)
        for name in (*QUEUE_DIRS, RESULTS_DIR):
            (ipc / name).mkdir(exist_ok=True)
