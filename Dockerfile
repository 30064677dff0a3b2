# syntax=docker/dockerfile:1
# meshsage container image. Multi-arch: python:3.11-slim is published for linux/amd64 and
# linux/arm64 (64-bit Raspberry Pi OS), so one command builds both:
#   docker buildx build --platform linux/amd64,linux/arm64 -t meshsage .
# No compilers are installed: every dependency ships wheels for those two platforms. 32-bit
# arm/v7 may need a toolchain for dependencies without arm/v7 wheels.
#
# Run (see docs/operations.md and docker-compose.example.yml):
#   docker run -d --name meshsage --stop-timeout 45 \
#     -v meshsage-data:/data -v "$PWD/config:/config:ro" --env-file meshsage.env \
#     --device /dev/serial/by-id/usb-...:/dev/ttyUSB0 meshsage
# Stop grace: the bot drains in-flight replies for up to 30 s on SIGTERM, and Docker's default
# stop timeout is 10 s, so pass --stop-timeout 45 (compose: stop_grace_period: 45s).
#
# No HEALTHCHECK: the bot serves no port, so the only cheap check is "the process is alive",
# which Docker already sees (it restarts it per the restart policy). Probing the LLM would be
# costly and would mark the bot unhealthy for an LLM outage it reports to users itself.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Non-root user; dialout (gid 20 here and on Debian/Pi OS hosts) owns the serial radio passed
# in with --device.
RUN useradd --system --uid 10001 --user-group --groups dialout \
        --home-dir /data --no-create-home --shell /usr/sbin/nologin meshsage \
    && install -d -o meshsage -g meshsage -m 0750 /data \
    && install -d -m 0755 /config

WORKDIR /src
# README.md is optional for the build (setuptools only warns); the wildcard copies it if present.
COPY pyproject.toml README.md* ./
COPY bot ./bot
RUN pip install ".[all]" && meshsage --version

ENV MESHSAGE_STATE_DIR=/data \
    MESHSAGE_CONFIG=/config/config.yaml
VOLUME /data
WORKDIR /data
USER meshsage
STOPSIGNAL SIGTERM
ENTRYPOINT ["meshsage"]
CMD ["run"]
