"""Voice notes: how long a note takes to become text, against its length, with both engines; the worker's memory.

Run from the repository root with the project's interpreter (the `voice` extra and the dev group installed)::

    .venv/bin/python bench/voice_stt.py             # ~4 min on a 2-core machine
    .venv/bin/python bench/voice_stt.py --quick     # the 5 s and 15 s notes only, ~1 min
    .venv/bin/python bench/voice_stt.py --json out.json

The notes are farm instructions read by Debian's espeak-ng and encoded as OGG/Opus as Telegram sends them, about 5,
15, 60 and 110 s long (the last near FARMHOST_STT_MAX_SECONDS' default of 120 s). The model is faster-whisper-base (int8, beam 1, the engines' settings), assembled from the dev
wheels (farmhost_dev/voice.py). For each engine:

- embedded: a fresh EmbeddedEngine (its worker process starts and loads the model with the first note): the first
  note's time, then each note warm; the worker's VmHWM (peak so far) from /proc after each note, and its VmRSS
  after the longest;
- wyoming: a fresh `python -m wyoming_faster_whisper` on a free port (it loads its model at start), the same notes
  through WyomingEngine; the server's VmRSS and VmHWM.

Goals, printed as verdicts: warm transcription <= 0.6 x the note's length; the first note after a cold start at most
2 s more than the same note warm; the worker's peak RSS <= 400 MB (PASS or FAIL). The figures are in docs/performance.md ("Voice notes").
The script reports; it never gates (exit 0).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # farmhost_dev: the dev tools at the repo root

from farmhost.config import VoiceSettings
from farmhost.voice.audio import decode
from farmhost.voice.embedded import EmbeddedEngine
from farmhost.voice.wyoming import WyomingEngine
from farmhost_dev.voice import WyomingServer, spoken_note, whisper_model

SENTENCES = (
    "Turn on the irrigation pump for field 2 at 6 in the morning and tell me how dry field 1 is.",
    "The greenhouse door is open and the temperature is dropping, close the vents at sunset.",
    "Check the water level in the main tank and send me the soil moisture for the orchard.",
    "Switch off the lights in the barn and remind me to feed the chickens tomorrow at eight.",
)
TARGETS = (5, 15, 60, 120)
WARM_RATIO_GOAL = 0.6
FIRST_NOTE_EXTRA_GOAL = 2.0
RSS_GOAL_MB = 400


def note_of(seconds: float) -> bytes:
    """Farm sentences read one after another until the note is about `seconds` long."""
    # Start near the length: espeak-ng reads each sentence in ~5 s, and a long note is read in one go, not 20 times.
    count = max(1, int(seconds * 0.9 / 6))
    while True:
        text = " ".join(SENTENCES[i % len(SENTENCES)] for i in range(count))
        note = spoken_note(text)
        if decode(note, max_seconds=3600).seconds >= seconds * 0.9:
            return note
        count += 1


def status_mb(pid: int, field: str) -> float:
    """`field` (VmRSS, VmHWM) of /proc/<pid>/status in MB; 0 when the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except FileNotFoundError:
        pass
    return 0.0


def settings(**values: Any) -> VoiceSettings:
    base: dict[str, Any] = {"model": None, "url": None, "language": None, "max_seconds": 3600.0,
                            "idle_seconds": 300.0, "models_dir": Path(tempfile.gettempdir()) / "models"}  # fmt: skip
    return VoiceSettings(**(base | values))


async def timed(engine: EmbeddedEngine | WyomingEngine, note: bytes) -> tuple[float, float, str]:
    started = time.monotonic()
    said = await engine.transcribe(note)
    return time.monotonic() - started, said.seconds, said.text


async def measure(
    engine: EmbeddedEngine | WyomingEngine, notes: dict[int, bytes], runs: int, pid: Callable[[], int | None]
) -> dict[str, Any]:
    """The first note, then each note warm (median of `runs` for the short ones) and the peak RSS after it."""
    first, length, text = await timed(engine, notes[TARGETS[0]])
    print(f"  first note ({length:.1f} s) after a cold start: {first:.2f} s  {text[:70]!r}", flush=True)
    rows = []
    for target, note in notes.items():
        times = []
        for _ in range(runs if target <= 15 else 1):
            took, length, text = await timed(engine, note)
            times.append(took)
        took = statistics.median(times)
        hwm = round(status_mb(pid() or 0, "VmHWM"))
        rows.append({"target": target, "seconds": round(length, 2), "took": round(took, 2),
                     "ratio": round(took / length, 3), "hwm_mb": hwm})  # fmt: skip
        print(f"  {length:5.1f} s note: {took:5.2f} s  ({took / length:.2f} x its length)  peak {hwm} MB  "
              f"{text[:50]!r}", flush=True)  # fmt: skip
    warm5 = rows[0]["took"]
    return {"first": round(first, 2), "first_extra": round(first - warm5, 2), "rows": rows,
            "rss_mb": round(status_mb(pid() or 0, "VmRSS")), "hwm_mb": rows[-1]["hwm_mb"]}  # fmt: skip


async def run(args: argparse.Namespace) -> dict[str, Any]:
    model = whisper_model()
    targets = TARGETS[:2] if args.quick else TARGETS
    print("making the notes with espeak-ng ...", flush=True)
    notes = {target: note_of(target) for target in targets}
    report: dict[str, Any] = {"machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                                          "load": os.getloadavg()[0]}}  # fmt: skip

    print(f"embedded: faster-whisper ({model}), int8, beam 1, worker process", flush=True)
    engine = EmbeddedEngine(settings(model=str(model)))
    try:
        embedded = await measure(engine, notes, args.runs, lambda: engine.worker_pid)
    finally:
        await engine.aclose()
    print(f"  worker RSS {embedded['rss_mb']} MB, peak {embedded['hwm_mb']} MB", flush=True)
    report["embedded"] = embedded

    with tempfile.TemporaryDirectory() as tmp:
        started = time.monotonic()
        server = WyomingServer(model, Path(tmp))
        print(f"wyoming: wyoming-faster-whisper at {server.url}, listening after {time.monotonic() - started:.1f} s")
        try:
            wyoming = await measure(WyomingEngine(settings(url=server.url)), notes, args.runs, lambda: server.proc.pid)
        finally:
            server.stop()
    print(f"  server RSS {wyoming['rss_mb']} MB, peak {wyoming['hwm_mb']} MB", flush=True)
    report["wyoming"] = wyoming
    return report


def verdicts(report: dict[str, Any]) -> list[str]:
    lines = []
    for name in ("embedded", "wyoming"):
        part = report[name]
        worst = max(row["ratio"] for row in part["rows"])
        ok = "meets" if worst <= WARM_RATIO_GOAL else "MISSES"
        lines.append(f"{name}: warm {worst:.2f} x the note's length at worst: {ok} the goal <= {WARM_RATIO_GOAL}")
        ok = "meets" if part["first_extra"] <= FIRST_NOTE_EXTRA_GOAL else "MISSES"
        lines.append(f"{name}: first note +{part['first_extra']:.2f} s: {ok} the goal <= +{FIRST_NOTE_EXTRA_GOAL} s")
    embedded = report["embedded"]
    lines.append(f"embedded: worker RSS after the longest note {embedded['rss_mb']} MB")
    longest = embedded["rows"][-1]["seconds"]
    verdict = "PASS" if embedded["hwm_mb"] <= RSS_GOAL_MB else "FAIL"
    lines.append(f"embedded: worker peak RSS (VmHWM, notes up to {longest:.0f} s) {embedded['hwm_mb']} MB: "
                 f"{verdict} (goal <= {RSS_GOAL_MB} MB)")  # fmt: skip
    # The same faster-whisper and model in a process with glibc's default heap settings: the same run's baseline.
    lines.append(f"wyoming: server peak RSS {report['wyoming']['hwm_mb']} MB (faster-whisper without the worker's "
                 "heap settings, farmhost/voice/worker.py)")  # fmt: skip
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="the 5 s and 15 s notes only")
    parser.add_argument("--runs", type=int, default=3, help="warm runs of the 5 s and 15 s notes (median)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    report = asyncio.run(run(args))
    report["verdicts"] = verdicts(report)
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("\n".join(report["verdicts"]))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
