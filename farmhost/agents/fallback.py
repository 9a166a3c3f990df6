"""AssistFallback: a chat message answered by Home Assistant's Assist when no LLM is configured or none answers.

The farmer's words go to the farm action `ha_assist`, run as the job's group through the router's door
(`Router.run_as`, under the id `assist:<run id>`), exactly as a request of that group's agent: the same
authorisation (main only unless the farm profile's `actionGroups` opens `ha_assist`), the same service policy and
production gate, one audit line, the ledger, the request log. Nothing here decides who may do what.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Final

from farmhost.protocol.params import MAX_ASSIST_CHARS
from farmhost.protocol.requests import FarmActionRequest

if TYPE_CHECKING:
    from farmhost.agents.jobs import AgentJob
    from farmhost.ipc.router import Router
    from farmhost.store.groups import Group

ASSISTANT_NAME: Final = "assist"
# A leading "@farm_bot" (the trigger of a group that needs one) is not part of what Assist should understand.
_MENTION_RE: Final = re.compile(r"^\s*@\w+[\s,:]*")

NOTICE_KEY: Final = "assist-fallback"
NOTICE: Final = (
    "Answers in this chat come from Home Assistant's own assistant (Assist), because {why}. Assist understands "
    'short commands and questions about the farm\'s devices, such as "turn on the irrigation pump", "what is the '
    'soil moisture of field 1" or "is the barn light on". An LLM would add conversation, questions that need '
    "several steps or the farm's memory and history, schedules, dashboards and screenshots; the operator configures "
    "one with FARMHOST_LLM_BASE_URL and FARMHOST_LLM_MODEL (docs/configuration.md)."
)
WHY_NO_LLM: Final = "no LLM is configured"
WHY_LLM_FAILED: Final = "no configured LLM endpoint answered"


def assist_notice(why: str | None) -> str:
    """The one-time notice of a chat whose answers come from Assist, saying why and what an LLM would add."""
    return NOTICE.format(why=why or WHY_NO_LLM)


class AssistUnavailable(Exception):
    """Assist could not answer; `message` says why (the farm action's own error, or no answer from the host)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class AssistFallback:
    """Asks Assist, as the job's group, through the router's door."""

    def __init__(self, door: Router) -> None:
        self._door = door

    def words(self, job: AgentJob) -> str | None:
        """What the farmer said, as Assist should hear it (None when the job is no chat message)."""
        if job.scheduled or job.chat_jid is None or job.message is None:
            return None
        text = _MENTION_RE.sub("", job.message).strip()[:MAX_ASSIST_CHARS]
        return text or None

    async def answer(self, job: AgentJob, group: Group, text: str) -> str:
        """Assist's spoken answer to `text`, asked as `group` (the job's) under the id `assist:<run id>`.

        Raises:
            AssistUnavailable: the action was refused or failed (within ha_assist's own timeout).
        """
        request = FarmActionRequest(type="farm_action", action="ha_assist", params={"text": text})
        answer = await self._door.run_as(group, request, request_id=f"assist:{job.run_id}", via="assist")
        document = answer.document
        if document["status"] != "success":
            raise AssistUnavailable(f"{document['error']} ({document['errorCode']})")
        result = document["result"]
        speech = result.get("speech") if isinstance(result, dict) else None
        return str(speech) if speech else "(Assist gave no answer)"
