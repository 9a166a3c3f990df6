"""A chat photo end to end: Telegram (the fake Bot API) to the built-in runner in bubblewrap to the scripted LLM.

With FARMHOST_LLM_VISION the model gets the photo as an image part, downscaled and re-encoded by the host; without
it, or from a fallback endpoint without it, the model gets text only and the reply says it did not see the photo;
a file that is no usable image is not attached, and the agent and the chat are told why.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from inbound_support import MAIN_CHAT, new_data_dir, running, settings_for, wait_sent
from llm_stub import Recorded, Reply, ScriptedLLM
from photo_support import camera_jpeg, decoded, image_parts, jpeg_bytes, png_bomb
from telegram_stub import FakeTelegram

from farmhost.agents.photos import MAX_JPEG_BYTES, MAX_SIDE
from farmhost.agents.proxy.images import unseen_text

pytestmark = pytest.mark.slow  # real agent runs in bubblewrap

CAPTION = "what is wrong with these leaves?"
ANSWER = "Those look like early blight spots."


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return new_data_dir(tmp_path)


def vision_settings(root: Path, tg: FakeTelegram, llm: ScriptedLLM, **values: Any) -> Any:
    llm_values = {"FARMHOST_LLM_BASE_URL": llm.base_url, "FARMHOST_LLM_MODEL": "farm-model"}
    return settings_for(root, tg, FARMHOST_AGENT_RUNTIME="bwrap", **(llm_values | values))


async def photo_reply(root: Path, tg: FakeTelegram, settings: Any, content: bytes) -> tuple[str, str]:
    """Send a captioned photo to the main chat; the reply's text and the photo's path in the workspace."""
    async with running(settings, deliver=True, command=None):
        tg.media_message(MAIN_CHAT, "photo", content=content, caption=CAPTION, chat_type="private", title=None)
        [reply] = await wait_sent(tg, 1, MAIN_CHAT, timeout=60)
    [name] = [p.name for p in (root / "groups" / "main" / "inbox").iterdir()]
    return str(reply.params["text"]), f"inbox/{name}"


def dead_url() -> str:
    """The base URL of a port nothing listens on (the hosted endpoint while the farm's internet is down)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        port = holder.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def the_prompt(request: Recorded) -> dict[str, Any]:
    """The request's last user message (the photo's message)."""
    return [m for m in request.messages if m["role"] == "user"][-1]


def run_log(root: Path) -> str:
    [log] = (root / "logs" / "runs" / "main").glob("run-*.log")
    return log.read_text()


async def test_a_photo_reaches_a_model_that_can_see_as_a_downscaled_image_part(
    root: Path, fake_telegram: FakeTelegram, llm_stub: ScriptedLLM
) -> None:
    llm_stub.script(Reply(ANSWER))
    settings = vision_settings(root, fake_telegram, llm_stub, FARMHOST_LLM_VISION="1")
    reply, path = await photo_reply(root, fake_telegram, settings, camera_jpeg(3000, 2000))
    assert reply == ANSWER  # nothing to add: the model saw it
    (request,) = llm_stub.requests
    message = the_prompt(request)
    text, image = message["content"]
    assert text["type"] == "text" and text["text"].endswith(f"[photo: {path}] {CAPTION}")
    url = image["image_url"]["url"]
    picture = decoded(url)
    assert picture.format == "JPEG" and max(picture.size) <= MAX_SIDE and picture.size == (1024, 683)
    assert jpeg_bytes(url) <= MAX_JPEG_BYTES
    assert f"photo: {path} attached as a 1024x683 JPEG of " in run_log(root)
    # The group's conversation keeps the words, not the picture: later runs do not send it again.
    kept = (root / "groups" / "main" / ".farmagent" / "conversation.json").read_text()
    assert CAPTION in kept and "data:image" not in kept


async def test_without_vision_the_model_gets_text_and_the_reply_says_it_cannot_see(
    root: Path, fake_telegram: FakeTelegram, llm_stub: ScriptedLLM
) -> None:
    llm_stub.script(Reply(ANSWER))
    settings = vision_settings(root, fake_telegram, llm_stub)
    reply, path = await photo_reply(root, fake_telegram, settings, camera_jpeg(3000, 2000))
    (request,) = llm_stub.requests
    assert image_parts(request.messages) == [] and "image_url" not in json.dumps(request.body)
    assert the_prompt(request)["content"].endswith(f"[photo: {path}] {CAPTION}")  # today's placeholder, as before
    assert (
        reply == f"{ANSWER}\n\n(The model did not see your photo, saved as {path}: the farm's model cannot see photos.)"
    )


async def test_a_fallback_endpoint_without_vision_gets_no_image_part(
    root: Path, fake_telegram: FakeTelegram, llm_stub: ScriptedLLM
) -> None:
    llm_stub.script(Reply(ANSWER))
    settings = vision_settings(
        root,
        fake_telegram,
        llm_stub,
        FARMHOST_LLM_BASE_URL=dead_url(),
        FARMHOST_LLM_MODEL="hosted-vision-model",
        FARMHOST_LLM_VISION="1",
        FARMHOST_LLM_2_BASE_URL=llm_stub.base_url,
        FARMHOST_LLM_2_MODEL="local-text-model",
    )
    reply, path = await photo_reply(root, fake_telegram, settings, camera_jpeg(3000, 2000))
    (request,) = llm_stub.requests
    assert request.model == "local-text-model" and image_parts(request.messages) == []
    assert [part["text"] for part in the_prompt(request)["content"]][-1] == unseen_text(path)
    local = llm_stub.base_url.removeprefix("http://").removesuffix("/v1")
    assert reply.startswith(f"{ANSWER}\n\n(answered by the fallback LLM endpoint 2, local-text-model at {local}")
    assert reply.endswith(
        f"(The model did not see your photo, saved as {path}: an LLM that answered (local-text-model at {local}) "
        "cannot see photos.)"
    )


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda: b"<html>this is not a photo</html>", "the file is not a JPEG, PNG or WebP image"),
        (png_bomb, "the image has more than the 24 million pixels a photo may have"),
    ],
    ids=["not-an-image", "decompression-bomb"],
)
async def test_a_photo_that_is_no_usable_image_is_not_attached_and_the_run_still_happens(
    root: Path, fake_telegram: FakeTelegram, llm_stub: ScriptedLLM, make: Callable[[], bytes], why: str
) -> None:
    llm_stub.script(Reply(ANSWER))
    settings = vision_settings(root, fake_telegram, llm_stub, FARMHOST_LLM_VISION="1")
    reply, path = await photo_reply(root, fake_telegram, settings, make())
    (request,) = llm_stub.requests
    assert image_parts(request.messages) == []
    assert the_prompt(request)["content"].endswith(f"\n[farmhost: the photo {path} is not attached: {why}]")
    assert reply == f"{ANSWER}\n\n(The model did not see your photo, saved as {path}: {why}.)"
    assert f"photo: {path} not attached: {why}" in run_log(root)
