"""Real images for the photo tests: a camera-sized JPEG, a decompression bomb, and reading back what a model got."""

from __future__ import annotations

import base64
import functools
import io
from typing import Any

import numpy as np
from PIL import Image

DATA_URL_PREFIX = "data:image/jpeg;base64,"


@functools.cache  # the same picture every call (seeded): made once per test process (it took 2-8 s each time)
def camera_jpeg(width: int = 3000, height: int = 2000) -> bytes:
    """A JPEG as a phone takes it: smooth colours with sensor noise (noise keeps it from compressing to nothing)."""
    rng = np.random.default_rng(38)
    pixels = rng.standard_normal((height, width, 3), dtype=np.float32)
    pixels *= 24  # in place, in float32: float64 temporaries of a 6-megapixel picture cost seconds on a busy host
    pixels[:, :, 0] += np.linspace(0, 255, width, dtype=np.float32)[None, :]
    pixels[:, :, 1] += np.linspace(0, 255, height, dtype=np.float32)[:, None]
    pixels[:, :, 2] += (
        np.linspace(0, 255, width, dtype=np.float32)[None, :] + np.linspace(0, 255, height, dtype=np.float32)[:, None]
    ) / 2
    np.clip(pixels, 0, 255, out=pixels)
    out = io.BytesIO()
    Image.fromarray(pixels.astype(np.uint8)).save(out, format="JPEG", quality=92)
    return out.getvalue()


def png_bomb(width: int = 20_000, height: int = 20_000) -> bytes:
    """A PNG of black pixels: a few hundred KB that would be width x height bytes decoded."""
    out = io.BytesIO()
    Image.new("L", (width, height)).save(out, format="PNG")
    return out.getvalue()


def decoded(url: str) -> Image.Image:
    """The image of a `data:image/jpeg;base64,` URL (loaded, so it can be checked after)."""
    assert url.startswith(DATA_URL_PREFIX), url[:40]
    image = Image.open(io.BytesIO(base64.b64decode(url.removeprefix(DATA_URL_PREFIX))))
    image.load()
    return image


def image_parts(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every image part of a request's messages."""
    return [
        part
        for message in messages
        if isinstance(message.get("content"), list)
        for part in message["content"]
        if part.get("type") == "image_url"
    ]


def jpeg_bytes(url: str) -> int:
    """How long the JPEG of a data URL is."""
    return len(base64.b64decode(url.removeprefix(DATA_URL_PREFIX)))
