"""Slash commands on the loopback Discord (tests/fakes/fake_discord.py): what Discord does
between a person typing ``/reset`` and the bot's answer showing.

What it speaks: the bulk registration of application commands (PUT global or per guild, kept
in ``registered``), INTERACTION_CREATE events built by ``command``, the interaction callback
(POST /interactions/{id}/{token}/callback), editing the original response (PATCH
/webhooks/{app}/{token}/messages/@original) and follow-ups (POST /webhooks/{app}/{token}).
As strict as Discord where it matters: a callback more than ``deadline`` seconds (3, by the
fake's clock) after the event answers 404 "Unknown interaction" (code 10062), and nothing can
be sent for that interaction afterwards; a second callback answers 400 (code 40060); an edit
or follow-up before the callback answers 404 (code 10015, the webhook does not exist yet);
a token older than 15 minutes is dead. Ephemeral answers (flag 64) are seen by the invoker
only: ``Answer.ephemeral`` says so, and they never enter a channel's history.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web

if TYPE_CHECKING:
    from tests.fakes.fake_discord import FakeDiscord

Json = dict[str, Any]
EPHEMERAL = 64
DEADLINE = 3.0  # seconds Discord gives a bot to acknowledge an interaction
TOKEN_LIFE = 15 * 60.0  # an interaction token works for 15 minutes


@dataclass
class Answer:
    """One message shown for an interaction (the original response or a follow-up)."""

    id: int
    content: str
    ephemeral: bool
    original: bool


@dataclass
class Invocation:
    """One slash command a person ran, and what the bot did with it."""

    id: int
    token: str
    name: str
    channel_id: int
    created: float  # the fake's clock when the event went out
    payload: Json
    callback: Json | None = None  # the bot's acknowledgement (type 4 or 5, flags)
    acked_at: float | None = None
    answers: list[Answer] = field(default_factory=list)
    refused: list[tuple[str, int]] = field(default_factory=list)  # (what, Discord code)

    @property
    def ephemeral(self) -> bool:
        data = (self.callback or {}).get("data") or {}
        return bool(int(data.get("flags") or 0) & EPHEMERAL)

    @property
    def text(self) -> str:
        """Everything the person sees for this command, in order."""
        return "\n".join(a.content for a in self.answers)


class FakeInteractions:
    def __init__(self, server: FakeDiscord) -> None:
        self._server = server
        self.deadline = DEADLINE
        self.registered: dict[int | None, list[Json]] = {}  # guild id (None: global) -> commands
        self.registrations = 0
        self.register_status = 200  # e.g. 403: the applications.commands scope is missing
        self.invocations: list[Invocation] = []
        self.changed = asyncio.Event()

    def routes(self, app: web.Application) -> None:
        app.router.add_put("/api/v10/applications/{app}/commands", self._register)
        app.router.add_put("/api/v10/applications/{app}/guilds/{gid}/commands", self._register)
        app.router.add_post("/api/v10/interactions/{iid}/{token}/callback", self._callback)
        app.router.add_patch(
            "/api/v10/webhooks/{app}/{token}/messages/@original", self._edit_original
        )

    # --- what tests do ----------------------------------------------------------------------
    async def command(
        self,
        name: str,
        options: dict[str, str] | None = None,
        *,
        author: Json | None = None,
        channel_id: int | None = None,
        dm: bool = False,
        roles: tuple[int, ...] = (),
    ) -> Invocation:
        """A person runs ``/name`` with ``options`` (option name -> text) in a guild channel
        (``channel_id``, default the allowed one) or in their DM with the bot."""
        from tests.fakes.fake_discord import ALICE, APP_ID, CHANNEL_ID, GUILD_ID, _now, user

        server = self._server
        author = author or user(ALICE, "alice")
        iid = server.snowflake()
        token = f"itoken{iid}"
        data: Json = {
            "id": str(iid),
            "application_id": str(APP_ID),
            "type": 2,
            "token": token,
            "version": 1,
            "data": {
                "id": str(iid + 1),
                "name": name,
                "type": 1,
                "options": [{"name": k, "type": 3, "value": v} for k, v in (options or {}).items()],
            },
            "app_permissions": "0",
            "locale": "en-US",
            "entitlements": [],
            "attachment_size_limit": 10 * 1024 * 1024,
        }
        if dm:
            cid = server.dm_channel_id(int(author["id"]))
            data["channel_id"] = str(cid)
            data["channel"] = {"id": str(cid), "type": 1, "recipients": [author]}
            data["user"] = author
            data["context"] = 1
            data["authorizing_integration_owners"] = {"0": str(author["id"])}
        else:
            cid = channel_id if channel_id is not None else CHANNEL_ID
            data["guild_id"] = str(GUILD_ID)
            data["guild_locale"] = "en-US"
            data["channel_id"] = str(cid)
            data["channel"] = {"id": str(cid), "type": 0, "guild_id": str(GUILD_ID)}
            data["member"] = {
                "user": author,
                "roles": [str(r) for r in roles],
                "joined_at": _now(),
                "deaf": False,
                "mute": False,
                "flags": 0,
                "permissions": "0",
            }
            data["context"] = 0
            data["authorizing_integration_owners"] = {"0": str(GUILD_ID)}
        invocation = Invocation(iid, token, name, cid, server.clock(), data)
        self.invocations.append(invocation)
        await server.dispatch("INTERACTION_CREATE", data)
        return invocation

    async def wait(
        self, invocation: Invocation, *, answers: int = 1, timeout: float = 30.0
    ) -> Invocation:
        """Until ``answers`` messages show for ``invocation`` (or it was refused)."""

        async def enough() -> None:
            while len(invocation.answers) < answers and not invocation.refused:
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(enough(), timeout)
        return invocation

    async def wait_registered(self, timeout: float = 30.0) -> dict[int | None, list[Json]]:
        async def done() -> None:
            while not self.registrations:
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(done(), timeout)
        return self.registered

    async def wait_acked(self, invocation: Invocation, timeout: float = 30.0) -> Invocation:
        async def acked() -> None:
            while invocation.callback is None and not invocation.refused:
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(acked(), timeout)
        return invocation

    # --- REST -------------------------------------------------------------------------------
    def _find(self, token: str) -> Invocation | None:
        return next((i for i in self.invocations if i.token == token), None)

    def _refuse(self, inv: Invocation | None, what: str, status: int, code: int) -> web.Response:
        from tests.fakes.fake_discord import FakeDiscord

        if inv is not None:
            inv.refused.append((what, code))
        self.changed.set()
        return FakeDiscord._error(status, code, what)

    async def _register(self, request: web.Request) -> web.Response:
        from tests.fakes.fake_discord import FakeDiscord

        if self.register_status != 200:
            return FakeDiscord._error(self.register_status, 50001, "Missing Access")
        gid = request.match_info.get("gid")
        body = await request.json()
        self.registrations += 1
        stored = []
        for i, cmd in enumerate(body):
            stored.append(
                {
                    **cmd,
                    "id": str(self._server.snowflake() + i),
                    "application_id": request.match_info["app"],
                    "version": "1",
                    "type": cmd.get("type", 1),
                    **({"guild_id": gid} if gid else {}),
                }
            )
        self.registered[int(gid) if gid else None] = stored
        self.changed.set()
        return web.Response(
            body=json.dumps(stored).encode(), headers={"Content-Type": "application/json"}
        )

    async def _callback(self, request: web.Request) -> web.Response:
        from tests.fakes.fake_discord import BOT_USER, _json

        inv = next((i for i in self.invocations if str(i.id) == request.match_info["iid"]), None)
        if inv is None or inv.token != request.match_info["token"]:
            return self._refuse(inv, "Unknown interaction", 404, 10062)
        now = self._server.clock()
        if now - inv.created > self.deadline:
            return self._refuse(inv, "Unknown interaction", 404, 10062)
        if inv.callback is not None:
            return self._refuse(inv, "Interaction has already been acknowledged", 400, 40060)
        body = await request.json()
        inv.callback = body
        inv.acked_at = now
        kind = int(body["type"])
        msg_id = self._server.snowflake()
        data = body.get("data") or {}
        if kind == 4:  # an answer straight away
            inv.answers.append(
                Answer(msg_id, str(data.get("content") or ""), inv.ephemeral, original=True)
            )
        self.changed.set()
        message = self._server._message(str(data.get("content") or ""), BOT_USER, inv.channel_id)
        message["id"] = str(msg_id)
        message["flags"] = int(data.get("flags") or 0) | (128 if kind == 5 else 0)
        return _json(
            {
                "interaction": {
                    "id": str(inv.id),
                    "type": 2,
                    "response_message_id": str(msg_id),
                    "response_message_loading": kind == 5,
                    "response_message_ephemeral": inv.ephemeral,
                },
                "resource": {"type": kind, "message": message},
            }
        )

    def _usable(self, token: str) -> tuple[Invocation | None, web.Response | None]:
        inv = self._find(token)
        if inv is None:
            return None, self._refuse(None, "Unknown Webhook", 404, 10015)
        if inv.callback is None:  # never acknowledged (or too late): the webhook never existed
            return inv, self._refuse(inv, "Unknown Webhook", 404, 10015)
        if self._server.clock() - inv.created > TOKEN_LIFE:
            return inv, self._refuse(inv, "Invalid Webhook Token", 401, 50027)
        return inv, None

    def _reply(self, inv: Invocation, answer: Answer) -> web.Response:
        from tests.fakes.fake_discord import BOT_USER, _json

        self.changed.set()
        message = self._server._message(answer.content, BOT_USER, inv.channel_id)
        message["id"] = str(answer.id)
        message["flags"] = EPHEMERAL if answer.ephemeral else 0
        return _json(message)

    async def _edit_original(self, request: web.Request) -> web.Response:
        inv, refused = self._usable(request.match_info["token"])
        if refused is not None or inv is None:
            return refused or web.Response(status=404)
        payload = await request.json()
        content = str(payload.get("content") or "")
        if len(content) > 2000:
            return self._refuse(inv, "Invalid Form Body: content too long", 400, 50035)
        originals = [a for a in inv.answers if a.original]
        if originals:
            originals[0].content = content
            answer = originals[0]
        else:  # the "is thinking..." message becomes the answer
            answer = Answer(self._server.snowflake(), content, inv.ephemeral, original=True)
            inv.answers.insert(0, answer)
        return self._reply(inv, answer)

    async def followup(self, request: web.Request) -> web.Response:
        """POST /webhooks/{application id}/{interaction token}: a follow-up message."""
        inv, refused = self._usable(request.match_info["token"])
        if refused is not None or inv is None:
            return refused or web.Response(status=404)
        if request.content_type.startswith("multipart/"):
            form = await request.post()
            payload = json.loads(str(form["payload_json"]))
        else:
            payload = await request.json()
        content = str(payload.get("content") or "")
        if len(content) > 2000:
            return self._refuse(inv, "Invalid Form Body: content too long", 400, 50035)
        ephemeral = bool(int(payload.get("flags") or 0) & EPHEMERAL)
        answer = Answer(self._server.snowflake(), content, ephemeral, original=False)
        inv.answers.append(answer)
        return self._reply(inv, answer)
