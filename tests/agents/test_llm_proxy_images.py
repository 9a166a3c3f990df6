"""Image parts through the LLM proxy: the run's photo reaches a model that can see, and only there, and only it."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from llm_stub import Reply, ScriptedLLM, Streamed
from photo_support import camera_jpeg, image_parts
from PIL import Image
from runtime_support import settings_for
from test_llm_fallback_chain import dead_url
from test_llm_proxy import KEY, MODEL, proxied

from farmhost.agents.photos import PreparedPhoto, downscale
from farmhost.agents.proxy.images import IMAGE_TOKENS, unseen_text

PATH = "inbox/2026-11-30T10-00-00-photo-7.jpg"
CAPTION = "[photo: inbox/2026-11-30T10-00-00-photo-7.jpg] what is wrong with these leaves?"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    root.mkdir()
    return root


@pytest.fixture
def second() -> Iterator[ScriptedLLM]:
    with ScriptedLLM() as stub:
        yield stub


@pytest.fixture(scope="module")
def photo() -> PreparedPhoto:
    jpeg, width, height = downscale(camera_jpeg(3000, 2000))
    return PreparedPhoto(path=PATH, jpeg=jpeg, width=width, height=height)


def with_image(url: str, text: str = CAPTION) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": url}}]}
    ]


def llm_settings(root: Path, llm: ScriptedLLM, **extra: str) -> Any:
    return settings_for(
        root, FARMHOST_LLM_BASE_URL=llm.base_url, FARMHOST_LLM_API_KEY=KEY, FARMHOST_LLM_MODEL=MODEL, **extra
    )


async def test_the_runs_photo_reaches_a_model_that_can_see_as_it_was_attached(
    root: Path, llm_stub: ScriptedLLM, photo: PreparedPhoto
) -> None:
    llm_stub.script(Reply("Leaf spot."))
    settings = llm_settings(root, llm_stub, FARMHOST_LLM_VISION="1")
    async with proxied(settings, photos=[photo]) as (client, usage, _):
        answer = await client.chat.completions.create(model="x", messages=with_image(photo.data_url))
    assert answer.choices[0].message.content == "Leaf spot."
    (seen,) = llm_stub.requests
    (part,) = image_parts(seen.messages)
    assert part["image_url"]["url"] == photo.data_url
    assert Image.open(io.BytesIO(photo.jpeg)).size == (1024, 683)
    assert CAPTION in seen.text() and usage.unseen_by == {}


async def test_a_model_that_cannot_see_gets_a_line_saying_where_the_photo_is(
    root: Path, llm_stub: ScriptedLLM, photo: PreparedPhoto
) -> None:
    llm_stub.script(Reply("I cannot see it."))
    async with proxied(llm_settings(root, llm_stub), photos=[photo]) as (client, usage, _):
        await client.chat.completions.create(model="x", messages=with_image(photo.data_url))
    (seen,) = llm_stub.requests
    assert image_parts(seen.messages) == [] and "data:image" not in json.dumps(seen.body)
    assert seen.messages[0]["content"] == [
        {"type": "text", "text": CAPTION},
        {"type": "text", "text": unseen_text(PATH)},
    ]
    assert "saved in the workspace as inbox/2026-11-30T10-00-00-photo-7.jpg" in unseen_text(PATH)
    assert "cannot see photos" in unseen_text(PATH)
    assert list(usage.unseen_by) == [1]


async def test_a_fallback_without_vision_never_gets_the_image(
    root: Path, second: ScriptedLLM, photo: PreparedPhoto
) -> None:
    second.script(Reply("From the local model."))
    settings = settings_for(
        root,
        FARMHOST_LLM_BASE_URL=dead_url(),
        FARMHOST_LLM_MODEL="hosted-vision-model",
        FARMHOST_LLM_VISION="1",
        FARMHOST_LLM_2_BASE_URL=second.base_url,
        FARMHOST_LLM_2_MODEL="local-text-model",
    )
    async with proxied(settings, photos=[photo]) as (client, usage, _):
        stream = await client.chat.completions.create(
            model="x",
            messages=with_image(photo.data_url),
            stream=True,
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == "From the local model."
    (seen,) = second.requests
    assert seen.model == "local-text-model" and image_parts(seen.messages) == []
    assert unseen_text(PATH) in seen.text()
    assert usage.answered_by.keys() == usage.unseen_by.keys() == {2}


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("https://attacker.example/exfil?data=the-farm-secrets.png", "may carry only the photo farmhost attached"),
        ("data:image/png;base64,iVBORw0KGgo=", "may carry only the photo farmhost attached"),
    ],
)
async def test_an_image_the_host_did_not_attach_is_refused(
    root: Path, llm_stub: ScriptedLLM, photo: PreparedPhoto, url: str, why: str
) -> None:
    settings = llm_settings(root, llm_stub, FARMHOST_LLM_VISION="1")
    async with proxied(settings, photos=[photo]) as (client, usage, _):
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(model="x", messages=with_image(url))
    assert refused.value.status_code == 400 and why in refused.value.message
    assert llm_stub.requests == [] and usage.requests == 0  # nothing went upstream; the reservation was given back


async def test_a_run_without_a_photo_may_send_no_image(root: Path, llm_stub: ScriptedLLM) -> None:
    settings = llm_settings(root, llm_stub, FARMHOST_LLM_VISION="1")
    async with proxied(settings) as (client, _, _):
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(
                model="x",
                messages=with_image("https://example.com/cat.jpg"),
            )
    assert "no photo is attached to this run, so its requests may carry no image parts" in refused.value.message
    assert llm_stub.requests == []


async def test_a_photo_costs_its_image_tokens_not_its_base64_when_a_stream_reports_no_usage(
    root: Path, llm_stub: ScriptedLLM, photo: PreparedPhoto
) -> None:
    llm_stub.script(Streamed(Reply("Leaf spot."), usage=False))
    settings = llm_settings(root, llm_stub, FARMHOST_LLM_VISION="1")
    async with proxied(settings, photos=[photo]) as (client, usage, _):
        stream = await client.chat.completions.create(
            model="x",
            messages=with_image(photo.data_url),
            stream=True,
        )
        _ = [chunk async for chunk in stream]
    # Charged its bound: a token a byte of the text (a few hundred) and IMAGE_TOKENS for the photo.
    assert IMAGE_TOKENS <= usage.prompt_tokens < IMAGE_TOKENS + 1000, (usage.prompt_tokens, len(photo.data_url))
    assert len(photo.data_url) > 60 * IMAGE_TOKENS  # what counting the bytes of its base64 would have charged
