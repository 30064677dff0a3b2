"""Command line: ``meshsage run | chat | check-config | doctor | status | backup | restore |
memory show | memory reindex | memory rebuild | export | import | migrate-store``.

Invariants:
- This is the only place that configures logging (stderr), sets the umask (0077: state files
  are private) and reads the process environment (with the memory tools it runs,
  ``bot.cli_memory``).
- ``run``, ``chat`` and ``check-config`` judge a config with the same ``preflight.check``; what
  ``check-config`` passes, ``run`` starts (given the same environment and terminal).
- Domain errors become one line on stderr and the error's exit code; no tracebacks for
  problems the operator can fix.
- SIGINT/SIGTERM set a stop event; the app then finishes in-flight turns and closes cleanly.
  A second SIGINT stops at once (unanswered messages are answered on the next start). In a
  terminal chat, Ctrl-C first stops the answer being written (``bot.interrupts``).
- ``chat`` logs nothing below WARNING without ``-v``, whatever ``log_level`` says (that is the
  service's; in a terminal nothing at all), piped or not: its output is the conversation.
- ``-v`` works before or after the subcommand.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from bot import __version__, cli_memory
from bot.config import Config, load_config
from bot.domain import DM_SPACE
from bot.errors import ConfigError, MeshsageError, TransportError
from bot.memory.export import FORMATS
from bot.ops import cli_ops, preflight
from bot.ops.backup import KEEP_DEFAULT

log = logging.getLogger("bot.cli")

DESCRIPTION = (
    "meshsage: an LLM chat bot for Meshtastic mesh radios and Discord, with one memory behind "
    "both. Start with `meshsage chat` in a terminal, `meshsage check-config` and `meshsage "
    "doctor` before a service, `meshsage run` as the service."
)


TARGET_HELP = (
    "judge the config for `meshsage chat` (the console alone, piped input allowed: scripts "
    "and CI) or for a service (no terminal); default: as `meshsage run` here"
)


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="debug logging"
    )
    cfg = argparse.ArgumentParser(add_help=False, parents=[common])
    cfg.add_argument("--config", help="config file (default: $MESHSAGE_CONFIG, else defaults)")
    envf = argparse.ArgumentParser(add_help=False)
    envf.add_argument(
        "--env-file",
        help="read KEY=value secrets from this file too (e.g. /etc/meshsage/env, as systemd does)",
    )
    p = argparse.ArgumentParser(prog="meshsage", description=DESCRIPTION)
    p.add_argument("--version", action="version", version=f"meshsage {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", parents=[cfg], help="run the configured transports until SIGTERM")
    run.add_argument(
        "--hold-on-config-error",
        action="store_true",
        help="on a bad config, print the fix and wait for SIGTERM instead of exiting "
        "(containers: no restart loop)",
    )
    sub.add_parser("chat", parents=[cfg], help="chat with the bot in this terminal")
    check = sub.add_parser(
        "check-config", parents=[common, envf], help="validate a config the way `run` would"
    )
    check.add_argument("file", nargs="?", help="config file (default: $MESHSAGE_CONFIG)")
    check.add_argument(
        "--service",
        action="store_true",
        help="judge it as a service would run it: no terminal (systemd, a container)",
    )
    check.add_argument("--for", dest="target", choices=preflight.TARGETS, help=TARGET_HELP)
    doctor = sub.add_parser(
        "doctor", parents=[cfg, envf], help="check config, database, LLM, radio, Discord, disk"
    )
    doctor.add_argument("--for", dest="target", choices=preflight.TARGETS, help=TARGET_HELP)
    status = sub.add_parser("status", parents=[cfg], help="what the running bot reports")
    status.add_argument("--json", action="store_true", help="print the raw status file")
    status.add_argument(
        "--watch", nargs="?", const=2.0, type=_positive_seconds, metavar="SECONDS",
        help="refresh the view every SECONDS (default 2) until Ctrl-C",
    )  # fmt: skip
    backup = sub.add_parser("backup", parents=[cfg], help="copy the database (safe while running)")
    backup.add_argument(
        "file", help="a directory (ending in /: created if missing) for dated files, or a file"
    )
    backup.add_argument(
        "--keep", type=_positive, default=KEEP_DEFAULT, metavar="N",
        help=f"into a directory: keep the newest N backups (default {KEEP_DEFAULT})",
    )  # fmt: skip
    backup.add_argument("--force", action="store_true", help="replace an existing backup file")
    backup.add_argument(
        "--missing-ok", action="store_true",
        help="no database yet (before the bot's first start) is not an error (the daily timer)",
    )  # fmt: skip
    restore = sub.add_parser("restore", parents=[cfg], help="replace the database from a backup")
    restore.add_argument("file", help="a file written by `meshsage backup`")
    mem = sub.add_parser("memory", help="inspect memory")
    mem_sub = mem.add_subparsers(dest="memory_command", required=True)
    show = mem_sub.add_parser(
        "show", parents=[cfg], help="print the context assembled for a message"
    )
    show.add_argument("person", help="person id (e.g. !1234abcd, a Discord user id, alice)")
    show.add_argument("--message", required=True, help="the new message to assemble for")
    show.add_argument("--transport", default="console")
    show.add_argument("--space", default=DM_SPACE)
    mem_sub.add_parser(
        "reindex",
        parents=[cfg],
        help="embed every message that has no vector yet (memory.embeddings)",
    )
    rebuild = mem_sub.add_parser(
        "rebuild",
        parents=[cfg],
        help="redo a person's sessions and summaries from the raw log (uses the LLM)",
    )
    rebuild.add_argument("person")
    rebuild.add_argument("--transport", default="console")
    rebuild.add_argument("--space", default=DM_SPACE)
    export = sub.add_parser("export", parents=[cfg], help="write a person's memory to stdout")
    export.add_argument("person")
    export.add_argument("--transport", default="console")
    export.add_argument("--format", choices=FORMATS, default="json")
    imp = sub.add_parser(
        "import",
        parents=[cfg],
        help="load a JSON, JSONL or Markdown export (one transaction; all or nothing)",
    )
    imp.add_argument("file")
    pins = sub.add_parser(
        "pins", parents=[cfg], help="mesh key pins (ids, fingerprints); --repin a reset radio"
    )
    pins.add_argument("--repin", metavar="NODE", help="drop NODE's pin: its next PKI DM pins it")
    pins.add_argument("--key", metavar="BASE64", help="with --repin: pin this public key instead")
    move = sub.add_parser(
        "migrate-store",
        parents=[common, envf],
        help="copy every row from one store into an empty one, and verify",
    )
    move.add_argument(
        "--from",
        dest="source",
        required=True,
        metavar="URL",
        help="sqlite:///path/to/meshsage.db or postgresql://user@host/db",
    )
    move.add_argument("--to", dest="dest", required=True, metavar="URL")
    move.add_argument(
        "--password-env",
        default="MESHSAGE_PG_PASSWORD",
        metavar="VAR",
        help="variable holding the PostgreSQL password (if it is set)",
    )
    return p


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0.2 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"must be seconds from 0.2 to 3600 (got {text!r})")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number, 1 or more (got {text!r})")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """The console entry point; output to a closed pipe (``meshsage status | head -3``) ends
    quietly instead of in a BrokenPipeError traceback."""
    try:
        code = _main(argv)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # Python flushes stdout again at exit; point it at /dev/null so that flush is silent.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 141  # 128 + SIGPIPE, what a shell reports for a writer cut off by `head`


def _main(argv: Sequence[str] | None) -> int:
    args = _parser().parse_args(argv)
    os.umask(0o077)
    try:
        env = dict(os.environ)
        if getattr(args, "env_file", None):
            env.update(read_env_file(Path(args.env_file)))
        if args.command == "check-config":
            return _check_config(args, env)
        if args.command == "doctor":
            from bot.ops.doctor import run_doctor

            return asyncio.run(
                run_doctor(
                    config_path=args.config, env=env, out=print,
                    interactive=args.target != "service" and _isatty(sys.stdin),
                    chat=args.target == "chat",
                )
            )  # fmt: skip
        if args.command == "migrate-store":
            _setup_logging("DEBUG" if args.verbose else "WARNING")
            return asyncio.run(cli_memory.migrate_store(args, env))
        config = load_config(args.config, env=env)
        interactive = _isatty(sys.stdin)
        if args.command in ("run", "chat"):
            only = ["console"] if args.command == "chat" else None
            preflight.check(
                config, env=env, interactive=interactive, only=only,
                scripted_console=args.command == "chat",
            )  # fmt: skip
            names = only or config.enabled_transports()
            quiet = interactive and "console" in names and not args.verbose
            level = config.log_level
            if args.command == "chat" and level in ("DEBUG", "INFO"):
                level = "WARNING"  # the conversation is the output; -v shows the rest
            _setup_logging("DEBUG" if args.verbose else level, quiet=quiet)
            return _serve_locked(config, env=env, only=only, console=interactive)
        _setup_logging("DEBUG" if args.verbose else config.log_level)
        if args.command == "status" and args.watch is not None:
            from bot.ops.status import find
            from bot.ops.watch import watch

            path = find(config.database_path.parent, env)
            return watch(path, interval=args.watch, out=sys.stdout, tty=_isatty(sys.stdout))
        if args.command == "status":
            return cli_ops.status(config, as_json=args.json, env=env)
        if args.command == "backup":
            return cli_ops.backup(config, args.file, env=env, keep=args.keep, force=args.force,
                                  missing_ok=args.missing_ok)  # fmt: skip
        if args.command == "restore":
            return cli_ops.restore(config, Path(args.file), env=env)
        if args.command == "memory" and args.memory_command == "reindex":
            return asyncio.run(cli_memory.memory_reindex(config, args))
        if args.command == "memory" and args.memory_command == "rebuild":
            return asyncio.run(cli_memory.memory_rebuild(config, args))
        if args.command == "export":
            return asyncio.run(cli_memory.export_person(config, args))
        if args.command == "import":
            return asyncio.run(cli_memory.import_person(config, args))
        if args.command == "pins":
            return asyncio.run(cli_memory.pins(config, args))
        if args.command == "memory":
            return asyncio.run(cli_memory.memory_show(config, args))
    except MeshsageError as exc:
        print(f"meshsage: {exc}", file=sys.stderr, flush=True)
        if isinstance(exc, ConfigError) and getattr(args, "hold_on_config_error", False):
            _hold()
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    return 2


def _hold() -> None:
    """Wait for SIGTERM/SIGINT after a config error (a container would otherwise restart-loop,
    repeating the message until it scrolls away)."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: sys.exit(ConfigError.exit_code))
    print(
        "meshsage: waiting; fix the config, then restart the container (docker restart ...)",
        file=sys.stderr,
        flush=True,
    )
    while True:
        signal.pause()


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=value lines as systemd's EnvironmentFile= reads them (comments, optional quotes)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            f"{path}: cannot read the environment file ({exc.strerror}). Fix: run as a user "
            "that can read it (e.g. sudo), or leave out --env-file."
        ) from None
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")) or "=" not in line:
            continue
        key, _, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key.strip().removeprefix("export ").strip()] = value
    return out


def _check_config(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    path = args.file or env.get("MESHSAGE_CONFIG") or None
    config = load_config(path, env=env)
    service = args.service or args.target == "service"
    chat = args.target == "chat"
    interactive = not service and _isatty(sys.stdin)
    preflight.check(config, env=env, interactive=interactive, **preflight.for_chat(chat))
    from bot.identity import risks

    for risk in risks(config):  # not problems: the bot runs, the operator is told
        print(f"warning: {risk}", file=sys.stderr)
    print(f"{config.source}: OK ({preflight.describe(config, chat=chat)})")
    return 0


def _isatty(stream: object) -> bool:
    try:
        return bool(stream.isatty())  # type: ignore[attr-defined]
    except (AttributeError, ValueError, OSError):
        return False


def _setup_logging(level: str, *, quiet: bool = False) -> None:
    if quiet:  # a person chatting in the terminal sees answers (and apologies), no log lines
        level = "CRITICAL"
    logging.basicConfig(
        level=level,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("httpx", "httpx2", "openai", "aiosqlite", "discord", "meshtastic", "meshcore"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))


def _serve_locked(
    config: Config, *, env: Mapping[str, str], only: list[str] | None, console: bool
) -> int:
    from bot.ops.backup import RunLock

    with RunLock(config.database_path.parent):
        return asyncio.run(_serve(config, env=env, only=only, console=console))


async def _serve(
    config: Config, *, env: Mapping[str, str], only: list[str] | None, console: bool
) -> int:
    from bot.app import build

    started = time.monotonic()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # Opening (and migrating) the database can take longer than WatchdogSec on an SD card:
    # keep systemd's watchdog fed while the event loop runs; TimeoutStartSec bounds a stuck start.
    keepalive = asyncio.create_task(_starting_pings(env))
    from bot.ops.probe import warn_if_unreachable

    # The LLM is probed at start (server down, base_url without /v1, model not pulled): a
    # terminal chat prints the line, a service logs it. Neither waits for it.
    def say(line: str) -> None:
        log.warning("%s", line.removeprefix("meshsage: "))

    if console and "console" in (only or config.enabled_transports()):
        say = functools.partial(print, file=sys.stderr, flush=True)
    probe = asyncio.create_task(
        warn_if_unreachable(config.llm.base_url, say, model=config.llm.model)
    )
    try:
        app = await build(config, env=env, only=only)
        from bot.identity import risks

        for risk in risks(config) if only is None else ():
            log.warning("%s", risk)
    except BaseException:
        probe.cancel()
        raise
    finally:
        keepalive.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await keepalive
    from bot.interrupts import Interrupts
    from bot.transports.console import ConsoleTransport

    keys = next((t for t in app.transports if isinstance(t, ConsoleTransport)), None)
    if only == ["console"]:  # a chat: its few words about the exit go where the person looks
        app.say = functools.partial(print, file=sys.stderr, flush=True)
    interrupts = Interrupts(
        stop=stop, responder=app.responder, hurry=app.hurry, tty=console,
        say=functools.partial(print, file=sys.stderr, flush=True),
        console=keys if console else None,
    )  # fmt: skip
    loop.add_signal_handler(signal.SIGINT, interrupts)
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    log.info(
        "meshsage %s: model %s at %s, %s",
        __version__,
        config.llm.model,
        config.llm.base_url,
        preflight.describe_store(config),
    )
    ended = await app.run(stop)
    probe.cancel()
    if interrupts.hurried.is_set():
        return 130
    names = [t.name for t in app.transports]
    log.info("ran for %.1f s", time.monotonic() - started)
    if ended and "console" not in names:
        raise TransportError(
            f"every transport stopped by itself ({', '.join(names)}); see the errors above. "
            "Fix: correct what they name, then start again (systemd restarts the service)."
        )
    return 0


async def _starting_pings(env: Mapping[str, str]) -> None:
    from bot.ops.sdnotify import Notifier

    notifier = Notifier(env=env)
    if notifier.watchdog_interval is None:
        notifier.close()
        return
    try:
        notifier.status("starting: opening the database (a migration may take a while)")
        while True:
            notifier.watchdog()
            await asyncio.sleep(notifier.watchdog_interval / 3)
    finally:
        notifier.close()


if __name__ == "__main__":
    raise SystemExit(main())
