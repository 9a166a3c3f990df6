"""What the IPC benchmark runs on: machine, farmhost commit, filesystem, and what one file create/fsync costs there."""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any


def machine_info(bench_dir: Path) -> dict[str, Any]:
    """nproc, CPU model, kernel, Python, the farmhost commit, the bench directory's filesystem, the load average."""
    model = "?"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as handle:
        model = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), "?")
    return {
        "nproc": os.cpu_count(),
        "cpu": model,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "farmhost_commit": _git_commit(),
        "filesystem": _filesystem(bench_dir),
        **file_costs(bench_dir),
        "loadavg_at_start": os.getloadavg()[0],
    }


def _git_commit() -> str:
    """The commit of the farmhost being measured, and whether farmhost/ differs from it."""
    repo = str(Path(__file__).resolve().parent.parent)
    try:
        head = subprocess.run(
            ["git", "-C", repo, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        )
        dirty = subprocess.run(
            ["git", "-C", repo, "status", "--porcelain", "--", "farmhost"], capture_output=True, text=True, check=False
        )
    except OSError:
        return "?"
    return f"{head.stdout.strip() or '?'}{' + uncommitted changes in farmhost/' if dirty.stdout.strip() else ''}"


def _filesystem(path: Path) -> str:
    """The type of the mount holding `path` (longest matching mount point in /proc/mounts)."""
    best, kind = "", "?"
    target = str(path.resolve())
    with contextlib.suppress(OSError), open("/proc/mounts") as handle:
        for line in handle:
            fields = line.split()
            point = fields[1]
            inside = target == point or target.startswith(point.rstrip("/") + "/")
            if inside and len(point) >= len(best):
                best, kind = point, fields[2]
    return kind


def file_costs(directory: Path) -> dict[str, float]:
    """Median cost of one file create (O_EXCL) and of one fsync in `directory`: what every round trip pays."""
    probe = Path(tempfile.mkdtemp(prefix="probe-", dir=directory))
    creates: list[float] = []
    fsyncs: list[float] = []
    try:
        for i in range(60):
            started = time.perf_counter()
            fd = os.open(probe / f".f{i}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            created = time.perf_counter()
            try:
                os.write(fd, b"{}" * 100)  # about the size of a result envelope
                synced = time.perf_counter()
                os.fsync(fd)
            finally:
                os.close(fd)
            creates.append(created - started)
            fsyncs.append(time.perf_counter() - synced)
    finally:
        shutil.rmtree(probe, ignore_errors=True)
    return {
        "create_p50_us": round(statistics.median(creates) * 1e6),
        "fsync_p50_us": round(statistics.median(fsyncs) * 1e6),
    }
