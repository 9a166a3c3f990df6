"""The process that keeps `hass` running: starts it again on exit 100 (restart), stops it with its parent or a signal.

Run by path (`python .../supervisor.py --python ... --config ...`, see HaInstance.start), so stdlib only: it must
not import farmhost, and its command line names it in `ps` as the local HA's supervisor.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Final

RESTART_EXIT_CODE: Final = 100  # `hass` exits with this on homeassistant.restart; the supervisor starts it again
POLL_S: Final = 0.1  # how often the loop looks at hass, the signal flag and the parent: a stop takes at most this


def supervise(python: str, config: str, log_path: str, pid_file: str, parent: int | None) -> int:
    """Run `hass` until it exits with something other than 100; forward SIGTERM/SIGINT; die with the parent."""
    stopping = False
    child: subprocess.Popen[bytes] | None = None

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    run_dir = Path(pid_file).parent
    with open(log_path, "ab") as log:
        while True:
            log.write(f"### supervisor: starting hass ({time.strftime('%H:%M:%S')})\n".encode())
            log.flush()
            child = subprocess.Popen(
                [python, "-m", "homeassistant", "-c", config, "--skip-pip", "--log-no-color"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            Path(pid_file).write_text(f"{child.pid}\n")
            while child.poll() is None:
                orphaned = parent is not None and os.getppid() != parent
                if stopping or orphaned:
                    child.terminate()
                    try:
                        child.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        child.kill()
                        child.wait()
                    break
                time.sleep(POLL_S)
            rc = child.returncode
            (run_dir / "hass.rc").write_text(f"{rc}\n")
            if rc != RESTART_EXIT_CODE or stopping:
                log.write(f"### supervisor: hass exited {rc}, done\n".encode())
                return 0 if stopping else rc
            log.write(b"### supervisor: hass exited 100 (restart requested): starting it again\n")


def main(argv: list[str] | None = None) -> int:
    """The supervisor's command line (HaInstance.start writes it)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", required=True, help="the HA venv's interpreter")
    parser.add_argument("--config", required=True, help="HA's config dir")
    parser.add_argument("--log", required=True, help="hass.log: hass's output and the supervisor's lines")
    parser.add_argument("--pid-file", required=True, help="hass.pid (hass.rc goes beside it)")
    parser.add_argument("--parent", type=int, help="stop hass when this process is no longer our parent")
    args = parser.parse_args(argv)
    return supervise(args.python, args.config, args.log, args.pid_file, args.parent)


if __name__ == "__main__":
    sys.exit(main())
