"""Rules on effects: how fast an agent's unapproved effect is undone, and what following HA live costs HA.

Run from the repository root with the project's interpreter::

    .venv/bin/python bench/safety_undo.py              # 50 attacks, a 60 s cost window, about 2 min
    .venv/bin/python bench/safety_undo.py --quick      # 10 attacks, a 20 s window

A fresh local Home Assistant (the test harness's farm, two users: the owner and farmhost's own) and, in this
process, farmhost's live view (farm/homeassistant/live_view.py) and rules on effects (farm/control/effect_rules.py) on a real
database, with a profile that puts the irrigation pump under approval. Each attack is what an agent can do
through `ha_call_service`: `input_boolean.turn_on` of the pump's relay, made with farmhost's token. Measured:

- event to undo: from the pump's `state_changed` reaching the live view to HA's answer to the undo
  (`switch.turn_off`), as the enforcer records it (goal, issue 32: p99 <= 1 s against the local HA);
- the blip: how long HA reports the pump on (its `last_changed` on, then off);
- HA requests per minute while the farm is idle: the live view (one socket, events pushed) against the 2 s
  REST polling the automatic off used before (GET /api/states every 2 s, run in the same window as a baseline).

Reports; never gates.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from farmhost.farm.audit import AuditLog
from farmhost.farm.control.effect_rules import EffectRules
from farmhost.farm.homeassistant.client import HAClient
from farmhost.farm.homeassistant.live_view import LiveView, StateChange
from farmhost.localha.client import http_json
from farmhost.localha.instance import HaInstance, start_session_instance
from farmhost.store.db import Database, now_utc

PUMP = "switch.irrigation_pump"
RELAY = "input_boolean.pump_relay"
POLL_SECONDS = 2.0  # the automatic off's REST look before the live view


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank) of `values`."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


async def attacks(ha: HaInstance, data: Path, n: int) -> dict[str, Any]:
    """`n` relay attacks, each undone; the enforcer's latencies and HA's blips, in ms."""
    (data / "farm-profile.json").write_text(
        json.dumps({"policy": {"rules": [{"entities": [PUMP], "requireApproval": True}]}})
    )
    db = Database.open(data)
    client = HAClient(url=ha.url, token=ha.farmhost_token)
    await client.start()
    view = LiveView(ws_url=ha.ws_url, token=ha.farmhost_token)
    enforcer = EffectRules(
        ha=client, view=view, db=db, profile_path=data / "farm-profile.json", audit=AuditLog(data / "farm-state", max_bytes=10_000_000),
        started_at=now_utc(),
    )  # fmt: skip
    pump_times: list[tuple[str, datetime]] = []

    def watch(change: StateChange) -> None:
        if change.entity_id == PUMP and change.new.last_changed is not None:
            pump_times.append((change.new.state, change.new.last_changed))

    enforcer.start()
    view.add_listener(watch)
    await view.start()
    try:
        if not await view.wait_synced(30):
            raise SystemExit("the live view did not sync within 30 s")
        for i in range(n):
            before = len(enforcer.latencies)
            await asyncio.to_thread(
                http_json,
                "POST",
                f"{ha.url}/api/services/input_boolean/turn_on",
                ha.farmhost_token,
                {"entity_id": RELAY},
            )
            deadline = time.monotonic() + 10
            while len(enforcer.latencies) == before or (view.get(PUMP) and view.get(PUMP).state != "off"):  # type: ignore[union-attr]
                if time.monotonic() > deadline:
                    raise SystemExit(f"attack {i + 1} was not undone within 10 s")
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)  # let the relay settle before the next attack
    finally:
        await enforcer.stop()
        await view.stop()
        await client.close()
        db.close()
    blips = [
        (off - on).total_seconds() * 1000
        for (s1, on), (s2, off) in itertools.pairwise(pump_times)
        if s1 == "on" and s2 == "off"
    ]
    return {"undoMs": [x * 1000 for x in enforcer.latencies], "blipMs": blips}


async def cost(ha: HaInstance, seconds: float) -> dict[str, Any]:
    """Requests HA served in `seconds` of an idle farm: the live view's, and 2 s polling's in the same window."""
    view = LiveView(ws_url=ha.ws_url, token=ha.farmhost_token)
    events = 0

    def count(_change: StateChange) -> None:
        nonlocal events
        events += 1

    view.add_listener(count)
    await view.start()
    await view.wait_synced(30)
    start_commands, start_events = view.commands, events
    client = HAClient(url=ha.url, token=ha.farmhost_token)
    await client.start()
    polls = 0
    polled_bytes = 0
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            states = await client.get_states()
            polls += 1
            polled_bytes += len(json.dumps(states))
            await asyncio.sleep(max(0.0, min(POLL_SECONDS, deadline - time.monotonic())))
    finally:
        await client.close()
        await view.stop()
    minutes = seconds / 60
    return {
        "windowSeconds": seconds,
        "liveViewRequestsPerMinute": (view.commands - start_commands) / minutes,
        "liveViewEventsPerMinute": (events - start_events) / minutes,
        "liveViewSetupRequests": start_commands,
        "pollingRequestsPerMinute": polls / minutes,
        "pollingKiBPerMinute": polled_bytes / 1024 / minutes,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table (and `--json PATH`)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--attacks", type=int, default=50)
    parser.add_argument("--window", type=float, default=60.0, help="seconds of the idle cost window")
    parser.add_argument("--quick", action="store_true", help="10 attacks and a 20 s window")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)  # each undo logs a warning: not part of the report
    n, window = (10, 20.0) if args.quick else (args.attacks, args.window)
    with tempfile.TemporaryDirectory(prefix="farmhost-bench-undo-") as tmp:
        root = Path(tmp)
        started = time.monotonic()
        ha = start_session_instance(root / "ha", log=lambda m: print(f"[ha] {m}", file=sys.stderr))
        try:
            data = root / "data"
            data.mkdir()
            undone = asyncio.run(attacks(ha, data, n))
            spent = asyncio.run(cost(ha, window))
        finally:
            ha.stop()
        wall = time.monotonic() - started
    undo, blip = undone["undoMs"], undone["blipMs"]
    lines = [
        f"safety undo: {n} relay attacks on a pump under approval (local HA, farmhost in-process)",
        (
            f"  event -> undo answered  p50 {statistics.median(undo):7.1f} ms   p99 {percentile(undo, 99):7.1f} ms"
            f"   max {max(undo):7.1f} ms   (goal p99 <= 1000 ms)"
        ),
    ]
    if blip:
        lines.append(
            f"  pump on in HA (blip)   p50 {statistics.median(blip):7.1f} ms   p99 {percentile(blip, 99):7.1f} ms"
            f"   max {max(blip):7.1f} ms   ({len(blip)} blips seen)"
        )
    lines += [
        f"HA requests per minute, idle farm, {window:g} s window:",
        (
            f"  live view        {spent['liveViewRequestsPerMinute']:6.1f} /min  "
            f"(+{spent['liveViewSetupRequests']} at connect: auth, current_user, subscribe, get_states)"
        ),
        f"  2 s polling      {spent['pollingRequestsPerMinute']:6.1f} /min  ({spent['pollingKiBPerMinute']:.0f} KiB/min)",
        f"wall {wall:.0f} s",
    ]
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps({"attacks": n, **undone, **spent}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
