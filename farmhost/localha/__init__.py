"""The local Home Assistant with the simulated farm: installed, configured and supervised for the demo and the test suite.

Modules, lowest first: `errors` (HaSetupError, HaHttpError), `install` (the cached HA venv), `config` (a fresh config
dir: the farm configuration of `farm/`, seeded users and tokens), `farm_entities` (the farm's entities, start values
and aliases), `client` (REST and WebSocket on aiohttp, blocking calls), `farm_client` (setting up, driving and
checking the farm through the client), `supervisor` (the stdlib process that keeps `hass` running), `instance`
(HaInstance: one HA started, waited for, restarted, stopped) and `__main__` (the command line,
`python -m farmhost.localha install|start|status|stop`). Only `farmhost demo` (lazily), the tests and the benchmarks
import this package: never `farmhost run` or any other production command.
"""
