"""Tests for farmhost.memory.corpus: multilingual search over real files, cache invalidation, symlink refusal."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from farmhost_testing import write_tree

from farmhost.memory.chunker import split_lines
from farmhost.memory.corpus import MemoryCorpus
from farmhost.memory.files import MAX_FILES_PER_ROOT, read_memory_file

FILES = {
    "field/MEMORY.md": (
        "# Farm\nThe north field grows tomatoes under drip irrigation.\n\n"
        "# Devices\nswitch.pump_north runs the north drip line for 20 minutes.\n"
    ),
    "field/memory/pt/campo.md": (
        "# Campo sul\nA irrigação do campo sul começa às seis da manhã.\n\n"
        "O milho precisa de água duas vezes por semana.\n"
    ),
    "field/memory/pl/pole.md": "# Szklarnia\nŻółte pomidory w szklarni podlewamy co drugi dzień.\n",
    "field/memory/zh/温室.md": "# 温室\n温室里的西红柿每天早上浇水。\n\n# 仓库\n水泵放在仓库里。\n",
    "global/MEMORY.md": "# Rules\nThe agent may never open the main water valve without asking.\n",
}


@pytest.fixture
def roots(tmp_path: Path) -> dict[str, Path]:
    write_tree(tmp_path, FILES)
    return {"field": tmp_path / "field", "global": tmp_path / "global"}


@pytest.mark.parametrize(
    ("query", "root", "path"),
    [
        ("irrigacao campo sul", "field", "memory/pt/campo.md"),
        ("IRRIGAÇÃO às seis", "field", "memory/pt/campo.md"),
        ("zolte pomidory", "field", "memory/pl/pole.md"),
        ("żółte szklarni", "field", "memory/pl/pole.md"),
        ("西红柿 浇水", "field", "memory/zh/温室.md"),
        ("红柿", "field", "memory/zh/温室.md"),
        ("pump_north drip", "field", "MEMORY.md"),
        ("water valve", "global", "MEMORY.md"),
    ],
)
def test_search_finds_across_scripts(roots: dict[str, Path], query: str, root: str, path: str) -> None:
    hits = MemoryCorpus(roots).search(query)
    assert hits, query
    assert (hits[0].root, hits[0].path) == (root, path)
    assert hits[0].score > 0


def test_hit_line_ranges_match_the_file(roots: dict[str, Path]) -> None:
    hits = MemoryCorpus(roots).search("水泵 仓库 pump water irrigação pomidory", top_k=20, per_file_cap=10)
    assert len(hits) >= 5
    for hit in hits:
        lines = split_lines((roots[hit.root] / hit.path).read_text(encoding="utf-8"))
        window = "\n".join(lines[hit.start_line - 1 : hit.end_line])
        assert hit.snippet in window
        assert hit.citation == f"{hit.path}#L{hit.start_line}-L{hit.end_line}"
    zh = [h for h in hits if h.path.endswith("温室.md") and "水泵" in h.snippet]
    assert [(h.start_line, h.end_line) for h in zh] == [(4, 5)]


def test_results_are_sorted_and_deterministic(roots: dict[str, Path]) -> None:
    first = MemoryCorpus(roots).search("north field water", top_k=8)
    again = MemoryCorpus(roots).search("north field water", top_k=8)
    assert first == again
    assert [h.score for h in first] == sorted((h.score for h in first), reverse=True)


@pytest.mark.parametrize("query", ["", "   ", "?!…", "nonexistentword"])
def test_queries_without_matches(roots: dict[str, Path], query: str) -> None:
    assert MemoryCorpus(roots).search(query) == []


def test_per_file_cap_and_top_k(tmp_path: Path) -> None:
    (tmp_path / "g" / "memory").mkdir(parents=True)
    long = "\n\n".join(f"# Day {i}\nThe pump ran {i} minutes." for i in range(30))
    (tmp_path / "g" / "memory" / "log.md").write_text(long, encoding="utf-8")
    (tmp_path / "g" / "MEMORY.md").write_text("# Pump\nThe pump is switch.pump_north.\n", encoding="utf-8")
    corpus = MemoryCorpus({"g": tmp_path / "g"})
    hits = corpus.search("pump", top_k=8, per_file_cap=3)
    assert sum(h.path == "memory/log.md" for h in hits) == 3
    assert any(h.path == "MEMORY.md" for h in hits)
    assert len(corpus.search("pump", top_k=2, per_file_cap=3)) == 2
    assert len(corpus.search("pump", top_k=64, per_file_cap=64)) == 31


def test_snippet_is_trimmed_around_the_match(tmp_path: Path) -> None:
    (tmp_path / "g").mkdir()
    filler = "\n".join(f"filler line number {i} about nothing" for i in range(15))
    (tmp_path / "g" / "MEMORY.md").write_text(f"{filler}\nthe greenhouse heater is climate.heater\n{filler}\n")
    (hit,) = MemoryCorpus({"g": tmp_path / "g"}, max_chunk_chars=2000).search("greenhouse heater")
    assert len(hit.snippet) <= 302
    assert "greenhouse heater" in hit.snippet


def test_edits_are_seen_and_unchanged_files_are_not_reread(roots: dict[str, Path]) -> None:
    corpus = MemoryCorpus(roots)
    assert corpus.search("cebola") == []
    assert corpus.stats.files_chunked == len(FILES)
    indexed = corpus.stats.segments_indexed

    corpus.search("tomatoes")
    assert corpus.stats.files_chunked == len(FILES)  # nothing changed: nothing re-read
    assert corpus.stats.segments_indexed == indexed

    campo = roots["field"] / "memory/pt/campo.md"
    campo.write_text(campo.read_text(encoding="utf-8") + "\n# Horta\nA cebola roxa foi plantada ontem.\n")
    hits = corpus.search("cebola")
    assert [(h.path, h.start_line, h.end_line) for h in hits] == [("memory/pt/campo.md", 6, 7)]
    assert corpus.stats.files_chunked == len(FILES) + 1  # only the edited file
    assert corpus.stats.segments_indexed == indexed + 1

    new = roots["global"] / "memory" / "cebola.md"
    new.parent.mkdir()
    new.write_text("A cebola gosta de sol.\n")
    assert {h.path for h in corpus.search("cebola")} == {"memory/pt/campo.md", "memory/cebola.md"}
    assert corpus.stats.files_chunked == len(FILES) + 2

    campo.unlink()
    assert [h.path for h in corpus.search("cebola")] == ["memory/cebola.md"]
    assert corpus.stats.files_chunked == len(FILES) + 2


def test_only_memory_markdown_is_indexed(tmp_path: Path) -> None:
    ws = tmp_path / "g"
    (ws / "memory" / "deep" / "er").mkdir(parents=True)
    (ws / "memory" / "deep" / "er" / "note.md").write_text("secret tractor")
    (ws / "notes.md").write_text("secret tractor")  # not MEMORY.md nor under memory/
    (ws / "memory" / "note.txt").write_text("secret tractor")
    (ws / "memory" / "dir.md").mkdir()
    os.mkfifo(ws / "memory" / "fifo.md")
    assert [h.path for h in MemoryCorpus({"g": ws}).search("tractor")] == ["memory/deep/er/note.md"]


def test_symlinks_are_skipped(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "passwd.md").write_text("root secret tractor")
    (outside / "sub" / "x.md").write_text("root secret tractor")
    ws = tmp_path / "g"
    (ws / "memory").mkdir(parents=True)
    (ws / "memory" / "real.md").write_text("a tractor in the barn")
    (ws / "memory" / "link.md").symlink_to(outside / "passwd.md")
    (ws / "memory" / "linkdir").symlink_to(outside / "sub")
    (ws / "MEMORY.md").symlink_to(outside / "passwd.md")
    corpus = MemoryCorpus({"g": ws})
    assert [h.path for h in corpus.search("tractor secret")] == ["memory/real.md"]
    assert read_memory_file(ws, "memory/link.md") is None
    assert read_memory_file(ws, "memory/linkdir/x.md") is None
    assert read_memory_file(ws, "MEMORY.md") is None


def test_a_linked_memory_dir_is_skipped(tmp_path: Path) -> None:
    outside = tmp_path / "other_group" / "memory"
    outside.mkdir(parents=True)
    (outside / "x.md").write_text("other group tractor")
    ws = tmp_path / "g"
    ws.mkdir()
    (ws / "memory").symlink_to(outside)
    assert MemoryCorpus({"g": ws}).search("tractor") == []


@pytest.mark.parametrize(
    ("rel", "expected"),
    [
        ("memory/a.md", "alpha\n"),
        ("MEMORY.md", "top\n"),
        ("memory/../MEMORY.md", None),
        ("../g/MEMORY.md", None),
        ("/etc/passwd", None),
        ("memory//a.md", None),
        ("memory/missing.md", None),
        ("memory", None),
    ],
)
def test_read_memory_file(tmp_path: Path, rel: str, expected: str | None) -> None:
    (tmp_path / "g" / "memory").mkdir(parents=True)
    (tmp_path / "g" / "memory" / "a.md").write_text("alpha\n")
    (tmp_path / "g" / "MEMORY.md").write_text("top\n")
    assert read_memory_file(tmp_path / "g", rel) == expected


def test_missing_root_is_empty(tmp_path: Path) -> None:
    assert MemoryCorpus({"g": tmp_path / "nope"}).search("anything") == []


def test_a_memory_over_the_file_cap_says_so_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # An agent can write any number of files; the host reads at most MAX_FILES_PER_ROOT and tells the operator.
    notes = tmp_path / "g" / "memory"
    notes.mkdir(parents=True)
    for i in range(MAX_FILES_PER_ROOT + 5):
        (notes / f"n{i:05d}.md").write_text(f"note {i} about the pump\n")
    corpus = MemoryCorpus({"g": tmp_path / "g"})
    with caplog.at_level(logging.WARNING, logger="farmhost.memory.files"):
        corpus.search("pump")
        (notes / "n00000.md").write_text("changed note about the pump\n")
        corpus.search("pump")
    assert corpus.stats.files_chunked == MAX_FILES_PER_ROOT + 1  # the first listing's files, then the edited one
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    expected = f"memory of {tmp_path / 'g'} has more than 2,000 files: only the first 2,000 (by name) are searched"
    assert warnings == [expected + "; merge notes into fewer files"]
