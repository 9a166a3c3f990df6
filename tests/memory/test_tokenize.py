"""Tests for farmhost.memory.tokenize: folding and tokens across Latin, Polish, Chinese, Japanese, Korean, Hindi."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from farmhost.memory.tokenize import fold, is_cjk, tokenize


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Irrigação às 6h", "irrigacao as 6h"),
        ("Żółty ŁĄKA", "zolty laka"),
        ("Ærø Øster Đorđe", "aero oster dorde"),
        ("Straße İzmir", "strasse izmir"),
        ("ＡＢＣ１２", "abc12"),  # fullwidth forms via NFKC
        ("西红柿", "西红柿"),  # CJK untouched
        ("토마토 ガ", "토마토 ガ"),  # Hangul not split into jamo, kana keeps its voicing mark
    ],
)
def test_fold(text: str, expected: str) -> None:
    assert fold(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", []),
        ("... !? — ---", []),
        ("Regar o tomate, às 6h!", ["regar", "o", "tomate", "as", "6h"]),
        ("Pomidory na żółtym polu", ["pomidory", "na", "zoltym", "polu"]),
        ("CO2: 12.5 ppm", ["co2", "12", "5", "ppm"]),
        ("番茄", ["番", "番茄", "茄"]),
        ("西红柿需要浇水", ["西", "西红", "红", "红柿", "柿", "柿需", "需", "需要", "要", "要浇", "浇", "浇水", "水"]),
        ("水", ["水"]),
        ("pH值7", ["ph", "值", "7"]),  # digits are words of their own, not part of a CJK run
        ("토마토 물", ["토", "토마", "마", "마토", "토", "물"]),
        ("किसान खेत", ["किसान", "खेत"]),  # Devanagari vowel signs stay inside the word
    ],
)
def test_tokenize(text: str, expected: list[str]) -> None:
    assert tokenize(text) == expected


@pytest.mark.parametrize(
    ("document", "query"),
    [
        ("A irrigação do campo norte começa às seis.", "irrigacao campo"),
        ("Irrigacao do campo norte", "IRRIGAÇÃO"),
        ("Żółte pomidory rosną na łące za stodołą.", "zolte pomidory lace stodola"),
        ("zolte pomidory", "Żółte"),
        ("温室里的番茄需要每天浇水。", "番茄 浇水"),
        ("西红柿的叶子发黄了", "红柿"),
        ("The north field's tomatoes need water at dawn.", "Tomatoes NORTH"),
    ],
)
def test_query_tokens_are_found_in_document(document: str, query: str) -> None:
    assert set(tokenize(query)) <= set(tokenize(document))


def test_cjk_bigram_does_not_match_unrelated_text() -> None:
    assert "番茄" not in tokenize("番薯和茄子")  # sweet potato and eggplant share characters, not the word


# The tokenizer as first written, one character at a time: the fast one (translate tables, an ASCII path) must give
# exactly its tokens for any text.
def _reference_tokens(text: str) -> list[str]:
    folded = "".join(_reference_fold(c) for c in unicodedata.normalize("NFKC", text).casefold())
    tokens: list[str] = []
    word: list[str] = []
    cjk: list[str] = []

    def flush_word() -> None:
        if word:
            tokens.append("".join(word))
            word.clear()

    def flush_cjk() -> None:
        run = "".join(cjk)
        for i, char in enumerate(run):
            tokens.append(char)
            if i + 1 < len(run):
                tokens.append(run[i : i + 2])
        cjk.clear()

    for char in folded:
        category = unicodedata.category(char)[0]
        if is_cjk(char) and category in "LN":
            flush_word()
            cjk.append(char)
        elif category in "LNM":
            flush_cjk()
            word.append(char)
        else:
            flush_word()
            flush_cjk()
    flush_word()
    flush_cjk()
    return tokens


def _reference_fold(char: str) -> str:
    if is_cjk(char):
        return char
    strokes = {"ł": "l", "ø": "o", "đ": "d", "ð": "d", "ħ": "h", "ŧ": "t", "ı": "i", "æ": "ae", "œ": "oe"}
    strokes |= {"þ": "th", "ŀ": "l"}
    if char in strokes:
        return strokes[char]
    marks = ((0x0300, 0x036F), (0x1AB0, 0x1AFF), (0x1DC0, 0x1DFF), (0x20D0, 0x20FF), (0xFE20, 0xFE2F))
    kept = [c for c in unicodedata.normalize("NFKD", char) if not any(lo <= ord(c) <= hi for lo, hi in marks)]
    return "".join(strokes.get(c, c) for c in kept)


_FARM_TEXT = st.text(
    alphabet=st.sampled_from(list("aZ9 .,-_é ÇłØæß̈ı西红柿トマトㄱ가\u0915\u093f\u3099\ufb01\u2163\n\t"))
    | st.characters(),
    max_size=80,
)


@settings(max_examples=400, deadline=None)
@given(_FARM_TEXT)
def test_tokens_are_those_of_the_character_by_character_tokenizer(text: str) -> None:
    assert tokenize(text) == _reference_tokens(text)
    assert fold(text) == "".join(_reference_fold(c) for c in unicodedata.normalize("NFKC", text).casefold())
