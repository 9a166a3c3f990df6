"""memory_search through the real daemon finds words of any script, inside sentences written without spaces.

Thai, Lao, Khmer, Burmese, Tibetan, Japanese, Korean; and Arabic and Hebrew without the vowel marks the memory wrote.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from farmhost_testing import drop, init_data_dir, ok, running_daemon, wait_result

_ids = itertools.count()

# One line per script, each "plant <crop> in the field to the north" or the like, with no spaces between words.
LINES = {
    "thai": "ปลูกข้าวในนาทางทิศเหนือ",
    "thai-white": "ผ้าผืนนี้ขาวมาก",  # "this cloth is very white": the letters of ข้าว (rice) without its marks
    "lao": "ປູກເຂົ້າຢູ່ນາທາງເໜືອ",
    "khmer": "ដាំស្រូវនៅវាលខាងជើង",
    "burmese": "မြောက်ဘက်လယ်မှာစပါးစိုက်တယ်",
    "tibetan": "བྱང་ཕྱོགས་ཞིང་ཁར་ནས་བཏབ།",
    "japanese": "北の畑でトマトを育てています",
    "korean": "북쪽밭에토마토를심었다",
    "arabic": "زرعنا الطَّمَاطِم في الحقل الشمالي",
    "hebrew": "שָׁלוֹם לַחַקְלָאִים בַּשָּׂדֶה",
}


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = init_data_dir(tmp_path_factory.mktemp("scripts") / "data")
    notes = root / "groups" / "field" / "memory"
    notes.mkdir(parents=True, exist_ok=True)
    text = "".join(f"# {name}\n\n{line}\n\n" for name, line in LINES.items())
    (notes / "scripts.md").write_text(text, encoding="utf-8")
    with running_daemon(root):
        yield root


def search(data_dir: Path, query: str) -> list[str]:
    """The snippets of the memory hits of `query` in group field's memory."""
    rid = f"scr-{next(_ids)}"
    params = {"query": query, "sources": "memory", "topK": 3}
    drop(data_dir, "field", "actions", {"type": "memory_action", "action": "memory_search", "params": params,
                                        "requestId": rid})  # fmt: skip
    return [hit["snippet"] for hit in ok(wait_result(data_dir, "field", rid))["hits"]]


@pytest.mark.parametrize(
    ("query", "script"),
    [
        ("ข้าว", "thai"),  # rice, inside the sentence, ranked above the line with only its letters
        ("ขาว", "thai-white"),  # and white the other way round
        ("ทิศเหนือ", "thai"),  # north
        ("ເຂົ້າ", "lao"),
        ("ស្រូវ", "khmer"),
        ("စပါး", "burmese"),
        ("ཞིང", "tibetan"),
        ("トマト", "japanese"),
        ("토마토", "korean"),
        ("الطماطم", "arabic"),  # written without the harakat the memory has
        ("שלום", "hebrew"),  # written without the points the memory has
    ],
)
def test_a_word_is_found_inside_its_line_first(farm: Path, query: str, script: str) -> None:
    snippets = search(farm, query)
    assert snippets, f"{query!r} finds nothing"
    assert LINES[script] in snippets[0], snippets
