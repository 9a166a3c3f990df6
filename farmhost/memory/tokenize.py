"""Unicode tokenisation for memory search: case and accent folding, words, and CJK character bigrams."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
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

# Combining diacritic blocks that only ever decorate a base letter (Latin, Greek, Cyrillic accents).
# Marks of Indic and other scripts live elsewhere and stay: they are part of the word there.
_DIACRITIC_RANGES: Final[tuple[tuple[int, int], ...]] = (
    (0x0300, 0x036F),
    (0x1AB0, 0x1AFF),
    (0x1DC0, 0x1DFF),
    (0x20D0, 0x20FF),
    (0xFE20, 0xFE2F),
)

# Scripts written without spaces between words (or whose words are short syllable groups):
# Han, Hiragana, Katakana, Hangul, plus their extension and compatibility blocks.
_CJK_RANGES: Final[tuple[tuple[int, int], ...]] = (
    (0x1100, 0x11FF),  # Hangul Jamo
    (0x2E80, 0x2FDF),  # CJK radicals, Kangxi radicals
    (0x3040, 0x30FF),  # Hiragana, Katakana
    (0x3130, 0x318F),  # Hangul compatibility Jamo
    (0x31F0, 0x31FF),  # Katakana phonetic extensions
    (0x3400, 0x4DBF),  # CJK extension A
    (0x4E00, 0x9FFF),  # CJK unified ideographs
    (0xA960, 0xA97F),  # Hangul Jamo extended A
    (0xAC00, 0xD7FF),  # Hangul syllables and Jamo extended B
    (0xF900, 0xFAFF),  # CJK compatibility ideographs
    (0x20000, 0x3FFFF),  # CJK extensions B onwards
)


def _in_ranges(code: int, ranges: tuple[tuple[int, int], ...]) -> bool:
    return any(low <= code <= high for low, high in ranges)


def is_cjk(char: str) -> bool:
    """Whether a character belongs to a script tokenised as character bigrams (Han, kana, Hangul)."""
    return _in_ranges(ord(char), _CJK_RANGES)


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
    """One already case-folded character with its Latin/Greek/Cyrillic accents removed."""
    if is_cjk(char):
        # NFKD would split Hangul syllables into jamo and kana into base + voicing mark.
        return char
    if char in _LETTER_FOLDS:
        return _LETTER_FOLDS[char]
    decomposed = unicodedata.normalize("NFKD", char)
    kept = "".join(c for c in decomposed if not _in_ranges(ord(c), _DIACRITIC_RANGES))
    return "".join(_LETTER_FOLDS.get(c, c) for c in kept)


# What a folded character is to the tokenizer: part of a word, a CJK character (its own tokens), or a separator.
_WORD: Final = "w"
_CJK: Final = "c"
_SEPARATOR: Final = " "


def _char_class(char: str) -> str:
    category = unicodedata.category(char)[0]
    if category in "LN" and is_cjk(char):
        return _CJK
    # Marks (M*) count so that scripts such as Devanagari keep their vowel signs inside the word.
    return _WORD if category in "LNM" else _SEPARATOR


_FOLDS: Final = _LazyTable(_fold_char)
_CLASSES: Final = _LazyTable(_char_class)
_RUNS: Final = re.compile(f"{_WORD}+|{_CJK}+")
# Folded ASCII text: its word characters are exactly the ASCII letters and digits.
_ASCII_WORDS: Final = re.compile(r"[a-z0-9]+")


def fold(text: str) -> str:
    """Normalise text for matching: NFKC, casefold, and accent folding ("Irrigação" -> "irrigacao").

    Args:
        text: Any Unicode text.

    Returns:
        The folded text; CJK characters are kept as they are.
    """
    if text.isascii():
        return text.lower()
    return unicodedata.normalize("NFKC", text).casefold().translate(_FOLDS)


def _cjk_tokens(run: str) -> list[str]:
    """Single characters plus overlapping bigrams of a CJK run, in text order."""
    tokens: list[str] = []
    for i, char in enumerate(run):
        tokens.append(char)
        if i + 1 < len(run):
            tokens.append(run[i : i + 2])
    return tokens


def tokenize(text: str) -> list[str]:
    """Split text into search tokens, for any script.

    Words are maximal runs of letters, digits and marks after folding; runs of Han, Hiragana,
    Katakana or Hangul become their single characters plus overlapping character bigrams, so
    "西红柿" yields 西, 西红, 红, 红柿, 柿 and a query for "红柿" matches it.

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
            tokens.extend(_cjk_tokens(folded[start:end]))
    return tokens
