# farmhost: the two commands of the README, and the pieces they are made of.
# Everything installs into this checkout (.tools/ for uv, .venv/ for farmhost); nothing global but Debian packages.

PYTHON ?= python3
UV_VERSION ?= 0.13.9
DATA_DIR ?= ./data
DEMO_DIR ?= ./demo-data
UV := .tools/bin/uv
export UV_PYTHON_DOWNLOADS := never
export UV_PROJECT_ENVIRONMENT := .venv
# Bytecode compiled at install (site-packages by uv, the checkout's farmagent by compileall): agent sandboxes mount
# the interpreter and the sources read-only and never write them, so without it every agent run compiles from source.
export UV_COMPILE_BYTECODE := 1

.PHONY: demo run test test-fast install debian ha opencode docker lint typecheck pytest pytest-fast bench bench-attack bench-sites bench-stop schema clean

## demo: install farmhost and the local Home Assistant, then the live demo farm in ./demo-data: HA with the simulated
## farm, farmhost with the farm dashboard and a screenshot, a terminal chat with the agent (Ctrl-C stops it all)
demo: debian install ha
	.venv/bin/farmhost demo --data-dir $(DEMO_DIR)

## run: install, create ./data with a local main group, and run the daemon in the foreground (Ctrl-C stops it)
run: install
	.venv/bin/farmhost init --data-dir $(DATA_DIR)
	@.venv/bin/farmhost group list --data-dir $(DATA_DIR) --json | grep -q '"isMain": true' || \
	  .venv/bin/farmhost group add --data-dir $(DATA_DIR) --jid local:main --name "Farm office" --folder main --main
	.venv/bin/farmhost run --data-dir $(DATA_DIR)

## test: install everything the tests need, then lint, type-check and run the whole suite
test: debian install ha opencode docker lint typecheck pytest

## test-fast: the same without the tests marked `slow` (the end-to-end cases): for a quick round while developing
test-fast: debian install ha opencode docker lint typecheck pytest-fast

$(UV):
	$(PYTHON) -m venv .tools
	.tools/bin/pip install -q "uv==$(UV_VERSION)"

install: $(UV)
	$(UV) sync --frozen --extra voice --python $(PYTHON) -q
	.venv/bin/python -m compileall -q container/farmagent

## opencode: OpenCode at the pinned version in .tools/opencode, for agents of kind opencode (docs/agent-runtime.md)
opencode:
	scripts/opencode-install

## docker: a private Docker engine for the tests (scripts/docker-engine, ~/.cache/farmhost-docker) and the images they
## run: the agent image (container/) and the farmhost image (Dockerfile, without Chromium), both on a Debian base made by
## debootstrap (scripts/docker-images; first time a few minutes, then seconds).
## Without root or docker.io it says so and the Docker live tests skip; pytest stops the engine when it ends.
docker:
	@if scripts/docker-engine start; then scripts/docker-images; \
	else echo "[farmhost] no Docker engine for the tests: the Docker backend's live tests will skip"; fi

## debian: the Debian packages the demo and the tests use, installed when missing (as root; otherwise it prints the command)
debian:
	scripts/debian-packages

## ha: the Home Assistant the demo and the tests run, cached in ~/.cache/farmhost-ha (first time ~90 s, with progress)
ha: install
	.venv/bin/python -m farmhost.localha install

lint:
	.venv/bin/ruff check farmhost container tests bench farmhost_dev
	.venv/bin/ruff format --check farmhost container tests bench farmhost_dev
	.venv/bin/lint-imports --no-cache

typecheck:
	.venv/bin/mypy

# Four pytest workers (pytest-xdist), each test file on one worker: each worker starts its own Home Assistant
# (about 200 MB; the model server, Chromium and Whisper when its files use them). Four on two cores: most of a test's time
# is waiting on real parts (HA, Chromium, Docker, a model server, a held on-period), so four workers took half the
# wall time of two for the same summed test time (docs/testing.md, "Workers").
# --no-loadscope-reorder: files are handed out in the order tests/conftest.py puts them (the slow ones first), not
# by their number of tests, which left the long end-to-end files with few tests to the end.
PYTEST_WORKERS ?= 4
PYTEST = .venv/bin/pytest -q -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=30

# FARMHOST_TEST_DOCKER_HOST: the private engine of `make docker` when it runs, for the Docker live tests only (a
# DOCKER_HOST would make every test daemon default to the docker runtime); the engine is stopped afterwards.
# TMPDIR: the tests' temporary files in memory when there is room (scripts/test-tmpdir, docs/testing.md).
pytest:
	TMPDIR=$$(scripts/test-tmpdir) FARMHOST_TEST_DOCKER_HOST=$$(scripts/docker-engine host) $(PYTEST); status=$$?; scripts/docker-engine stop; exit $$status

pytest-fast:
	TMPDIR=$$(scripts/test-tmpdir) FARMHOST_TEST_DOCKER_HOST=$$(scripts/docker-engine host) $(PYTEST) -m "not slow"; status=$$?; \
	  scripts/docker-engine stop; exit $$status

## bench: the IPC round-trip benchmark (figures in docs/performance.md)
bench: install
	.venv/bin/python bench/ipc_roundtrip.py

## bench-attack: main's ping and the event loop's lag while other groups attack the host (docs/performance.md)
bench-attack: install
	.venv/bin/python bench/ipc_under_attack.py

## bench-sites: a farm action carried to another site over MQTT and back, beside the local one (docs/performance.md)
bench-sites: install
	.venv/bin/python bench/sites_roundtrip.py

## bench-stop: the emergency stop against the local Home Assistant, to the last guarded entity safe (docs/performance.md)
bench-stop: install
	.venv/bin/python bench/emergency_stop.py

# The IPC contract's JSON Schema, from the host's models: the docs' copy and the agent package's (its tools).
schema: install
	.venv/bin/farmhost schema -o docs/schema/ipc-v1.schema.json
	cp docs/schema/ipc-v1.schema.json container/farmagent/ipc_contract.json
	.venv/bin/farmhost schema --tools -o container/farmagent/tool_table.json

clean:
	rm -rf .venv .tools .mypy_cache .ruff_cache .pytest_cache
