"""Image parts of an agent's request: only the run's own photos pass, and only to an endpoint that can see.

The host attaches a chat photo to a run (agents/photos.py) and gives the proxy its data URL. An agent's request
may carry that URL in an `image_url` part of a message; any other image (an https URL the model's provider would
fetch for the agent, or bytes of the agent's own choosing) is refused with the reason. For an endpoint without
vision (FARMHOST_LLM[_n]_VISION unset) each image part is replaced by a text part saying that a photo arrived,
where it is in the workspace, and that the model answering cannot see it. Pure: dicts in, dicts out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from farmhost.agents.proxy.body import BodyRefused

# The most one image may cost in prompt tokens (the budgets hold it before an answer says): a photo is at most
# 1024 px a side (agents/photos.py), which OpenAI counts as 765 at high detail, Qwen2-VL about 1,340 and Anthropic
# about 1,400 (width x height / 750, at most about 1,600).
IMAGE_TOKENS: Final = 1600


def unseen_text(path: str) -> str:
    """The text part standing for a photo the model answering cannot see."""
    return (
        f"[farmhost: a photo arrived here; it is saved in the workspace as {path}, "
        "but the model answering now cannot see photos: say so if the photo matters]"
    )


def checked_images(body: dict[str, Any], photos: Mapping[str, str]) -> int:
    """How many image parts `body`'s messages carry; each must be one of the run's `photos` (data URL -> path).

    Raises:
        BodyRefused: an image part that is not one of the run's photos, or is not shaped as OpenAI's.
    """
    count = 0
    for part in _image_parts(body):
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else None
        if not isinstance(url, str):
            raise BodyRefused('an image part needs "image_url": {"url": ...}')
        if url not in photos:
            if photos:
                raise BodyRefused(
                    "an image part may carry only the photo farmhost attached to this run (the AgentInput's "
                    "images); the proxy sends no other image or image URL to the model"
                )
            raise BodyRefused(
                "no photo is attached to this run, so its requests may carry no image parts; the proxy sends no "
                "image or image URL of an agent's own to the model"
            )
        count += 1
    return count


def without_images(body: dict[str, Any], photos: Mapping[str, str]) -> dict[str, Any]:
    """`body` with each image part (checked by `checked_images`) replaced by its `unseen_text` part."""
    messages = []
    for message in body["messages"]:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list) and any(_is_image(part) for part in content):
            parts = [
                {"type": "text", "text": unseen_text(photos[part["image_url"]["url"]])} if _is_image(part) else part
                for part in content
            ]
            message = {**message, "content": parts}
        messages.append(message)
    return {**body, "messages": messages}


def _image_parts(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        part
        for message in body["messages"]
        if isinstance(message, dict) and isinstance(message.get("content"), list)
        for part in message["content"]
        if _is_image(part)
    ]


def _is_image(part: object) -> bool:
    return isinstance(part, dict) and part.get("type") == "image_url"
