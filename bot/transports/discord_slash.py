"""Slash commands on Discord: ``/reset``, ``/history`` ... as the same commands as ``!reset``.

A slash command becomes the ``Inbound`` its ``!`` form would be (``!history 5``) and goes the
same way: the responder's limits, queue, operator check and command code; only the answer
travels differently, through the interaction (the "is thinking..." message, then follow-ups)
instead of a reply in the channel.

Invariants:
- Every command of the registry has a spec here (``SPECS``; a test holds the two equal), and
  every spec is registered at start: globally (every server and DMs) or, with
  ``discord.slash_guilds``, in those servers only. Registration is tried once per process
  after the first READY; a refusal is one ERROR line saying how to fix it (the ``!`` commands
  keep working), a network failure is tried again at the next READY.
- Admission is ``discord_policy.admit`` as for an @mention (the slash is the address): the
  same user, role and channel lists, DMs only when ``dms`` is on. A command where the bot does
  not answer gets one ephemeral sentence saying where it does; nothing else is done.
- The interaction is acknowledged (deferred) before anything that can wait: Discord drops an
  interaction not acknowledged within 3 s. One that could not be acknowledged (too late, or
  Discord refused) is not run at all (the person sees Discord's "did not respond" and can run
  it again) and the operator gets one WARNING line saying why.
- In a shared channel the answer is ephemeral (seen by the person only) unless the spec says
  it is public (``/more``, the rest of a public answer); in a DM it is a normal message.
  Nothing can ping anyone (``AllowedMentions.none()``).
- An inbound from a slash command has ``message_id = "slash:<interaction id>"``: ``owns`` tells
  the transport to answer through the interaction. After a restart the interaction is gone:
  such a reply fails with a reason and is never posted into the channel (it may be private).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import discord
from discord import app_commands

from bot.config import DiscordConfig
from bot.domain import DM_SPACE, Delivery, DeliveryStatus, Inbound, Reply
from bot.transports.discord_policy import Seen, admit
from bot.transports.discord_send import (
    NETWORK_ERRORS,
    NO_MENTIONS,
    channel_space,
    describe,
    send_attachments,
    transient,
)

log = logging.getLogger("bot.transport.discord")

SLASH_PREFIX = "slash:"
REMEMBERED = 500  # interactions kept for their answers (a token works for 15 minutes)
NOT_HERE = (
    "I don't answer in this channel. Use /{name} in a channel where I answer, or in a DM with me."
)
NO_DMS = "I don't answer in DMs. Use /{name} in a server channel where I answer."
NOT_YOU = "I can't answer you here (the operator's user or role lists)."
LATE = (
    "the /%s interaction from %s could not be acknowledged (%s): Discord gives a bot 3 s. "
    "The command was not run; the person sees 'did not respond' and can run it again. If "
    "this repeats, the machine or the event loop is overloaded (see meshsage status)."
)
REFUSED = (
    "Discord refused the slash commands (%s). Fix: re-invite the bot with the "
    "applications.commands scope (docs/discord.md, step 2), or set discord.slash_commands: "
    "false. The !commands work meanwhile."
)
GONE = "the slash command's interaction is no longer known (restart); nothing posted"

Handle = Callable[[Inbound], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class SlashSpec:
    """One slash command: its ``!`` name, what Discord shows, and its one text option."""

    name: str
    description: str
    option: str | None = None  # the option's name (its text is the ``!`` command's argument)
    option_help: str = ""
    required: bool = False
    public: bool = False  # answered for everyone in a shared channel (else only the person)
    operator: bool = False  # hidden from members without Manage Server; bot.operators decides


SPECS: tuple[SlashSpec, ...] = (
    SlashSpec("help", "What I can do"),
    SlashSpec("reset", "Start afresh: nothing said before is used again (facts stay)"),
    SlashSpec("forget", "Delete everything I keep about you", "confirm", "yes, to confirm"),
    SlashSpec("history", "Your last exchanges with me", "count", "how many (1-10)"),
    SlashSpec("summary", "What I remember of our conversation"),
    SlashSpec("remember", "Pin a fact about you", "fact", "the fact", required=True),
    SlashSpec("facts", "The facts I keep about you"),
    SlashSpec("unremember", "Drop a fact", "number", "its number in /facts", required=True),
    SlashSpec("status", "Model, uptime and your message count"),
    SlashSpec("export", "Your conversations as a file, by DM"),
    SlashSpec("more", "The rest of my last cut answer", public=True),
    SlashSpec("sessions", "Your recent sessions"),
    SlashSpec("pin", "Keep the current session"),
    SlashSpec("link", "Link your accounts (mesh, Discord)", "code", "the code, if you have one"),
    SlashSpec("unlink", "Undo a link"),
    SlashSpec("incognito", "Stop storing what we say", "off", "off, to end it"),
    SlashSpec(
        "persona",
        "Show or choose a persona",
        "choice",
        "a name, off, or (operators) here|server|bot and a name or prompt",
    ),
    SlashSpec("stats", "Operator: counters", operator=True),
    SlashSpec(
        "model",
        "Operator: the model here, or set one",
        "choice",
        "NAME [here|server|bot], or clear",
        operator=True,
    ),
    SlashSpec(
        "repin", "Operator: mesh key pins, or re-pin a node", "node", "!1234abcd", operator=True
    ),
)

SLASH_NAMES = tuple(spec.name for spec in SPECS)
ERRORS: tuple[type[BaseException], ...] = (discord.HTTPException, *NETWORK_ERRORS)
SEND_ERRORS: tuple[type[BaseException], ...] = (
    discord.HTTPException,
    discord.ClientException,
    OSError,
    aiohttp.ClientError,
    asyncio.TimeoutError,
    ValueError,  # ids that are not Discord's
)


@dataclass(slots=True)
class _Pending:
    interaction: discord.Interaction[Any]
    private: bool
    answered: bool = False  # the "is thinking..." message was replaced by the first part


class SlashCommands:
    """Builds the command tree for a client and answers what its commands start."""

    def __init__(
        self,
        *,
        config: DiscordConfig,
        prefix: str,
        names: tuple[str, ...],
        handle: Callable[[], Handle | None],
        transport: str,
    ) -> None:
        known = {s.name for s in SPECS}
        self.specs = tuple(s for s in SPECS if s.name in names)
        self.missing = tuple(n for n in names if n not in known)  # a command without a spec
        self._config = config
        self._prefix = prefix
        self._handle = handle
        self._transport = transport
        self._pending: OrderedDict[str, _Pending] = OrderedDict()
        self._synced = False
        self.late = 0  # interactions that could not be acknowledged in time

    # --- registration -----------------------------------------------------------------------
    def install(self, client: discord.Client) -> app_commands.CommandTree[Any]:
        tree: app_commands.CommandTree[Any] = app_commands.CommandTree(client)
        guilds = [discord.Object(id=g) for g in self._config.slash_guilds]
        for spec in self.specs:
            if guilds:
                tree.add_command(self._command(spec), guilds=guilds)
            else:
                tree.add_command(self._command(spec))
        return tree

    async def sync(self, tree: app_commands.CommandTree[Any]) -> None:
        """Register the commands with Discord, once per process (called on READY)."""
        if self._synced:
            return
        try:
            if self._config.slash_guilds:
                for gid in self._config.slash_guilds:
                    await tree.sync(guild=discord.Object(id=gid))
            else:
                await tree.sync()
        except (discord.Forbidden, discord.NotFound) as exc:
            self._synced = True  # a refusal does not change by asking again
            log.error(REFUSED, describe(exc))
            return
        except ERRORS as exc:
            log.warning("slash commands not registered yet (%s); trying at the next connect",
                        describe(exc))  # fmt: skip
            return
        self._synced = True
        where = (
            f"{len(self._config.slash_guilds)} server(s)"
            if self._config.slash_guilds
            else ("every server and DMs")
        )
        log.info("%d slash command(s) registered for %s", len(self.specs), where)

    def _command(self, spec: SlashSpec) -> app_commands.Command[Any, Any, None]:
        invoked = self._invoked

        async def bare(interaction: discord.Interaction[Any]) -> None:
            await invoked(interaction, spec, "")

        async def needed(interaction: discord.Interaction[Any], text: str) -> None:
            await invoked(interaction, spec, text)

        async def optional(interaction: discord.Interaction[Any], text: str | None = None) -> None:
            await invoked(interaction, spec, text or "")

        callback: Callable[..., Awaitable[None]]
        if spec.option is None:
            callback = bare
        else:
            chosen = needed if spec.required else optional
            callback = app_commands.rename(text=spec.option)(
                app_commands.describe(text=spec.option_help or spec.option)(chosen)
            )
        command: app_commands.Command[Any, Any, None] = app_commands.Command(
            name=spec.name, description=spec.description, callback=callback
        )
        if spec.operator:
            command.default_permissions = discord.Permissions(manage_guild=True)
        return command

    # --- an interaction ---------------------------------------------------------------------
    def _refusal(self, interaction: discord.Interaction[Any], spec: SlashSpec) -> str | None:
        user = interaction.user
        channel = interaction.channel
        is_dm = interaction.guild_id is None
        if is_dm and not isinstance(channel, discord.DMChannel):
            return NOT_HERE.format(name=spec.name)  # a group DM: never a conversation here
        seen = Seen(
            author_id=user.id,
            author_is_bot=user.bot,
            is_dm=is_dm,
            channel_id=interaction.channel_id or 0,
            parent_id=channel.parent_id if isinstance(channel, discord.Thread) else None,
            role_ids=frozenset(r.id for r in getattr(user, "roles", ())),
            mentions_bot=True,  # the slash addresses the bot
        )
        reason = admit(seen, config=self._config)
        if reason is None:
            return None
        if reason == "DMs disabled":
            return NO_DMS.format(name=spec.name)
        if reason == "channel not in channels":
            return NOT_HERE.format(name=spec.name)
        return NOT_YOU

    async def _invoked(
        self, interaction: discord.Interaction[Any], spec: SlashSpec, arg: str
    ) -> None:
        name = spec.name
        handle = self._handle()
        refusal = self._refusal(interaction, spec)
        if handle is None:
            refusal = "I am starting; try again in a moment."
        is_dm = interaction.guild_id is None
        private = not is_dm and not spec.public
        try:
            if refusal is not None:
                await interaction.response.send_message(
                    refusal, ephemeral=True, allowed_mentions=NO_MENTIONS
                )
                log.debug("slash /%s from %s refused: %s", name, interaction.user.id, refusal)
                return
            await interaction.response.defer(ephemeral=private, thinking=True)
        except ERRORS as exc:
            self.late += 1
            log.warning(LATE, name, interaction.user.id, describe(exc))
            return
        assert handle is not None
        key = f"{SLASH_PREFIX}{interaction.id}"
        self._pending[key] = _Pending(interaction, private)
        while len(self._pending) > REMEMBERED:
            self._pending.popitem(last=False)
        channel_id = interaction.channel_id or 0
        inbound = Inbound(
            transport=self._transport,
            sender=str(interaction.user.id),
            text=f"{self._prefix}{name} {arg}".strip(),
            space=DM_SPACE
            if is_dm or interaction.guild_id is None
            else channel_space(interaction.guild_id, channel_id),
            message_id=key,
            sender_name=interaction.user.display_name,
            received_at=interaction.created_at,
            authenticated=True,  # Discord's login (bot.trust)
        )
        await handle(inbound)

    # --- answers ----------------------------------------------------------------------------
    @staticmethod
    def owns(inbound: Inbound) -> bool:
        return (inbound.message_id or "").startswith(SLASH_PREFIX)

    async def send(
        self, client: discord.Client, reply: Reply, parts: list[str], *, limit: int
    ) -> Delivery:
        """A slash command's answer: through its interaction, never into the channel; files
        (an export) to the person's DMs. Never raises for Discord trouble."""
        sent: list[str] = []
        try:
            posted, failed = await self.deliver(reply, parts)
            sent += posted
            if failed is not None:
                log.warning("delivery to %s failed: %s", reply.inbound.key, failed.detail)
                return failed
            if reply.attachments:
                for msg in await send_attachments(client, reply, None, limit=limit):
                    sent.append(str(msg.id))
        except SEND_ERRORS as exc:
            retry = transient(exc)
            how = "postponed" if retry else "failed"
            log.warning("slash answer to %s %s after %d message(s): %s", reply.inbound.key,
                        how, len(sent), describe(exc))  # fmt: skip
            status = DeliveryStatus.PENDING if retry else DeliveryStatus.FAILED
            return Delivery(status, tuple(sent), detail=describe(exc))
        return Delivery(DeliveryStatus.DELIVERED, tuple(sent))

    async def deliver(self, reply: Reply, parts: list[str]) -> tuple[list[str], Delivery | None]:
        """Post ``parts`` through the interaction; (ids posted, a failed Delivery or None)."""
        pending = self._pending.get(reply.inbound.message_id or "")
        if pending is None:
            return [], Delivery(DeliveryStatus.FAILED, detail=GONE)
        interaction = pending.interaction
        sent: list[str] = []
        for i, part in enumerate(parts):
            if i in reply.done_parts:
                continue
            if not pending.answered:
                msg: discord.Message = await interaction.edit_original_response(
                    content=part, allowed_mentions=NO_MENTIONS
                )
                pending.answered = True
            else:
                msg = await interaction.followup.send(
                    part, ephemeral=pending.private, allowed_mentions=NO_MENTIONS, wait=True
                )
            sent.append(str(msg.id))
            if reply.progress is not None:
                await reply.progress(i, str(msg.id))
        return sent, None
