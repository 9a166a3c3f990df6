"""BM25 index build and query over token lists (rank_bm25 Okapi with an IDF that never goes to zero)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

import numpy as np
from rank_bm25 import BM25Okapi

K1: Final = 1.5
B: Final = 0.75


class _PositiveIdfOkapi(BM25Okapi):  # type: ignore[misc]  # rank_bm25 ships no type hints
    """Okapi BM25 with Lucene's IDF, log(1 + (N - n + 0.5) / (n + 0.5)), which is > 0 for every N and n.

    The classic Okapi IDF is zero or negative for a term in half or more of the documents, so
    on a two-chunk MEMORY.md the only matching chunk would score 0 and rank as noise. BM25Plus
    is not used because its delta gives every non-matching document a positive score.
    """

    def _calc_idf(self, nd: dict[str, int]) -> None:
        n_docs = self.corpus_size
        for word, freq in nd.items():
            self.idf[word] = math.log(1.0 + (n_docs - freq + 0.5) / (freq + 0.5))


class Bm25Index:
    """An immutable BM25 index over a list of token lists (one per document).

    Build once per corpus version; rank_bm25 has no incremental update, so a changed corpus
    means a new index built from the cached token lists.
    """

    def __init__(self, documents: Sequence[Sequence[str]]) -> None:
        """Index `documents`, each a token list (empty lists are allowed and never match).

        Args:
            documents: One token list per document; a document's position is its id.
        """
        self.size: int = len(documents)
        self._model: _PositiveIdfOkapi | None = None
        # Inverted postings (term -> document ids, term frequencies) so a query costs in
        # proportion to the matching documents, not the corpus.
        self._postings: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        if self.size == 0 or not any(documents):
            return
        self._model = _PositiveIdfOkapi([list(d) for d in documents], k1=K1, b=B)
        ids: dict[str, list[int]] = {}
        freqs: dict[str, list[int]] = {}
        for doc_id, doc_freqs in enumerate(self._model.doc_freqs):
            for term, freq in doc_freqs.items():
                ids.setdefault(term, []).append(doc_id)
                freqs.setdefault(term, []).append(freq)
        self._postings = {t: (np.array(ids[t], dtype=np.int64), np.array(freqs[t], dtype=np.float64)) for t in ids}
        self._norm = K1 * (1.0 - B + B * np.array(self._model.doc_len, dtype=np.float64) / self._model.avgdl)

    def idf(self, term: str) -> float:
        """The term's IDF (0.0 for a term in no document)."""
        if self._model is None:
            return 0.0
        return float(self._model.idf.get(term, 0.0))

    def scores(self, tokens: Sequence[str]) -> list[float]:
        """BM25 score of every document for the query tokens (each distinct token counted once).

        Args:
            tokens: The query's tokens.

        Returns:
            One score per document, 0.0 for a document sharing no token with the query.
        """
        total = np.zeros(self.size, dtype=np.float64)
        if self._model is None:
            return [0.0] * self.size
        for term in dict.fromkeys(tokens):
            posting = self._postings.get(term)
            if posting is None:
                continue
            doc_ids, tf = posting
            total[doc_ids] += self.idf(term) * tf * (K1 + 1.0) / (tf + self._norm[doc_ids])
        return [float(s) for s in total]


def build(documents: Sequence[Sequence[str]]) -> Bm25Index:
    """Build a BM25 index over token lists (see `Bm25Index`)."""
    return Bm25Index(documents)


def query(index: Bm25Index, tokens: Sequence[str], k: int) -> list[tuple[int, float]]:
    """The top `k` documents for the query tokens.

    Args:
        index: The index to search.
        tokens: The query's tokens.
        k: At most this many results (k <= 0 gives []).

    Returns:
        (document id, score) pairs with score > 0, by score descending then id ascending.
    """
    if k <= 0:
        return []
    scored = [(i, s) for i, s in enumerate(index.scores(tokens)) if s > 0.0]
    scored.sort(key=lambda pair: (-pair[1], pair[0]))
    return scored[:k]
