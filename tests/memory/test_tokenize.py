"""Tests for farmhost.memory.tokenize: folding and tokens across Latin, Polish, CJK, Hindi, Thai, Arabic, Hebrew, ...

The scripts written without spaces of South-East Asia and Tibet are bigrammed like CJK.
"""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from farmhost.memory.tokenize import fold, is_spaceless, tokenize


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
        ("الطَّمَاطِم", "الطماطم"),  # Arabic harakat (fatha, shadda, kasra) fold away like Latin accents
        ("ٱلرَّحْمَٰن", "ٱلرحمن"),  # and the dagger alif U+0670
        ("שָׁלוֹם", "שלום"),  # Hebrew points (qamats, shin dot, holam)
        ("בֵּית־סֵפֶר", "בית־ספר"),  # the maqaf between two words is punctuation, not a point: it stays
        ("ข้าว", "ข้าว"),  # Thai tone marks and vowel signs are part of the word
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
        # Thai: letters with their tone marks and vowel signs (own code points) as units, then unit bigrams.
        ("ข้าว", ["ข้", "ข้า", "า", "าว", "ว"]),
        ("นา ข้าว", ["น", "นา", "า", "ข้", "ข้า", "า", "าว", "ว"]),
        ("ข้าว 2 กก.", ["ข้", "ข้า", "า", "าว", "ว", "2", "ก", "กก", "ก"]),
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
        ("ปลูกข้าวในนาทางทิศเหนือ", "ข้าว"),  # Thai: rice, inside "plant rice in the field to the north"
        ("ปลูกข้าวในนาทางทิศเหนือ", "ทิศเหนือ"),
        ("ປູກເຂົ້າຢູ່ນາທາງເໜືອ", "ເຂົ້າ"),  # Lao
        ("ដាំស្រូវនៅវាលខាងជើង", "ស្រូវ"),  # Khmer, with its subscript consonant (coeng)
        ("មាន ៥ ហិកតា ១៩ ម៉ែត្រ", "ម៉ែត្រ"),  # Khmer digits and a word with its own sign
        ("မြောက်ဘက်လယ်မှာစပါးစိုက်တယ်", "စပါး"),  # Burmese
        ("မြောက်ဘက်လယ်မှာစပါးစိုက်တယ်", "လယ်"),  # a word ending in an asat (a mark)
        ("ཞིང་ཁར་ནས་བཏབ།", "ནས"),  # Tibetan: barley, between its syllable marks
        ("زرعنا الطَّمَاطِم في الحقل الشمالي", "الطماطم"),  # Arabic: tomatoes, written with its vowel marks
        ("زرعنا الطماطم في الحقل الشمالي", "الطَّمَاطِم"),  # and the other way round
        ("שָׁלוֹם לַחַקְלָאִים", "שלום"),  # Hebrew, pointed in the memory
    ],
)
def test_query_tokens_are_found_in_document(document: str, query: str) -> None:
    assert set(tokenize(query)) <= set(tokenize(document))


def test_cjk_bigram_does_not_match_unrelated_text() -> None:
    assert "番茄" not in tokenize("番薯和茄子")  # sweet potato and eggplant share characters, not the word


@pytest.mark.parametrize("other", ["ข้างบ้าน", "ขาวมาก"])  # "beside the house", "very white"
def test_a_thai_word_is_not_all_found_where_only_its_letters_are(other: str) -> None:
    assert not set(tokenize("ข้าว")) <= set(tokenize(other)), "they share letters with ข้าว (rice), not its bigrams"


# The tokenizer as first written, one character at a time: the fast one (translate tables, an ASCII path) must give
# exactly its tokens for any text.
def _reference_tokens(text: str) -> list[str]:
    folded = "".join(_reference_fold(c) for c in unicodedata.normalize("NFKC", text).casefold())
    tokens: list[str] = []
    word: list[str] = []
    units: list[str] = []  # of a run of a script written without spaces: a character with its marks each

    def flush_word() -> None:
        if word:
            tokens.append("".join(word))
            word.clear()

    def flush_units() -> None:
        for i, unit in enumerate(units):
            tokens.append(unit)
            if i + 1 < len(units):
                tokens.append(unit + units[i + 1])
        units.clear()

    for char in folded:
        category = unicodedata.category(char)[0]
        if is_spaceless(char) and category in "LNM":
            flush_word()
            if category == "M" and units:
                units[-1] += char
            else:
                units.append(char)
        elif category in "LNM":
            flush_units()
            word.append(char)
        else:
            flush_word()
            flush_units()
    flush_word()
    flush_units()
    return tokens


def _reference_fold(char: str) -> str:
    if is_spaceless(char):
        return char
    strokes = {"ł": "l", "ø": "o", "đ": "d", "ð": "d", "ħ": "h", "ŧ": "t", "ı": "i", "æ": "ae", "œ": "oe"}
    strokes |= {"þ": "th", "ŀ": "l"}
    if char in strokes:
        return strokes[char]
    marks = ((0x0300, 0x036F), (0x1AB0, 0x1AFF), (0x1DC0, 0x1DFF), (0x20D0, 0x20FF), (0xFE20, 0xFE2F))
    marks += ((0x064B, 0x065F), (0x0670, 0x0670))  # Arabic harakat, dagger alif
    hebrew_points = {c for c in range(0x0591, 0x05C8) if unicodedata.category(chr(c)) == "Mn"}
    kept = [
        c
        for c in unicodedata.normalize("NFKD", char)
        if not any(lo <= ord(c) <= hi for lo, hi in marks) and ord(c) not in hebrew_points
    ]
    return "".join(strokes.get(c, c) for c in kept)


_FARM_TEXT = st.text(
    alphabet=st.sampled_from(
        list("aZ9 .,-_é ÇłØæß̈ı西红柿トマトㄱ가\u0915\u093f\u3099\ufb01\u2163\n\t")
        + list("ข้าวເຂົ້າស្រូវစပါးཞིང་الطَّمَاطِمשָׁלוֹם־\u0e33")
    )
    | st.characters(),
    max_size=80,
)


@settings(max_examples=400, deadline=None)
@given(_FARM_TEXT)
def test_tokens_are_those_of_the_character_by_character_tokenizer(text: str) -> None:
    assert tokenize(text) == _reference_tokens(text)
    assert fold(text) == "".join(_reference_fold(c) for c in unicodedata.normalize("NFKC", text).casefold())
