"""Unicode tokenisation for memory search: case, accent and vowel-mark folding, words, and character bigrams.

The bigrams are for the scripts written without spaces: CJK, Thai, Lao, Khmer, Burmese, Tibetan, ...
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence
from typing import Final

# Letters that carry their "accent" as part of the letter itself (a stroke, not a combining mark),
# so NFKD leaves them alone; farm languages (Polish, Norwegian/Danish, Croatian/Vietnamese) use them.
_LETTER_FOLDS: Final[dict[str, str]] = {
    "ł": "l",
    "ø": "o",
    "đ": "d",
    "ð": "d",
    "ħ": "h",
    "ŧ": "t",
    "ı": "i",
    "æ": "ae",
    "œ": "oe",
    "þ": "th",
    "ŀ": "l",
}

# Combining marks that only ever decorate a base letter: Latin, Greek and Cyrillic accents, Arabic vowel marks
# (harakat, the dagger alif) and Hebrew points and cantillation, which most writers leave out ("שלום" for "שָׁלוֹם").
# Marks of Indic and other scripts are not here: they are part of the word there. Hebrew's punctuation between the
# points (maqaf U+05BE, paseq U+05C0, sof pasuq U+05C3, nun hafukha U+05C6) stays: it separates words.
_DIACRITIC_RANGES: Final[tuple[tuple[int, int], ...]] = (
    (0x0300, 0x036F),
    (0x0591, 0x05BD),  # Hebrew cantillation and points
    (0x05BF, 0x05BF),  # rafe
    (0x05C1, 0x05C2),  # shin and sin dots
    (0x05C4, 0x05C5),  # upper and lower dots
    (0x05C7, 0x05C7),  # qamats qatan
    (0x064B, 0x065F),  # Arabic harakat: tanwin, fatha, damma, kasra, shadda, sukun, ...
    (0x0670, 0x0670),  # Arabic superscript (dagger) alif
    (0x1AB0, 0x1AFF),
    (0x1DC0, 0x1DFF),
    (0x20D0, 0x20FF),
    (0xFE20, 0xFE2F),
)

# Scripts written without spaces between words: their words cannot be told apart without a dictionary, so their
# text is indexed as single characters plus overlapping bigrams. A letter and the combining marks after it (Thai
# tone marks and vowel signs, a Khmer subscript, a Burmese medial) count as one character here, so a word's
# bigrams in a query are those of the same word inside a sentence.
_SPACELESS_RANGES: Final[tuple[tuple[int, int], ...]] = (
    (0x0E00, 0x0E7F),  # Thai
    (0x0E80, 0x0EFF),  # Lao
    (0x0F00, 0x0FFF),  # Tibetan
    (0x1000, 0x109F),  # Myanmar
    (0x1100, 0x11FF),  # Hangul Jamo
    (0x1780, 0x17FF),  # Khmer
    (0x1950, 0x19DF),  # Tai Le, New Tai Lue
    (0x19E0, 0x19FF),  # Khmer symbols
    (0x1A00, 0x1AAF),  # Buginese, Tai Tham
    (0x1B00, 0x1B7F),  # Balinese
    (0x2E80, 0x2FDF),  # CJK radicals, Kangxi radicals
    (0x3040, 0x30FF),  # Hiragana, Katakana
    (0x3130, 0x318F),  # Hangul compatibility Jamo
    (0x31F0, 0x31FF),  # Katakana phonetic extensions
    (0x3400, 0x4DBF),  # CJK extension A
    (0x4E00, 0x9FFF),  # CJK unified ideographs
    (0xA960, 0xA97F),  # Hangul Jamo extended A
    (0xA980, 0xA9FF),  # Javanese, Myanmar extended B
    (0xAA60, 0xAADF),  # Myanmar extended A, Tai Viet
    (0xAC00, 0xD7FF),  # Hangul syllables and Jamo extended B
    (0xF900, 0xFAFF),  # CJK compatibility ideographs
    (0x20000, 0x3FFFF),  # CJK extensions B onwards
)


def _in_ranges(code: int, ranges: tuple[tuple[int, int], ...]) -> bool:
    return any(low <= code <= high for low, high in ranges)


def is_spaceless(char: str) -> bool:
    """Whether a character belongs to a script written without spaces, tokenised as character bigrams."""
    return _in_ranges(ord(char), _SPACELESS_RANGES)


# Per-character tables for str.translate, filled on first sight of each character; a hostile text of many distinct
# characters still gets correct answers once a table is full, only no longer cached.
_TABLE_LIMIT: Final = 1 << 16


class _LazyTable(dict[int, str]):
    """A str.translate table computed per character on first use: C-speed lookups after that."""

    def __init__(self, compute: Callable[[str], str]) -> None:
        super().__init__()
        self._compute = compute

    def __missing__(self, code: int) -> str:
        value = self._compute(chr(code))
        if len(self) < _TABLE_LIMIT:
            self[code] = value
        return value


def _fold_char(char: str) -> str:
    """One already case-folded character with its accents, Arabic vowel marks and Hebrew points removed."""
    if is_spaceless(char):
        # NFKD would split Hangul syllables into jamo and kana into base + voicing mark.
        return char
    if char in _LETTER_FOLDS:
        return _LETTER_FOLDS[char]
    decomposed = unicodedata.normalize("NFKD", char)
    kept = "".join(c for c in decomposed if not _in_ranges(ord(c), _DIACRITIC_RANGES))
    return "".join(_LETTER_FOLDS.get(c, c) for c in kept)


# What a folded character is to the tokenizer: part of a word, a character of a script written without spaces (the
# start of one of its bigram units), a mark continuing such a unit, or a separator.
_WORD: Final = "w"
_SPACELESS: Final = "c"
_SPACELESS_MARK: Final = "k"
_SEPARATOR: Final = " "


def _char_class(char: str) -> str:
    category = unicodedata.category(char)[0]
    if category in "LNM" and is_spaceless(char):
        return _SPACELESS_MARK if category == "M" else _SPACELESS
    # Marks (M*) count so that scripts such as Devanagari keep their vowel signs inside the word.
    return _WORD if category in "LNM" else _SEPARATOR


_FOLDS: Final = _LazyTable(_fold_char)
_CLASSES: Final = _LazyTable(_char_class)
_RUNS: Final = re.compile(f"{_WORD}+|[{_SPACELESS}{_SPACELESS_MARK}]+")
# Folded ASCII text: its word characters are exactly the ASCII letters and digits.
_ASCII_WORDS: Final = re.compile(r"[a-z0-9]+")


def fold(text: str) -> str:
    """Normalise text for matching: NFKC, casefold, and accent folding ("Irrigação" -> "irrigacao").

    Args:
        text: Any Unicode text.

    Returns:
        The folded text; characters of scripts written without spaces are kept as they are.
    """
    if text.isascii():
        return text.lower()
    return unicodedata.normalize("NFKC", text).casefold().translate(_FOLDS)


def _spaceless_tokens(run: str, classes: str) -> list[str]:
    """Single units plus overlapping bigrams of units, in text order; a unit is a character and its marks."""
    units: Sequence[str] = run
    if _SPACELESS_MARK in classes:
        starts = [i for i, cls in enumerate(classes) if cls == _SPACELESS or i == 0]
        units = [run[a:b] for a, b in zip(starts, [*starts[1:], len(run)], strict=True)]
    tokens: list[str] = []
    for i, unit in enumerate(units):
        tokens.append(unit)
        if i + 1 < len(units):
            tokens.append(unit + units[i + 1])
    return tokens


def tokenize(text: str) -> list[str]:
    """Split text into search tokens, for any script.

    Words are maximal runs of letters, digits and marks after folding; runs of a script written
    without spaces (Han, kana, Hangul, Thai, Lao, Khmer, Burmese, Tibetan, ...) become their single
    characters plus overlapping character bigrams, so "西红柿" yields 西, 西红, 红, 红柿, 柿 and a query
    for "红柿" matches it. There a character keeps its combining marks: "ข้าว" yields ข้, ข้า, า, าว, ว.

    Args:
        text: Any Unicode text (a document chunk or a query).

    Returns:
        The tokens in text order, with repetitions; [] when the text has no letters or digits.
    """
    if text.isascii():  # the common case: folding ASCII is lower-casing, its word characters are [a-z0-9]
        return _ASCII_WORDS.findall(text.lower())
    folded = fold(text)
    classes = folded.translate(_CLASSES)  # one class letter per folded character
    tokens: list[str] = []
    for run in _RUNS.finditer(classes):
        start, end = run.span()
        if classes[start] == _WORD:
            tokens.append(folded[start:end])
        else:
            tokens.extend(_spaceless_tokens(folded[start:end], classes[start:end]))
    return tokens
