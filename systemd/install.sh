#!/usr/bin/env bash
# Install or upgrade meshsage as a systemd service from this checkout. Run as root:
#   sudo systemd/install.sh
# Idempotent: re-run it after "git pull" to upgrade. It never overwrites /etc/meshsage/config.yaml
# or /etc/meshsage/env, and it does not start or restart the service (it tells you how).
set -euo pipefail

SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PREFIX=/opt/meshsage
VENV=$PREFIX/.venv
ETC=/etc/meshsage
UNIT=/etc/systemd/system/meshsage.service
PYTHON=${PYTHON:-python3}

say() { printf 'meshsage-install: %s\n' "$*"; }

if [ "$(id -u)" -ne 0 ]; then
    say "run as root: sudo $0" >&2
    exit 1
fi
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    say "$PYTHON is older than 3.11; install python3 (>= 3.11) and python3-venv, or set PYTHON=" >&2
    exit 1
fi

if id -u meshsage >/dev/null 2>&1; then
    say "user meshsage exists"
else
    say "creating system user meshsage (home /var/lib/meshsage, no login shell)"
    useradd --system --user-group --home-dir /var/lib/meshsage --no-create-home \
        --shell /usr/sbin/nologin meshsage
fi

if [ ! -x "$VENV/bin/python" ]; then
    say "creating virtualenv $VENV"
    install -d -m 0755 "$PREFIX"
    "$PYTHON" -m venv "$VENV"
fi
say "installing meshsage[all] from $SRC into $VENV"
"$VENV/bin/pip" install --quiet --upgrade pip
"$VENV/bin/pip" install --quiet --upgrade "${SRC}[all]"

say "ensuring $ETC (root:meshsage 0750)"
install -d -m 0750 -o root -g meshsage "$ETC"
if [ -e "$ETC/config.yaml" ]; then
    say "keeping existing $ETC/config.yaml"
elif [ -f "$SRC/config.example.yaml" ]; then
    say "copying config.example.yaml to $ETC/config.yaml: edit it before starting"
    install -m 0640 -o root -g meshsage "$SRC/config.example.yaml" "$ETC/config.yaml"
else
    say "no config.example.yaml in $SRC: write $ETC/config.yaml yourself before starting" >&2
fi
if [ -e "$ETC/env" ]; then
    say "keeping existing $ETC/env"
else
    say "creating $ETC/env (0640) for secrets"
    install -m 0640 -o root -g meshsage /dev/null "$ETC/env"
    printf '%s\n' '# Secrets for meshsage, read by systemd (EnvironmentFile). KEY=value, no quotes needed.' \
        '#DISCORD_TOKEN=' '#OPENAI_API_KEY=' >"$ETC/env"
fi

say "installing $UNIT and enabling it"
install -m 0644 "$SRC/systemd/meshsage.service" "$UNIT"
systemctl daemon-reload
systemctl enable meshsage.service

"$VENV/bin/meshsage" --version
if [ -e "$ETC/config.yaml" ]; then
    "$VENV/bin/meshsage" check-config "$ETC/config.yaml" || say "fix the config, then start the service" >&2
fi
if systemctl is-active --quiet meshsage.service; then
    say "done. The running service still has the old code: sudo systemctl restart meshsage"
else
    say "done. Start it with: sudo systemctl start meshsage; logs: journalctl -u meshsage -f"
fi
