"""Tests for farmhost.memory.bm25: positive IDF on tiny corpora, zero-score exclusion, deterministic order."""

from __future__ import annotations

import pytest

from farmhost.memory.bm25 import build, query
from farmhost.memory.tokenize import tokenize


def _docs(*texts: str) -> list[list[str]]:
    return [tokenize(t) for t in texts]


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
    index = build(_docs(*chunks))
    tokens = tokenize(text)
    assert all(index.idf(t) > 0 for t in tokens if any(t in d for d in _docs(*chunks)))
    results = query(index, tokens, k=10)
    assert results[0][0] == best
    assert results[0][1] > 0
    scores = index.scores(tokens)
    assert all(scores[best] > s for i, s in enumerate(scores) if i != best)


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_term_in_every_chunk_still_counts(size: int) -> None:
    docs = [["pump", f"word{i}"] for i in range(size)]
    index = build(docs)
    assert index.idf("pump") > 0
    assert [i for i, _ in query(index, ["pump"], k=10)] == list(range(size))


def test_non_matching_chunks_score_zero_and_are_excluded() -> None:
    index = build(_docs("pump north", "pump south", "valve east"))
    assert index.scores(["pump"])[2] == 0.0
    assert [i for i, _ in query(index, ["pump"], k=10)] == [0, 1]
    assert query(index, ["nothing"], k=10) == []
    assert query(index, [], k=10) == []


def test_ties_break_by_index_and_k_limits() -> None:
    index = build([["a", "x"], ["b"], ["a", "x"], ["a", "x"]])
    assert [i for i, _ in query(index, ["a"], k=10)] == [0, 2, 3]
    assert [i for i, _ in query(index, ["a"], k=2)] == [0, 2]
    assert query(index, ["a"], k=0) == []


def test_term_frequency_and_rarity_raise_the_score() -> None:
    index = build([["pump", "pump", "valve"], ["pump", "valve", "tank"], ["tank", "valve", "hose"]])
    assert [i for i, _ in query(index, ["pump"], k=3)] == [0, 1]
    # "hose" is rarer than "valve", so the chunk with both ranks first
    assert query(index, ["valve", "hose"], k=3)[0][0] == 2


def test_duplicate_query_tokens_count_once() -> None:
    index = build([["pump"], ["valve"]])
    assert index.scores(["pump", "pump"]) == index.scores(["pump"])


@pytest.mark.parametrize("docs", [[], [[]], [[], []]])
def test_empty_corpora(docs: list[list[str]]) -> None:
    index = build(docs)
    assert query(index, ["pump"], k=5) == []
    assert index.scores(["pump"]) == [0.0] * len(docs)


def test_empty_documents_next_to_real_ones_never_match() -> None:
    index = build([[], ["pump"], []])
    assert query(index, ["pump"], k=5)[0][0] == 1
    assert len(query(index, ["pump"], k=5)) == 1


def test_classic_okapi_idf_fails_where_ours_does_not() -> None:
    from rank_bm25 import BM25Okapi

    docs = [["tomatoes", "field"], ["maize", "field"]]
    assert BM25Okapi(docs).get_scores(["field"])[0] <= 0  # why the variant exists
    ours = build(docs)
    assert ours.scores(["field"])[0] > 0
    best, score = query(ours, ["field", "tomatoes"], k=2)[0]
    assert (best, score > ours.scores(["field", "tomatoes"])[1]) == (0, True)
