"""`farmhost demo` end to end, with every part real: its own Home Assistant, farmhost, Chromium, a bubblewrap agent.

The demo runs as a subprocess exactly as `make demo` runs it (non-interactively: stdin is a pipe), with the
scripted LLM configured through the environment. One run is checked from every side: what it prints, the HA
login it prints, the dashboard in HA, the screenshot, the simulator moving the soil, a chat line answered by
the agent (and the agent's message to the main chat printed first), the transcript, and the clean stop on SIGINT.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from demo_support import alive, changed_soil, demo, ha_answers, login, login_step, png_size, require_cached_ha
from farmhost_testing import clean_env, farmhost, wait_for
from ha_fixture import WsSession
from llm_stub import Reply, ScriptedLLM, ToolCall

from farmhost.store.db import Database
from farmhost.store.transcripts import latest

QUESTION = "How are the fields doing?"
NOTICE = "Heads-up: frost is likely tonight, I am keeping an eye on it."
ANSWER = "Field 1 is drying slowly; no watering needed before tomorrow."


@pytest.mark.slow
def test_the_demo_runs_a_live_farm_you_can_log_into_look_at_and_talk_to(tmp_path: Path, llm_stub: ScriptedLLM) -> None:
    require_cached_ha()
    llm_stub.script(ToolCall("send_message", {"chatJid": "local:main", "text": NOTICE}), Reply(ANSWER))
    env = clean_env(
        FARMHOST_LLM_BASE_URL=llm_stub.base_url,
        FARMHOST_LLM_MODEL="farm-model",
        FARMHOST_LLM_API_KEY="sk-demo-test",
        FARMHOST_AGENT_RUNTIME="bwrap",
    )
    data_dir = tmp_path / "demo-data"
    with demo(data_dir, "--port", "0", "--tick", "1", env=env) as run:
        run.wait_line("Chat: type a message", timeout=45)
        where = run.summary()
        url, dashboard = where["Home Assistant"], where["Farm dashboard"]
        assert url.startswith("http://127.0.0.1:") and dashboard == f"{url}/farmhost-farm"
        assert where["Data directory"] == str(data_dir)
        assert where["LLM"] == f"farm-model at {llm_stub.base_url}"
        assert "No LLM is configured" not in run.output()

        # The printed login is accepted by HA's login page (and a wrong password is not).
        username, password = where["Login"].split(" / ")
        assert login_step(url, username, password + "x")["errors"] == {"base": "invalid_auth"}
        token = login(url, username, password)

        # The farm dashboard is in HA, as dashboards/farm.yaml says.
        with WsSession(url.replace("http://", "ws://") + "/api/websocket", token) as ws:
            assert ws.auth["type"] == "auth_ok"
            config = ws.command("lovelace/config", url_path="farmhost-farm")
        assert config["success"], config
        assert config["result"]["title"] == "Farm"
        assert [view["path"] for view in config["result"]["views"]][:2] == ["overview", "irrigation"]

        # The screenshot is a PNG of the viewport, inside the data dir.
        shot = Path(where["Screenshot"])
        assert shot.is_relative_to(data_dir / "groups" / "main" / "screenshots")
        assert png_size(shot) == (1280, 800)

        # The simulator drives the farm: soil moisture moves within a few ticks.
        before, after = changed_soil(url, token, timeout=5)
        assert after < before  # drying: nobody waters at 18:00

        # A chat line is an agent run of the main group; what it sent to the chat comes before its answer.
        run.send(QUESTION)
        answer = run.wait_line(f"farm bot: {ANSWER}", timeout=45)
        notice = run.wait_line(NOTICE)
        assert run.lines.index(notice) < run.lines.index(answer)
        assert notice == f"farm bot [message (from main)]: {NOTICE}"
        first = llm_stub.requests[0]
        assert QUESTION in first.text() and first.headers["authorization"] == "Bearer sk-demo-test"
        ha_pids = run.ha_pids()
        assert ha_pids and all(alive(pid) for pid in ha_pids)

        code = run.stop(signal.SIGINT)
        output = run.output()
        assert code == 0, output
        assert output.splitlines()[-1] == "[demo] stopped (exit status 0)"
        assert "Traceback" not in output
        assert "[ha] Home Assistant stopped (exit code 0)" in output
        wait_for(lambda: not any(alive(pid) for pid in ha_pids), timeout=2, what="HA processes gone")
        assert not ha_answers(url)

    db = Database.open(data_dir)
    try:
        stored = [(m.direction, m.sender, m.text) for m in latest(db.conn, ["local:main"])]
    finally:
        db.close()
    # The farm's alerts (the frost comes within seconds at --tick 1) are in the chat too, told by the host itself.
    # The morning report too: the demo sends today's at start once it is past 07:00 farm time.
    alerts = ("CRITICAL: ", "Warning: ", "Reminder (", "Resolved at ", "Good morning.")
    chat = [m for m in stored if not (m[0] == "out" and m[2].startswith(alerts))]
    assert chat == [("in", "you", QUESTION), ("out", "farmhost", NOTICE), ("out", "farmhost", ANSWER)]
    assert all("type `ack" not in m[2] for m in stored)  # the terminal's stand-in for the buttons is not stored
    # The dashboard and the screenshot ran as the main group through the router's door, logged like any request.
    requests = [json.loads(line) for line in (data_dir / "logs" / "requests.ndjson").read_text().splitlines()]
    by_demo = [(r["group"], r["action"], r["status"]) for r in requests if r.get("via") == "demo"]
    assert by_demo == [("main", "ha_apply_dashboard", "success"), ("main", "ha_capture_screenshot", "success")]


def test_demo_help_explains_what_it_does_and_every_flag(tmp_path: Path) -> None:
    done = farmhost("demo", "--help", data_dir=tmp_path / "d", env=clean_env(COLUMNS="100"))
    assert done.returncode == 0 and done.stderr == ""
    text = " ".join(done.stdout.split())
    for phrase in (
        "usage: farmhost demo",
        "real Home Assistant",
        "simulated farm",
        "night frost",
        "ha_apply_dashboard",
        "ha_capture_screenshot",
        "login (user demo, password demo-farm)",
        "terminal chat",
        "FARMHOST_LLM_BASE_URL",
        "Ctrl-C (SIGINT) or SIGTERM",
        "--data-dir",
        "--port",
        "--tick",
        "--start-hour",
        "--no-chat",
        "--exit-after-setup",
        "--exit-on-eof",
        "--keep-ha",
        "--no-screenshot",
        "docs/demo.md",
    ):
        assert phrase in text, phrase
    assert not (tmp_path / "d").exists()
