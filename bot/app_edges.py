"""The edges ``bot.app.build`` wires around the core: the configured transports, the relay
bridge between the mesh and Discord, and the operator's web view.

Only ``bot.app`` calls these; they build, they do not start anything (``App.start`` does).

Invariants:
- Adapter modules (console, Meshtastic, Discord, the web view) are imported only when their
  part is built, so a section left out costs nothing and needs no optional dependency; a
  missing discord.py is a ``MeshsageError`` that names the package to install.
- The relay needs both the meshtastic and the discord transports; otherwise it refuses to
  build with the fix, rather than relaying to nobody.
- The web view refuses to build without the token a non-loopback bind needs.
- The console keeps a line in its history file only while the conversation is not incognito.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import IO, TYPE_CHECKING

from bot.bridge import Bridge
from bot.commands import COMMAND_NAMES
from bot.config import Config
from bot.domain import ConversationKey
from bot.errors import MeshsageError
from bot.ops.metrics import Counters, Latencies
from bot.transports.base import Transport

if TYPE_CHECKING:
    from bot.app import App
    from bot.web.server import WebServer


def build_web(
    app: App, *, env: Mapping[str, str], latencies: Latencies, counters: Counters
) -> WebServer:
    """The web view (``web:``); refuses without the token a non-loopback bind needs."""
    from bot.web.checks import web_problems, web_token
    from bot.web.model import Collector
    from bot.web.server import WebServer

    problems = web_problems(app.config, env=env)
    if problems:
        raise MeshsageError(" ".join(problems))
    collector = Collector(
        status=app.status_now,
        transports=lambda: app.transports,
        store=app.store,
        latencies=latencies,
        counters=counters,
        last_error=app.last_error,
        waiting=app.responder.waiting,
        model_name=lambda: app.gate.model_name,
        backups=app.config.database_path.parent / "backups",
    )
    return WebServer(
        config=app.config.web,
        token=web_token(app.config, env),
        collector=collector,
        name=app.config.bot.name,
    )


def build_bridge(config: Config, transports: list[Transport]) -> Bridge:
    """Connect the meshtastic and discord transports through the bridge (``relay:``)."""
    from bot.transports.discord import DiscordTransport
    from bot.transports.meshtastic import MeshtasticTransport

    mesh = next((t for t in transports if isinstance(t, MeshtasticTransport)), None)
    chat = next((t for t in transports if isinstance(t, DiscordTransport)), None)
    if mesh is None or chat is None:
        raise MeshsageError(
            "relay: pairs need both the meshtastic: and the discord: sections enabled. Fix: "
            "enable both, or remove the relay: pairs."
        )
    discord_side = chat.attach_relay(config.relay)
    bridge = Bridge(config.relay, mesh=mesh, discord=discord_side)
    discord_side.bind(bridge)
    mesh.channel_listener = bridge.mesh_heard
    return bridge


async def _not_incognito(app: App, key: ConversationKey) -> bool:
    """The console's history file keeps a line only while this is true."""
    conv = await app.store.find_conversation(key)
    return conv is None or not conv.incognito


def build_transport(
    name: str,
    app: App,
    *,
    env: Mapping[str, str],
    stdin: IO[bytes] | None,
    stdout: IO[str] | None,
) -> Transport:
    config = app.config
    if name == "console":
        from bot.transports.console import ConsoleTransport

        cc = config.console_config()
        return ConsoleTransport(
            user=cc.user,
            context_tokens=cc.context_tokens,
            max_tokens=cc.max_tokens,
            wait_idle=app.responder.wait_idle,
            export_dir=config.database_path.parent / "exports",
            history_file=config.database_path.parent / "console_history",
            keep_line=partial(_not_incognito, app, ConversationKey("console", cc.user)),
            stdin=stdin,
            stdout=stdout,
        )
    if name == "meshtastic" and config.meshtastic is not None:
        from bot.transports.meshtastic import build_meshtastic

        return build_meshtastic(
            config.meshtastic,
            bot_name=config.bot.name,
            command_prefix=config.bot.command_prefix,
            command_names=COMMAND_NAMES,
        )
    if name == "meshcore" and config.meshcore is not None:
        try:
            import meshcore  # noqa: F401  (only to say what is missing, before anything runs)
        except ImportError:
            raise MeshsageError(
                "the meshcore: section needs the meshcore library, which is not installed. "
                "Fix: pip install 'meshsage[meshcore]' (or remove the meshcore: section)."
            ) from None
        from bot.transports.meshcore import build_meshcore

        return build_meshcore(
            config.meshcore,
            bot_name=config.bot.name,
            command_prefix=config.bot.command_prefix,
            command_names=COMMAND_NAMES,
        )
    if name == "discord" and config.discord is not None:
        try:
            from bot.transports.discord import build_discord
        except ImportError as exc:
            if exc.name != "discord":
                raise
            raise MeshsageError(
                "the discord: section needs discord.py, which is not installed. Fix: "
                "pip install 'meshsage[discord]' (or remove the discord: section)."
            ) from None
        store = app.store
        return build_discord(
            config.discord,
            env=env,
            max_message_chars=config.bot.max_message_chars,
            vision=config.llm.vision,
            command_prefix=config.bot.command_prefix,
            command_names=COMMAND_NAMES,
            seen_path=config.database_path.parent / "discord-seen.json",
            known=lambda ids, since: store.known_platform_ids("discord", ids, since=since),
        )
    raise MeshsageError(f"transport '{name}' is not available in this build")
