"""Demo: the order of the demo (HA, farmhost, dashboard, screenshot, simulator, chat), its signals and its clean stop.

Set-up runs step by step, each step raced against the stop signal: Ctrl-C (SIGINT) or SIGTERM at any moment
ends the demo cleanly. Blocking Home Assistant work runs in worker threads that are never abandoned: the stop
waits for a step in flight (an HA start takes a few seconds) and then stops what it started. The stop order is
the reverse of the start: chat, simulator, farmhost (App.stop), Home Assistant (stopped and waited for, unless
--keep-ha). The last line printed is always "[demo] stopped ...". The stop works with the output gone too (a
`| tee` that Ctrl-C ended first): lines then go nowhere (farmhost/demo/output.py), the stop goes on.

A failed dashboard or screenshot does not end the demo (it is reported and the rest runs); with
--exit-after-setup it makes the exit status 1, so CI notices.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

from farmhost.app import STOP_TIMEOUT, App
from farmhost.config import LlmSettings, Settings, build_config
from farmhost.demo import host
from farmhost.demo.console import ConsoleChat, StdinLines
from farmhost.demo.ha import DemoHa, HaProblem
from farmhost.demo.output import LineOutput
from farmhost.demo.simulator import FarmSimulator, clock_text
from farmhost.demo.text import NO_LLM_HOWTO, NO_LLM_SHORT, Summary, summary
from farmhost.errors import ConfigError, FarmhostError
from farmhost.farm.dashboards.lovelace import url_path
from farmhost.logs import configure

T = TypeVar("T")
LOG_FILE: Final = "demo.log"
LOCK_FILE: Final = "demo.lock"


@dataclass(frozen=True, kw_only=True)
class DemoOptions:
    """The command line's choices."""

    data_dir: Path
    port: int | None = None
    tick: float = 10.0
    start_hour: float = 18.0
    chat: bool = True
    exit_after_setup: bool = False
    exit_on_eof: bool = False
    keep_ha: bool = False
    screenshot: bool = True
    verbose: bool = False


class _Stopped(Exception):
    """The stop signal came during set-up."""


class Demo:
    """One demo run on one data dir."""

    def __init__(self, options: DemoOptions, settings: Settings, *, write: Callable[[str], None] | None = None) -> None:
        """Prepare; `run()` does everything.

        Args:
            options: the command line's choices.
            settings: the settings from the environment and .env (the demo overrides data dir, HA, Telegram).
            write: where lines go (default: stdout, flushed per line, dropped once nobody reads it).
        """
        self.options = options
        self.base_settings = settings
        self._write = write or LineOutput()
        self._stop = asyncio.Event()
        self._threads: set[asyncio.Future[Any]] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._ha: DemoHa | None = None
        self._app: App | None = None
        self._lock_fd = -1
        self._log_handlers: list[logging.Handler] = []
        self.problems: list[str] = []

    # ---- output

    def say(self, where: str, message: str) -> None:
        """One line of progress, `[where] message`."""
        self._write(f"[{where}] {message}")

    # ---- the whole run

    async def run(self) -> int:
        """Set everything up, run until a signal (or as the options say), stop everything; the exit status."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal, sig)
        code = 0
        try:
            code = await self._main()
        except _Stopped:
            code = 0
        except HaProblem as err:
            self.say("demo", f"error: Home Assistant: {err}")
            code = 1
        except FarmhostError as err:
            self.say("demo", f"error: {err.message}")
            code = 2
        finally:
            await self._teardown()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            self.say("demo", f"stopped (exit status {code})")
            self._close_logs()
        return code

    def _on_signal(self, sig: int) -> None:
        if self._stop.is_set():
            self.say("demo", "already stopping; please wait")
            return
        self._stop.set()  # first: whatever happens to the line below, the signal stops the demo
        self.say("demo", f"{signal.Signals(sig).name}: stopping the chat, the simulator, farmhost and Home Assistant")

    async def _main(self) -> int:
        options = self.options
        data_dir = options.data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        self._take_lock(data_dir)
        host.check_not_running(data_dir)
        self._configure_logs(data_dir)
        self.say("demo", f"data directory {data_dir} (log: {data_dir / LOG_FILE})")

        ha = DemoHa(data_dir / "ha", port=options.port, keep=options.keep_ha, log=lambda line: self.say("ha", line))
        self._ha = ha
        await self._blocking(ha.install)
        await self._blocking(ha.start_or_reuse)
        username, password = await self._blocking(ha.ensure_login)
        self.say("ha", f"browser login: {username} / {password}")

        if host.ensure_main_group(data_dir):
            self.say("farmhost", f"registered the main group {host.MAIN_JID} (folder {host.MAIN_FOLDER})")
        settings = host.demo_settings(self.base_settings, data_dir=data_dir, ha_url=ha.url, ha_token=ha.farmhost_token)
        config = build_config(settings)
        profile = config.farm.profile_path
        if host.install_profile(profile):
            self.say("farmhost", f"wrote the demo farm's safe profile to {profile} (docs/farm-actions.md)")
        exposed = [s["entity_id"] for s in await self._blocking(ha.get_states)]
        if hidden := host.kept_from_assist(profile, exposed):
            await self._blocking(lambda: ha.hide_from_assist(hidden))
            self.say("ha", f"not exposed to Assist (the farm profile limits them): {', '.join(hidden)}")
        self._app = App(config)
        await self._until_stop(self._app.start())
        runtime = self._app.runtime.backend.name if self._app.runtime and self._app.runtime.backend else "unavailable"
        self.say("farmhost", f"running in this process (agent sandbox: {runtime}; LLM: {_llm(config.agents.llm)})")

        simulator = FarmSimulator(
            ha, tick=options.tick, start_hour=options.start_hour, say=lambda line: self.say("sim", line)
        )
        self._spawn(simulator.run(), "simulator")
        self.say("sim", f"one farm hour every {options.tick:g} s, starting at {clock_text(options.start_hour)}")

        await self._dashboard()
        shot = await self._screenshot() if options.screenshot else "(off: --no-screenshot)"

        self._write(
            summary(
                Summary(
                    ha_url=ha.url,
                    dashboard_path=f"/{url_path(host.DASHBOARD)}",
                    username=username,
                    password=password,
                    data_dir=data_dir,
                    screenshot=shot,
                    tick=options.tick,
                    farm_time=clock_text(options.start_hour),
                    llm=_llm(config.agents.llm),
                    log_file=data_dir / LOG_FILE,
                    ha_log=ha.log_path,
                    chat="--exit-after-setup" if options.exit_after_setup else "on" if options.chat else "--no-chat",
                )
            )
        )
        if not config.agents.llm.enabled:
            self._write(NO_LLM_HOWTO + "\n")
        if options.exit_after_setup:
            self.say("demo", "set-up done (--exit-after-setup)")
            return 1 if self.problems else 0
        if options.chat:
            self._start_chat(config.agents.llm)
        await self._stop.wait()
        return 0

    # ---- steps

    def _running(self) -> App:
        assert self._app is not None, "the steps run after the App started"
        return self._app

    async def _dashboard(self) -> None:
        try:
            applied = await self._until_stop(host.apply_dashboard(self._running()))
        except FarmhostError as err:
            self.problems.append(err.message)
            self.say("farmhost", f"the farm dashboard was not applied: {err.message}")
            return
        self.say(
            "farmhost",
            f"applied the farm dashboard to Home Assistant with ha_apply_dashboard "
            f"({applied.get('urlPath')}: {applied.get('views')} views, {applied.get('cards')} cards)",
        )

    async def _screenshot(self) -> str:
        try:
            path, result = await self._until_stop(host.capture_screenshot(self._running()))
        except FarmhostError as err:
            self.problems.append(err.message)
            self.say("farmhost", f"no screenshot: {err.message}")
            return f"(failed: {err.message})"
        self.say("farmhost", f"screenshot with ha_capture_screenshot: {path} ({result['width']}x{result['height']})")
        return str(path)

    def _start_chat(self, llm: LlmSettings) -> None:
        app = self._app
        assert app is not None and app.db is not None and app.runtime is not None
        console = ConsoleChat(
            db=app.db,
            runtime=app.runtime,
            jid=host.MAIN_JID,
            folder=host.MAIN_FOLDER,
            llm_configured=llm.enabled,
            say=self._write,
            no_llm_hint=NO_LLM_SHORT,
            alerts=app.alerts,
        )
        lines = StdinLines(asyncio.get_running_loop()).start()
        echo = not os.isatty(0)
        self._spawn(console.deliver_forever(), "outbox")
        self._spawn(self._chat(console, lines, echo=echo), "chat")

    async def _chat(self, console: ConsoleChat, lines: StdinLines, *, echo: bool) -> None:
        while True:
            line = await lines.queue.get()
            if line is None:
                if self.options.exit_on_eof:
                    self.say("demo", "end of input: stopping (--exit-on-eof)")
                    self._stop.set()
                else:
                    self.say("demo", "end of input: the chat is closed; the demo keeps running until Ctrl-C")
                return
            await console.handle(line, echo=echo)

    # ---- helpers

    async def _until_stop(self, step: Awaitable[T]) -> T:
        """Await `step` unless the stop signal comes first (then cancel it and raise _Stopped)."""
        task = asyncio.ensure_future(step)
        stopper = asyncio.ensure_future(self._stop.wait())
        try:
            done, _ = await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
        if task in done:
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        raise _Stopped

    async def _blocking(self, fn: Callable[[], T]) -> T:
        """Run blocking `fn` in a thread; the teardown waits for it even when the stop signal came first."""
        future = asyncio.ensure_future(asyncio.to_thread(fn))
        self._threads.add(future)
        future.add_done_callback(self._threads.discard)
        return await self._until_stop(asyncio.shield(future))

    def _spawn(self, work: Awaitable[None], name: str) -> None:
        async def guarded() -> None:
            try:
                await work
            except asyncio.CancelledError:
                raise
            except Exception:
                logging.getLogger(__name__).exception("demo: %s failed", name)
                self.say("demo", f"the {name} failed; see {self.options.data_dir / LOG_FILE}")

        self._tasks.append(asyncio.create_task(guarded(), name=f"demo:{name}"))

    async def _teardown(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._app is not None:
            try:
                await asyncio.wait_for(self._app.stop(), STOP_TIMEOUT)
                self.say("farmhost", "stopped")
            except Exception as err:  # noqa: BLE001 - report and go on: Home Assistant must still be stopped
                self.say("farmhost", f"did not stop cleanly: {err!r}")
        if self._threads:
            await asyncio.gather(*list(self._threads), return_exceptions=True)
        if self._ha is not None:
            try:
                await asyncio.to_thread(self._ha.stop)
            except Exception as err:  # noqa: BLE001 - the last step: report it
                self.say("ha", f"did not stop cleanly: {err!r}")
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def _take_lock(self, data_dir: Path) -> None:
        fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise ConfigError(f"another farmhost demo (pid {holder}) is running on {data_dir}") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock_fd = fd

    def _configure_logs(self, data_dir: Path) -> None:
        """Send farmhost's log lines (redacted, as `farmhost run` writes them) to <data>/demo.log; errors to stderr.

        Warnings stay in the file: the chat already says what they would (a run refused for want of an LLM).
        """
        settings = self.base_settings
        configure("DEBUG" if self.options.verbose else "INFO", secrets=settings.secret_values())
        root = logging.getLogger()
        to_stderr = root.handlers[0]
        to_stderr.setLevel(logging.INFO if self.options.verbose else logging.ERROR)
        to_file = logging.FileHandler(data_dir / LOG_FILE, encoding="utf-8")
        to_file.setFormatter(to_stderr.formatter)  # the same redacting formatter (and filters) as stderr's
        for redact in to_stderr.filters:
            to_file.addFilter(redact)
        root.addHandler(to_file)
        self._log_handlers = [to_file, to_stderr]

    def _close_logs(self) -> None:
        root = logging.getLogger()
        for handler in self._log_handlers:
            root.removeHandler(handler)
            handler.close()
        self._log_handlers = []


def _llm(llm: LlmSettings) -> str:
    if not llm.endpoints:
        return "not configured (see below)"
    first = llm.endpoints[0]
    return f"{first.model} at {first.base_url}"
