"""Inbound media: placeholders in the transcript and the prompt, files saved into the group's inbox, size-capped."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from inbound_support import FIELD_CHAT, new_data_dir, prompts, running, settings_for, until
from telegram_stub import FakeTelegram

FIELD = f"telegram:{FIELD_CHAT}"
CAP = 1000


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return new_data_dir(tmp_path)


def inbox(root: Path) -> dict[str, bytes]:
    folder = root / "groups" / "field" / "inbox"
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())} if folder.is_dir() else {}


async def test_media_become_placeholders_and_files_in_the_inbox(root: Path, fake_telegram: FakeTelegram) -> None:
    tg = fake_telegram
    photo = b"\xff\xd8 a small jpeg " * 20
    async with running(settings_for(root, tg, FARMHOST_TELEGRAM_MEDIA_MAX_BYTES=CAP)) as host:
        tg.media_message(FIELD_CHAT, "photo", content=photo, caption="the north field")
        tg.media_message(FIELD_CHAT, "document", content=b"a,b\n1,2\n", file_name="../../etc/soil readings.csv")
        tg.media_message(FIELD_CHAT, "voice", content=b"OggS voice")
        tg.media_message(FIELD_CHAT, "location", latitude=38.7223, longitude=-9.1393)
        tg.media_message(FIELD_CHAT, "photo", content=b"x" * 5000, caption="too big")
        last = tg.media_message(FIELD_CHAT, "document", content=b"y" * 100, declared_size=25 * 1024 * 1024)
        await until(lambda: host.offset() == last["update_id"] + 1, what="all stored")
        texts = [t[2] for t in host.transcript(FIELD)]
    files = inbox(root)
    names = sorted(files)
    assert len(names) == 3, names
    photo_name = next(n for n in names if "-photo-" in n)
    doc_name = next(n for n in names if "-document-" in n)
    voice_name = next(n for n in names if "-voice-" in n)
    assert photo_name.endswith(".jpg") and files[photo_name] == photo  # the largest size that fits
    assert doc_name.endswith("-etc_soil_readings.csv") and files[doc_name] == b"a,b\n1,2\n"
    assert voice_name.endswith(".ogg") and files[voice_name] == b"OggS voice"
    assert texts[0] == f"[photo: inbox/{photo_name}] the north field"
    assert texts[1] == f"[document: inbox/{doc_name}]"
    assert texts[2] == f"[voice: inbox/{voice_name}]"
    assert texts[3] == "[location: 38.7223, -9.1393]"
    assert texts[4] == "[photo: (not saved: 4 KB is over the 1000 bytes limit)] too big"
    assert texts[5] == "[document: (not saved: 25 MB is over the 1000 bytes limit)]"
    assert photo_name[:19].replace("T", " ").count("-") == 4  # local time, e.g. 2026-11-30T10-00-00


async def test_a_caption_can_trigger_and_the_agent_sees_the_placeholder(
    root: Path, fake_telegram: FakeTelegram
) -> None:
    tg = fake_telegram
    async with running(settings_for(root, tg)) as host:
        update = tg.media_message(FIELD_CHAT, "photo", content=b"leaf spots", caption="@Field what is this?")
        await until(lambda: (row := host.update(update["update_id"])) is not None and row["status"] == "done")
    [run] = prompts(root, "field")
    [name] = inbox(root)
    assert run["prompt"].endswith(f"@ana: [photo: inbox/{name}] @Field what is this?")


async def test_an_unregistered_chat_media_is_never_downloaded(root: Path, fake_telegram: FakeTelegram) -> None:
    tg = fake_telegram
    async with running(settings_for(root, tg)) as host:
        update = tg.media_message(-777, "photo", content=b"someone else's photo", caption="hi")
        await until(lambda: host.offset() == update["update_id"] + 1)
        row = host.update(update["update_id"])
    assert row["status"] == "ignored" and tg.downloads == []
    assert not any(call.method == "getFile" for call in tg.calls)


async def test_a_planted_inbox_link_is_not_followed(root: Path, fake_telegram: FakeTelegram, tmp_path: Path) -> None:
    tg = fake_telegram
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, root / "groups" / "field" / "inbox")
    async with running(settings_for(root, tg)) as host:
        update = tg.media_message(FIELD_CHAT, "document", content=b"payload", file_name="x.txt")
        await until(lambda: host.offset() == update["update_id"] + 1)
        [(_, _, text)] = host.transcript(FIELD)
    assert list(outside.iterdir()) == []
    assert text.startswith("[document: (not saved: cannot write to inbox/:")


async def test_a_download_failing_on_the_network_is_retried_then_noted(root: Path, fake_telegram: FakeTelegram) -> None:
    tg = fake_telegram
    tg.fail("getFile", status=502, description="Bad Gateway", times=1)
    async with running(settings_for(root, tg)) as host:
        first = tg.media_message(FIELD_CHAT, "voice", content=b"OggS one")
        await until(lambda: host.offset() == first["update_id"] + 1, what="first stored")
        tg.fail("getFile", status=502, description="Bad Gateway", times=5)
        second = tg.media_message(FIELD_CHAT, "voice", content=b"OggS two")
        await until(lambda: host.offset() == second["update_id"] + 1, what="second stored")
        texts = [t[2] for t in host.transcript(FIELD)]
    assert texts[0].startswith("[voice: inbox/") and list(inbox(root).values()) == [b"OggS one"]
    assert texts[1].startswith("[voice: (not saved: downloading the voice failed:")
