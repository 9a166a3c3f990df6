"""Pytest plugin: the session's real Home Assistant (`ha`), the env to point farmhost at it (`ha_env`), `ha_reset`.

Registered from tests/conftest.py (`pytest_plugins = ["ha_fixture"]`). The machinery lives in farmhost/localha/
(install, config, client, instance, ...); what it installs and where is in tests/ha/README.md.

- `ha` (session): a fresh HA 2025.4.4 with the simulated farm, started on first use (about 5 s with the venv cached)
  and stopped at the end of the session. If the cached venv is missing, it is installed once before the first test
  (about 40 s, progress printed), outside any test's timeout.
- `ha_env` (function): `{"HA_URL": ..., "HA_TOKEN": ...}` for `Daemon(data_dir, env=clean_env(**ha_env))`;
  starts HA again first if an earlier test left it stopped.
- `ha_reset` (function): `ha`, running, with every farm helper back to its start value (FARM_DEFAULTS).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator

import pytest

from farmhost.localha.client import WsSession
from farmhost.localha.errors import HaHttpError, HaSetupError
from farmhost.localha.farm_entities import (
    CALENDAR_ENTITY,
    DRIVERS,
    FARM_DEFAULTS,
    FARM_ENTITIES,
    FARM_ENTITY_IDS,
    FarmEntity,
)
from farmhost.localha.install import HA_VERSION, install, installed_version
from farmhost.localha.instance import HaInstance, start_session_instance

__all__ = [
    "CALENDAR_ENTITY",
    "DRIVERS",
    "FARM_DEFAULTS",
    "FARM_ENTITIES",
    "FARM_ENTITY_IDS",
    "HA_VERSION",
    "FarmEntity",
    "HaHttpError",
    "HaInstance",
    "HaSetupError",
    "WsSession",
]

_HA_FIXTURES = frozenset({"ha", "ha_env", "ha_reset"})


def _printer(config: pytest.Config, *, newline: bool = False) -> Callable[[str], None]:
    """Print progress lines past pytest's output capture (installing and starting HA takes a while)."""
    capman = config.pluginmanager.getplugin("capturemanager")
    prefix = "\n" if newline else ""

    def say(message: str) -> None:
        if capman is None:
            print(f"[ha] {message}", file=sys.stderr, flush=True)
            return
        with capman.global_and_fixture_disabled():
            print(f"{prefix}[ha] {message}", file=sys.stderr, flush=True)

    return say


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Install HA's venv here, when a selected test needs HA: the one-time install must not eat a test's timeout."""
    if config.option.collectonly or not any(_HA_FIXTURES & set(getattr(i, "fixturenames", ())) for i in items):
        return
    if installed_version() != HA_VERSION:
        try:
            install(_printer(config))
        except HaSetupError as err:
            raise pytest.UsageError(f"cannot install Home Assistant for the tests: {err}") from None


@pytest.fixture(scope="session")
def ha(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HaInstance]:
    """A running Home Assistant with the simulated farm, for the whole session; stopped at the end."""
    say = _printer(request.config, newline=True)  # after the dots of earlier tests
    instance = start_session_instance(tmp_path_factory.mktemp("ha"), log=say)
    try:
        yield instance
    finally:
        rc = instance.stop()
        if rc not in (0, None):
            say(f"Home Assistant exited with {rc} at the end of the session; log: {instance.log_path}")


@pytest.fixture
def ha_env(ha: HaInstance) -> dict[str, str]:
    """HA_URL and HA_TOKEN of the running session instance (restarted first if a test left it stopped)."""
    ha.ensure_running()
    return ha.env()


@pytest.fixture
def ha_reset(ha: HaInstance) -> HaInstance:
    """The session instance, running, with every farm helper (and so every sensor) at its start value."""
    ha.ensure_running()
    ha.reset()
    return ha
