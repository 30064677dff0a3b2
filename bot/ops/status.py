"""The status file: what ``meshsage status`` and the container HEALTHCHECK read.

Invariants:
- The running bot checks its health every ``STATUS_INTERVAL`` seconds and rewrites
  ``STATUS_FILE`` only when the report changed, or ``STATUS_HEARTBEAT`` seconds after the last
  write (so a fresh report proves the bot alive: an idle bot writes twice a minute, not twelve
  times), by writing a private temporary file and renaming it over the old one (atomic: a
  reader sees the old or the new file, never half of one). Mode 0600 like every state file.
- Where: systemd's ``RuntimeDirectory=`` (``$RUNTIME_DIRECTORY``, a tmpfs: no SD-card writes)
  when it gives one; else, for a bot started by hand in a login session, ``meshsage/`` in the
  session's ``$XDG_RUNTIME_DIR`` (also a tmpfs, /run/user/<uid>) when that is a writable
  directory; else the state dir (``report_path``). ``meshsage status`` reads the newest report
  of ``$RUNTIME_DIRECTORY``, the session's runtime dir, ``/run/meshsage`` (the unit's, for an
  operator's shell) and the state dir (``find``).
- A report is *fresh* when written less than ``STALE_AFTER`` seconds ago and not dated in the
  future (more than ``FUTURE_SLACK``: the clock went back since, e.g. a dead bot's file from
  before a Pi's clock was stepped); ``status`` exits 0 only for a fresh, healthy report whose
  pid is running (``pid_running``), so a hung or dead bot fails the check whatever the clock.
- The file holds counts, states and timings only; never message text.
- ``healthy`` is false whenever people are not being served: a store or a loop that failed, a
  transport stopped, restarting or losing messages (``TransportStatus.problem``), the LLM in
  an outage (``llm_outage_since``); each is one line of ``problems`` saying what and the fix.
  ``watchdog_ok`` is the narrower test the systemd watchdog uses (store and loops): a restart
  cannot fix a refused token or a down LLM server, and would stop the transports that work.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

STATUS_FILE = "status.json"
STATUS_INTERVAL = 5.0
STALE_AFTER = 60.0
FUTURE_SLACK = 5.0  # a report dated further ahead than this was written on another clock
# Half of STALE_AFTER: a heartbeat delayed by a slow tick (up to STORE_TIMEOUT, 20 s) still
# lands before the report goes stale.
STATUS_HEARTBEAT = 30.0
RUNTIME_ENV = "RUNTIME_DIRECTORY"  # set by systemd for RuntimeDirectory=
SESSION_ENV = "XDG_RUNTIME_DIR"  # a login session's tmpfs (pam_systemd/logind)
SYSTEMD_RUNTIME_DIR = Path("/run/meshsage")  # RuntimeDirectory=meshsage in systemd/


def report_path(state_dir: Path, env: Mapping[str, str]) -> Path:
    """Where the running bot writes its report: the runtime directory systemd gave it (the
    first, if it lists several), else the login session's runtime dir (``session_dir``),
    else the state dir."""
    runtime = env.get(RUNTIME_ENV, "").split(":")[0]
    if runtime:
        return Path(runtime) / STATUS_FILE
    session = session_dir(env)
    return session / STATUS_FILE if session is not None else state_dir / STATUS_FILE


def session_dir(env: Mapping[str, str]) -> Path | None:
    """``$XDG_RUNTIME_DIR/meshsage`` when the session's runtime dir (a tmpfs that logind
    creates for each logged-in user) is a directory this user may write; else None."""
    base = env.get(SESSION_ENV, "")
    if not base or not os.path.isabs(base):
        return None
    if not (os.path.isdir(base) and os.access(base, os.W_OK | os.X_OK)):
        return None
    return Path(base) / "meshsage"


def find(
    state_dir: Path, env: Mapping[str, str], *, systemd_dir: Path = SYSTEMD_RUNTIME_DIR
) -> Path:
    """Where ``meshsage status`` reads the report: the newest of ``$RUNTIME_DIRECTORY`` (the
    bot's own environment: the HEALTHCHECK), the session's runtime dir (a bot started by hand),
    the systemd unit's runtime dir (an operator's shell) and the state dir (a report left
    behind elsewhere by a bot started another way is older); a report it may not read wins
    (the reader then says why). When none holds one, where this environment's bot would write
    it."""
    own, state = report_path(state_dir, env), state_dir / STATUS_FILE
    session = session_dir(env)
    order = [] if own == state else [own]  # on a tie, the earlier place wins
    order += [p / STATUS_FILE for p in (session,) if p is not None]
    order += [systemd_dir / STATUS_FILE, state]
    newest: tuple[float, Path] | None = None
    for candidate in dict.fromkeys(order):
        try:
            mtime = candidate.stat().st_mtime
        except PermissionError:
            return candidate
        except OSError:
            continue
        if newest is None or mtime > newest[0]:
            newest = (mtime, candidate)
    return newest[1] if newest is not None else own


@dataclass(frozen=True)
class TransportStatus:
    link: str
    ok: bool
    detail: str = ""
    outbox: int = 0
    problem: str = ""  # non-empty: not serving people (what and the fix)


@dataclass(frozen=True)
class Status:
    written_at: float
    started_at: float
    pid: int
    version: str
    healthy: bool
    problems: list[str] = field(default_factory=list)
    transports: dict[str, TransportStatus] = field(default_factory=dict)
    messages_in_today: int = 0
    messages_out_today: int = 0
    llm_calls: int = 0
    llm_failed_calls: int = 0  # since the start
    llm_outage_since: float | None = None  # first failure of the current run of failures
    llm_outage_failures: int = 0  # failed calls since then
    llm_last_failure: str = ""
    watchdog_ok: bool = True
    llm_p50_seconds: float | None = None
    llm_p95_seconds: float | None = None
    database_bytes: int = 0
    last_error_at: float | None = None
    last_error: str = ""
    relay: dict[str, int] = field(default_factory=dict)  # bridge counters (relay: pairs)
    # mesh DMs refused as not their node's (bot.identity): refused_key_changed, refused_no_pki
    identity: dict[str, int] = field(default_factory=dict)
    store: str = ""  # "SQLite /path" or "PostgreSQL postgresql://user@host/db" (no password)
    llm_limits: str = ""  # what the LLM server holds, as learned (bot.llm.server_limits)
    web: str = ""  # where the web view is served, or why it is not (``run`` only)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Status:
        data: dict[str, Any] = json.loads(text)
        data["transports"] = {
            name: TransportStatus(**t) for name, t in data.get("transports", {}).items()
        }
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` in one rename; the file is 0600 whatever the umask."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read(path: Path) -> Status:
    """Raises OSError (missing, unreadable) or ValueError (not a status file)."""
    try:
        return Status.from_json(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, TypeError, KeyError) as exc:
        raise ValueError(f"{path} is not a meshsage status file ({exc})") from None


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def _age(seconds: float) -> str:
    seconds = int(seconds)
    days, rest = divmod(seconds, 86_400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h {minutes}m"
    if hours:
        return f"{hours}h {minutes}m"
    return f"{minutes}m {secs}s"


def _clock(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def pid_running(pid: int) -> bool:
    """Whether a process ``pid`` exists (one of another user counts: it exists)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def render(
    status: Status, *, now: float | None = None, running: bool | None = None
) -> tuple[list[str], bool]:
    """Human lines and whether the bot is fresh and healthy. ``running``: whether the report's
    pid runs (None: not checked, e.g. the bot's own view of itself)."""
    now = time.time() if now is None else now
    age = now - status.written_at
    future = age < -FUTURE_SLACK
    fresh = age < STALE_AFTER and not future
    ok = fresh and status.healthy and running is not False
    state = "healthy" if ok else "NOT HEALTHY"
    if future:
        report = (
            f"  report:     dated {-age:.0f} s in the future (the clock went back since it was "
            "written: a bot that died before the clock was stepped?)"
        )
    else:
        report = f"  report:     written {round(age)} s ago" + (
            "" if fresh else f" (stale: older than {STALE_AFTER:.0f} s; is the bot running?)"
        )
    lines = [
        f"meshsage {status.version} (pid {status.pid}): {state}",
        report,
        *(
            [
                f"  process:    pid {status.pid} is not running: the bot died without removing "
                "its report. Fix: sudo systemctl restart meshsage (journalctl -u meshsage says why)"
            ]
            if running is False
            else []
        ),
        f"  uptime:     {_age(status.written_at - status.started_at)}",
    ]
    for name, t in sorted(status.transports.items()):
        extra = f", outbox {t.outbox}" if t.outbox else ""
        why = f" ({t.detail})" if t.detail else ""
        flag = "" if t.ok else " LOOP NOT OK"
        flag += " NOT SERVING" if t.problem else ""
        lines.append(f"  {name + ':':<11} {t.link}{extra}{why}{flag}")
    lines += [
        f"  today:      {status.messages_in_today} in, {status.messages_out_today} out",
        f"  LLM:        p50 {_seconds(status.llm_p50_seconds)}, p95 "
        f"{_seconds(status.llm_p95_seconds)} over the last {status.llm_calls} call(s)"
        + (f", {status.llm_failed_calls} failed" if status.llm_failed_calls else ""),
        *([f"  LLM limits: {status.llm_limits}"] if status.llm_limits else []),
        f"  database:   {status.store + ', ' if status.store else ''}"
        f"{status.database_bytes / 1e6:.1f} MB",
        *([f"  web view:   {status.web}"] if status.web else []),
    ]
    if status.llm_outage_since is not None:
        lines.append(
            f"  LLM DOWN:   since {_clock(status.llm_outage_since)}, "
            f"{status.llm_outage_failures} failed call(s) since (last: {status.llm_last_failure})"
        )
    if status.relay:
        r = status.relay
        lines.append(
            f"  relay:      {r.get('mesh_to_discord', 0)} mesh->discord, "
            f"{r.get('discord_to_mesh', 0)} discord->mesh, {r.get('cut', 0)} cut, "
            f"{r.get('refused', 0)} refused, {r.get('digests', 0)} digest(s), "
            f"reactions {r.get('reactions_to_discord', 0)} mesh->discord, "
            f"{r.get('reactions_to_mesh', 0)} discord->mesh"
        )
    if status.identity:
        i = status.identity
        lines.append(
            f"  identity:   {sum(i.values())} mesh DM(s) refused as not their node's "
            f"({i.get('refused_key_changed', 0)} with another key, "
            f"{i.get('refused_no_pki', 0)} without PKI); `meshsage pins` lists the pins"
        )
    if status.last_error_at is not None:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(status.last_error_at))
        lines.append(f"  last error: {when} {status.last_error}")
    lines += [f"  problem:    {p}" for p in status.problems]
    return lines, ok
