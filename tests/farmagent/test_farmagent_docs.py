"""container/: the README's example runs against a real daemon, the README names every setting, the image is sane."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from agent_support import Farm
from farmhost_testing import FIELD_JID

from farmhost.store import outbox
from farmhost.store.db import Database

CONTAINER = Path(__file__).parents[2] / "container"


def test_the_example_script_posts_to_the_chat(farm: Farm) -> None:
    done = subprocess.run(
        [sys.executable, str(CONTAINER / "examples" / "irrigation_note.py"), FIELD_JID],
        env=farm.agent_env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0 and "queued in 1 chunk(s)" in done.stdout, done.stderr
    db = Database.open(farm.data_dir)
    try:
        bodies = [e.body or "" for e in outbox.list_entries(db.conn, limit=100_000) if e.chat_jid == FIELD_JID]
    finally:
        db.close()
    assert any(b.startswith("Irrigation notes: ") and "main:MEMORY.md#L1-L3" in b for b in bodies), bodies


def test_the_readme_documents_every_setting() -> None:
    readme = (CONTAINER / "README.md").read_text()
    config = (CONTAINER / "farmagent" / "config.py").read_text()
    settings = set(re.findall(r"FARMAGENT_[A-Z_]+", config))
    assert len(settings) >= 8
    assert {name for name in settings if f"`{name}`" not in readme} == set()


def test_the_image_is_slim_non_root_and_runs_the_runner() -> None:
    lines = [line.strip() for line in (CONTAINER / "Dockerfile").read_text().splitlines()]
    instructions = [line for line in lines if line and not line.startswith("#")]
    assert re.fullmatch(r"ARG BASE_IMAGE=python:3\.1[12]-slim", instructions[0])
    # The final stage: after the last FROM (the OpenCode stage before it only picks the platform's binary).
    last_from = max(i for i, line in enumerate(instructions) if line.startswith("FROM"))
    final = instructions[last_from:]
    assert final[0] == "FROM ${BASE_IMAGE}"
    assert "USER 1000:1000" in final and "WORKDIR /workspace/group" in final
    assert final[-1] == 'ENTRYPOINT ["python", "-I", "-m", "farmagent.run"]'
    copies = [line for line in final if line.startswith(("COPY", "ADD"))]
    assert copies == [
        "COPY pyproject.toml /src/farmagent/",
        "COPY farmagent /src/farmagent/farmagent",
        "COPY --from=opencode /opt/opencode /opt/opencode",
    ]
    assert not re.search(r"amd64|arm64|x86_64|aarch64", "\n".join(final))  # nothing architecture-specific
    assert not re.search(r"(?i)(api_key|token|secret)\s*=", "\n".join(instructions))
    assert (CONTAINER / ".dockerignore").read_text().splitlines()[1] == "*"
