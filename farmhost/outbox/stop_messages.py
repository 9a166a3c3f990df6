"""The emergency stop in the chat: the Stop everything button, its callback data, and the answers to /stop, /resume.

The button carries `stop:all` and nothing else: any other data under the `stop` prefix is not this button. Who may
press it is checked where it is handled (telegram/inbound/buttons.py: in the main chat, by its members as
main_members.py tells them), exactly as for /stop. Pure: no Bot API here, so any module that posts a safety message can attach
`stop_keyboard()` to it (it is a plain `reply_markup` for `enqueue_notice`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final

from farmhost.outbox.text import one_line

if TYPE_CHECKING:  # the button's data and keyboard are needed where the stop itself is not
    from farmhost.emergency_stop import EntityOutcome, ResumeReport, StopReport

CALLBACK_PREFIX: Final = "stop"
CALLBACK_DATA: Final = f"{CALLBACK_PREFIX}:all"
BUTTON_TEXT: Final = "Stop everything"
# Names listed per line of the answer before "... and N more" (a message stays readable on a phone).
NAMES_SHOWN: Final = 20


def stop_keyboard() -> dict[str, Any]:
    """The inline keyboard with the one Stop everything button (a `reply_markup` for a notice)."""
    return {"inline_keyboard": [[{"text": BUTTON_TEXT, "callback_data": CALLBACK_DATA}]]}


def is_stop_callback(data: str | None) -> bool:
    """Whether a press's data is exactly the Stop everything button's."""
    return data == CALLBACK_DATA


def stop_text(report: StopReport) -> str:
    """The answer to /stop or the button: what was turned off or closed, what failed, and how to resume."""
    lines = [f"EMERGENCY STOP by {report.by}: agents are paused and guarded devices are being kept safe."]
    if report.problem is not None:
        lines.append(f"Nothing was switched: {report.problem}.")
    if report.made_safe:
        lines.append(f"Turned off / closed ({len(report.made_safe)}): {_names(report.made_safe)}.")
    if report.failed:
        lines.append(f"FAILED ({len(report.failed)}), check these by hand now:")
        lines.extend(f"• {one_line(o.name, 60)} ({o.entity_id}): {one_line(o.error or '', 400)}" for o in report.failed)
    if report.already_safe:
        lines.append(f"Already safe ({len(report.already_safe)}): {_names(report.already_safe)}.")
    if report.no_safe_state:
        shown = _few(report.no_safe_state)
        lines.append(f"Left as they are (the farm profile names no safe state for them): {shown}.")
    if report.problem is None and not (report.made_safe or report.failed or report.already_safe):
        lines.append("The farm profile guards no device that Home Assistant knows: nothing was switched.")
    if report.denied:
        denied = ", ".join(f"{row.id} ({one_line(row.summary, 60)})" for row in report.denied[:NAMES_SHOWN])
        more = f" and {len(report.denied) - NAMES_SHOWN} more" if len(report.denied) > NAMES_SHOWN else ""
        lines.append(f"Pending approvals denied: {denied}{more}.")
    lines.append(
        "No agent runs until /resume (chat messages and scheduled tasks start none). /resume turns nothing back on."
    )
    return "\n".join(lines)


def resume_text(report: ResumeReport) -> str:
    """The answer to /resume."""
    if report.was is None:
        return "Agents were not paused; nothing changed."
    return (
        f"Agents resumed by {report.by} (they were {report.was}). Nothing was turned back on: "
        "devices stay as they are until someone switches them."
    )


def _names(outcomes: list[EntityOutcome]) -> str:
    return _few(f"{one_line(o.name, 60)} ({o.entity_id})" for o in outcomes)


def _few(items: Iterable[str]) -> str:
    listed = list(items)
    more = f" and {len(listed) - NAMES_SHOWN} more" if len(listed) > NAMES_SHOWN else ""
    return ", ".join(listed[:NAMES_SHOWN]) + more
