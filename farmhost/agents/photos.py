"""Photos for a model that can see: a chat photo in the group's workspace made into a small JPEG for its run.

The host, not the agent, reads the file and decides what the model gets: a workspace path of the form
`inbox/<name>` (AgentJob.photo), opened through descriptors that follow no link the agent may have planted, a
regular file within SOURCE_MAX_BYTES, decoded by Pillow only as JPEG, PNG or WebP and only when its header names at
most MAX_PIXELS (a decompression bomb is refused before any pixel is decoded), downscaled to MAX_SIDE pixels on its
longest side and re-encoded as JPEG within MAX_JPEG_BYTES. The work runs in one worker thread of its own (one
photo's pixels in the daemon's memory at a time) and the run waits for it at most TIMEOUT seconds. Whatever goes
wrong becomes a PhotoError whose message says why, and the run goes on without the image.
"""

from __future__ import annotations

import asyncio
import base64
import io
import os
import stat
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from farmhost.files import DIR_FLAGS

# What a vision model reads well (OpenAI scales anything larger to 768 px on the short side anyway) at about a
# thousand prompt tokens.
MAX_SIDE: Final = 1024
# A 1024 px photo is 100-250 KB at quality 85; the cap keeps a request with it far inside the proxy's 4 MiB body
# limit (base64 adds a third) however many turns resend it.
MAX_JPEG_BYTES: Final = 300 * 1024
# Telegram sends photos at most 2560 px a side; a file the agent swapped in may be anything, so the daemon reads
# at most this much of it...
SOURCE_MAX_BYTES: Final = 20 * 1024 * 1024
# ...and decodes at most this many pixels (24 MP, a phone camera's; about 72 MB of RGB while it is scaled down).
MAX_PIXELS: Final = 24_000_000
# A 24 MP PNG decodes and scales in about 2 s on a Raspberry Pi 4; a run does not wait longer than this for it.
TIMEOUT: Final = 20.0
# Lower JPEG qualities tried, in order, until the photo fits MAX_JPEG_BYTES (then it is made smaller).
QUALITIES: Final = (85, 70, 55, 40)
MIN_SIDE: Final = 256
FORMATS: Final = ("JPEG", "PNG", "WEBP")
PHOTO_PREFIX: Final = "inbox/"
_READ_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class PhotoError(Exception):
    """The photo cannot be given to the model; `message` says why, for the agent and the chat."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True, kw_only=True)
class PreparedPhoto:
    """A photo ready for a model: where it is in the workspace and its downscaled JPEG."""

    path: str  # in the workspace, e.g. `inbox/2026-11-30T10-00-00-photo-123.jpg`
    jpeg: bytes
    width: int
    height: int

    @property
    def data_url(self) -> str:
        """The JPEG as the `image_url.url` of an OpenAI image part."""
        return "data:image/jpeg;base64," + base64.b64encode(self.jpeg).decode("ascii")


def read_photo_sync(workspace: Path, path: str) -> bytes:
    """The bytes of `path` (`inbox/<name>`) in `workspace`, following no link.

    Raises:
        PhotoError: the path is not a file in `inbox/`, is missing, a link, not a regular file, or too big.
    """
    name = path.removeprefix(PHOTO_PREFIX)
    if not path.startswith(PHOTO_PREFIX) or not name or "/" in name or name.startswith("."):
        raise PhotoError(f"{path!r} is not a file in the workspace's {PHOTO_PREFIX}")  # AgentJob refuses it first
    try:
        ws = os.open(workspace, DIR_FLAGS)
        try:
            inbox = os.open(PHOTO_PREFIX.rstrip("/"), DIR_FLAGS, dir_fd=ws)
        finally:
            os.close(ws)
        try:
            fd = os.open(name, _READ_FLAGS, dir_fd=inbox)
        finally:
            os.close(inbox)
    except FileNotFoundError:
        raise PhotoError("the file is no longer in the workspace") from None
    except OSError as err:
        raise PhotoError(f"the file cannot be opened ({err.strerror or err}; links are not followed)") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise PhotoError("the file is not a regular file")
        if info.st_size > SOURCE_MAX_BYTES:
            raise PhotoError(f"the file is over {SOURCE_MAX_BYTES // (1024 * 1024)} MB")
        with os.fdopen(os.dup(fd), "rb") as handle:
            data = handle.read(SOURCE_MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > SOURCE_MAX_BYTES:  # it grew after the fstat
        raise PhotoError(f"the file is over {SOURCE_MAX_BYTES // (1024 * 1024)} MB")
    return data


def downscale(data: bytes, *, max_side: int = MAX_SIDE, max_bytes: int = MAX_JPEG_BYTES) -> tuple[bytes, int, int]:
    """`data` (a JPEG, PNG or WebP image) as a JPEG at most `max_side` px a side and `max_bytes` long.

    Returns:
        The JPEG, its width and its height.

    Raises:
        PhotoError: not an image of those formats, more than MAX_PIXELS, broken, or not small enough even at the
            lowest quality and MIN_SIDE.
    """
    # Imported here: Pillow costs the daemon 3.6 MB of RSS and 20 ms of start-up, and only a farm whose model can
    # see, and that gets a photo, needs it.
    from PIL import Image, ImageOps, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data), formats=FORMATS) as image:
                width, height = image.size
                if width * height > MAX_PIXELS:
                    raise PhotoError(
                        f"the image is {width}x{height} pixels, more than the {MAX_PIXELS // 1_000_000} million "
                        "a photo may have"
                    )
                image.draft("RGB", (max_side, max_side))  # a JPEG decodes at 1/2, 1/4 or 1/8 scale: much less work
                oriented = ImageOps.exif_transpose(image)
                rgb = oriented.convert("RGB")
    except PhotoError:
        raise
    except UnidentifiedImageError:
        raise PhotoError("the file is not a JPEG, PNG or WebP image") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise PhotoError(
            f"the image has more than the {MAX_PIXELS // 1_000_000} million pixels a photo may have"
        ) from None
    except (OSError, ValueError, SyntaxError, EOFError, MemoryError) as err:  # what Pillow's decoders raise
        raise PhotoError(f"the image cannot be decoded ({err})") from None
    side = max_side
    while side >= MIN_SIDE:
        rgb.thumbnail((side, side), Image.Resampling.LANCZOS)
        for quality in QUALITIES:
            out = io.BytesIO()
            rgb.save(out, format="JPEG", quality=quality, optimize=True)
            if out.tell() <= max_bytes:
                return out.getvalue(), rgb.width, rgb.height
        side = side * 3 // 4
    raise PhotoError(f"the image does not fit {max_bytes // 1024} KB even at {MIN_SIDE} px")


def prepare_photo_sync(workspace: Path, path: str) -> PreparedPhoto:
    """Read and downscale one photo (blocking: call it through `PhotoPreparer`).

    Raises:
        PhotoError: why the model cannot be given it.
    """
    jpeg, width, height = downscale(read_photo_sync(workspace, path))
    return PreparedPhoto(path=path, jpeg=jpeg, width=width, height=height)


class PhotoPreparer:
    """The one worker thread photos are prepared in, and the deadline a run waits for it."""

    def __init__(self, *, timeout: float = TIMEOUT) -> None:
        self._timeout = timeout
        self._executor: ThreadPoolExecutor | None = None

    def start(self) -> None:
        """Make the worker (its thread starts with the first photo)."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="photo")

    def stop(self) -> None:
        """Let the worker go; a photo being prepared finishes in the background."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    async def prepare(self, workspace: Path, path: str) -> PreparedPhoto:
        """`prepare_photo_sync` in the worker, within the deadline.

        Raises:
            PhotoError: why the model cannot be given it (a deadline passed included).
        """
        assert self._executor is not None, "start() the preparer first"
        loop = asyncio.get_running_loop()
        work = loop.run_in_executor(self._executor, prepare_photo_sync, workspace, path)
        try:
            return await asyncio.wait_for(work, self._timeout)
        except TimeoutError:
            raise PhotoError(f"preparing the photo took longer than {self._timeout:g} s") from None
