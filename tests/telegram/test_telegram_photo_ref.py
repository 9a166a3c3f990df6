"""Which photo a chat message's run attaches: only the file its own placeholder names, in the group's inbox."""

from __future__ import annotations

import pytest

from farmhost.agents.jobs import AgentJob
from farmhost.telegram.inbound.photos import photo_path

SAVED = "inbox/2026-11-30T10-00-00-photo-123.jpg"


@pytest.mark.parametrize(
    ("text", "path"),
    [
        (f"[photo: {SAVED}] what is this?", SAVED),
        (f"[photo: {SAVED}]", SAVED),
        ("[photo: (not saved: 25 MB is over the 20 MB limit)] too big", None),  # no file to attach
        ("[photo: inbox/../../etc/shadow] look", None),
        ("[photo: inbox/.farmagent/conversation.json]", None),
        ("[photo: /etc/shadow]", None),
        (f"look at this [photo: {SAVED}]", None),  # only the message's own placeholder, at its start
        (f"[voice: {SAVED}]", None),
        ("what is wrong with the pump?", None),
    ],
)
def test_the_photo_is_the_one_the_placeholder_names(text: str, path: str | None) -> None:
    assert photo_path(text) == path


@pytest.mark.parametrize("photo", ["inbox/../x.jpg", "../inbox/x.jpg", "inbox/a/b.jpg", "/inbox/x.jpg", "inbox/"])
def test_a_job_names_only_a_file_of_its_inbox(photo: str) -> None:
    with pytest.raises(ValueError, match="a file name in inbox/"):
        AgentJob(folder="main", prompt="hi", scheduled=False, photo=photo)
