#!/usr/bin/env bash
# Install or upgrade meshsage as a systemd service from this checkout. Run as root:
#   sudo systemd/install.sh                       (asks which radio / Discord / LLM)
#   sudo systemd/install.sh --serial /dev/serial/by-id/usb-... [--discord] [--model NAME]
#   sudo systemd/install.sh --tcp 192.168.1.50 --llm-url http://gpu-box:11434/v1 --yes
#   sudo systemd/install.sh --meshcore-serial /dev/serial/by-id/usb-...   (a MeshCore companion)
# Idempotent: re-run it after "git pull" to upgrade. It never overwrites /etc/meshsage/config.yaml
# (a re-run with other flags shows the difference and keeps it) or a token already in
# /etc/meshsage/env, repairs a half-made virtualenv, checks the options before it installs
# anything, validates the config with the same check `meshsage run` applies (as the service
# user, without a terminal) before it enables anything, installs a daily backup timer
# (--no-backup-timer skips it), and does not start or restart the service (it tells you how).
# MESHSAGE_ROOT=DIR installs into DIR and touches nothing outside it (systemctl calls are only
# recorded in DIR/systemctl.log). Details: docs/operations.md.
set -euo pipefail

SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# MESHSAGE_ROOT installs into a throwaway tree (tests): no root needed, no user, no chown.
ROOT=${MESHSAGE_ROOT:-}
PREFIX=$ROOT/opt/meshsage
VENV=$PREFIX/.venv
ETC=$ROOT/etc/meshsage
STATE=$ROOT/var/lib/meshsage
UNITS=$ROOT/etc/systemd/system
UNIT=$UNITS/meshsage.service
BACKUPS=$STATE/backups
SERIAL_DIR=${MESHSAGE_SERIAL_DIR:-/dev/serial/by-id}
PYTHON=${PYTHON:-python3}
EXTRAS=${EXTRAS:-meshtastic,discord}

say() { printf 'meshsage-install: %s\n' "$*"; }
die() {
    printf 'meshsage-install: %s\n' "$*" >&2
    exit 1
}

usage() {
    cat <<'EOF'
Usage: sudo systemd/install.sh [options]
  --serial DEVICE     Meshtastic radio on USB (use its /dev/serial/by-id/... path)
  --tcp HOST[:PORT]   Meshtastic node over WiFi/Ethernet, or meshtasticd
  --meshcore-serial DEVICE
                      MeshCore companion radio on USB (docs/meshcore.md)
  --meshcore-tcp HOST[:PORT]
                      MeshCore WiFi companion (port 5000 unless given)
  --discord           enable Discord (token from $DISCORD_TOKEN or asked; see docs/discord.md)
  --llm-url URL       OpenAI-compatible server (default http://localhost:11434/v1, Ollama)
  --model NAME        model name on that server (default llama3.2:3b)
  --postgres          also install asyncpg (storage.url: postgresql://...; docs/postgresql.md)
  --web               serve the web view and /metrics on 127.0.0.1:8470 (this machine only)
  --web-lan           serve them on every address, guarded by a token that is generated into
                      /etc/meshsage/env (MESHSAGE_WEB_TOKEN); docs/operations.md "Web view"
  --no-backup-timer   do not install the daily backup timer (meshsage-backup.timer)
  --yes               ask nothing; fail when something needed is missing
  --interactive       ask even when stdin is not a terminal
Without --serial, --tcp, --meshcore-* or --discord (and with a terminal), it asks. An existing
/etc/meshsage/config.yaml is kept and only validated.
Dry run: MESHSAGE_ROOT=DIR systemd/install.sh [options] installs into DIR only (no root
needed, no user created, no chown; systemctl calls are recorded in DIR/systemctl.log), e.g.
  MESHSAGE_ROOT=/tmp/meshsage-try systemd/install.sh --tcp 192.168.1.50 --yes
EOF
}

SERIAL="" TCP="" MC_SERIAL="" MC_TCP="" DISCORD=no LLM_URL="http://localhost:11434/v1" MODEL="llama3.2:3b" ASK=auto
TIMER=yes FLAGS=no WEB=no
while [ $# -gt 0 ]; do
    case "$1" in
    --serial) SERIAL=${2:?--serial needs a device path}; FLAGS=yes; shift 2 ;;
    --tcp) TCP=${2:?--tcp needs a host}; FLAGS=yes; shift 2 ;;
    --meshcore-serial) MC_SERIAL=${2:?--meshcore-serial needs a device path}; FLAGS=yes; shift 2 ;;
    --meshcore-tcp) MC_TCP=${2:?--meshcore-tcp needs a host}; FLAGS=yes; shift 2 ;;
    --discord) DISCORD=yes; FLAGS=yes; shift ;;
    --llm-url) LLM_URL=${2:?--llm-url needs a URL}; FLAGS=yes; shift 2 ;;
    --model) MODEL=${2:?--model needs a name}; FLAGS=yes; shift 2 ;;
    --postgres) EXTRAS="$EXTRAS,postgres"; shift ;;
    --web) WEB=local; FLAGS=yes; shift ;;
    --web-lan) WEB=lan; FLAGS=yes; shift ;;
    --no-backup-timer) TIMER=no; shift ;;
    --yes) ASK=no; shift ;;
    --interactive) ASK=yes; shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown option: $1" ;;
    esac
done
if [ "$ASK" = auto ]; then
    if [ -t 0 ] && [ -z "$SERIAL$TCP$MC_SERIAL$MC_TCP" ] && [ "$DISCORD" = no ]; then ASK=yes; else ASK=no; fi
fi

if [ -z "$ROOT" ] && [ "$(id -u)" -ne 0 ]; then
    die "run as root: sudo $0 $*"
fi

# --- choose transports (only when there is no config yet) ------------------------------------
ask() { # ask VAR "question" default
    local answer
    printf '%s ' "$2" >&2
    IFS= read -r answer || answer=""
    printf -v "$1" '%s' "${answer:-$3}"
}

choose() {
    local devices=() choice i
    if [ -d "$SERIAL_DIR" ]; then
        for dev in "$SERIAL_DIR"/*; do [ -e "$dev" ] && devices+=("$dev"); done
    fi
    say "Which radio? (the bot answers on the mesh through it)"
    for i in "${!devices[@]}"; do printf '  %d) %s\n' "$((i + 1))" "${devices[$i]}" >&2; done
    printf '  t) a node over TCP (WiFi/Ethernet, meshtasticd)\n  n) no radio\n' >&2
    local default=n
    [ "${#devices[@]}" -eq 0 ] || default=1
    ask choice "radio [$default]:" "$default"
    case "$choice" in
    t | T) ask TCP "node address (host or host:port):" "" ;;
    n | N) ;;
    *)
        [[ "$choice" =~ ^[0-9]+$ ]] && [ "$choice" -ge 1 ] && [ "$choice" -le "${#devices[@]}" ] ||
            die "no such choice: $choice"
        SERIAL=${devices[$((choice - 1))]}
        ;;
    esac
    ask choice "Answer on Discord too? [y/N]:" "n"
    case "$choice" in y | Y | yes) DISCORD=yes ;; esac
    ask LLM_URL "LLM server URL [$LLM_URL]:" "$LLM_URL"
    ask MODEL "model [$MODEL]:" "$MODEL"
    say "Serve a web view (health, airtime, nodes heard, queues) and /metrics?"
    printf '  n) no
  l) on this machine only (127.0.0.1:8470; from elsewhere through ssh -L)
' >&2
    printf '  a) on every address, with a token (stored in %s/env)
' "$ETC" >&2
    ask choice "web view [n]:" "n"
    case "$choice" in
    l | L) WEB=local ;;
    a | A) WEB=lan ;;
    n | N) ;;
    *) die "no such choice: $choice" ;;
    esac
}

render_config() { # the config these options make, on stdout
    {
        printf '# Written by systemd/install.sh. Every key: config.example.yaml;\n'
        printf '# check it with: meshsage check-config --service --env-file /etc/meshsage/env\n'
        printf 'llm:\n  base_url: %s\n  model: "%s"\n' "$LLM_URL" "$MODEL"
        if [ -n "$SERIAL" ]; then
            printf 'meshtastic:\n  connection: serial\n  device: %s\n' "$SERIAL"
        elif [ -n "$TCP" ]; then
            printf 'meshtastic:\n  connection: tcp\n  host: %s\n' "${TCP%%:*}"
            [ "$TCP" = "${TCP#*:}" ] || printf '  port: %s\n' "${TCP#*:}"
        fi
        if [ -n "$MC_SERIAL" ]; then
            printf 'meshcore:\n  connection: serial\n  device: %s\n' "$MC_SERIAL"
        elif [ -n "$MC_TCP" ]; then
            printf 'meshcore:\n  connection: tcp\n  host: %s\n' "${MC_TCP%%:*}"
            [ "$MC_TCP" = "${MC_TCP#*:}" ] || printf '  port: %s\n' "${MC_TCP#*:}"
        fi
        if [ "$DISCORD" = yes ]; then
            printf 'discord:\n  # token: DISCORD_TOKEN in /etc/meshsage/env (docs/discord.md)\n  dms: true\n'
        fi
        if [ "$WEB" = local ]; then
            printf 'web:\n  enabled: true  # http://127.0.0.1:8470/ (elsewhere: ssh -L 8470:127.0.0.1:8470 HOST)\n'
        elif [ "$WEB" = lan ]; then
            printf 'web:\n  enabled: true\n  bind: 0.0.0.0\n  token_env: MESHSAGE_WEB_TOKEN  # in /etc/meshsage/env\n'
        fi
    }
}

svc() { # systemctl, or in a test root only a line in its log (nothing outside the root)
    if [ -n "$ROOT" ]; then
        echo "systemctl $*" >>"$ROOT/systemctl.log"
        [ "$1" != is-active ] || return 3
        return 0
    fi
    systemctl "$@"
}

# --- the options, checked before anything is installed ----------------------------------------
check_options() {
    [ -z "$SERIAL" ] || [ -z "$TCP" ] || die "choose one radio: --serial or --tcp, not both"
    [ -z "$MC_SERIAL" ] || [ -z "$MC_TCP" ] ||
        die "choose one MeshCore companion: --meshcore-serial or --meshcore-tcp, not both"
    if [ -n "$MC_SERIAL$MC_TCP" ]; then
        case ",$EXTRAS," in *,meshcore,*) ;; *) EXTRAS="$EXTRAS,meshcore" ;; esac
    fi
    case "$LLM_URL" in
    http://?* | https://?*) ;;
    *) die "--llm-url must start with http:// or https:// (got '$LLM_URL'), e.g. http://localhost:11434/v1" ;;
    esac
    if [ -n "$MC_SERIAL" ] && [ ! -e "$MC_SERIAL" ]; then
        say "warning: $MC_SERIAL does not exist now (companion unplugged?); the bot retries until it appears"
    fi
    if [ -n "$SERIAL" ] && [ ! -e "$SERIAL" ]; then
        say "warning: $SERIAL does not exist now (radio unplugged?); the bot retries until it appears"
    fi
    [ -e "$ETC/config.yaml" ] && return 0
    if [ -z "$SERIAL$TCP$MC_SERIAL$MC_TCP" ] && [ "$DISCORD" = no ]; then
        die "choose at least one transport: --serial DEVICE, --tcp HOST, --meshcore-serial DEVICE, --meshcore-tcp HOST or --discord (a service has no terminal for the console; for a terminal chat run: meshsage chat)"
    fi
    if [ "$DISCORD" = yes ] && [ -z "${DISCORD_TOKEN:-}" ] && [ "$ASK" != yes ] &&
        ! grep -qs '^DISCORD_TOKEN=.' "$ETC/env"; then
        die "--discord needs the bot token, and DISCORD_TOKEN is not set: run again with DISCORD_TOKEN=... in the environment (sudo DISCORD_TOKEN=... $0 ...), or put DISCORD_TOKEN=... in $ETC/env first (docs/discord.md). Nothing was installed."
    fi
}
if [ ! -e "$ETC/config.yaml" ] && [ "$ASK" = yes ]; then
    choose
fi
check_options
[ "$WEB" = no ] || EXTRAS="$EXTRAS,web"

# --- Python and venv support first: a half-made venv is what a missing python3-venv leaves ---
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    die "$PYTHON is missing or older than 3.11; install python3 (>= 3.11), or set PYTHON="
fi
if ! "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null; then
    die "$PYTHON cannot create virtualenvs (no ensurepip). Fix: sudo apt install python3-venv, then run this again."
fi
# 32-bit Raspberry Pi OS on a Pi 4/5 runs a 64-bit kernel (uname -m says aarch64) under a
# 32-bit userland, so ask the Python that will run the bot.
if ! "$PYTHON" -c 'import struct, sys; sys.exit(struct.calcsize("P") != 8)'; then
    die "a 64-bit OS is required (tiktoken, regex and numpy publish no 32-bit ARM wheels); install 64-bit Raspberry Pi OS"
fi

as_owner() { # chown/chmod only in a real install
    [ -z "$ROOT" ] || return 0
    "$@"
}

if [ -n "$ROOT" ]; then
    say "installing into $ROOT (test root: no system user, no ownership changes)"
elif id -u meshsage >/dev/null 2>&1; then
    say "user meshsage exists"
else
    say "creating system user meshsage (home /var/lib/meshsage, no login shell)"
    useradd --system --user-group --home-dir /var/lib/meshsage --no-create-home \
        --shell /usr/sbin/nologin meshsage
fi

venv_ok() {
    [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import sys' 2>/dev/null &&
        "$VENV/bin/python" -m pip --version >/dev/null 2>&1
}
if [ -e "$VENV" ] && ! venv_ok; then
    say "repairing the half-made virtualenv $VENV (removing it and creating it again)"
    rm -rf "$VENV"
fi
if [ ! -e "$VENV" ]; then
    say "creating virtualenv $VENV"
    install -d -m 0755 "$PREFIX"
    if ! "$PYTHON" -m venv "$VENV" || ! venv_ok; then
        rm -rf "$VENV"
        die "creating the virtualenv failed. Fix: sudo apt install python3-venv, then run this again."
    fi
fi
say "installing meshsage[$EXTRAS] from $SRC into $VENV (versions pinned by constraints.txt)"
"$VENV/bin/pip" install --quiet --upgrade pip
"$VENV/bin/pip" install --quiet --upgrade -c "$SRC/constraints.txt" "${SRC}[${EXTRAS}]"

say "ensuring $ETC (root:meshsage 0750) and $STATE (meshsage 0700)"
install -d -m 0750 "$ETC"
as_owner chown root:meshsage "$ETC"
install -d -m 0700 "$STATE"
as_owner chown meshsage:meshsage "$STATE"

NEW_CONFIG=""
if [ -e "$ETC/config.yaml" ]; then
    say "keeping existing $ETC/config.yaml (validated below)"
    if [ "$FLAGS" = yes ]; then
        candidate=$(mktemp)
        render_config >"$candidate"
        if diff -q "$ETC/config.yaml" "$candidate" >/dev/null; then
            rm -f "$candidate"
        else
            say "your options differ from it; it is kept as it is. The difference (- kept, + options):"
            diff -u --label "$ETC/config.yaml (kept)" --label "from these options" \
                "$ETC/config.yaml" "$candidate" || true
            say "to use the options instead: sudo mv $ETC/config.yaml $ETC/config.yaml.old, then run this again"
            rm -f "$candidate"
        fi
    fi
else
    # Written next to its final name and moved there only once it validates (below).
    NEW_CONFIG=$ETC/.config.yaml.new
    say "writing $ETC/config.yaml (moved into place once it validates)"
    render_config >"$NEW_CONFIG"
    chmod 0640 "$NEW_CONFIG"
    as_owner chown root:meshsage "$NEW_CONFIG"
fi
CONFIG=${NEW_CONFIG:-$ETC/config.yaml}

if [ ! -e "$ETC/env" ]; then
    say "creating $ETC/env (0640) for secrets"
    install -m 0640 /dev/null "$ETC/env"
    printf '%s\n' '# Secrets for meshsage, read by systemd (EnvironmentFile). KEY=value, no quotes needed.' \
        '#DISCORD_TOKEN=' '# only for a hosted LLM API; a local server (Ollama, llama.cpp) needs no key:' \
        '#OPENAI_API_KEY=' >"$ETC/env"
    as_owner chown root:meshsage "$ETC/env"
fi
if [ "$DISCORD" = yes ] && ! grep -q '^DISCORD_TOKEN=.' "$ETC/env"; then
    token=${DISCORD_TOKEN:-}
    if [ -z "$token" ] && [ "$ASK" = yes ]; then
        printf 'Discord bot token (input hidden; Developer Portal -> Bot -> Reset Token): ' >&2
        IFS= read -rs token || token=""
        printf '\n' >&2
    fi
    if [ -n "$token" ]; then
        printf 'DISCORD_TOKEN=%s\n' "$token" >>"$ETC/env"
        say "stored the Discord token in $ETC/env"
    fi
fi

if [ "$WEB" = lan ] && ! grep -q '^MESHSAGE_WEB_TOKEN=.' "$ETC/env"; then
    printf 'MESHSAGE_WEB_TOKEN=%s\n' "$("$PYTHON" -c 'import secrets; print(secrets.token_hex(24))')" >>"$ETC/env"
    say "stored a new web view token in $ETC/env (see it: sudo grep MESHSAGE_WEB_TOKEN $ETC/env)"
fi

# `meshsage status`, `meshsage doctor`, `meshsage backup FILE` for the operator, pointed at the
# service's config and state dir (run them as the service user: sudo -u meshsage meshsage ...).
BIN=$ROOT/usr/local/bin/meshsage
install -d -m 0755 "$(dirname "$BIN")"
# shellcheck disable=SC2016  # the wrapper expands these when it runs, not now
printf '%s\n' '#!/bin/sh' \
    "# Installed by meshsage's systemd/install.sh: the service's config and state by default." \
    ': "${MESHSAGE_CONFIG:=/etc/meshsage/config.yaml}"' \
    ': "${MESHSAGE_STATE_DIR:=/var/lib/meshsage}"' \
    'export MESHSAGE_CONFIG MESHSAGE_STATE_DIR' \
    "exec $VENV/bin/meshsage \"\$@\"" >"$BIN"
chmod 0755 "$BIN"
"$VENV/bin/meshsage" --version
# The same check `meshsage run` applies, as the service will run it: its user, its
# environment file, no terminal.
check=("$VENV/bin/meshsage" check-config --service --env-file "$ETC/env" "$CONFIG")
if [ -z "$ROOT" ] && command -v runuser >/dev/null 2>&1; then
    check=(runuser -u meshsage -- env MESHSAGE_STATE_DIR="$STATE" "${check[@]}")
else
    check=(env MESHSAGE_STATE_DIR="$STATE" "${check[@]}")
fi
if ! "${check[@]}" </dev/null; then
    [ -z "$NEW_CONFIG" ] || rm -f "$NEW_CONFIG"
    die "the config above would not run, so nothing was enabled. Fix $ETC/config.yaml (or $ETC/env; or the options) as the message says, then run this again."
fi
[ -z "$NEW_CONFIG" ] || mv "$NEW_CONFIG" "$ETC/config.yaml"

say "ensuring the backup directory $BACKUPS (meshsage 0700)"
install -d -m 0700 "$BACKUPS"
as_owner chown meshsage:meshsage "$BACKUPS"

say "installing $UNIT and enabling it"
install -d -m 0755 "$UNITS"
install -m 0644 "$SRC/systemd/meshsage.service" "$UNIT"
if [ "$TIMER" = yes ]; then
    say "installing the daily backup timer (meshsage-backup.timer: $BACKUPS/, newest 7 kept)"
    install -m 0644 "$SRC/systemd/meshsage-backup.service" "$UNITS/meshsage-backup.service"
    install -m 0644 "$SRC/systemd/meshsage-backup.timer" "$UNITS/meshsage-backup.timer"
fi
svc daemon-reload
svc enable meshsage.service
if [ "$TIMER" = yes ]; then
    svc enable --now meshsage-backup.timer
fi
if svc is-active --quiet meshsage.service; then
    say "done. The running service still has the old code: sudo systemctl restart meshsage"
else
    say "done. Start it with: sudo systemctl start meshsage"
    say "then: sudo -u meshsage meshsage status; journalctl -u meshsage -f (docs/operations.md)"
fi
