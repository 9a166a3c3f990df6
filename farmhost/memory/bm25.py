"""An incremental BM25 index: per-file segments with rank_bm25's term statistics, scored with a positive IDF.

The scores are exactly those of `rank_bm25.BM25Okapi` (k1 = 1.5, b = 0.75) over all live documents,
with Lucene's IDF in place of Okapi's. What differs is the bookkeeping: documents come in
segments (one per memory file or chat message) that can be added, replaced and removed, and the
corpus-wide numbers (document count, total length, document frequency per term) are kept as
running counters. Replacing one file therefore costs in proportion to that file, not to the corpus.
The caches a query builds (a term's postings across segments, the tie-break order) survive updates too:
a removed segment's documents are masked out of the scores until the next renumbering, and a segment
added under a key greater than every other (the newest chat message) is appended to them.
An index can also start from a `FrozenIndex` (a snapshot's arrays): those documents keep their ids and their
postings are read from the arrays in place; replacing or removing one of their files masks it like any other.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
from rank_bm25 import BM25Okapi

from farmhost.memory.frozen import FrozenIndex

K1: Final = 1.5
B: Final = 0.75

SegmentKey = tuple[str, int, str]
"""Orders segments for ties: (kind, number, path), e.g. ("memory", root index, "MEMORY.md")."""


def positive_idf(n_docs: int, doc_freq: int) -> float:
    """Lucene's IDF, log(1 + (N - n + 0.5) / (n + 0.5)): > 0 for every N >= n >= 0.

    The classic Okapi IDF is zero or negative for a term in half or more of the documents, so
    on a two-chunk MEMORY.md the only matching chunk would score 0 and rank as noise. BM25Plus
    is not used because its delta gives every non-matching document a positive score.
    """
    return math.log(1.0 + (n_docs - doc_freq + 0.5) / (doc_freq + 0.5))


class PositiveIdfOkapi(BM25Okapi):  # type: ignore[misc]  # rank_bm25 ships no type hints
    """rank_bm25's Okapi BM25 with `positive_idf`; keeps the per-term document counts it computed."""

    def _calc_idf(self, nd: dict[str, int]) -> None:
        self.doc_counts: dict[str, int] = nd
        for word, freq in nd.items():
            self.idf[word] = positive_idf(self.corpus_size, freq)


@dataclass(slots=True)
class _Segment:
    key: SegmentKey
    base: int  # global id of the segment's first document
    count: int
    total_len: int
    doc_len: list[int]  # empty for a frozen segment: its lengths are in the frozen arrays only
    doc_counts: dict[str, int] | None  # term -> documents of this segment containing it (None: frozen, computed)
    postings: dict[str, tuple[list[int], list[int]]] | None  # term -> (local ids, frequencies); None: frozen

    @property
    def frozen(self) -> bool:
        return self.postings is None


def _segment(key: SegmentKey, base: int, documents: Sequence[Sequence[str]]) -> _Segment:
    lengths = [len(d) for d in documents]
    if len(documents) == 1:  # a chat message: the same counts without a model each (a window loads thousands)
        counts = Counter(documents[0])
        postings = {t: ([0], [f]) for t, f in counts.items()}
        return _Segment(key, base, 1, lengths[0], lengths, dict.fromkeys(counts, 1), postings)
    if not any(documents):  # rank_bm25 divides by the corpus size and cannot take an empty one
        return _Segment(key, base, len(lengths), sum(lengths), lengths, {}, {})
    model = PositiveIdfOkapi([list(d) for d in documents], k1=K1, b=B)
    ids: dict[str, list[int]] = {}
    freqs: dict[str, list[int]] = {}
    for local, doc_freqs in enumerate(model.doc_freqs):
        for term, freq in doc_freqs.items():
            ids.setdefault(term, []).append(local)
            freqs.setdefault(term, []).append(freq)
    postings = {t: (ids[t], freqs[t]) for t in ids}
    return _Segment(key, base, len(lengths), sum(lengths), lengths, model.doc_counts, postings)


def _grown(array: np.ndarray, size: int) -> np.ndarray:
    grown = np.zeros(size, dtype=array.dtype)
    grown[: array.size] = array
    return grown


def _merge(term: str, segments: Iterable[_Segment]) -> tuple[np.ndarray, np.ndarray]:
    """The term's postings in these segments, as global ids and term frequencies."""
    ids: list[int] = []
    tf: list[int] = []
    for seg in segments:
        assert seg.postings is not None  # frozen segments' postings are read from the frozen arrays instead
        local_ids, freqs = seg.postings[term]
        ids.extend(seg.base + i for i in local_ids)
        tf.extend(freqs)
    return np.array(ids, dtype=np.int64), np.array(tf, dtype=np.float64)


class _TieOrder:
    """Global id -> rank in (segment key, position) order, and the segments by base to find a document's owner.

    Ranks only need to order the live documents, so a removed segment leaves a gap (and a stale entry in
    `by_base` that no live id falls into), and a segment whose key is above every key seen is ranked after
    all of them without touching the rest.
    """

    def __init__(self, segments: dict[SegmentKey, _Segment], next_id: int) -> None:
        self.rank = np.zeros(next_id, dtype=np.int64)
        position = 0
        keys = sorted(segments)
        for key in keys:
            seg = segments[key]
            count = seg.count
            self.rank[seg.base : seg.base + count] = np.arange(position, position + count)
            position += count
        self._next_rank = position
        self._last_key = keys[-1] if keys else None
        self.by_base = sorted(segments.values(), key=lambda seg: seg.base)
        self._bases = np.array([seg.base for seg in self.by_base], dtype=np.int64)

    def append(self, seg: _Segment) -> bool:
        """Rank a new segment after every other; False when its key is not above them all (rebuild instead)."""
        if self._last_key is not None and seg.key <= self._last_key:
            return False
        count = seg.count
        if self.rank.size < seg.base + count:
            self.rank = _grown(self.rank, max(seg.base + count, 2 * self.rank.size))
        self.rank[seg.base : seg.base + count] = np.arange(self._next_rank, self._next_rank + count)
        self._next_rank += count
        self._last_key = seg.key
        if self._bases.size <= len(self.by_base):
            self._bases = _grown(self._bases, 2 * self._bases.size + 16)
        self._bases[len(self.by_base)] = seg.base  # the highest base yet: ids only grow between renumberings
        self.by_base.append(seg)
        return True

    def bases(self) -> np.ndarray:
        """The segments' first ids, ascending (parallel to `by_base`)."""
        return self._bases[: len(self.by_base)]


class Bm25Index:
    """BM25 over segments of documents (token lists), updated one segment at a time.

    A document is addressed by (segment key, position in its segment). Ties in score are broken
    by segment key, then position, so results are deterministic whatever the order of updates.
    An index can start from a `FrozenIndex` (`Bm25Index(frozen)`): its documents keep ids below
    `frozen.n_docs`, their postings stay the frozen arrays (read in place, never merged), and a frozen
    segment that is replaced or removed is masked out like any other. Not thread-safe.
    """

    def __init__(self, frozen: FrozenIndex | None = None) -> None:
        """Create an index: empty, or holding the documents of a checked `frozen` index."""
        self._segments: dict[SegmentKey, _Segment] = {}
        self._frozen = frozen
        self._frozen_end = 0 if frozen is None else frozen.n_docs  # ids below are frozen documents
        self._posting_terms: np.ndarray | None = None  # of the frozen postings, built at the first frozen removal
        # Document frequency per term is the frozen one (offsets) plus this change to it.
        self._df_change: dict[str, int] = {}
        self._n_docs = self._total_len = self._next_id = self._unfrozen_docs = 0
        self._doc_len = np.zeros(0, dtype=np.float64)  # by global id; ids of removed segments are unused
        self._dead = np.zeros(0, dtype=np.bool_)  # by global id: removed, still in merged postings until _compact
        self._kinds: dict[str, int] = {}  # a segment key's kind ("memory", "session") -> its code in _kind
        self._kind = np.zeros(0, dtype=np.int16)  # by global id
        # Global postings per term, built on first use; segments added since wait in _pending, removed ones are
        # masked by _dead, so an update never throws away a merge of every other segment's postings.
        self._merged: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._pending: dict[str, list[_Segment]] = {}
        self._term_segments: dict[str, set[SegmentKey]] = {}  # unfrozen segments only
        self._order: _TieOrder | None = None
        if frozen is not None:
            self._load(frozen)

    def _load(self, frozen: FrozenIndex) -> None:
        n = frozen.n_docs
        self._doc_len = frozen.doc_len.astype(np.float64)
        self._dead = np.zeros(n, dtype=np.bool_)
        codes = [self._kinds.setdefault(key[0], len(self._kinds)) for key in frozen.keys]
        self._kind = np.repeat(np.array(codes, dtype=np.int16), frozen.counts)
        for key, start, count in zip(frozen.keys, frozen.starts.tolist(), frozen.counts.tolist(), strict=True):
            total = int(frozen.doc_len[start : start + count].sum())
            self._segments[key] = _Segment(key, start, count, total, [], None, None)
        self._n_docs = self._next_id = n
        self._total_len = int(frozen.doc_len.sum())

    @property
    def size(self) -> int:
        """Number of documents in the index."""
        return self._n_docs

    def __contains__(self, key: SegmentKey) -> bool:
        return key in self._segments

    def keys(self) -> list[SegmentKey]:
        """The keys of the segments in the index, in tie-break order."""
        return sorted(self._segments)

    def frozen_keys(self) -> list[SegmentKey]:
        """The keys of the segments still as the frozen index had them (neither replaced nor removed)."""
        return sorted(key for key, seg in self._segments.items() if seg.frozen)

    def put(self, key: SegmentKey, documents: Sequence[Sequence[str]]) -> None:
        """Add the segment `key`, replacing any segment already under that key.

        Args:
            key: The segment's key (also its place in tie-breaks).
            documents: The segment's documents as token lists; empty lists never match.
        """
        self.remove(key)
        if self._next_id - self._frozen_end + len(documents) > 2 * max(self._unfrozen_docs, 512):
            self._compact()
        segment = _segment(key, self._next_id, documents)
        self._next_id += len(documents)
        if self._doc_len.size < self._next_id:
            size = max(self._next_id, 2 * self._doc_len.size)
            self._doc_len = _grown(self._doc_len, size)
            self._dead = _grown(self._dead, size)
            self._kind = _grown(self._kind, size)
        self._doc_len[segment.base : segment.base + len(documents)] = segment.doc_len
        self._kind[segment.base : segment.base + len(documents)] = self._kinds.setdefault(key[0], len(self._kinds))
        self._segments[key] = segment
        self._account(segment, +1)
        assert segment.postings is not None
        for term in segment.postings:
            if term in self._merged:
                self._pending.setdefault(term, []).append(segment)
        if self._order is not None and not self._order.append(segment):
            self._order = None

    def remove(self, key: SegmentKey) -> None:
        """Remove the segment `key` if present."""
        segment = self._segments.pop(key, None)
        if segment is not None:
            self._account(segment, -1)
            self._dead[segment.base : segment.base + segment.count] = True

    def _doc_counts(self, segment: _Segment) -> dict[str, int]:
        if segment.doc_counts is not None:
            return segment.doc_counts
        frozen = self._frozen
        assert frozen is not None
        if self._posting_terms is None:
            self._posting_terms = frozen.posting_terms()
        inside = (frozen.ids >= segment.base) & (frozen.ids < segment.base + segment.count)
        counts = np.bincount(self._posting_terms[inside], minlength=len(frozen.terms))
        return {frozen.terms[t]: int(counts[t]) for t in np.flatnonzero(counts).tolist()}

    def _frozen_df(self, term: str) -> int:
        frozen = self._frozen
        if frozen is None or (tid := frozen.vocab.get(term)) is None:
            return 0
        return int(frozen.offsets[tid + 1] - frozen.offsets[tid])

    def _df(self, term: str) -> int:
        return self._frozen_df(term) + self._df_change.get(term, 0)

    def _account(self, segment: _Segment, sign: int) -> None:
        self._n_docs += sign * segment.count
        self._total_len += sign * segment.total_len
        if not segment.frozen:
            self._unfrozen_docs += sign * segment.count
        change = self._df_change
        if sign > 0:  # an added segment is never frozen, and no term can reach zero
            for term, count in self._doc_counts(segment).items():
                change[term] = change.get(term, 0) + count
                self._term_segments.setdefault(term, set()).add(segment.key)
            return
        for term, count in self._doc_counts(segment).items():
            left = change.get(term, 0) - count
            if left:
                change[term] = left
            else:
                change.pop(term, None)
            if not segment.frozen:
                holders = self._term_segments[term]
                holders.discard(segment.key)
                if not holders:
                    del self._term_segments[term]
            if not self._df(term):
                self._merged.pop(term, None)
                self._pending.pop(term, None)

    def _compact(self) -> None:
        """Renumber the live unfrozen documents from the end of the frozen ones, so removals stop taking id space."""
        next_id = self._frozen_end
        unfrozen = [self._segments[key] for key in sorted(self._segments) if not self._segments[key].frozen]
        for seg in unfrozen:
            seg.base = next_id
            next_id += seg.count
        self._next_id = next_id
        end = self._frozen_end
        self._doc_len = _grown(self._doc_len[:end], next_id)
        self._dead = _grown(self._dead[:end], next_id)
        self._kind = _grown(self._kind[:end], next_id)
        for seg in unfrozen:
            self._doc_len[seg.base : seg.base + seg.count] = seg.doc_len
            self._kind[seg.base : seg.base + seg.count] = self._kinds[seg.key[0]]
        self._merged = {}
        self._pending = {}
        self._order = None

    def idf(self, term: str) -> float:
        """The term's IDF over the current documents (0.0 for a term in no document)."""
        freq = self._df(term)
        return 0.0 if not freq else positive_idf(self._n_docs, freq)

    def _postings(self, term: str) -> tuple[np.ndarray, np.ndarray] | None:
        """The term's postings over every document (those of removed segments included: _scores masks them)."""
        merged = self._merged.get(term)
        if merged is None:
            if not self._df(term):
                return None
            parts: list[tuple[np.ndarray, np.ndarray]] = []
            frozen = self._frozen
            if frozen is not None and (tid := frozen.vocab.get(term)) is not None:
                start, end = int(frozen.offsets[tid]), int(frozen.offsets[tid + 1])
                parts.append((frozen.ids[start:end], frozen.tfs[start:end]))
            holders = self._term_segments.get(term)
            if holders:
                parts.append(_merge(term, (self._segments[k] for k in holders)))
            if len(parts) == 1:
                merged = parts[0]
            else:
                merged = (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
            self._merged[term] = merged
        elif term in self._pending:
            ids, tf = _merge(term, self._pending.pop(term))
            merged = self._merged[term] = (np.concatenate((merged[0], ids)), np.concatenate((merged[1], tf)))
        return merged

    def _scores(self, tokens: Sequence[str]) -> np.ndarray:
        total = np.zeros(self._next_id, dtype=np.float64)
        if self._n_docs == 0 or self._total_len == 0:
            return total
        avgdl = self._total_len / self._n_docs
        for term in dict.fromkeys(tokens):
            posting = self._postings(term)
            if posting is None:
                continue
            ids, tf = posting
            norm = K1 * (1.0 - B + B * self._doc_len[ids] / avgdl)
            total[ids] += self.idf(term) * tf * (K1 + 1.0) / (tf + norm)
        total[self._dead[: self._next_id]] = 0.0
        return total

    def _tie_order(self) -> _TieOrder:
        if self._order is None:
            self._order = _TieOrder(self._segments, self._next_id)
        return self._order

    def scores(self, tokens: Sequence[str]) -> dict[tuple[SegmentKey, int], float]:
        """The BM25 score of every document for the query (each distinct token counted once)."""
        total = self._scores(tokens)
        return {(seg.key, i): float(total[seg.base + i]) for seg in self._segments.values() for i in range(seg.count)}

    def freeze(self) -> FrozenIndex:
        """Every live document as a `FrozenIndex` (renumbered in key order); the index itself is unchanged.

        Raises:
            ValueError: a segment key is not a memory file's ("memory", root, path): chat messages are not frozen.
        """
        keys = sorted(self._segments)
        if any(key[0] != "memory" for key in keys):
            raise ValueError("only memory files are frozen; remove the chat messages first")
        counts = np.array([self._segments[k].count for k in keys], dtype=np.int64)
        remap = np.full(self._next_id, -1, dtype=np.int64)
        old_ids = np.concatenate(
            [np.arange(s.base, s.base + s.count) for s in (self._segments[k] for k in keys)] or [np.zeros(0, np.int64)]
        ).astype(np.int64)
        remap[old_ids] = np.arange(old_ids.size)
        doc_len = self._doc_len[old_ids].astype(np.int64)
        # Every live posting as (term, new id, tf), gathered per segment (one pass, no per-term merge), then sorted.
        names: dict[str, int] = {}
        runs: list[tuple[int, int, int]] = []  # (term number, the segment's new base, postings) per segment and term
        local_ids: list[int] = []
        freqs: list[int] = []
        for key in keys:
            seg = self._segments[key]
            if seg.postings is None:
                continue
            new_base = int(remap[seg.base]) if seg.count else 0
            for term, (local, tf) in seg.postings.items():
                runs.append((names.setdefault(term, len(names)), new_base, len(local)))
                local_ids.extend(local)
                freqs.extend(tf)
        term_parts, id_parts, tf_parts = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
        if runs:
            run = np.array(runs, dtype=np.int64)
            term_parts.append(np.repeat(run[:, 0], run[:, 2]))
            id_parts.append(np.array(local_ids, dtype=np.int64) + np.repeat(run[:, 1], run[:, 2]))
            tf_parts.append(np.array(freqs, dtype=np.int64))
        frozen = self._frozen
        if frozen is not None:
            new = remap[frozen.ids]
            alive = new >= 0
            numbers = np.array([names.setdefault(t, len(names)) for t in frozen.terms], dtype=np.int64)
            if self._posting_terms is None:
                self._posting_terms = frozen.posting_terms()
            term_parts.append(numbers[self._posting_terms[alive]])
            id_parts.append(new[alive])
            tf_parts.append(frozen.tfs[alive].astype(np.int64))
        all_terms, all_ids, all_tfs = (np.concatenate(p) for p in (term_parts, id_parts, tf_parts))
        terms = sorted(names)  # the vocabulary in order; a name's number is its place of first sight
        place = np.zeros(len(names), dtype=np.int64)
        place[[names[t] for t in terms]] = np.arange(len(terms))
        all_terms = place[all_terms]
        order = np.lexsort((all_ids, all_terms))
        used = np.bincount(all_terms, minlength=len(terms))
        kept = [t for t, n in zip(terms, used.tolist(), strict=True) if n]
        offsets = np.zeros(len(kept) + 1, dtype=np.int64)
        np.cumsum(used[used > 0], out=offsets[1:])
        ids = all_ids[order].astype(np.int32)
        return FrozenIndex(keys, counts, doc_len, kept, offsets, ids, all_tfs[order].astype(np.int32))

    def ranked(
        self, tokens: Sequence[str], batch: int = 8, *, kind: str | None = None
    ) -> Iterator[tuple[SegmentKey, int, float]]:
        """The matching documents for the query tokens, best first, sorted lazily.

        Args:
            tokens: The query's tokens.
            batch: How many to sort before the first result; each further batch is 4 times larger,
                so a caller that stops after a few results never sorts the whole match list.
            kind: Only documents of segments whose key starts with this kind; they are scored over
                every document all the same (same IDF and average length).

        Yields:
            (segment key, position, score) with score > 0, by score descending, then segment key,
            then position.
        """
        total = self._scores(tokens)
        if kind is not None:
            total[self._kind[: self._next_id] != self._kinds.get(kind, -1)] = 0.0
        remaining = np.flatnonzero(total > 0.0)
        order = self._tie_order()
        rank, bases, by_base = order.rank, order.bases(), order.by_base
        batch = max(batch, 1)
        while remaining.size:
            if remaining.size > batch:
                # The `batch` best scores and everything tied with the last of them, so ties never split.
                cut = remaining.size - batch
                threshold = np.partition(total[remaining], cut)[cut]
                take, remaining = remaining[total[remaining] >= threshold], remaining[total[remaining] < threshold]
            else:
                take, remaining = remaining, remaining[:0]
            ordered = take[np.lexsort((rank[take], -total[take]))]
            owners = np.searchsorted(bases, ordered, side="right") - 1
            for doc, owner in zip(ordered.tolist(), owners.tolist(), strict=True):
                yield by_base[owner].key, doc - by_base[owner].base, float(total[doc])
            batch *= 4
