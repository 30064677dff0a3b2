"""Command line: ``meshsage run | chat | check-config | memory show | memory reindex``.

Invariants:
- This is the only place that configures logging (stderr) and reads the process environment.
- Domain errors become one line on stderr and the error's exit code; no tracebacks for
  problems the operator can fix.
- SIGINT/SIGTERM set a stop event; the app then finishes in-flight turns and closes cleanly.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence

from bot import __version__
from bot.app import build
from bot.config import Config, load_config
from bot.domain import DM_SPACE, ConversationKey
from bot.errors import ConfigError, MeshsageError
from bot.llm.port import merge_system

log = logging.getLogger("bot.cli")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="meshsage", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"meshsage {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the configured transports until SIGINT/SIGTERM")
    run.add_argument("--config", help="config file (default: $MESHSAGE_CONFIG or defaults)")
    chat = sub.add_parser("chat", help="chat with the bot in this terminal")
    chat.add_argument("--config")
    check = sub.add_parser("check-config", help="validate a config file and exit")
    check.add_argument("file")
    mem = sub.add_parser("memory", help="inspect memory")
    mem_sub = mem.add_subparsers(dest="memory_command", required=True)
    show = mem_sub.add_parser("show", help="print the context assembled for a message")
    show.add_argument("person", help="person id (e.g. !1234abcd, a Discord user id, alice)")
    show.add_argument("--message", required=True, help="the new message to assemble for")
    show.add_argument("--transport", default="console")
    show.add_argument("--space", default=DM_SPACE)
    show.add_argument("--config")
    reindex = mem_sub.add_parser(
        "reindex", help="embed every message that has no vector yet (memory.embeddings)"
    )
    reindex.add_argument("--config")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "check-config":
            config = load_config(args.file)
            print(
                f"{args.file}: OK (transports: {', '.join(config.enabled_transports())}; "
                f"database: {config.database_path})"
            )
            return 0
        config = load_config(args.config)
        _setup_logging("DEBUG" if args.verbose else config.log_level)
        if args.command == "run":
            return asyncio.run(_serve(config, only=None))
        if args.command == "chat":
            return asyncio.run(_serve(config, only=["console"]))
        if args.command == "memory" and args.memory_command == "reindex":
            return asyncio.run(_memory_reindex(config, args))
        if args.command == "memory":
            return asyncio.run(_memory_show(config, args))
    except MeshsageError as exc:
        print(f"meshsage: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    return 2


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("httpx", "httpx2", "openai", "aiosqlite", "discord", "meshtastic"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))


async def _serve(config: Config, *, only: list[str] | None) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    app = await build(config, env=os.environ, only=only)
    log.info(
        "meshsage %s: model %s at %s, database %s",
        __version__,
        config.llm.model,
        config.llm.base_url,
        config.database_path,
    )
    await app.run(stop)
    return 0


async def _memory_show(config: Config, args: argparse.Namespace) -> int:
    """Print the messages a real turn would send now, style hint and template merge included
    (built by the same code as a reply, for a message not stored)."""
    section = getattr(config, args.transport, None) or config.console_config()
    try:  # the transport is built (never started) for its limits: budget and style hint
        app = await build(config, env=os.environ, only=[args.transport])
    except MeshsageError as exc:
        print(f"note: transport {args.transport} not built ({exc}); no style hint", file=sys.stderr)
        app = await build(config, env=os.environ, transports=[])
    limits = app.transports[0].limits if app.transports else None
    app.transports = []  # built, not started: nothing to stop
    try:
        key = ConversationKey(args.transport, args.person, args.space)
        conv = await app.store.find_conversation(key)
        if conv is None:
            print(f"no conversation for {key}", file=sys.stderr)
            return 1
        ctx = await app.context.build(
            conv,
            new_text=args.message,
            new_message_id=None,
            budget=limits.context_tokens if limits else section.context_tokens,
            style_hint=limits.style_hint if limits else "",
        )
        print(f"# context for {key}: {ctx.tokens}/{ctx.budget} tokens")
        for block in ctx.blocks:
            print(f"\n## {block.name} ({block.tokens} tokens)\n{block.text}")
        if ctx.retrieved:
            print("\n## why these older turns were retrieved")
            for m in ctx.retrieved:
                why = ctx.retrieved_reasons.get(m.id, "?")
                print(f"- message {m.id} ({m.author}): {why}")
        sent = ctx.messages if config.llm.system_role else merge_system(ctx.messages)
        print(f"\n# the {len(sent)} messages sent to {config.llm.model}")
        if app.context.recall == "notes":
            print(
                "(recall notes that earlier turns carried live in the running bot's memory; "
                "a fresh process shows those turns without them)"
            )
        for msg in sent:
            print(f"\n## {msg.role}\n{msg.content}")
        return 0
    finally:
        await app.close()  # also closes the LLM and embedding clients


async def _memory_reindex(config: Config, args: argparse.Namespace) -> int:
    if not config.memory.embeddings.enabled:
        raise ConfigError(
            f"memory.embeddings is disabled in {args.config or 'the configuration'}. Fix: set "
            "memory.embeddings.enabled: true (and pull the model, e.g. "
            f"`ollama pull {config.memory.embeddings.model}`), then run this again."
        )
    app = await build(config, env=os.environ, transports=[])
    try:
        indexer = app.indexer
        assert indexer is not None
        started = time.monotonic()
        last = started

        def progress(done: int) -> None:
            nonlocal last
            if time.monotonic() - last >= 1.0:
                last = time.monotonic()
                print(f"reindex: {done} message(s) embedded so far", file=sys.stderr)

        done = await indexer.backfill(progress=progress)
        print(
            f"reindex: {done} message(s) embedded with {indexer.model} "
            f"in {time.monotonic() - started:.1f} s; every message now has a vector",
            file=sys.stderr,
        )
        return 0
    finally:
        await app.close()


if __name__ == "__main__":
    raise SystemExit(main())
