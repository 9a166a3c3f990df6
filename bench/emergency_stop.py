"""The emergency stop against the real Home Assistant: from the command to the last guarded entity safe.

Run from the repository root with the project's interpreter::

    .venv/bin/python bench/emergency_stop.py              # 30 rounds, about 40 s after HA is up
    .venv/bin/python bench/emergency_stop.py --rounds 5   # a smoke run
    .venv/bin/python bench/emergency_stop.py --json out.json

The local test Home Assistant (farmhost/localha, installed in ~/.cache/farmhost-ha; started here on a free port)
with its simulated farm, and farmhost's own parts in this process: the database of a fresh data dir, the agent
runtime (only its pause is used), the audit log, the HAClient and emergency_stop.py's EmergencyStop, which is
what `/stop` and the Stop everything button call. The farm profile guards every switch, light and fan, every relay
helper behind them and the irrigation duration (a range 0..120): N entities.

Each round turns all N on (the relays and the duration at 90, through HA's REST API as a person would), waits
until HA reports them so, then times `EmergencyStop.stop()`. An observer on its own WebSocket subscription to HA's
`state_changed` events stamps the moment each entity reaches its safe state: the figure is from the call to the
last of those stamps (what a farmer waits for), beside the stop's own answer time (its states read back until all
are safe, then audited). The baseline, in the same run: one `input_boolean.turn_off` through the same HAClient,
call to answer. The Telegram leg of a real `/stop` (the long poll's delivery, the reply through the outbox) is not
in these figures. The script reports; it never gates (exit 0, 2 when it could not run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # farmhost_dev: the dev tools at the repo root

from farmhost.agents.runtime import AgentRuntime
from farmhost.config import Settings, build_config
from farmhost.emergency_stop import EmergencyStop
from farmhost.farm.audit import AuditLog
from farmhost.farm.control import policy
from farmhost.farm.control.effects import guarded
from farmhost.farm.control.safe_state import is_safe_state
from farmhost.farm.homeassistant.client import HAClient
from farmhost.layout import DataLayout
from farmhost.localha.client import WsSession
from farmhost.localha.instance import HaInstance, start_session_instance
from farmhost.store.db import Database
from farmhost_dev.testing import init_data_dir_in_process

RULES: list[dict[str, Any]] = [
    {"entities": ["switch.*", "light.*", "fan.*", "input_boolean.*_relay"], "maxCallsPerHour": 60},
    {"entities": ["number.irrigation_duration"], "valueRange": [0, 120]},
]
RELAYS = [
    "input_boolean.pump_relay",
    "input_boolean.field_1_valve_relay",
    "input_boolean.field_2_valve_relay",
    "input_boolean.barn_light_relay",
    "input_boolean.greenhouse_fan_relay",
]
BASELINE_RELAY = "input_boolean.barn_light_relay"
ON_TIMEOUT_S = 20.0  # HA reports every entity on within this (template entities follow their relays)
SAFE_TIMEOUT_S = 20.0  # the observer sees every entity safe within this


@dataclass
class Figures:
    """Milliseconds, p50 and max over the rounds."""

    n: int
    p50_ms: float
    max_ms: float

    @classmethod
    def of(cls, samples: list[float]) -> Figures:
        """The figures of samples in seconds."""
        return cls(n=len(samples), p50_ms=statistics.median(samples) * 1000, max_ms=max(samples) * 1000)


@dataclass
class Report:
    """The whole run, as `--json` dumps it."""

    entities: list[str]
    rounds: int
    last_safe: Figures | None = None
    stop_answered: Figures | None = None
    baseline_call: Figures | None = None
    failures: list[str] = field(default_factory=list)


class Observer:
    """HA's state_changed events on a WebSocket of its own, stamped on arrival (time.monotonic)."""

    def __init__(self, ha: HaInstance) -> None:
        self._ws = WsSession(ha.ws_url, ha.token, timeout=3600)
        answer = self._ws.command("subscribe_events", event_type="state_changed")
        if not answer.get("success"):
            raise RuntimeError(f"subscribe_events refused: {answer}")
        self._lock = threading.Lock()
        self.events: list[tuple[float, str, dict[str, Any]]] = []
        self._thread = threading.Thread(target=self._run, name="observer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                message = self._ws.recv()
                stamp = time.monotonic()
                data = (message.get("event") or {}).get("data") or {}
                new = data.get("new_state")
                if isinstance(new, dict):
                    with self._lock:
                        self.events.append((stamp, str(data.get("entity_id")), new))
        except (OSError, ConnectionError):
            return  # closed

    def since(self, start: float) -> list[tuple[float, str, dict[str, Any]]]:
        """The events stamped at or after `start`."""
        with self._lock:
            return [event for event in self.events if event[0] >= start]

    def close(self) -> None:
        """Stop listening."""
        self._ws.close()
        self._thread.join(5)


async def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def _all_on(ha: HaInstance, client: HAClient, entities: list[str]) -> None:
    ha.call_service("input_boolean", "turn_on", {"entity_id": RELAYS})
    ha.call_service("input_number", "set_value", {"entity_id": "input_number.irrigation_duration_raw", "value": 90})
    rules = policy.parse_profile(json.dumps({"policy": {"rules": RULES}}).encode()).rules

    async def none_safe() -> bool:
        states = {s["entity_id"]: s for s in await client.get_states()}
        return not any(is_safe_state(e, states[e]["state"], rules, states[e]["attributes"]) for e in entities)

    await _wait(none_safe, ON_TIMEOUT_S, "every guarded entity on")


async def _measure(ha: HaInstance, data_dir: Path, rounds: int) -> Report:
    (data_dir / "farm-profile.json").write_text(json.dumps({"policy": {"rules": RULES}}))
    rules = policy.load_profile(data_dir / "farm-profile.json").rules
    settings = Settings(_env_file=None, FARMHOST_DATA_DIR=data_dir)  # type: ignore[call-arg]
    layout = DataLayout(data_dir)
    db = Database.open(data_dir)
    runtime = AgentRuntime(
        settings=build_config(settings).agents,
        layout=layout,
        group=lambda folder: None,
        before_run=_no_hook,
        memory_snippets=lambda folder, prompt: [],
    )
    audit = AuditLog(layout.farm_state, max_bytes=10_000_000)
    client = HAClient(url=ha.url, token=ha.token)
    await client.start()
    observer = Observer(ha)
    stop = EmergencyStop(db=db, runtime=runtime, ha=client, profile_path=data_dir / "farm-profile.json", audit=audit)
    entities = guarded(rules, [s["entity_id"] for s in await client.get_states()])
    report = Report(entities=entities, rounds=rounds)
    last_safe: list[float] = []
    answered: list[float] = []
    baseline: list[float] = []
    try:
        for number in range(rounds + 1):  # round 0 warms the sockets up and is not counted
            await _all_on(ha, client, entities)
            start = time.monotonic()
            result = await stop.stop(by="bench", via="bench")
            took = time.monotonic() - start
            stop.resume(by="bench")
            if result.failed or result.problem:
                report.failures.append(f"round {number}: {result.failed} {result.problem}")
            stamps = await _safe_stamps(observer, start, entities, rules)
            ha.call_service("input_boolean", "turn_on", {"entity_id": BASELINE_RELAY})
            await _wait(lambda: _is(client, BASELINE_RELAY, "on"), ON_TIMEOUT_S, f"{BASELINE_RELAY} on")
            call_start = time.monotonic()
            await client.ws_command(
                "call_service", domain="input_boolean", service="turn_off", service_data={"entity_id": BASELINE_RELAY}
            )
            call_took = time.monotonic() - call_start
            if number == 0:
                continue
            last_safe.append(max(stamps.values()) - start)
            answered.append(took)
            baseline.append(call_took)
            print(f"round {number}: last safe {last_safe[-1] * 1000:.0f} ms, answered {took * 1000:.0f} ms, "
                  f"one call {call_took * 1000:.1f} ms", file=sys.stderr)  # fmt: skip
    finally:
        observer.close()
        await client.close()
        audit.close()
        db.close()
    report.last_safe, report.stop_answered = Figures.of(last_safe), Figures.of(answered)
    report.baseline_call = Figures.of(baseline)
    return report


async def _safe_stamps(observer: Observer, start: float, entities: list[str], rules: Any) -> dict[str, float]:
    """When each entity was first seen in its safe state after `start` (waits until all were)."""
    stamps: dict[str, float] = {}

    async def all_safe() -> bool:
        for stamp, entity_id, new in observer.since(start):
            fresh = entity_id in entities and entity_id not in stamps
            if fresh and is_safe_state(entity_id, new.get("state"), rules, new.get("attributes") or {}):
                stamps[entity_id] = stamp
        return len(stamps) == len(entities)

    await _wait(all_safe, SAFE_TIMEOUT_S, "every guarded entity safe")
    return stamps


async def _is(client: HAClient, entity_id: str, state: str) -> bool:
    return (await client.get_state(entity_id))["state"] == state


async def _no_hook(folder: str) -> None:
    return None


def _row(name: str, figures: Figures | None, note: str) -> str:
    if figures is None:
        return f"| {name:<34} | {'-':>3} | {'-':>8} | {'-':>8} | {note} |"
    return f"| {name:<34} | {figures.n:>3} | {figures.p50_ms:>8.1f} | {figures.max_ms:>8.1f} | {note} |"


def main() -> int:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30, help="counted rounds (default 30)")
    parser.add_argument("--json", type=Path, help="also write the report as JSON here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # the stop's own warnings (paused, resumed) at every round are noise here
    with tempfile.TemporaryDirectory(prefix="farmhost-stop-bench-") as tmp:
        try:
            ha = start_session_instance(Path(tmp) / "ha", log=lambda m: print(m, file=sys.stderr))
        except Exception as err:  # noqa: BLE001 - a benchmark reports why it could not run
            print(f"cannot start Home Assistant: {err}", file=sys.stderr)
            return 2
        try:
            data_dir = init_data_dir_in_process(Path(tmp) / "data")
            report = asyncio.run(_measure(ha, data_dir, args.rounds))
        finally:
            ha.stop()
    n = len(report.entities)
    print(f"\nEmergency stop, {n} guarded entities on, {report.rounds} rounds ({', '.join(report.entities)})\n")
    print(f"| {'measure':<34} | {'n':>3} | {'p50 ms':>8} | {'max ms':>8} | note |")
    print(f"|{'-' * 36}|{'-' * 5}|{'-' * 10}|{'-' * 10}|------|")
    print(_row("command to the last entity safe", report.last_safe, f"{n} entities, seen on HA's event stream"))
    print(_row("command to the stop's answer", report.stop_answered, "states read back, audited"))
    print(_row("baseline: one service call", report.baseline_call, "input_boolean.turn_off, call to answer"))
    if report.failures:
        print(f"\n{len(report.failures)} round(s) with failures: {report.failures[:3]}")
    if args.json is not None:
        args.json.write_text(json.dumps(asdict(report), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
