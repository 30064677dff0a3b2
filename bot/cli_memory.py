"""The memory tools behind ``meshsage memory show | memory reindex | memory rebuild | export |
import | pins | migrate-store`` (``bot.cli`` parses the arguments and sets up logging; these
act).

Invariants:
- Every tool closes what it opened (the store, or an app built without running transports,
  which also closes the LLM and embedding clients), whatever happens.
- A transport built for ``memory show`` (its budget and style hint) is never started.
- ``import`` validates the file before the database is opened; ``export`` writes the
  document to stdout and nothing else there. Progress and summaries go to stderr.
- A conversation or person that is not there is one line on stderr and exit code 1.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from bot.config import Config
from bot.domain import ConversationKey
from bot.errors import ConfigError, MeshsageError
from bot.llm.port import merge_system
from bot.memory.export import import_document, person_document, render
from bot.memory.export_read import read_export
from bot.memory.store import SqliteStore

if TYPE_CHECKING:
    from bot.memory.postgres import PostgresStore


async def memory_show(config: Config, args: argparse.Namespace) -> int:
    """Print the messages a real turn would send now, style hint and template merge included
    (built by the same code as a reply, for a message not stored)."""
    from bot.app import build

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
        if app.context.inner.recall == "notes":
            print(
                "(recall notes are stored with their turns, so this shows them as the bot sends "
                "them; this message's own note is not saved by memory show)"
            )
        for msg in sent:
            print(f"\n## {msg.role}\n{msg.content}")
        return 0
    finally:
        await app.close()  # also closes the LLM and embedding clients


async def memory_reindex(config: Config, args: argparse.Namespace) -> int:
    from bot.app import build

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


async def open_store(config: Config) -> SqliteStore | PostgresStore:
    """The configured store: SQLite in the state dir, or ``storage.url``."""
    if config.storage.url is None:
        return await SqliteStore.open(config.database_path)
    from bot.memory.open import open_url

    return await open_url(
        config.storage.url,
        password_env=config.storage.password_env,
        env=os.environ,
        gateway=config.storage.gateway,
    )


async def migrate_store(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from bot.memory.move import bar, copy_store
    from bot.memory.open import open_url

    var = args.password_env if env.get(args.password_env) is not None else None
    source = await open_url(args.source, password_env=var, env=env)
    try:
        dest = await open_url(args.dest, password_env=var, env=env, copying=True)
        try:
            started = time.monotonic()
            counts = await copy_store(source, dest, progress=bar(sys.stderr.write))
        finally:
            await dest.close()
    finally:
        await source.close()
    print(
        f"migrate-store: copied and verified {', '.join(f'{n:,} {t}' for t, n in counts.items())}"
        f" in {time.monotonic() - started:.1f} s",
        file=sys.stderr,
    )
    return 0


async def memory_rebuild(config: Config, args: argparse.Namespace) -> int:
    from bot.app import build

    app = await build(config, env=os.environ, transports=[])
    try:
        key = ConversationKey(args.transport, args.person, args.space)
        conv = await app.store.find_conversation(key)
        if conv is None:
            print(f"no conversation for {key}", file=sys.stderr)
            return 1
        assert app.sessions is not None
        started = time.monotonic()

        def progress(done: int, total: int) -> None:
            width = 30
            filled = width * done // total if total else width
            print(f"\rrebuild: [{'#' * filled}{'.' * (width - filled)}] {done}/{total} sessions",
                  end="", file=sys.stderr, flush=True)  # fmt: skip

        done = await app.sessions.rebuild(conv.id, progress=progress)
        print(
            f"\nrebuild: {done} session summaries and the long-term summary rewritten from the "
            f"log in {time.monotonic() - started:.1f} s",
            file=sys.stderr,
        )
        return 0
    finally:
        await app.close()


async def export_person(config: Config, args: argparse.Namespace) -> int:
    store = await open_store(config)
    try:
        doc = await person_document(store, args.transport, args.person)
        if not doc["conversations"]:
            print(f"no memory for {args.transport}:{args.person}", file=sys.stderr)
            return 1
        sys.stdout.write(render(doc, args.format))
        return 0
    finally:
        await store.close()


async def pins(config: Config, args: argparse.Namespace) -> int:
    from bot.identity import pins_command

    store = await open_store(config)
    try:
        return await pins_command(store, config, repin=args.repin, key=args.key, out=print)
    finally:
        await store.close()


async def import_person(config: Config, args: argparse.Namespace) -> int:
    imported = read_export(Path(args.file))  # validated before the database is opened
    doc = imported.doc
    store = await open_store(config)
    try:
        counts = await import_document(store, doc)
    finally:
        await store.close()
    print(
        f"imported {doc['transport']}:{doc['person']}: "
        + ", ".join(f"{n} {what}" for what, n in counts.items()),
        file=sys.stderr,
    )
    for lost in imported.lost:
        print(f"not in a {imported.fmt} export, so not imported: {lost}", file=sys.stderr)
    return 0
