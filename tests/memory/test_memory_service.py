"""MemoryService releases its corpora's inotify instances: on close(), and when the daemon stops."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

from farmhost_testing import clean_env, scaled

from farmhost.layout import DataLayout
from farmhost.memory.search import MemoryService


def inotify_fds() -> int:
    """The inotify instances this process holds."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed already
            count += os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify"
    return count


async def test_close_releases_every_corpus(tmp_path: Path) -> None:
    layout = DataLayout(tmp_path)
    (layout.workspace("field") / "memory").mkdir(parents=True)
    (layout.workspace("field") / "memory" / "crops.md").write_text("# Crops\nTomatoes in the north field.\n")
    (layout.workspace("global")).mkdir(parents=True)
    (layout.workspace("global") / "MEMORY.md").write_text("# Rules\nAsk before opening the tomatoes valve.\n")
    before = inotify_fds()
    service = MemoryService(layout)
    field = await service.search("field", "tomatoes", top_k=5)
    assert [(d["groupFolder"], d["path"]) for d in field] == [("field", "memory/crops.md"), ("global", "MEMORY.md")]
    await service.search("global", "tomatoes", top_k=5)
    assert inotify_fds() == before + 2  # one corpus per folder searched
    await service.close()
    assert inotify_fds() == before
    assert len(await service.search("field", "tomatoes", top_k=5)) == 2  # a new corpus
    assert inotify_fds() == before + 1
    await service.close()
    assert inotify_fds() == before


PROBE = """
import asyncio, os, sys
from pathlib import Path
from farmhost.app import App
from farmhost.config import Settings

def inotify_fds() -> int:
    links = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    return links.count("anon_inode:inotify")

async def main() -> None:
    app = App(Settings(_env_file=None, FARMHOST_DATA_DIR=Path(sys.argv[1])))
    before = inotify_fds()
    await app.start()
    service = app.memory
    assert service is not None
    await service.search("main", "appliance", top_k=3)
    await service.search("global", "appliance", top_k=3)
    during = inotify_fds()
    await app.stop()
    print(before, during, inotify_fds())  # service is still referenced: only close() can have released them

asyncio.run(main())
"""


def test_the_daemon_closes_its_corpora_when_it_stops(data_dir: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(data_dir)],
        capture_output=True, text=True, env=clean_env(), timeout=scaled(60), check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    before, during, after = map(int, done.stdout.split())
    assert during >= before + 2, done.stdout  # the IPC watcher's and one per corpus
    assert after == before, done.stdout
