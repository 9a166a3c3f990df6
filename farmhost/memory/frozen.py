"""A BM25 index's documents frozen as flat arrays (CSR postings): what a snapshot stores and a restart loads.

Loading one is a handful of array reads, with no Python object per document or posting, so a group's first
search after a restart costs milliseconds instead of a rebuild. `check()` verifies the arrays are a
consistent index before any of it is used: a damaged or foreign file must be rebuilt, never trusted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# ("memory", root number, path): the keys a frozen index holds, in ascending order, numbered from 0 by it.
FrozenKey = tuple[str, int, str]


@dataclass(frozen=True, slots=True)
class FrozenIndex:
    """Every live document of an index, renumbered from 0 in segment-key order.

    Attributes:
        keys: The segments, ascending; segment i holds documents [starts[i], starts[i] + counts[i]).
        counts: Documents per segment (int64).
        doc_len: Tokens per document (int64).
        terms: The vocabulary, each term once (its index is its term id).
        offsets: int64, len(terms) + 1: term t's postings are ids[offsets[t]:offsets[t + 1]], ids ascending.
        ids: Document ids of the postings (int32).
        tfs: Term frequencies of the postings (int32, >= 1).
    """

    keys: list[FrozenKey]
    counts: np.ndarray
    doc_len: np.ndarray
    terms: list[str]
    offsets: np.ndarray
    ids: np.ndarray
    tfs: np.ndarray
    vocab: dict[str, int] = field(init=False, repr=False, compare=False)
    starts: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "vocab", dict(zip(self.terms, range(len(self.terms)), strict=True)))
        starts = np.zeros(len(self.keys), dtype=np.int64)
        if len(self.keys) > 1:
            np.cumsum(self.counts[:-1], out=starts[1:])
        object.__setattr__(self, "starts", starts)

    @property
    def n_docs(self) -> int:
        """How many documents."""
        return int(self.doc_len.size)

    def check(self) -> None:
        """Raise ValueError (saying what is wrong) unless the arrays form one consistent index."""
        n, nnz = self.n_docs, int(self.ids.size)
        if len(self.keys) != self.counts.size or any(a <= b for a, b in zip(self.keys[1:], self.keys, strict=False)):
            raise ValueError("segment keys not strictly ascending, or not one count per key")
        if self.counts.size and (int(self.counts.min()) < 0 or int(self.counts.sum()) != n):
            raise ValueError("segment document counts do not add up to the documents")
        if not self.counts.size and n:
            raise ValueError("documents without a segment")
        if len(self.vocab) != len(self.terms) or any(not t for t in self.terms):
            raise ValueError("vocabulary has an empty or repeated term")
        if self.offsets.size != len(self.terms) + 1 or self.tfs.size != nnz:
            raise ValueError("postings arrays of different lengths")
        if int(self.offsets[0]) != 0 or int(self.offsets[-1]) != nnz or bool(np.any(np.diff(self.offsets) < 0)):
            raise ValueError("postings offsets not ascending from 0 to the number of postings")
        if nnz and (int(self.ids.min()) < 0 or int(self.ids.max()) >= n or int(self.tfs.min()) < 1):
            raise ValueError("a posting's document id or term frequency is out of range")
        if nnz > 1:
            rising = np.diff(self.ids) > 0
            rising[self.offsets[1:-1][(self.offsets[1:-1] > 0) & (self.offsets[1:-1] < nnz)] - 1] = True
            if not bool(rising.all()):
                raise ValueError("a term's postings are not in ascending document order")
        if n and not np.array_equal(np.bincount(self.ids, weights=self.tfs, minlength=n), self.doc_len):
            raise ValueError("document lengths disagree with the postings")

    def posting_terms(self) -> np.ndarray:
        """The term id of every posting (parallel to `ids`)."""
        return np.repeat(np.arange(len(self.terms), dtype=np.int32), np.diff(self.offsets))
