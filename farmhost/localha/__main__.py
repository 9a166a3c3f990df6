"""The local Home Assistant's command line: install the venv, start an instance detached, status, stop.

    .venv/bin/python -m farmhost.localha install            # create/refresh the cached venv (no-op when up to date)
    .venv/bin/python -m farmhost.localha start [--dir D]    # fresh config in D, start HA detached, write D/ha.env
    .venv/bin/python -m farmhost.localha status [--dir D]   # print D/ha.env if the instance runs (exit 1 if not)
    .venv/bin/python -m farmhost.localha stop [--dir D]     # SIGTERM to the supervisor (KILL only if it hangs)

The test suite's pytest plugin (`ha_fixture`, in a source checkout only) uses the same modules (`install()`,
`HaInstance`); its README in the checkout's test directory describes the test instance.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from farmhost.localha.errors import HaSetupError
from farmhost.localha.install import install, installed_version, log_to_stderr, venv_dir
from farmhost.localha.instance import start_session_instance


def _default_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"farmhost-ha-{os.environ.get('USER', 'user')}"


def _read_pid(path: Path) -> int | None:
    with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
        pid = int(path.read_text())
        os.kill(pid, 0)
        return pid
    return None


def main(argv: list[str] | None = None) -> int:
    """The command line: install, start, status, stop."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("install", help="create or refresh the cached HA venv")
    for name in ("start", "stop", "status"):
        p = sub.add_parser(name)
        p.add_argument("--dir", type=Path, default=_default_dir(), help="instance dir (config/, hass.log, ha.env)")
    args = parser.parse_args(argv)
    try:
        if args.command == "install":
            started = time.monotonic()
            install()
            log_to_stderr(
                f"homeassistant {installed_version()} ready in {venv_dir()} ({time.monotonic() - started:.1f} s)"
            )
            return 0
        root: Path = args.dir
        pid = _read_pid(root / "supervisor.pid")
        if args.command == "status":
            if pid is None:
                print("not running")
                return 1
            print((root / "ha.env").read_text(), end="")
            return 0
        if args.command == "stop":
            if pid is None:
                log_to_stderr("not running")
                return 0
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 30
            while _read_pid(root / "supervisor.pid") is not None and time.monotonic() < deadline:
                time.sleep(0.1)
            if _read_pid(root / "supervisor.pid") is not None:
                os.killpg(pid, signal.SIGKILL)
            (root / "supervisor.pid").unlink(missing_ok=True)
            log_to_stderr(f"stopped (hass exit code {(root / 'hass.rc').read_text().strip()})")
            return 0
        if pid is not None:
            log_to_stderr(f"already running (supervisor {pid}); see {root / 'ha.env'}")
            return 0
        root.mkdir(parents=True, exist_ok=True)
        instance = start_session_instance(root, watch_parent=False)
        instance.detach()  # it outlives this command; `stop` uses supervisor.pid
        env = {
            **instance.env(),
            "HA_OWNER_TOKEN": instance.token,
            "HA_WS_URL": instance.ws_url,
            "HA_CONFIG_DIR": str(instance.config_dir),
        }
        (root / "ha.env").write_text("".join(f"{k}={v}\n" for k, v in env.items()))
        log_to_stderr(f"env in {root / 'ha.env'}; log in {instance.log_path}")
        return 0
    except HaSetupError as err:
        log_to_stderr(f"error: {err}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
