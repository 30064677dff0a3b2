# syntax=docker/dockerfile:1
# meshsage container image. Multi-arch: the Python base image is published for linux/amd64 and
# linux/arm64 (64-bit Raspberry Pi OS), so one command builds both:
#   docker buildx build --platform linux/amd64,linux/arm64 -t meshsage .
# No compilers are installed: every dependency ships wheels for those two platforms. 32-bit
# arm/v7 is not supported (tiktoken, regex and numpy publish no wheels for it; see README).
#
# Run (see docs/operations.md and docker-compose.example.yml):
#   docker run -d --name meshsage --stop-timeout 45 \
#     -v meshsage-data:/data -v "$PWD/config:/config:ro" --env-file meshsage.env \
#     --device /dev/serial/by-id/usb-...:/dev/ttyUSB0 meshsage
# Stop grace: the bot drains in-flight replies for up to 30 s on SIGTERM, and Docker's default
# stop timeout is 10 s, so pass --stop-timeout 45 (compose: stop_grace_period: 45s).
#
# Base image pinned to a Python patch release and a Debian release, so a rebuild gets the same
# interpreter; bump it deliberately (and rebuild to pick up Debian security updates).
FROM python:3.11.14-slim-bookworm

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Non-root user; dialout (gid 20 here and on Debian/Pi OS hosts) owns the serial radio passed
# in with --device.
RUN useradd --system --uid 10001 --user-group --groups dialout \
        --home-dir /data --no-create-home --shell /usr/sbin/nologin meshsage \
    && install -d -o meshsage -g meshsage -m 0700 /data \
    && install -d -m 0755 /config

WORKDIR /src
# Dependencies in their own layer: it depends on pyproject.toml and constraints.txt only, so a
# code change rebuilds in seconds instead of downloading every dependency again. An empty
# package stands in for bot/ while the dependencies install. EXTRAS=all adds numpy
# (memory.embeddings).
ARG EXTRAS=meshtastic,discord
COPY pyproject.toml constraints.txt README.md* ./
RUN mkdir bot && touch bot/__init__.py \
    && pip install "setuptools>=68" \
    && pip install -c constraints.txt ".[${EXTRAS}]" \
    && pip uninstall --yes meshsage \
    && rm -rf bot build ./*.egg-info

# The code layer: no dependency resolution, nothing downloaded (setuptools is installed).
COPY bot ./bot
RUN pip install --no-deps --no-build-isolation . && meshsage --version

# RUNTIME_DIRECTORY: where the bot keeps its status file (rewritten twice a minute idle), as
# systemd's RuntimeDirectory= does: /dev/shm is a tmpfs in every container, so the status
# costs the SD card under /data nothing; `meshsage status` (the HEALTHCHECK) reads it there.
ENV MESHSAGE_STATE_DIR=/data \
    MESHSAGE_CONFIG=/config/config.yaml \
    RUNTIME_DIRECTORY=/dev/shm/meshsage
VOLUME /data
WORKDIR /data
USER meshsage
STOPSIGNAL SIGTERM
# Healthy = the bot rewrote its status file in the last minute (it does at least every 30 s), reports every loop healthy (a
# hung bot stops rewriting it) and serves people: a stopped or restarting transport (a refused
# Discord token) or an LLM outage is unhealthy, the cause and fix in `meshsage status`.
# start-period covers startup and a migration.
HEALTHCHECK --interval=30s --timeout=10s --start-period=120s --retries=3 \
    CMD ["meshsage", "status"]
ENTRYPOINT ["meshsage"]
# --hold-on-config-error: a missing or invalid config prints its fix once and then waits for
# `docker stop` instead of exiting, so the restart policy does not loop on it.
CMD ["run", "--hold-on-config-error"]
