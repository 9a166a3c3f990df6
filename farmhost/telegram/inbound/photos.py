"""The photo of a triggering chat message: its file in the workspace, read back from the message's placeholder.

A saved photo's transcript text starts with `[photo: inbox/<name>.jpg]` (telegram/inbound/media.py); the chat's run
names that file in its AgentJob, so a model that can see gets the photo itself (agents/photos.py). A placeholder
saying the photo was not saved names no file, and text a sender typed to look like one names at most a file of
the group's own inbox, which its agent may read anyway.
"""

from __future__ import annotations

import re
from typing import Final

from farmhost.agents.jobs import PHOTO_RE

_PLACEHOLDER_RE: Final = re.compile(r"^\[photo: (inbox/[^\]\s/]+)\]")


def photo_path(text: str) -> str | None:
    """The workspace path of the photo a message's text starts with, or None."""
    found = _PLACEHOLDER_RE.match(text)
    if found is None or not PHOTO_RE.fullmatch(found.group(1)):
        return None
    return found.group(1)
