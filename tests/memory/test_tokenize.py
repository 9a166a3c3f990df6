"""Tests for farmhost.memory.tokenize: folding and tokens across Latin, Polish, Chinese, Japanese, Korean, Hindi."""

from __future__ import annotations

import pytest

from farmhost.memory.tokenize import fold, tokenize


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
