"""What the demo prints: the "where to look" summary, the LLM how-to, and the command's help text."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

NO_LLM_HOWTO: Final = """\
No LLM is configured: Home Assistant's own assistant (Assist) answers the chat instead. It understands short
commands and questions about the farm's devices, such as "turn on the irrigation pump", "what is the soil
moisture of field 1" or "is the barn light on", and acts under farmhost's policy; everything else keeps running.
For conversation, questions that need several steps or the farm's memory, schedules, dashboards and screenshots,
configure any OpenAI-compatible endpoint in .env (in the directory you start the demo from), then start the
demo again. For example:

  Ollama on this machine (a model that can call tools, e.g. `ollama pull qwen2.5:7b`):
    FARMHOST_LLM_BASE_URL=http://127.0.0.1:11434/v1
    FARMHOST_LLM_MODEL=qwen2.5:7b

  OpenAI:
    FARMHOST_LLM_BASE_URL=https://api.openai.com/v1
    FARMHOST_LLM_MODEL=gpt-4o-mini
    FARMHOST_LLM_API_KEY=sk-...

OpenRouter, llama.cpp and vLLM work the same way; see docs/configuration.md."""

NO_LLM_SHORT: Final = (
    "(no LLM is configured: set FARMHOST_LLM_BASE_URL and FARMHOST_LLM_MODEL in .env and start the demo again; "
    "the examples are printed above)"
)

HELP_DESCRIPTION: Final = """\
Run the whole appliance on this machine, on a simulated farm in a real Home Assistant:

1. installs Home Assistant 2025.4.4 into ~/.cache/farmhost-ha if it is not there (about 90 s, once,
   with progress lines) and starts it in <data-dir>/ha/ with the simulated farm the tests use
   (fields, pump, valves, weather, a calendar); an instance an earlier demo left running there
   (--keep-ha) is reused;
2. runs a farm simulator: a compressed day (one farm hour every --tick seconds) in which the soil of
   both fields dries, the pump with a field's valve open waters it, the air cools to a night frost
   (binary_sensor.frost_risk turns on) and warms again, and humidity follows;
3. starts farmhost on <data-dir> against that Home Assistant, with the main group local:main (created
   if missing), applies the farm dashboard (dashboards/farm.yaml) with ha_apply_dashboard and takes a
   screenshot of it with ha_capture_screenshot, both run as requests of the main group;
4. prints where to look: the Home Assistant URL and a login (user demo, password demo-farm), the data
   directory, the screenshot, the logs;
5. offers a terminal chat that stands in for the Telegram main chat: each line you type is an agent
   run of the main group; its answer, and any message the agent sends to the main chat, are printed
   here and stored in the chat's transcript. The LLM comes from .env (FARMHOST_LLM_BASE_URL,
   FARMHOST_LLM_MODEL, FARMHOST_LLM_API_KEY); without one Home Assistant's Assist answers simple
   commands and questions ("turn on the irrigation pump") and the demo says how to configure an LLM.

When stdin ends (no terminal, e.g. in CI) the demo keeps running until a signal, unless --exit-on-eof.
Ctrl-C (SIGINT) or SIGTERM stops everything cleanly: the chat, the simulator, farmhost, and Home
Assistant (stopped and waited for; with --keep-ha it is left running). Exit status 0 after a clean
stop, 1 when setting up failed, 2 for a configuration error."""

HELP_EPILOG: Final = """\
Examples:
  make demo                                     # install everything, then this with --data-dir ./demo-data
  farmhost demo --data-dir ./demo-data          # the same, when installed
  farmhost demo --data-dir /tmp/d --exit-after-setup --port 0   # CI: set up, print, stop
  echo "How dry is field 2?" | farmhost demo --data-dir /tmp/d --exit-on-eof

Settings come from the environment and .env as for `farmhost run`, except: the data dir is --data-dir
(default ./demo-data; FARMHOST_DATA_DIR is not used), HA_URL/HA_TOKEN are the demo's Home Assistant,
Telegram is off and FARM_MODE is demo. See docs/demo.md."""


@dataclass(frozen=True, kw_only=True)
class Summary:
    """Everything the "where to look" block shows."""

    ha_url: str
    dashboard_path: str
    username: str
    password: str
    data_dir: Path
    screenshot: str
    tick: float
    farm_time: str
    llm: str
    log_file: Path
    ha_log: Path
    chat: str  # "on", or why it is off


def summary(s: Summary) -> str:
    """The block printed once everything runs (the tests read its `Label: value` lines)."""
    lines = [
        "",
        "The farmhost demo is running.",
        "",
        f"  Home Assistant:  {s.ha_url}",
        f"  Farm dashboard:  {s.ha_url}{s.dashboard_path}",
        f"  Login:           {s.username} / {s.password}",
        f"  Data directory:  {s.data_dir}",
        f"  Screenshot:      {s.screenshot}",
        f"  Farm simulator:  one farm hour every {s.tick:g} s, starting at {s.farm_time}",
        f"  LLM:             {s.llm}",
        f"  Logs:            {s.log_file} (Home Assistant: {s.ha_log})",
        "",
    ]
    if s.chat == "on":
        lines.append(
            "Chat: type a message and press Enter; the farm agent answers here (this terminal is the main chat)."
        )
    else:
        lines.append(f"Chat: off ({s.chat}).")
    lines += ["Stop: Ctrl-C stops the chat, the simulator, farmhost and Home Assistant.", ""]
    return "\n".join(lines)
