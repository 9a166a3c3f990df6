# The farmhost image: the daemon with its locked dependencies, the docker CLI that starts agent containers on
# the host's engine, Chromium for dashboard screenshots. Nothing in it is specific to one CPU architecture:
#
#   docker build -t farmhost .                                                  (from the repository root)
#   docker buildx build --platform linux/arm64,linux/amd64 -t farmhost .
#   docker build --build-arg CHROMIUM=0 -t farmhost .                           (no screenshots, ~250 MB smaller)
#
# docker-compose.yml builds and runs it; docs/deployment.md explains the mounts. Inside a container the agent
# runtime is `docker` through the host's socket: bubblewrap cannot make its namespaces under Docker's default
# seccomp profile, so it is not installed here. Only the classic builder's features are used (no RUN --mount),
# so Debian's docker.io 20.10 and docker-compose 1.29 build it as well as BuildKit does.
#
# The two images it starts from are build arguments, the official ones unless told: any Debian bookworm with
# Python 3.11 and its venv module (PYTHON: that interpreter's path; Debian's own is /usr/bin/python3.11), and any
# image holding the static docker CLI at /usr/local/bin/docker. The tests build it on the debootstrap-made
# farmhost-base:bookworm and a CLI image of the machine's own client (scripts/docker-images), where no registry
# can be pulled from. A machine whose registries present a CA of its own passes its bundle as PIP_CERT and
# SSL_CERT_FILE (uv reads the latter; both unset by default).
ARG BASE_IMAGE=python:3.11-slim-bookworm
ARG DOCKER_CLI_IMAGE=docker:28.2.2-cli
ARG PYTHON=/usr/local/bin/python3.11

# The docker CLI only (a static binary); the engine is the host's, reached through the mounted socket.
FROM ${DOCKER_CLI_IMAGE} AS docker-cli

FROM ${BASE_IMAGE} AS build
ARG PYTHON
ARG PIP_CERT
ARG SSL_CERT_FILE

# The uv the Makefile pins (tests/deploy/test_dockerfiles.py keeps the two equal), then `uv sync --frozen`:
# exactly the versions of uv.lock, wheels only for every platform the lock lists (tests/deploy/test_arm64_wheels.py).
ARG UV_VERSION=0.13.9
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    UV_NO_CACHE=1 \
    UV_PYTHON_DOWNLOADS=never \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PROJECT_ENVIRONMENT=/app/.venv
# In a venv of its own: Debian's python3 refuses a system-wide pip install (PEP 668); the venv stays in this stage.
RUN "$PYTHON" -m venv /opt/uv \
    && /opt/uv/bin/pip install "uv==${UV_VERSION}" \
    && ln -s /opt/uv/bin/uv /usr/local/bin/uv

# Voice notes transcribed on the farm (docs/voice.md): the `voice` extra, faster-whisper with CTranslate2, ONNX
# Runtime and PyAV (wheels for amd64 and arm64; ~300 MB more in the image, docs/deployment.md). VOICE=0 leaves it
# out: voice notes are then kept in inbox/ untranscribed.
ARG VOICE=1

WORKDIR /app
# Dependencies first (a layer that survives edits of farmhost's own code), then the two workspace members.
COPY pyproject.toml uv.lock README.md LICENSE hatch_build.py ./
COPY container/pyproject.toml container/
RUN if [ "$VOICE" = "1" ]; then set -- --extra voice; fi \
    && uv sync --frozen --no-dev "$@" --no-install-workspace --python "$PYTHON"
COPY farmhost farmhost
COPY container/farmagent container/farmagent
# The starting dashboards and the global memory are seeded from the source tree (farmhost/layout.py: shipped_dir;
# a wheel carries them as package data), so farmhost stays an editable install of /app, as in a checkout.
COPY dashboards dashboards
COPY memory memory
RUN if [ "$VOICE" = "1" ]; then set -- --extra voice; fi \
    && uv sync --frozen --no-dev "$@" --python "$PYTHON" \
    && /app/.venv/bin/python -m compileall -q farmhost container/farmagent

FROM ${BASE_IMAGE}

LABEL org.opencontainers.image.title="farmhost" \
      org.opencontainers.image.description="Farm-agent appliance host: sandboxed agents talk to Home Assistant, memory and Telegram through IPC files" \
      org.opencontainers.image.licenses="GPL-3.0-or-later" \
      org.opencontainers.image.documentation="docs/deployment.md"

# tini reaps what Chromium leaves behind and forwards SIGTERM; Chromium and fonts for ha_capture_screenshot.
ARG CHROMIUM=1
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini ca-certificates tzdata \
    && if [ "$CHROMIUM" = "1" ]; then apt-get install -y --no-install-recommends chromium fonts-dejavu-core; fi \
    && rm -rf /var/lib/apt/lists/*

# The docker CLI only, from its stage above; the engine is the host's, reached through the mounted socket.
COPY --from=docker-cli /usr/local/bin/docker /usr/local/bin/docker

# uid 1000: the first user of Raspberry Pi OS, so a data dir made by `pi` fits; compose may run it as another uid.
RUN groupadd --gid 1000 farmhost \
    && useradd --uid 1000 --gid 1000 --create-home --home-dir /home/farmhost --shell /usr/sbin/nologin farmhost \
    && install -d -o 1000 -g 1000 -m 0750 /data

COPY --from=build /app /app

# No VOLUME: agent containers are started by the host's engine with `-v <data dir>/...`, so the data dir must be a
# host bind mount at the same path inside and outside (docker-compose.yml). An anonymous volume at /data would
# make every agent mount point at an empty directory on the host.
ENV PATH=/app/.venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HOME=/home/farmhost \
    FARMHOST_DATA_DIR=/data \
    FARMHOST_AGENT_RUNTIME=docker

USER 1000:1000
WORKDIR /home/farmhost

# Unhealthy when no daemon holds the data dir's lock or the newest group heartbeat is stale (farmhost/cli/health.py).
HEALTHCHECK --interval=30s --timeout=15s --start-period=60s --retries=3 CMD ["farmhost", "health"]

ENTRYPOINT ["/usr/bin/tini", "--", "farmhost"]
CMD ["run"]
