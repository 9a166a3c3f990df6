"""MemoryService releases its corpora's inotify instances: on close(), and when the daemon stops."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from farmhost_testing import clean_env, inotify_instances, scaled

from farmhost.layout import DataLayout
from farmhost.memory.search import MemoryService


async def test_close_releases_every_corpus(tmp_path: Path) -> None:
    layout = DataLayout(tmp_path)
    (layout.workspace("field") / "memory").mkdir(parents=True)
    (layout.workspace("field") / "memory" / "crops.md").write_text("# Crops\nTomatoes in the north field.\n")
    (layout.workspace("global")).mkdir(parents=True)
    (layout.workspace("global") / "MEMORY.md").write_text("# Rules\nAsk before opening the tomatoes valve.\n")
    before = inotify_instances()
    service = MemoryService(layout)
    field = await service.search("field", "tomatoes", top_k=5)
    assert [(d["groupFolder"], d["path"]) for d in field] == [("field", "memory/crops.md"), ("global", "MEMORY.md")]
    await service.search("global", "tomatoes", top_k=5)
    assert inotify_instances() == before + 2  # one corpus per folder searched
    await service.close()
    assert inotify_instances() == before
    assert len(await service.search("field", "tomatoes", top_k=5)) == 2  # a new corpus
    assert inotify_instances() == before + 1
    await service.close()
    assert inotify_instances() == before


PROBE = """
import asyncio, os, sys
from pathlib import Path
from farmhost.app import App
from farmhost.config import Settings
from farmhost_dev.testing import inotify_instances as inotify_fds

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
