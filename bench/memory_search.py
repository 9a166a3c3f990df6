"""Memory search benchmark: `MemoryCorpus` latency (cold, warm, after one edit) against naive rank-bm25 and bm25s.

Run from the repository root with the project's interpreter::

    .venv/bin/python bench/memory_search.py            # 100, 1,000 and 10,000 chunks, under ~2 minutes
    .venv/bin/python bench/memory_search.py --quick    # 100 and 1,000 chunks only

Each corpus is a generated workspace in a temporary directory (``MEMORY.md`` plus ``memory/*.md`` and
``memory/fields/*.md``, 10-50 chunks per file) of farm notes in English, Portuguese, Polish, Spanish, German
and Chinese, from a seeded RNG. Measured in the same run:

- ``cold``: the first search of a fresh ``MemoryCorpus`` (walks, reads, chunks, tokenises, builds the index);
- ``warm``: repeated random queries on the same corpus (nothing changed, so inotify lets it skip the listing);
- ``warm, no watch``: the same after ``close()``, as when the watch cannot be trusted (re-stats every file);
- ``edit``: the first search after one file was rewritten (``stats.files_chunked`` shows what was re-read);
- ``naive``: a ``rank_bm25.BM25Okapi`` built over all chunk token lists on every query (farmhost's tokenizer);
- ``bm25s``: index built once, then queries (same tokens), only when ``bm25s`` is importable.

The script reports; the only target (warm p50 <= 1 ms at 10,000 chunks) is printed PASS/FAIL, exit status 0.
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import platform
import random
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
from rank_bm25 import BM25Okapi

from farmhost.memory.bm25 import Bm25Index, SegmentKey
from farmhost.memory.chunker import chunk_markdown
from farmhost.memory.corpus import MemoryCorpus
from farmhost.memory.tokenize import tokenize

SEED = 20240611
WARM_QUERIES = 200
TARGET_WARM_P50_MS = 1.0
TARGET_CHUNKS = 10_000

FIELDS = ["north", "south", "river", "hill", "orchard", "greenhouse", "paddock", "east terrace"]
CROPS_EN = ["tomatoes", "maize", "wheat", "potatoes", "apples", "beans", "lettuce", "barley"]
DEVICES = ["valve", "pump", "soil probe", "weather station", "drip line", "tank sensor"]

TEMPLATES: dict[str, list[str]] = {
    "en": [
        "The {field} field was irrigated for {n} minutes after the {device} reported dry soil.",
        "We planted {crop} in the {field} field; expect harvest in about {n} weeks.",
        "The {device} in the {field} field needs a new battery before the frost.",
        "Aphids were found on the {crop}; spray neem oil at dusk and check again in {n} days.",
        "Never open the main valve when the tank level is below {n} percent.",
    ],
    "pt": [
        "A irrigação do campo {field} durou {n} minutos porque o solo estava seco.",
        "Plantamos milho e feijão no talhão {field}; a colheita será em {n} semanas.",
        "O sensor de umidade do campo {field} precisa de calibração depois da chuva.",
        "A bomba d'água parou às {n} horas; verificar o fusível e a pressão.",
    ],
    "pl": [
        "Nawadnianie pola {field} trwało {n} minut, gleba była bardzo sucha.",
        "Ziemniaki na polu {field} mają zarazę; opryskać w ciągu {n} dni.",
        "Zawór główny nie może być otwarty, gdy zbiornik ma mniej niż {n} procent wody.",
        "Pszenica ozima wzeszła dobrze, przymrozek zapowiadany za {n} dni.",
    ],
    "es": [
        "El riego por goteo del campo {field} funcionó {n} minutos esta mañana.",
        "Las manzanas del huerto necesitan poda antes de {n} semanas.",
        "La estación meteorológica marca {n} grados y viento fuerte del norte.",
    ],
    "de": [
        "Die Pumpe am Feld {field} lief {n} Minuten, der Boden war trocken.",
        "Gerste und Weizen sind gesät; Ernte in etwa {n} Wochen erwartet.",
        "Der Bodenfühler im Gewächshaus meldet {n} Prozent Feuchte.",
    ],
    "zh": [
        "{field}地块的西红柿需要浇水{n}分钟，土壤湿度传感器显示干燥。",
        "温室里的黄瓜长势很好，预计{n}天后采收。",
        "水泵在早上{n}点停止了，请检查水箱水位和阀门。",
        "小麦出现蚜虫，{n}天内喷洒农药。",
    ],
}

QUERIES = [
    "irrigation north field",
    "tank level valve",
    "battery soil probe",
    "aphids tomatoes",
    "harvest weeks maize",
    "irrigação campo",
    "colheita feijão",
    "bomba pressão fusível",
    "nawadnianie pola",
    "zawór zbiornik",
    "ziemniaki zaraza",
    "riego goteo",
    "poda manzanas",
    "Pumpe Boden trocken",
    "Gewächshaus Feuchte",
    "西红柿 浇水",
    "水泵 阀门",
    "蚜虫",
    "frost battery",
    "greenhouse humidity",
]


@dataclass(frozen=True, slots=True)
class Workspace:
    """A generated memory workspace and what it holds."""

    root: Path
    files: list[str]
    chunks: int


def _sentence(rng: random.Random) -> str:
    lang = rng.choice(list(TEMPLATES))
    return rng.choice(TEMPLATES[lang]).format(
        field=rng.choice(FIELDS), crop=rng.choice(CROPS_EN), device=rng.choice(DEVICES), n=rng.randint(2, 90)
    )


def _section(rng: random.Random, number: int) -> str:
    """A heading and one paragraph of 2-4 sentences: one chunk under the chunker's 800-character cap."""
    body = " ".join(_sentence(rng) for _ in range(rng.randint(2, 4)))
    return f"## Note {number}: {rng.choice(FIELDS)}\n\n{body}\n"


def _file_text(rng: random.Random, sections: int, title: str) -> str:
    return f"# {title}\n\n" + "\n".join(_section(rng, i) for i in range(sections))


def make_workspace(base: Path, target_chunks: int, seed: int) -> Workspace:
    """Write MEMORY.md plus memory/*.md files of 10-50 chunks each until about `target_chunks` chunks exist.

    Args:
        base: An empty directory to lay the workspace out in.
        target_chunks: Wanted number of chunks (the last file is cut to hit it closely).
        seed: RNG seed (same seed, same corpus).

    Returns:
        The workspace, with the chunk count measured by farmhost's own chunker.
    """
    rng = random.Random(seed)
    (base / "memory" / "fields").mkdir(parents=True)
    files: list[str] = []
    total = 0
    index = 0
    while total < target_chunks:
        remaining = target_chunks - total
        sections = min(remaining, rng.randint(10, 50))
        if index == 0:
            rel = "MEMORY.md"
        elif index % 3 == 0:
            rel = f"memory/fields/field-{index:04d}.md"
        else:
            rel = f"memory/notes-{index:04d}.md"
        text = _file_text(rng, max(1, sections - 1), f"Farm notes {index}")  # the title is a chunk too
        (base / rel).write_text(text, encoding="utf-8")
        total += len(chunk_markdown(rel, text))
        files.append(rel)
        index += 1
    return Workspace(base, files, total)


def _ms(seconds: float) -> float:
    return seconds * 1000.0


def percentile(samples: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile of the samples (the sample itself for one sample)."""
    ordered = sorted(samples)
    rank = max(1, math.ceil(pct / 100.0 * len(ordered)))
    return ordered[rank - 1]


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


@dataclass(slots=True)
class Row:
    """One line of the results table: latencies in milliseconds."""

    name: str
    chunks: int
    samples: int
    p50: float
    p99: float
    note: str = ""


def _row(name: str, chunks: int, seconds: Sequence[float], note: str = "") -> Row:
    ms = [_ms(s) for s in seconds]
    return Row(name, chunks, len(ms), percentile(ms, 50), percentile(ms, 99), note)


def _queries(rng: random.Random, count: int) -> list[str]:
    return [rng.choice(QUERIES) for _ in range(count)]


def _all_tokens(ws: Workspace) -> list[list[str]]:
    tokens: list[list[str]] = []
    for rel in ws.files:
        tokens.extend(tokenize(c.text) for c in chunk_markdown(rel, (ws.root / rel).read_text(encoding="utf-8")))
    return tokens


def bench_farmhost(ws: Workspace, cold_reps: int, rng: random.Random) -> list[Row]:
    """Cold, warm and after-edit latencies of `MemoryCorpus.search` on one workspace."""
    rows: list[Row] = []
    cold: list[float] = []
    corpus = MemoryCorpus({"main": ws.root})
    for _ in range(cold_reps):
        corpus = MemoryCorpus({"main": ws.root})
        cold.append(_timed(lambda c=corpus: c.search("irrigation north field")))  # type: ignore[misc]
    rows.append(_row("farmhost cold", ws.chunks, cold, "first search: read+chunk+tokenise+index"))

    warm = [_timed(lambda q=q: corpus.search(q)) for q in _queries(rng, WARM_QUERIES)]  # type: ignore[misc]
    rows.append(_row("farmhost warm", ws.chunks, warm, f"listings {corpus.stats.listings} (first search only)"))

    edits: list[float] = []
    chunked: list[int] = []
    transitions: list[str] = []
    for i in range(5):
        rel = ws.files[rng.randrange(len(ws.files))]
        path = ws.root / rel
        path.write_text(path.read_text(encoding="utf-8") + f"\n## Edit {i}\n\nThe east valve was replaced today.\n")
        before = corpus.stats.files_chunked
        edits.append(_timed(lambda: corpus.search("east valve replaced")))
        chunked.append(corpus.stats.files_chunked - before)
        transitions.append(f"{before}->{corpus.stats.files_chunked}")
    print(
        f"  edit at {ws.chunks:,} chunks: files_chunked before->after each edit {', '.join(transitions)} "
        f"(total {corpus.stats.files_chunked} over {len(ws.files)} files, "
        f"segments indexed {corpus.stats.segments_indexed})"
    )
    rows.append(_row("farmhost after edit", ws.chunks, edits, f"re-read and re-indexed {max(chunked)} file"))
    corpus.close()
    unwatched = [_timed(lambda q=q: corpus.search(q)) for q in _queries(rng, WARM_QUERIES)]  # type: ignore[misc]
    rows.append(_row("farmhost warm, no watch", ws.chunks, unwatched, "fallback: re-stats every file"))

    segments = _file_tokens(ws)
    index = Bm25Index()
    full = [_timed(lambda: _index_all(segments)) for _ in range(3)]
    rows.append(_row("  index from scratch", ws.chunks, full, "every file's segment, cached tokens"))
    for key, docs in segments.items():
        index.put(key, docs)
    picked = [rng.choice(list(segments)) for _ in range(20)]
    one = [_timed(lambda k=k: index.put(k, segments[k])) for k in picked]  # type: ignore[misc]
    rows.append(_row("  index update, one file", ws.chunks, one, "Bm25Index.put of one file's chunks"))
    return rows


def _file_tokens(ws: Workspace) -> dict[SegmentKey, list[list[str]]]:
    return {
        ("memory", 0, rel): [tokenize(c.text) for c in chunk_markdown(rel, (ws.root / rel).read_text(encoding="utf-8"))]
        for rel in ws.files
    }


def _index_all(segments: dict[SegmentKey, list[list[str]]]) -> Bm25Index:
    index = Bm25Index()
    for key, docs in segments.items():
        index.put(key, docs)
    return index


def bench_naive(ws: Workspace, tokens: list[list[str]], queries: int, rng: random.Random) -> Row:
    """A BM25Okapi built over all chunks on every query, then the top 8 taken."""

    def one(q: str) -> None:
        model = BM25Okapi(tokens)
        scores = model.get_scores(tokenize(q))
        np.argsort(-scores)[:8]

    times = [_timed(lambda q=q: one(q)) for q in _queries(rng, queries)]  # type: ignore[misc]
    return _row("naive rank-bm25", ws.chunks, times, "BM25Okapi rebuilt per query, no snippets")


def bench_bm25s(ws: Workspace, tokens: list[list[str]], rng: random.Random) -> list[Row] | None:
    """bm25s (index once, then queries) on the same token lists; None when bm25s is not importable."""
    try:
        bm25s: Any = importlib.import_module("bm25s")
    except ImportError:
        return None
    docs = [t if t else ["\u2400"] for t in tokens]  # bm25s rejects an empty document

    def build() -> Any:
        retriever = bm25s.BM25()
        retriever.index(docs, show_progress=False)
        return retriever

    build_times: list[float] = []
    retriever: Any = None
    for _ in range(3):
        start = time.perf_counter()
        retriever = build()
        build_times.append(time.perf_counter() - start)

    def one(q: str) -> None:
        qt = [t for t in tokenize(q) if t in retriever.vocab_dict] or ["irrigation"]
        retriever.retrieve([qt], k=min(8, len(docs)), show_progress=False)

    warm = [_timed(lambda q=q: one(q)) for q in _queries(rng, WARM_QUERIES)]  # type: ignore[misc]
    return [
        _row("bm25s index", ws.chunks, build_times, "build from the same tokens"),
        _row("bm25s warm", ws.chunks, warm, "query only, no file checks"),
    ]


def _print_table(rows: Sequence[Row]) -> None:
    print(f"\n| {'measure':<24} | {'chunks':>7} | {'n':>4} | {'p50 ms':>9} | {'p99 ms':>9} | note |")
    print(f"|{'-' * 26}|{'-' * 9}:|{'-' * 5}:|{'-' * 10}:|{'-' * 10}:|------|")
    for r in rows:
        print(f"| {r.name:<24} | {r.chunks:>7,} | {r.samples:>4} | {r.p50:>9.2f} | {r.p99:>9.2f} | {r.note} |")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print a markdown table; exit status 0 whatever the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="only 100 and 1,000 chunks")
    args = parser.parse_args(argv)
    sizes = [100, 1_000] if args.quick else [100, 1_000, TARGET_CHUNKS]
    print(
        f"memory search benchmark: {time.strftime('%Y-%m-%d %H:%M')}, {platform.machine()}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, {platform.platform()}"
    )
    rows: list[Row] = []
    bm25s_missing = False
    warm_at_target: float | None = None
    for size in sizes:
        rng = random.Random(SEED + size)
        with tempfile.TemporaryDirectory(prefix="memory-bench-") as tmp:
            ws = make_workspace(Path(tmp), size, SEED + size)
            print(f"corpus: {ws.chunks:,} chunks in {len(ws.files)} files")
            fh = bench_farmhost(ws, cold_reps=3 if size >= TARGET_CHUNKS else 5, rng=rng)
            rows.extend(fh)
            if size >= TARGET_CHUNKS:
                warm_at_target = fh[1].p50
            tokens = _all_tokens(ws)
            rows.append(bench_naive(ws, tokens, 3 if size >= TARGET_CHUNKS else 20, rng))
            extra = bench_bm25s(ws, tokens, rng)
            if extra is None:
                bm25s_missing = True
            else:
                rows.extend(extra)
    _print_table(rows)
    if bm25s_missing:
        print("\nbm25s: not installed (pip install bm25s to compare)")
    if warm_at_target is not None:
        verdict = "PASS" if warm_at_target <= TARGET_WARM_P50_MS else "FAIL"
        print(
            f"\ntarget warm p50 <= {TARGET_WARM_P50_MS:g} ms at {TARGET_CHUNKS:,} chunks: "
            f"{warm_at_target:.2f} ms {verdict}"
        )
    else:
        print(f"\ntarget warm p50 <= {TARGET_WARM_P50_MS:g} ms at {TARGET_CHUNKS:,} chunks: not measured (--quick)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
