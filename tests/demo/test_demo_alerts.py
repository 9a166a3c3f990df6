"""`farmhost demo` tells the night's frost in the terminal chat by itself (no LLM), and Acknowledge works there."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from demo_support import demo, kill_ha, require_cached_ha
from farmhost_testing import clean_env

pytestmark = pytest.mark.slow  # end to end, many seconds

HINT = re.compile(r"^\s*\(type `ack ([0-9]+)` to acknowledge, `snooze \1` to be reminded in 1 h\)$")


def test_the_demo_prints_the_frost_alert_and_acknowledge_works_from_the_terminal(tmp_path: Path) -> None:
    require_cached_ha()
    data_dir = tmp_path / "demo-data"
    try:
        args = ("--port", "0", "--tick", "2", "--start-hour", "0", "--no-screenshot")
        with demo(data_dir, *args, env=clean_env(FARMHOST_AGENT_RUNTIME="bwrap")) as run:
            run.wait_line("Chat: type a message", timeout=45)
            run.wait_line("frost: the air is", timeout=20)
            told = run.wait_line(lambda line: "CRITICAL: Frost: Frost risk reports cold" in line, timeout=10)
            assert told.startswith("farm bot [message]: CRITICAL: Frost: Frost risk reports cold. Since ")
            hint = run.wait_line(lambda line: HINT.match(line) is not None, timeout=5)
            match = HINT.match(hint)
            assert match is not None
            run.send(f"ack {match[1]}")
            run.wait_line("farm bot: Acknowledged: no more reminders of this alert.", timeout=10)
            run.send(f"ack {match[1]}")
            run.wait_line("farm bot: Already acknowledged by you (terminal).", timeout=10)
            assert "Answers in this chat come from" not in run.output()  # the host answered, not Assist
            assert run.stop() == 0, run.output()
    finally:
        kill_ha(data_dir)
