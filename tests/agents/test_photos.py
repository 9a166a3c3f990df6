"""A chat photo made ready for a model that can see: read without following links, bounded, downscaled, re-encoded."""

from __future__ import annotations

import io
import os
import time
from pathlib import Path

import pytest
from photo_support import camera_jpeg, png_bomb
from PIL import Image

from farmhost.agents.photos import MAX_JPEG_BYTES, MAX_SIDE, PhotoError, PhotoPreparer, prepare_photo_sync

NAME = "2026-11-30T10-00-00-photo-7.jpg"


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    (tmp_path / "ws" / "inbox").mkdir(parents=True)
    return tmp_path / "ws"


def put(workspace: Path, data: bytes, name: str = NAME) -> str:
    (workspace / "inbox" / name).write_bytes(data)
    return f"inbox/{name}"


def test_a_camera_photo_becomes_a_small_jpeg_of_the_same_shape(workspace: Path) -> None:
    source = camera_jpeg(3000, 2000)
    assert len(source) > 2 * 1024 * 1024  # a real phone photo's size
    started = time.monotonic()
    photo = prepare_photo_sync(workspace, put(workspace, source))
    took = time.monotonic() - started
    image = Image.open(io.BytesIO(photo.jpeg))
    assert image.format == "JPEG" and image.size == (photo.width, photo.height) == (MAX_SIDE, 683)
    assert len(photo.jpeg) <= MAX_JPEG_BYTES
    assert photo.path == f"inbox/{NAME}" and photo.data_url.startswith("data:image/jpeg;base64,/9j/")
    assert took < 10, took  # draft decoding at a fraction of the scale: well under a second on a workstation


def test_a_png_is_re_encoded_and_a_small_photo_is_not_enlarged(workspace: Path) -> None:
    out = io.BytesIO()
    Image.new("RGBA", (640, 480), (10, 200, 30, 128)).save(out, format="PNG")
    photo = prepare_photo_sync(workspace, put(workspace, out.getvalue()))
    assert (photo.width, photo.height) == (640, 480) and Image.open(io.BytesIO(photo.jpeg)).format == "JPEG"


def test_a_decompression_bomb_is_refused_before_it_is_decoded(workspace: Path) -> None:
    bomb = png_bomb()  # 400 million pixels in a few hundred KB
    started = time.monotonic()
    with pytest.raises(PhotoError, match="more than the 24 million pixels a photo may have"):
        prepare_photo_sync(workspace, put(workspace, bomb))
    assert time.monotonic() - started < 2  # nothing was decoded
    with pytest.raises(PhotoError, match=r"the image is 6000x5000 pixels, more than the 24 million"):
        prepare_photo_sync(workspace, put(workspace, png_bomb(6000, 5000)))


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"this is not an image at all", "the file is not a JPEG, PNG or WebP image"),
        (b"GIF89a" + b"\0" * 100, "the file is not a JPEG, PNG or WebP image"),  # a format it does not decode
        (camera_jpeg(400, 300)[:2000], "the image cannot be decoded"),  # cut short
    ],
)
def test_what_is_not_a_usable_image_says_why(workspace: Path, data: bytes, reason: str) -> None:
    with pytest.raises(PhotoError) as refused:
        prepare_photo_sync(workspace, put(workspace, data))
    assert refused.value.message.startswith(reason), refused.value.message


def test_no_link_the_agent_planted_is_followed(workspace: Path, tmp_path: Path) -> None:
    secret = tmp_path / "host-secret.jpg"
    secret.write_bytes(camera_jpeg(200, 100))
    os.symlink(secret, workspace / "inbox" / NAME)
    with pytest.raises(PhotoError, match=r"cannot be opened .*links are not followed"):
        prepare_photo_sync(workspace, f"inbox/{NAME}")
    (workspace / "inbox" / NAME).unlink()
    (workspace / "inbox").rmdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / NAME).write_bytes(camera_jpeg(200, 100))
    os.symlink(tmp_path / "elsewhere", workspace / "inbox")  # the directory itself a link
    with pytest.raises(PhotoError, match="links are not followed"):
        prepare_photo_sync(workspace, f"inbox/{NAME}")


def test_a_fifo_or_a_missing_file_does_not_block_and_says_so(workspace: Path) -> None:
    os.mkfifo(workspace / "inbox" / NAME)
    with pytest.raises(PhotoError, match="the file is not a regular file"):
        prepare_photo_sync(workspace, f"inbox/{NAME}")
    with pytest.raises(PhotoError, match="the file is no longer in the workspace"):
        prepare_photo_sync(workspace, "inbox/gone.jpg")


def test_a_huge_file_is_not_read(workspace: Path) -> None:
    with open(workspace / "inbox" / NAME, "wb") as f:
        f.truncate(21 * 1024 * 1024)  # sparse: costs no disk
    with pytest.raises(PhotoError, match="the file is over 20 MB"):
        prepare_photo_sync(workspace, f"inbox/{NAME}")


async def test_the_preparer_works_off_the_loop_and_gives_up_at_its_deadline(workspace: Path) -> None:
    path = put(workspace, camera_jpeg(3000, 2000))
    preparer = PhotoPreparer()
    preparer.start()
    try:
        photo = await preparer.prepare(workspace, path)
    finally:
        preparer.stop()
    assert photo.width == MAX_SIDE
    hurried = PhotoPreparer(timeout=0)
    hurried.start()
    try:
        with pytest.raises(PhotoError, match="preparing the photo took longer than 0 s"):
            await hurried.prepare(workspace, path)
    finally:
        hurried.stop()
