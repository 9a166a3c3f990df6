"""The first index of a large memory logs its progress and a summary; ordinary small refreshes stay silent."""

from __future__ import annotations

import itertools
import logging
import re
from pathlib import Path

import pytest

from farmhost.memory.corpus import MemoryCorpus

LOGGER = "farmhost.memory.corpus"
PROGRESS = re.compile(r"^indexing memory of group main: ([\d,]+)/([\d,]+) files$")
SUMMARY = re.compile(r"^indexed memory of group main: ([\d,]+) files, ([\d,]+) chunks in \d+\.\d s$")


def _memory(root: Path, files: int) -> Path:
    """A workspace with `files` notes under memory/ (a few sections each), and a MEMORY.md."""
    notes = root / "memory" / "fields"
    notes.mkdir(parents=True)
    (root / "MEMORY.md").write_text("# Farm\nThe main notes.\n", encoding="utf-8")
    for n in range(files - 1):
        text = "".join(
            f"# Field {n} section {s}\nSoil moisture at plot {n}-{s} was {20 + (n * s) % 40} % after irrigation.\n\n"
            for s in range(4)
        )
        (notes / f"field-{n:04d}.md").write_text(text, encoding="utf-8")
    return root


def _lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    records = [r for r in caplog.records if r.name == LOGGER]
    caplog.clear()
    return records


def _number(text: str) -> int:
    return int(text.replace(",", ""))


def test_a_first_index_of_500_files_logs_progress_and_a_summary(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    root = _memory(tmp_path / "main", 500)
    corpus = MemoryCorpus({"main": root})

    hits = corpus.search("soil moisture plot 7-2")
    assert hits, "the index works"
    records = _lines(caplog)
    messages = [r.getMessage() for r in records]
    progress = [m for m in map(PROGRESS.match, messages) if m]
    summary = [m for m in map(SUMMARY.match, messages) if m]
    assert messages[0] == "indexing memory of group main: 0/500 files", "more than 200 files: it says so at once"
    assert len(summary) == 1 and messages[-1] == summary[0].string
    assert _number(summary[0][1]) == 500 and _number(summary[0][2]) == 499 * 4 + 1
    # At most one progress line every 2 s after the first.
    stamps = [r.created for r in records if PROGRESS.match(r.getMessage())]
    assert all(b - a >= 2.0 for a, b in itertools.pairwise(stamps)), stamps
    assert len(progress) <= 1 + (records[-1].created - records[0].created) / 2.0
    assert all(_number(m[2]) == 500 for m in progress)
    # The fields the JSON log shows.
    assert records[0].__dict__["group"] == "main" and records[-1].__dict__["files"] == 500

    # The cached index: a second search reads nothing and says nothing; a few edits stay silent too.
    corpus.search("irrigation")
    assert _lines(caplog) == []
    for n in range(10):
        (root / "memory" / "fields" / f"field-{n:04d}.md").write_text(f"# Edited {n}\nNew pump notes.\n")
    assert corpus.search("pump notes")
    assert _lines(caplog) == []


def test_progress_lines_count_up_with_thousands_separators(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    root = _memory(tmp_path / "main", 1200)
    corpus = MemoryCorpus({"main": root}, progress_every=0.02)
    corpus.refresh()
    messages = [r.getMessage() for r in _lines(caplog)]
    counts = [_number(m[1]) for m in map(PROGRESS.match, messages) if m]
    assert messages[0] == "indexing memory of group main: 0/1,200 files"
    assert counts == sorted(counts) and len(counts) >= 2, messages
    assert SUMMARY.match(messages[-1]) and messages[-1].startswith("indexed memory of group main: 1,200 files, ")


def test_a_slow_refresh_of_few_files_reports_once_it_takes_long(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    root = _memory(tmp_path / "main", 40)
    # Under the file threshold: silent...
    MemoryCorpus({"main": root}).refresh()
    assert _lines(caplog) == []
    # ...unless it runs longer than the time threshold (0 s here): then progress from that moment, and the summary.
    MemoryCorpus({"main": root}, progress_after=0.0).refresh()
    messages = [r.getMessage() for r in _lines(caplog)]
    assert PROGRESS.match(messages[0]) and _number(PROGRESS.match(messages[0])[1]) >= 1  # type: ignore[index]
    assert messages[-1].startswith("indexed memory of group main: 40 files, ")
