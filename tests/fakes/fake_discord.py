"""A loopback Discord for the unmodified discord.py: the REST API under /api/v10 and a gateway
websocket at /gateway, on 127.0.0.1.

What it speaks: login (GET /users/@me, 401 on a wrong token), application info, the gateway
handshake (HELLO, heartbeats, IDENTIFY -> READY with one guild, or a configured close code such
as 4014), MESSAGE_CREATE dispatches built by ``guild_message``/``dm_message``, and the calls a
bot makes to answer: POST messages (JSON or multipart with files), typing, opening a DM. The
guild has two text channels (one allowed in tests), a thread in each, and two roles.
Every call is recorded so tests assert on what Discord would have received (payloads include
``message_reference`` and ``allowed_mentions``). ``patch`` points discord.py at this server.
As unkind as Discord where it matters: editing or deleting a message that is gone (deleted by
the bot or a moderator, ``delete_by_moderator``) or not in that channel is a 404 (code 10008);
edits beyond the channel's rate limit are 429s; ``fail_requests`` makes posts, edits and
deletes answer a 5xx for a while, and ``fail_after_write`` makes them answer a 5xx AFTER doing
the write (a gateway timeout behind which the message was really created or edited).
A post with ``enforce_nonce`` and a nonce seen in the last ``nonce_window`` seconds creates
nothing and returns the message first created with it (as Discord does; counted in
``deduped``). ``visible(channel)`` is what a person sees there.
Also: ``posts_429`` makes posts answer 429 without ``Via`` (discord.py raises it at once);
``edit_by_author`` sends MESSAGE_UPDATE for a person's edit (adding or removing the mention);
``react`` a reaction; threads opened from a message (``threads_opened``, THREAD_CREATE, 403
with ``threads_allowed = False``); GET of one message; and slash commands
(``interactions``: tests/fakes/fake_discord_interactions.py).
"""

from __future__ import annotations

import asyncio
import functools
import json
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import discord
import discord.gateway
import discord.http
import pytest
import yarl
from aiohttp import WSMsgType, web

from bot.transports import discord as discord_transport
from bot.transports import discord_connect
from tests.fakes.fake_discord_interactions import FakeInteractions

TOKEN = "fake-bot-token"
BOT_ID = 900_000_000_000_000_001
APP_ID = 900_000_000_000_000_002
GUILD_ID = 910_000_000_000_000_001
UNCACHED_GUILD_ID = 910_000_000_000_000_009  # a guild the READY payload does not carry
CHANNEL_ID = 920_000_000_000_000_001  # allowed in tests
OTHER_CHANNEL_ID = 920_000_000_000_000_002  # not allowed
THREAD_ID = 920_000_000_000_000_003  # a thread in CHANNEL_ID
OTHER_THREAD_ID = 920_000_000_000_000_004  # a thread in OTHER_CHANNEL_ID
ROLE_MEMBER = 940_000_000_000_000_001
ROLE_MUTED = 940_000_000_000_000_002
ALICE = 930_000_000_000_000_001
BOB = 930_000_000_000_000_002
OTHER_BOT = 930_000_000_000_000_003
READY_WAIT = 0.05  # discord.py's wait for more guilds after READY (``patch``)

Json = dict[str, Any]


def user(uid: int, name: str, *, bot: bool = False) -> Json:
    return {
        "id": str(uid),
        "username": name,
        "global_name": name.title(),
        "discriminator": "0",
        "avatar": None,
        "bot": bot,
    }


BOT_USER = user(BOT_ID, "meshsage", bot=True)


def _json(data: Json, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    # discord.py parses a body as JSON only when Content-Type is exactly application/json.
    body = json.dumps(data).encode()
    return web.Response(
        body=body, status=status, headers={"Content-Type": "application/json", **(headers or {})}
    )


def _now() -> str:
    return datetime.now(UTC).isoformat()


@dataclass
class Sent:
    """One message the bot posted."""

    channel_id: int
    payload: Json
    files: list[tuple[str, bytes]] = field(default_factory=list)
    id: int = 0

    @property
    def content(self) -> str:
        return str(self.payload.get("content") or "")

    @property
    def reference_id(self) -> int | None:
        ref = self.payload.get("message_reference")
        return int(ref["message_id"]) if ref else None


class FakeDiscord:
    def __init__(self, *, token: str = TOKEN, port: int = 0) -> None:
        self.token = token
        self.port = port
        self.close_code: int | None = None  # close the gateway with this code after IDENTIFY
        # True: as Discord, a guild message that does not mention the bot reaches a session
        # that did not ask for the Message Content intent with its text, embeds and files empty
        self.enforce_content_intent = False
        self.forbidden_channels: set[int] = set()  # POSTs there answer 403
        self.typing_status = 204  # e.g. 500: the typing indicator fails
        self.upload_limit = 10 * 1024 * 1024  # bytes of files per message; more answers 413
        self.drop_posts = 0  # the next N message posts lose their connection (a network outage)
        # The next N message posts/edits/deletes answer this 5xx (Discord having trouble); 503
        # is raised by discord.py at once, 500/502/504 are retried by it after 1, 3, 5... s.
        self.fail_requests = 0
        self.fail_status = 503
        self.fail_after_write = 0  # the next N posts/edits are done, then answered fail_status
        self.posts_429 = 0  # the next N posts answer 429 without ``Via`` (nothing is created)
        self.nonce_window = 300.0  # Discord: "the past few minutes"
        self.nonces: dict[str, tuple[float, int]] = {}  # nonce -> (when, message id)
        self.deduped = 0
        self.identifies_waived = 0  # IDENTIFYs after the first, sent without the 5 s wait
        self.sent: list[Sent] = []
        self.typing: list[int] = []
        self.dm_opened: list[int] = []
        self.logins = 0
        self.identify: Json | None = None
        self.ready = asyncio.Event()
        self._ws: web.WebSocketResponse | None = None
        self._seq = 0
        self._next_id = int(discord.utils.time_snowflake(datetime.now(UTC)))
        self._runner: web.AppRunner | None = None
        self.sent_event = asyncio.Event()
        self.history: dict[int, list[Json]] = {}  # channel id -> every message, oldest first
        self.history_reads: list[tuple[int, dict[str, str]]] = []
        self.resumable = True  # False: a RESUME is answered "invalid session" (op 9, d=false)
        self.sessions = 0  # READY payloads sent (new sessions)
        self._missed: list[tuple[str, Json]] = []  # events while disconnected, for a RESUME
        # Message edits: recorded with the time of ``clock`` (tests pass the bot's fake clock);
        # more than ``edit_limit[0]`` edits in ``edit_limit[1]`` seconds in one channel answer
        # 429 like Discord (body ``retry_after`` = when a slot frees, ``Via`` and X-RateLimit
        # headers; discord.py then waits and retries), counted in ``rate_limited``. Successful
        # edits carry no rate-limit headers: the bot learns of the limit only by hitting it.
        self.clock: Callable[[], float] = time.monotonic
        self.edit_limit: tuple[int, float] = (5, 5.0)
        self.edits: list[tuple[float, int, str]] = []  # (time, message id, new content)
        self.deleted: list[int] = []
        self.rate_limited = 0
        self.reactions: list[tuple[int, str]] = []  # (message id, emoji)
        self.webhooks_allowed = True  # False: Manage Webhooks missing (403)
        self.webhooks: dict[int, Json] = {}
        self.cdn: dict[int, bytes] = {}  # attachment id -> bytes served on the fake CDN
        self.cdn_reads: list[int] = []
        # slash commands: registration, INTERACTION_CREATE, callback, follow-ups
        self.interactions = FakeInteractions(self)
        self.threads_allowed = True  # False: Create Public Threads missing (403)
        self.threads_opened: list[tuple[int, int, str]] = []  # (channel, message, thread) ids

    # --- lifecycle --------------------------------------------------------------------------
    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/gateway", self._gateway)
        app.router.add_get("/api/v10/users/@me", self._me)
        app.router.add_get("/api/v10/oauth2/applications/@me", self._app_info)
        app.router.add_post("/api/v10/users/@me/channels", self._open_dm)
        app.router.add_post("/api/v10/channels/{cid}/messages", self._post_message)
        app.router.add_post("/api/v10/channels/{cid}/typing", self._typing)
        app.router.add_get("/attachments/{aid}/{name}", self._attachment)
        app.router.add_get("/api/v10/channels/{cid}/messages", self._history)
        app.router.add_patch("/api/v10/channels/{cid}/messages/{mid}", self._edit_message)
        app.router.add_delete("/api/v10/channels/{cid}/messages/{mid}", self._delete_message)
        app.router.add_put(
            "/api/v10/channels/{cid}/messages/{mid}/reactions/{emoji}/@me", self._react
        )
        app.router.add_get("/api/v10/channels/{cid}/webhooks", self._list_webhooks)
        app.router.add_post("/api/v10/channels/{cid}/webhooks", self._create_webhook)
        app.router.add_post("/api/v10/webhooks/{wid}/{token}", self._execute_webhook)
        self.interactions.routes(app)
        app.router.add_post("/api/v10/channels/{cid}/messages/{mid}/threads", self._open_thread)
        app.router.add_get("/api/v10/channels/{cid}/messages/{mid}", self._fetch_message)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        if self.port == 0:
            server = site._server
            assert server is not None
            self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]

    async def stop(self) -> None:
        if self._ws is not None:
            await self._ws.close()
        if self._runner is not None:
            await self._runner.cleanup()

    def patch(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Point discord.py's REST base and default gateway at this server, and let the
        transport's default client (``build_discord`` without a factory) wait ``READY_WAIT``
        instead of discord.py's 2 s for guilds after READY: this server sends no GUILD_CREATE
        (its guild is in READY), so the wait only ever ran out, costing every test 2 s."""
        monkeypatch.setattr(discord.http.Route, "BASE", f"http://127.0.0.1:{self.port}/api/v10")
        monkeypatch.setattr(
            discord.gateway.DiscordWebSocket,
            "DEFAULT_GATEWAY",
            yarl.URL(f"ws://127.0.0.1:{self.port}/gateway"),
        )
        monkeypatch.setattr(
            discord_transport,
            "default_client",
            functools.partial(discord_connect.default_client, guild_ready_timeout=READY_WAIT),
        )
        monkeypatch.setattr(discord.Client, "before_identify_hook", self._before_identify)

    async def _before_identify(self, shard_id: int | None, *, initial: bool = False) -> None:
        """``Client.before_identify_hook`` (a bound method of this server, so ``self`` is the
        server): discord.py sleeps 5 s before each IDENTIFY after the first (Discord allows
        one per 5 s); this server has no such limit. Counted in ``identifies_waived``."""
        if not initial:
            self.identifies_waived += 1

    def snowflake(self) -> int:
        self._next_id += 1
        return self._next_id

    def dm_channel_id(self, user_id: int) -> int:
        return user_id + 1_000  # one stable DM channel per user

    # --- what tests do ----------------------------------------------------------------------
    async def dispatch(self, event: str, data: Json) -> None:
        assert self._ws is not None, "no gateway session; await server.ready.wait() first"
        self._seq += 1
        await self._ws.send_json({"op": 0, "t": event, "s": self._seq, "d": data})

    async def say(self, data: Json) -> Json:
        """A message posted now: in the channel's history, and on the gateway if the bot has a
        session (else kept for a RESUME to replay)."""
        self.history.setdefault(int(data["channel_id"]), []).append(data)
        data = self._as_the_intent_allows(data)
        if self._ws is None or self._ws.closed:
            self._missed.append(("MESSAGE_CREATE", data))
        else:
            await self.dispatch("MESSAGE_CREATE", data)
        return data

    def _as_the_intent_allows(self, data: Json) -> Json:
        intents = int((self.identify or {}).get("intents", 0))
        mentioned = any(int(u["id"]) == BOT_ID for u in data.get("mentions", []))
        if not self.enforce_content_intent or intents & (1 << 15) or "guild_id" not in data:
            return data
        if mentioned:
            return data
        return {**data, "content": "", "embeds": [], "attachments": []}

    async def edit_by_author(
        self, data: Json, content: str, *, mention_bot: bool | None = None
    ) -> Json:
        """The author edits their message ``data`` to ``content`` (``mention_bot``: the new
        text @mentions the bot, or no longer does; None: as before): MESSAGE_UPDATE with the
        whole message, as Discord sends it, and the channel's history shows the new text."""
        mentioned = any(m["id"] == str(BOT_ID) for m in data.get("mentions", []))
        mention = mentioned if mention_bot is None else mention_bot
        others = [m for m in data.get("mentions", []) if m["id"] != str(BOT_ID)]
        edited = {
            **data,
            "content": f"<@{BOT_ID}> {content}" if mention else content,
            "mentions": [BOT_USER, *others] if mention else others,
            "edited_timestamp": _now(),
        }
        history = self.history.setdefault(int(data["channel_id"]), [])
        history[:] = [edited if m["id"] == data["id"] else m for m in history]
        await self.dispatch("MESSAGE_UPDATE", edited)
        return edited

    async def react(
        self, message_id: int, emoji: str, *, by: Json | None = None, channel_id: int = CHANNEL_ID
    ) -> None:
        """Someone adds a unicode-emoji reaction to a message (MESSAGE_REACTION_ADD)."""
        who = by or user(ALICE, "alice")
        await self.dispatch(
            "MESSAGE_REACTION_ADD",
            {
                "user_id": who["id"],
                "channel_id": str(channel_id),
                "message_id": str(message_id),
                "guild_id": str(GUILD_ID),
                "emoji": {"id": None, "name": emoji},
                "type": 0,
                "burst": False,
                "member": {
                    "user": who,
                    "roles": [],
                    "joined_at": _now(),
                    "deaf": False,
                    "mute": False,
                    "flags": 0,
                },
            },
        )

    def post_offline(self, data: Json) -> Json:
        """A message posted while the bot is away (stopped): only in the channel's history."""
        self.history.setdefault(int(data["channel_id"]), []).append(data)
        return data

    async def disconnect(self, code: int = 4000) -> None:
        """Drop the gateway session the way a network blip does; discord.py reconnects and
        tries to RESUME (see ``resumable``)."""
        ws, self._ws = self._ws, None
        self.ready.clear()
        if ws is not None:
            await ws.close(code=code, message=b"dropped by the fake")

    def delete_by_moderator(self, message_id: int) -> None:
        """Someone else deletes one of the bot's messages: editing it is then a 404."""
        self.deleted.append(message_id)

    def visible(self, channel_id: int) -> list[Sent]:
        """The bot's messages a person sees in the channel now (posted, not deleted)."""
        return [s for s in self.sent if s.channel_id == channel_id and s.id not in self.deleted]

    def _failing(self) -> web.Response | None:
        if self.fail_requests <= 0:
            return None
        self.fail_requests -= 1
        return self._error(self.fail_status, 0, "Service Unavailable")

    def _limited_without_via(self) -> web.Response | None:
        """A 429 without the ``Via`` header (``posts_429``): what Discord's edge answers when
        it limits by IP; discord.py raises it at once instead of waiting."""
        if self.posts_429 <= 0:
            return None
        self.posts_429 -= 1
        self.rate_limited += 1
        body = {"message": "You are being rate limited.", "retry_after": 1.0, "global": False}
        return _json(body, status=429)

    def _failing_after_write(self) -> web.Response | None:
        if self.fail_after_write <= 0:
            return None
        self.fail_after_write -= 1
        return self._error(self.fail_status, 0, "Gateway Timeout (after the write)")

    def _unknown(self, cid: int, mid: int) -> web.Response | None:
        """404 like Discord for a message that was deleted or never was in that channel."""
        if mid in self.deleted or not any(s.id == mid and s.channel_id == cid for s in self.sent):
            return self._error(404, 10008, "Unknown Message")
        return None

    async def wait_sent(self, count: int, timeout: float = 30.0) -> list[Sent]:
        """Until the bot has posted ``count`` messages in total."""

        async def enough() -> None:
            while len(self.sent) < count:
                self.sent_event.clear()
                await self.sent_event.wait()

        await asyncio.wait_for(enough(), timeout)
        return self.sent

    async def wait_content(self, sent: Sent, content: str, timeout: float = 30.0) -> None:
        """Until ``sent`` shows ``content`` (a streamed answer is edited into its final text)."""

        async def shown() -> None:
            while sent.content != content:
                self.sent_event.clear()
                await self.sent_event.wait()

        await asyncio.wait_for(shown(), timeout)

    def guild_message(
        self,
        content: str,
        *,
        author: Json | None = None,
        channel_id: int = CHANNEL_ID,
        mention_bot: bool = False,
        roles: tuple[int, ...] = (),
        reply_to: Sent | Json | None = None,
        guild_id: int = GUILD_ID,
        mentions: tuple[Json, ...] = (),
        mention_roles: tuple[int, ...] = (),
    ) -> Json:
        data = self._message(content, author or user(ALICE, "alice"), channel_id)
        data["guild_id"] = str(guild_id)
        data["mentions"] = list(mentions)
        data["mention_roles"] = [str(r) for r in mention_roles]
        data["member"] = {
            "roles": [str(r) for r in roles],
            "joined_at": _now(),
            "deaf": False,
            "flags": 0,
        }
        if mention_bot:
            data["mentions"] = [BOT_USER, *mentions]
            data["content"] = f"<@{BOT_ID}> {content}"
        if reply_to is not None:
            ref = self._as_message(reply_to) if isinstance(reply_to, Sent) else reply_to
            data["type"] = 19
            data["message_reference"] = {
                "message_id": ref["id"],
                "channel_id": ref["channel_id"],
                "guild_id": str(GUILD_ID),
            }
            data["referenced_message"] = ref
        return data

    def dm_message(
        self, content: str, *, author: Json | None = None, reply_to: Sent | None = None
    ) -> Json:
        author = author or user(ALICE, "alice")
        data = self._message(content, author, self.dm_channel_id(int(author["id"])))
        if reply_to is not None:
            data["type"] = 19
            data["message_reference"] = {
                "message_id": str(reply_to.id),
                "channel_id": str(reply_to.channel_id),
            }
            data["referenced_message"] = self._as_message(reply_to)
        return data

    def attachment(self, filename: str, data: bytes, content_type: str | None = None) -> Json:
        """An attachment object for a message payload, its bytes served by the fake CDN."""
        aid = self.snowflake()
        self.cdn[aid] = data
        url = f"http://127.0.0.1:{self.port}/attachments/{aid}/{filename}"
        att: Json = {
            "id": str(aid),
            "filename": filename,
            "size": len(data),
            "url": url,
            "proxy_url": url,
        }
        if content_type is not None:
            att["content_type"] = content_type
        return att

    async def _edit_message(self, request: web.Request) -> web.Response:
        cid, mid = int(request.match_info["cid"]), int(request.match_info["mid"])
        refused = self._failing() or self._unknown(cid, mid)
        if refused is not None:
            return refused
        now = self.clock()
        count, window = self.edit_limit
        recent = [
            t
            for t, m, _ in self.edits
            if now - t < window and any(s.id == m and s.channel_id == cid for s in self.sent)
        ]
        if len(recent) >= count:
            # As Discord answers: ``retry_after`` is when the window frees a slot, and the
            # headers (``Via`` above all) are what tells discord.py this is a rate limit to
            # wait out and retry, not a Cloudflare ban (a 429 without ``Via`` is raised at once).
            self.rate_limited += 1
            retry_after = max(min(recent) + window - now, 0.001)
            return _json(
                {
                    "message": "You are being rate limited.",
                    "retry_after": retry_after,
                    "global": False,
                },
                status=429,
                headers={
                    "Via": "1.1 google",
                    "Retry-After": str(max(1, round(retry_after))),
                    "X-RateLimit-Limit": str(count),
                    "X-RateLimit-Remaining": "0",
                    "X-RateLimit-Reset-After": f"{retry_after:.3f}",
                    "X-RateLimit-Bucket": "fake-edit-bucket",
                    "X-RateLimit-Scope": "user",
                },
            )
        payload = await request.json()
        content = str(payload.get("content") or "")
        if len(content) > 2000:
            return self._error(400, 50035, "Invalid Form Body: content too long")
        [sent] = [s for s in self.sent if s.id == mid]
        sent.payload = {**sent.payload, "content": content}
        self.edits.append((now, mid, content))
        self.sent_event.set()
        data = self._message(content, BOT_USER, cid)
        data["id"] = str(mid)
        data["edited_timestamp"] = _now()
        return self._failing_after_write() or _json(data)

    async def _delete_message(self, request: web.Request) -> web.Response:
        cid, mid = int(request.match_info["cid"]), int(request.match_info["mid"])
        refused = self._failing() or self._unknown(cid, mid)
        if refused is not None:
            return refused
        self.deleted.append(mid)  # stays in ``sent`` (counts there only grow)
        return web.Response(status=204)

    async def _react(self, request: web.Request) -> web.Response:
        from urllib.parse import unquote

        self.reactions.append(
            (int(request.match_info["mid"]), unquote(request.match_info["emoji"]))
        )
        return web.Response(status=204)

    async def _fetch_message(self, request: web.Request) -> web.Response:
        """GET one message of a channel's history (404, code 10008, when it is not there)."""
        cid, mid = int(request.match_info["cid"]), request.match_info["mid"]
        found = [m for m in self.history.get(cid, []) if m["id"] == mid]
        if not found:
            return self._error(404, 10008, "Unknown Message")
        return _json(found[-1])

    async def _open_thread(self, request: web.Request) -> web.Response:
        """A thread started from a message (the bot's ``open_threads``)."""
        cid, mid = int(request.match_info["cid"]), int(request.match_info["mid"])
        if not self.threads_allowed:
            return self._error(403, 50013, "Missing Permissions")
        body = await request.json()
        tid = self.snowflake()
        self.threads_opened.append((cid, mid, str(body.get("name"))))
        thread: Json = {
            "id": str(tid),
            "type": 11,
            "guild_id": str(GUILD_ID),
            "parent_id": str(cid),
            "owner_id": str(BOT_ID),
            "name": str(body.get("name")),
            "message_count": 0,
            "member_count": 1,
            "thread_metadata": {
                "archived": False,
                "auto_archive_duration": 1440,
                "archive_timestamp": _now(),
                "locked": False,
            },
        }
        if self._ws is not None and not self._ws.closed:  # as Discord: the creator hears of it
            await self.dispatch("THREAD_CREATE", {**thread, "newly_created": True})
        return _json(thread)

    def _webhook(self, cid: int, wid: int) -> Json:
        return {
            "id": str(wid),
            "type": 1,
            "channel_id": str(cid),
            "guild_id": str(GUILD_ID),
            "name": "meshsage relay",
            "avatar": None,
            "token": f"token{wid}",
            "application_id": str(APP_ID),
            "user": BOT_USER,
        }

    async def _list_webhooks(self, request: web.Request) -> web.Response:
        cid = int(request.match_info["cid"])
        if not self.webhooks_allowed:
            return self._error(403, 50013, "Missing Permissions")
        body = [w for w in self.webhooks.values() if w["channel_id"] == str(cid)]
        return web.Response(
            body=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )

    async def _create_webhook(self, request: web.Request) -> web.Response:
        cid = int(request.match_info["cid"])
        if not self.webhooks_allowed:
            return self._error(403, 50013, "Missing Permissions")
        wid = self.snowflake()
        self.webhooks[wid] = self._webhook(cid, wid)
        return _json(self.webhooks[wid])

    async def _execute_webhook(self, request: web.Request) -> web.Response:
        wid = int(request.match_info["wid"])
        if wid == APP_ID:  # an interaction's follow-up (the application's own webhook)
            return await self.interactions.followup(request)
        hook = self.webhooks.get(wid)
        if hook is None or request.match_info["token"] != hook["token"]:
            return self._error(404, 10015, "Unknown Webhook")
        payload = await request.json()
        cid = int(hook["channel_id"])
        sent = Sent(channel_id=cid, payload=payload, id=self.snowflake())
        self.sent.append(sent)
        self.sent_event.set()
        author = user(wid, str(payload.get("username") or "hook"), bot=True)
        data = self._message(str(payload.get("content") or ""), author, cid)
        data["id"] = str(sent.id)
        data["webhook_id"] = str(wid)
        data["guild_id"] = str(GUILD_ID)
        self.history.setdefault(cid, []).append(data)
        return _json(data)

    async def _history(self, request: web.Request) -> web.Response:
        """GET channel messages as Discord answers ``after``/``before``/``limit``: the
        ``limit`` messages right after ``after`` (or right before ``before``), newest first."""
        cid = int(request.match_info["cid"])
        query = dict(request.query)
        self.history_reads.append((cid, query))
        limit = int(query.get("limit", "50"))
        msgs = sorted(self.history.get(cid, []), key=lambda m: int(m["id"]))
        if "after" in query:
            picked = [m for m in msgs if int(m["id"]) > int(query["after"])][:limit]
        else:
            before = int(query.get("before", str(2**63)))
            picked = [m for m in msgs if int(m["id"]) < before][-limit:]
        return web.Response(
            body=json.dumps(list(reversed(picked))).encode(),
            headers={"Content-Type": "application/json"},
        )

    async def _attachment(self, request: web.Request) -> web.Response:
        aid = int(request.match_info["aid"])
        self.cdn_reads.append(aid)
        if aid not in self.cdn:
            return web.Response(status=404)
        return web.Response(body=self.cdn[aid])

    def _message(self, content: str, author: Json, channel_id: int) -> Json:
        return {
            "id": str(self.snowflake()),
            "channel_id": str(channel_id),
            "type": 0,
            "content": content,
            "author": author,
            "timestamp": _now(),
            "edited_timestamp": None,
            "tts": False,
            "mention_everyone": False,
            "mentions": [],
            "mention_roles": [],
            "attachments": [],
            "embeds": [],
            "pinned": False,
        }

    def _as_message(self, sent: Sent) -> Json:
        data = self._message(sent.content, BOT_USER, sent.channel_id)
        data["id"] = str(sent.id)
        return data

    # --- gateway ----------------------------------------------------------------------------
    async def _gateway(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.send_json({"op": 10, "d": {"heartbeat_interval": 45_000}})
        async for msg in ws:
            if msg.type != WSMsgType.TEXT:
                continue
            frame = json.loads(msg.data)
            if frame["op"] == 1:
                await ws.send_json({"op": 11})
            elif frame["op"] == 6:  # RESUME
                if not self.resumable:
                    self._missed.clear()  # what happened meanwhile is only in history now
                    await ws.send_json({"op": 9, "d": False})
                    continue
                self._ws = ws
                missed, self._missed = self._missed, []
                for event, data in missed:
                    await self.dispatch(event, data)
                await self.dispatch("RESUMED", {})
                self.ready.set()
            elif frame["op"] == 2:
                self._missed.clear()  # a new session gets no replay
                self.identify = frame["d"]
                if self.close_code is not None:
                    await ws.close(code=self.close_code, message=b"closed by the fake")
                    break
                self._ws = ws
                self._seq += 1
                self.sessions += 1
                await ws.send_json({"op": 0, "t": "READY", "s": self._seq, "d": self._ready()})
                self.ready.set()
        return ws

    def _ready(self) -> Json:
        return {
            "v": 10,
            "user": BOT_USER,
            "session_id": "fake-session",
            "resume_gateway_url": f"ws://127.0.0.1:{self.port}/gateway",
            "application": {"id": str(APP_ID), "flags": 0},
            "private_channels": [],
            "guilds": [self._guild()],
        }

    def _guild(self) -> Json:
        def text_channel(cid: int, name: str, position: int) -> Json:
            return {
                "id": str(cid),
                "type": 0,
                "name": name,
                "position": position,
                "permission_overwrites": [],
                "guild_id": str(GUILD_ID),
            }

        def role(rid: int, name: str, position: int) -> Json:
            return {
                "id": str(rid),
                "name": name,
                "permissions": "0",
                "position": position,
                "color": 0,
                "hoist": False,
                "managed": False,
                "mentionable": False,
            }

        def thread(tid: int, parent: int) -> Json:
            return {
                "id": str(tid),
                "type": 11,  # public thread
                "guild_id": str(GUILD_ID),
                "parent_id": str(parent),
                "owner_id": str(ALICE),
                "name": f"thread {tid}",
                "message_count": 0,
                "member_count": 1,
                "thread_metadata": {
                    "archived": False,
                    "auto_archive_duration": 1440,
                    "archive_timestamp": _now(),
                    "locked": False,
                },
            }

        return {
            "id": str(GUILD_ID),
            "name": "Test Guild",
            "owner_id": str(ALICE),
            "member_count": 3,
            "unavailable": False,
            "roles": [
                role(GUILD_ID, "@everyone", 0),
                role(ROLE_MEMBER, "member", 1),
                role(ROLE_MUTED, "muted", 2),
            ],
            "channels": [
                text_channel(CHANNEL_ID, "meshsage", 0),
                text_channel(OTHER_CHANNEL_ID, "general", 1),
            ],
            "threads": [thread(THREAD_ID, CHANNEL_ID), thread(OTHER_THREAD_ID, OTHER_CHANNEL_ID)],
            "members": [
                {"user": BOT_USER, "roles": [], "joined_at": _now(), "deaf": False, "flags": 0}
            ],
        }

    # --- REST -------------------------------------------------------------------------------
    def _authorized(self, request: web.Request) -> bool:
        return request.headers.get("Authorization") == f"Bot {self.token}"

    @staticmethod
    def _error(status: int, code: int, message: str) -> web.Response:
        return _json({"code": code, "message": message}, status=status)

    async def _me(self, request: web.Request) -> web.Response:
        self.logins += 1
        if not self._authorized(request):
            return self._error(401, 0, "401: Unauthorized")
        return _json(BOT_USER)

    async def _app_info(self, request: web.Request) -> web.Response:
        return _json(
            {
                "id": str(APP_ID),
                "name": "meshsage",
                "icon": None,
                "description": "",
                "rpc_origins": [],
                "bot_public": True,
                "bot_require_code_grant": False,
                "owner": user(ALICE, "alice"),
                "verify_key": "0" * 64,
                "flags": 0,
            }
        )

    async def _open_dm(self, request: web.Request) -> web.Response:
        body = await request.json()
        uid = int(body["recipient_id"])
        self.dm_opened.append(uid)
        return _json(
            {"id": str(self.dm_channel_id(uid)), "type": 1, "recipients": [user(uid, "someone")]}
        )

    async def _typing(self, request: web.Request) -> web.Response:
        self.typing.append(int(request.match_info["cid"]))
        if self.typing_status != 204:
            return _json({"code": 0, "message": "typing failed"}, self.typing_status)
        return web.Response(status=204)

    async def _post_message(self, request: web.Request) -> web.Response:
        cid = int(request.match_info["cid"])
        if self.drop_posts > 0:  # the request dies on the wire: no status, nothing posted
            self.drop_posts -= 1
            assert request.transport is not None
            request.transport.close()
            raise web.HTTPServiceUnavailable()  # never reaches the client
        refused = self._failing() or self._limited_without_via()
        if refused is not None:
            return refused
        if cid in self.forbidden_channels:
            return self._error(403, 50007, "Cannot send messages to this user")
        files: list[tuple[str, bytes]] = []
        if request.content_type.startswith("multipart/"):
            form = await request.post()
            payload = json.loads(str(form["payload_json"]))
            for key, value in form.items():
                if isinstance(value, web.FileField):
                    files.append((value.filename, value.file.read()))
                    del key
        else:
            payload = await request.json()
        if sum(len(blob) for _, blob in files) > self.upload_limit:
            return self._error(413, 40005, "Request entity too large")
        if len(str(payload.get("content") or "")) > 2000:
            return self._error(400, 50035, "Invalid Form Body: content too long")
        nonce = str(payload["nonce"]) if payload.get("nonce") is not None else None
        if nonce is not None and payload.get("enforce_nonce"):
            seen = self.nonces.get(nonce)
            if seen is not None and time.monotonic() - seen[0] < self.nonce_window:
                self.deduped += 1  # nothing created: the first message, as it is now
                [first] = [s for s in self.sent if s.id == seen[1]]
                return _json(self._as_message(first) | {"nonce": nonce})
        sent = Sent(channel_id=cid, payload=payload, files=files, id=self.snowflake())
        if nonce is not None:
            self.nonces[nonce] = (time.monotonic(), sent.id)
        self.sent.append(sent)
        self.sent_event.set()
        data = self._message(str(payload.get("content") or ""), BOT_USER, cid)
        data["id"] = str(sent.id)
        self.history.setdefault(cid, []).append(data)
        data["attachments"] = [
            {
                "id": str(self.snowflake()),
                "filename": name,
                "size": len(blob),
                "url": f"http://127.0.0.1/{name}",
                "proxy_url": f"http://127.0.0.1/{name}",
            }
            for name, blob in files
        ]
        if nonce is not None:
            data["nonce"] = nonce
        return self._failing_after_write() or _json(data)


def free_port() -> int:
    """A port nothing listens on (yet): connecting to it is refused, like Discord offline."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port
