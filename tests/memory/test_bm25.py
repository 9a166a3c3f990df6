"""Tests for farmhost.memory.bm25: positive IDF on tiny corpora, incremental updates equal a full rebuild."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rank_bm25 import BM25Okapi

from farmhost.memory.bm25 import Bm25Index, PositiveIdfOkapi, SegmentKey
from farmhost.memory.tokenize import tokenize

KEY: SegmentKey = ("memory", 0, "MEMORY.md")


def _docs(*texts: str) -> list[list[str]]:
    return [tokenize(t) for t in texts]


def build(docs: list[list[str]]) -> Bm25Index:
    """One segment holding `docs`, so a document's position is its index in `docs`."""
    index = Bm25Index()
    index.put(KEY, docs)
    return index


def ranked_ids(index: Bm25Index, tokens: list[str], batch: int = 8) -> list[int]:
    return [position for _, position, _ in index.ranked(tokens, batch)]


def scores(index: Bm25Index, tokens: list[str], count: int) -> list[float]:
    every = index.scores(tokens)
    return [every[(KEY, i)] for i in range(count)]


# Each case: chunks, a query whose terms appear in half or more of the chunks, the chunk that must rank first.
TINY_CORPORA = [
    pytest.param(["Tomatoes need water every morning."], "tomatoes water", 0, id="1-chunk"),
    pytest.param(
        ["The tomatoes in the north field need water.", "The maize in the south field is dry."],
        "tomatoes field",
        0,
        id="2-chunks-term-in-both",
    ),
    pytest.param(
        ["# Pomidory\nPomidory podlewamy rano.", "# Kukurydza\nKukurydza rośnie na polu, pomidory obok."],
        "podlewamy pomidory",
        0,
        id="2-chunks-polish",
    ),
    pytest.param(
        ["O campo norte tem tomates.", "O campo sul tem milho e irrigação.", "A bomba fica no galpão."],
        "irrigacao campo",
        1,
        id="3-chunks-portuguese",
    ),
    pytest.param(["北边的地种番茄。", "南边的地种玉米。", "水泵在仓库里。"], "番茄 地", 0, id="3-chunks-chinese"),
]


@pytest.mark.parametrize(("chunks", "text", "best"), TINY_CORPORA)
def test_tiny_corpora_rank_the_matching_chunk_first(chunks: list[str], text: str, best: int) -> None:
    docs = _docs(*chunks)
    index = build(docs)
    tokens = tokenize(text)
    assert all(index.idf(t) > 0 for t in tokens if any(t in d for d in docs))
    results = list(index.ranked(tokens))
    assert results[0][1] == best
    assert results[0][2] > 0
    every = scores(index, tokens, len(docs))
    assert all(every[best] > s for i, s in enumerate(every) if i != best)


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_term_in_every_chunk_still_counts(size: int) -> None:
    index = build([["pump", f"word{i}"] for i in range(size)])
    assert index.idf("pump") > 0
    assert ranked_ids(index, ["pump"]) == list(range(size))


def test_non_matching_chunks_score_zero_and_are_excluded() -> None:
    index = build(_docs("pump north", "pump south", "valve east"))
    assert scores(index, ["pump"], 3)[2] == 0.0
    assert ranked_ids(index, ["pump"]) == [0, 1]
    assert list(index.ranked(["nothing"])) == []
    assert list(index.ranked([])) == []


def test_ties_break_by_position_whatever_the_batch_size() -> None:
    index = build([["a", "x"], ["b"], ["a", "x"], ["a", "x"], ["a"], ["a", "x", "y", "z"]])
    expected = [4, 0, 2, 3, 5]  # the shortest document first, then the three ties in order
    for batch in (0, 1, 2, 3, 8):
        assert ranked_ids(index, ["a"], batch) == expected


def test_ties_across_segments_break_by_segment_key_whatever_the_insertion_order() -> None:
    index = Bm25Index()
    for key in [("memory", 1, "b.md"), ("memory", 0, "z.md"), ("session", 3, ""), ("memory", 0, "a.md")]:
        index.put(key, [["pump"]])
    assert [key for key, _, _ in list(index.ranked(["pump"]))] == [
        ("memory", 0, "a.md"),
        ("memory", 0, "z.md"),
        ("memory", 1, "b.md"),
        ("session", 3, ""),
    ]


def test_term_frequency_and_rarity_raise_the_score() -> None:
    index = build([["pump", "pump", "valve"], ["pump", "valve", "tank"], ["tank", "valve", "hose"]])
    assert ranked_ids(index, ["pump"]) == [0, 1]
    # "hose" is rarer than "valve", so the chunk with both ranks first
    assert ranked_ids(index, ["valve", "hose"])[0] == 2


def test_duplicate_query_tokens_count_once() -> None:
    index = build([["pump"], ["valve"]])
    assert index.scores(["pump", "pump"]) == index.scores(["pump"])


@pytest.mark.parametrize("docs", [[], [[]], [[], []]])
def test_empty_corpora(docs: list[list[str]]) -> None:
    index = build(docs)
    assert list(index.ranked(["pump"])) == []
    assert scores(index, ["pump"], len(docs)) == [0.0] * len(docs)


def test_empty_documents_next_to_real_ones_never_match() -> None:
    index = build([[], ["pump"], []])
    assert list(index.ranked(["pump"])) == [(KEY, 1, pytest.approx(index.scores(["pump"])[(KEY, 1)]))]


def test_classic_okapi_idf_fails_where_ours_does_not() -> None:
    docs = [["tomatoes", "field"], ["maize", "field"]]
    assert BM25Okapi(docs).get_scores(["field"])[0] <= 0  # why the variant exists
    ours = build(docs)
    assert scores(ours, ["field"], 2)[0] > 0
    best = list(ours.ranked(["field", "tomatoes"]))
    assert best[0][1] == 0 and best[0][2] > best[1][2]


def test_replacing_and_removing_a_segment_updates_the_corpus_statistics() -> None:
    index = Bm25Index()
    index.put(("memory", 0, "a.md"), [["pump", "north"], ["valve"]])
    index.put(("memory", 0, "b.md"), [["pump", "south"]])
    assert index.size == 3
    idf_before = index.idf("pump")
    index.put(("memory", 0, "a.md"), [["valve"]])  # the edit drops "pump" from a.md
    assert index.size == 2
    assert index.idf("pump") > idf_before  # rarer now
    assert index.idf("north") == 0.0
    index.remove(("memory", 0, "b.md"))
    assert list(index.ranked(["pump"])) == []
    assert index.keys() == [("memory", 0, "a.md")]
    index.remove(("memory", 9, "missing.md"))  # removing what is not there is a no-op
    assert index.size == 1


_WORDS = st.sampled_from(["pump", "valve", "north", "south", "tomato", "milho", "番", "茄", "frost"])
_DOC = st.lists(_WORDS, max_size=6)
_SEGMENT = st.lists(_DOC, min_size=0, max_size=4)
_OPS = st.lists(
    st.tuples(st.sampled_from(["put", "remove"]), st.integers(min_value=0, max_value=5), _SEGMENT), max_size=40
)


@settings(max_examples=150, deadline=None)
@given(ops=_OPS, query=st.lists(_WORDS, min_size=1, max_size=3), batch=st.integers(min_value=1, max_value=5))
def test_any_sequence_of_updates_scores_like_rank_bm25_over_the_live_documents(
    ops: list[tuple[str, int, list[list[str]]]], query: list[str], batch: int
) -> None:
    index = Bm25Index()
    live: dict[SegmentKey, list[list[str]]] = {}
    for op, number, docs in ops:
        key: SegmentKey = ("memory", 0, f"f{number}.md")
        if op == "put":
            index.put(key, docs)
            live[key] = docs
        else:
            index.remove(key)
            live.pop(key, None)
    flat = [(key, i, doc) for key in sorted(live) for i, doc in enumerate(live[key])]
    assert index.size == len(flat)
    ours = index.scores(query)
    if not any(doc for _, _, doc in flat):
        assert all(s == 0.0 for s in ours.values())
        assert list(index.ranked(query)) == []
        return
    reference = PositiveIdfOkapi([doc for _, _, doc in flat]).get_scores(list(dict.fromkeys(query)))
    for (key, i, _), expected in zip(flat, reference, strict=True):
        assert ours[(key, i)] == pytest.approx(expected, rel=1e-9, abs=1e-12)
    expected_order = sorted(
        ((key, i) for (key, i, _), s in zip(flat, reference, strict=True) if s > 0),
        key=lambda ki: (-ours[ki], ki),
    )
    assert [(key, i) for key, i, _ in index.ranked(query, batch)] == expected_order


def test_thousands_of_edits_keep_scores_exact() -> None:
    """Replacing files over and over renumbers documents now and then; scores must not drift."""
    index = Bm25Index()
    for n in range(3000):
        index.put(("memory", 0, f"f{n % 7}.md"), [["pump", f"w{n}"], ["valve", "pump"], [f"w{n}"]])
    last = sorted(range(2993, 3000), key=lambda n: n % 7)  # the surviving content, in key order f0..f6
    docs = [doc for n in last for doc in (["pump", f"w{n}"], ["valve", "pump"], [f"w{n}"])]
    reference = PositiveIdfOkapi(docs).get_scores(["pump", "w2999"])
    ours = index.scores(["pump", "w2999"])
    assert len(ours) == 21
    assert [ours[(("memory", 0, f"f{n % 7}.md"), i)] for n in last for i in range(3)] == pytest.approx(list(reference))
    assert next(index.ranked(["w2999"]))[:2] == (("memory", 0, f"f{2999 % 7}.md"), 2)


_MIXED_OPS = st.lists(
    st.tuples(
        st.sampled_from(["put", "remove", "append", "evict", "query", "freeze"]),
        st.integers(min_value=0, max_value=4),
        _SEGMENT,
        st.lists(_WORDS, min_size=1, max_size=3),
    ),
    max_size=60,
)


def _reference(live: dict[SegmentKey, list[list[str]]], query: list[str]) -> list[tuple[SegmentKey, int]]:
    """What a fresh index over the live segments ranks (the order and ties the cached one must keep)."""
    return [(key, i) for key, i, _ in _fresh(live).ranked(query, batch=64)]


@settings(max_examples=250, deadline=None)
@given(ops=_MIXED_OPS, batch=st.integers(min_value=1, max_value=5))
def test_queries_between_edits_appends_and_evictions_rank_like_a_fresh_index(
    ops: list[tuple[str, int, list[list[str]], list[str]]], batch: int
) -> None:
    """Messages come with ever higher keys, the oldest leave; files change and are frozen between; caches never lie."""
    index = Bm25Index()
    live: dict[SegmentKey, list[list[str]]] = {}
    next_message = 0
    for op, number, docs, query in ops:
        if op == "put":
            key: SegmentKey = ("memory", 0, f"f{number}.md")
            index.put(key, docs)
            live[key] = docs
        elif op == "remove":
            index.remove(("memory", 0, f"f{number}.md"))
            live.pop(("memory", 0, f"f{number}.md"), None)
        elif op == "append":
            next_message += 1 + number
            index.put(("session", next_message, ""), docs[:1] or [[]])
            live[("session", next_message, "")] = docs[:1] or [[]]
        elif op == "evict":
            for oldest in sorted(k for k in live if k[0] == "session")[: number + 1]:
                index.remove(oldest)
                del live[oldest]
        elif op == "freeze":  # a snapshot's restart: the memory files frozen, the index started from them
            for message in [k for k in live if k[0] == "session"]:
                index.remove(message)
                del live[message]
            frozen = index.freeze()
            frozen.check()
            assert frozen.keys == sorted(live)
            index = Bm25Index(frozen)
            assert index.frozen_keys() == sorted(live)
        else:
            ours = index.scores(query)
            assert set(ours) == {(key, i) for key in live for i in range(len(live[key]))}
            assert ours == pytest.approx(_fresh(live).scores(query), rel=1e-9, abs=1e-12)
            every = list(index.ranked(query, batch))
            assert [(key, i) for key, i, _ in every] == _reference(live, query)
            for kind in ("memory", "session"):
                assert list(index.ranked(query, batch, kind=kind)) == [r for r in every if r[0][0] == kind]
    assert index.size == sum(len(d) for d in live.values())


def test_ties_between_a_frozen_file_and_a_file_added_after_a_restart_break_by_key() -> None:
    """Found by the property test in CI: a frozen segment's documents had no tie rank, so they beat lower keys."""
    index = Bm25Index()
    index.put(("memory", 0, "f0.md"), [])
    index.put(("memory", 0, "f1.md"), [["pump"]])
    index = Bm25Index(index.freeze())
    index.put(("memory", 0, "f0.md"), [["pump"]])
    ranked = list(index.ranked(["pump"], batch=1))
    assert [(key[2], i) for key, i, _ in ranked] == [("f0.md", 0), ("f1.md", 0)]
    assert ranked[0][2] == ranked[1][2] > 0


def test_a_chat_window_sliding_for_thousands_of_messages_keeps_scores_exact() -> None:
    """Append one message, evict the oldest, query now and then: renumberings happen on the way, ranks stay right."""
    index = Bm25Index()
    live: dict[SegmentKey, list[list[str]]] = {("memory", 0, "MEMORY.md"): [["pump", "valve"], ["tank"]]}
    index.put(("memory", 0, "MEMORY.md"), live[("memory", 0, "MEMORY.md")])
    window, query = 50, ["pump", "w3"]
    for n in range(3000):
        live[("session", n, "")] = [["pump", f"w{n % 11}"]]
        index.put(("session", n, ""), live[("session", n, "")])
        if n >= window:
            index.remove(("session", n - window, ""))
            del live[("session", n - window, "")]
        if n % 37 == 0 or n == 2999:
            assert index.scores(query) == pytest.approx(_fresh(live).scores(query), rel=1e-9, abs=1e-12)
            assert [(key, i) for key, i, _ in index.ranked(query, batch=3)] == _reference(live, query)
    assert index.size == 2 + window


def _fresh(live: dict[SegmentKey, list[list[str]]]) -> Bm25Index:
    fresh = Bm25Index()
    for key in sorted(live):
        fresh.put(key, live[key])
    return fresh


def test_a_frozen_index_with_messages_is_refused() -> None:
    index = Bm25Index()
    index.put(("session", 1, ""), [["pump"]])
    with pytest.raises(ValueError, match="chat messages"):
        index.freeze()
