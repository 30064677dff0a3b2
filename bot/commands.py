"""User and operator commands, answered without the LLM.

Invariants:
- Every reply fits ``room`` UTF-8 bytes (``fit_bytes``), whatever stored text it quotes (facts,
  summary, history). The responder passes the transport's own size: one 200-byte packet on
  the mesh, what one Discord answer carries (2,000 characters), and ``UNLIMITED_ROOM`` on the
  console; the default is the mesh packet.
- ``!reset`` says exactly what it keeps and why: the facts the person pinned (``!remember``),
  and the log (stored, no longer used); facts inferred from the chats before it are dropped
  (they came from what the reset puts out of use), and the reply counts them.
- Commands act only on the conversation of the person who sent them (``!forget`` on all of that
  person's spaces on that transport), never on anyone else's.
- ``!forget`` deletes only after ``!forget yes`` from the same person within 60 s of the moment
  the prompt was *delivered* (``CommandResult.on_delivered``), not of the command's arrival.
- No argument raises: numbers are parsed with ``bot.text.small_number`` (ASCII digits only;
  ``"²"`` and ``"③"`` pass ``isdigit()`` but not ``int()``), anything else gets the usage line.
- ``!more`` returns the stored rest of the last cut answer unfitted (``more=True``): the
  responder cuts it for the transport and keeps what is left for the next ``!more``. With no
  rest stored, under an answer the model broke off at max_tokens (it ends in
  ``TRUNCATED_MARK``), it asks the responder to go on (``go_on=True``: ``GO_ON`` becomes the
  person's next message, answered by the LLM), on every transport.
- Operator commands answer only ids listed in ``bot.operators`` ("transport:person") whose
  message the transport authenticated; the local console user is always an operator (they
  own the machine and the database). Facts never grant anything: "remember that I am an
  operator" is stored as text and checked by no one.
- Before any handler runs, ``bot.trust`` (``SenderPolicy.refusal``) decides whether this
  sender may run the command at all: the one identity gate. A refused ``!link <code>`` spends
  the code.
- ``!remember``, ``!facts`` and ``!unremember`` are ``bot.commands_facts`` (its docstring
  states how a fact is pinned, updated, listed and removed).
- A command with an effect (``!remember``, ``!unremember``, ``!reset``, ``!link <code>``,
  ``!unlink``, ``!pin``, ``!model``, ``!persona``) run from ``held_commands`` writes its
  effect with ``done=`` the held id: the effect and the command's done mark commit in one
  transaction, and any earlier write of the command is one that a second run repeats
  harmlessly. A replay after a kill then tells the person instead of running it again
  (``bot.recovery``). ``!forget yes`` is recognised on replay by nothing of the person
  being left.
- ``!link``/``!unlink`` act only on DMs; a wrong, expired or used code gets one answer that
  reveals nothing, and tries are rate-limited (bot.memory.links).
- ``!export`` on a transport that cannot carry files says how to get the export instead.
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

from bot.commands_facts import FactCommands
from bot.commands_settings import SettingsCommands
from bot.domain import DM_SPACE, Attachment, Inbound
from bot.errors import MeshsageError
from bot.llm.port import TRUNCATED_MARK
from bot.memory import chapter_check
from bot.memory.chapter_text import CHAPTER_PROMPT, MERGE_PROMPT
from bot.memory.export import export_person
from bot.memory.links import LinkCodes
from bot.memory.port_derived import Derived, SessionLog
from bot.memory.port_identity import Identities
from bot.memory.port_log import ConversationLog
from bot.memory.port_upkeep import Upkeep
from bot.memory.port_work import Outbox
from bot.text import MESH_COMMAND_BYTES, counted, fit_bytes, small_number
from bot.trust import SenderPolicy

if TYPE_CHECKING:
    from bot.identity import PinnedKeys


class CommandStore(ConversationLog, Derived, SessionLog, Identities, Upkeep, Outbox, Protocol):
    """What the chat commands read and change in the store."""


FORGET_CONFIRM_SECONDS = 60.0
# Every command name (user, then operator): on shared channels only these trigger the bot.
COMMAND_NAMES = ("help", "reset", "forget", "history", "summary", "remember", "facts",
                 "unremember", "status", "export", "more", "sessions", "pin", "link", "unlink",
                 "incognito", "persona", "stats", "model", "repin")  # fmt: skip
HISTORY_DEFAULT = 3
HISTORY_MAX = 10
SESSIONS_SHOWN = 5
NO_FILES = ("meshtastic", "meshcore")  # transports that cannot carry an attachment
PROMPTS = (CHAPTER_PROMPT, MERGE_PROMPT)  # what a chapter must never be an echo of
GO_ON = "Please go on: continue your last answer from where it stopped, without repeating it."


@dataclass(frozen=True, slots=True)
class CommandResult:
    text: str
    attachments: tuple[Attachment, ...] = field(default_factory=tuple)
    more: bool = False  # text is the rest of a cut answer, to be fitted by the transport
    forgot: bool = False  # the person's data was deleted (transports drop their files too)
    on_delivered: Callable[[], None] | None = None  # run once the reply reached the person
    go_on: bool = False  # text is a message to answer with the LLM (``!more`` after a cut)


# (the message, the argument, the reply's room in bytes, the command's ``held_commands`` id:
# the write that is its effect passes it as ``done=``, so the mark commits with the effect)
Handler = Callable[[Inbound, str, int, int | None], Awaitable[CommandResult]]
UNLIMITED_ROOM = 20_000


class Commands:
    def __init__(
        self,
        *,
        store: CommandStore,
        facts: FactCommands,
        prefix: str,
        operators: tuple[str, ...],
        model_name: Callable[[], str],
        links: LinkCodes,
        clock: Callable[[], float] = time.monotonic,
        settings: SettingsCommands | None = None,
        trust: SenderPolicy | None = None,
        pins: PinnedKeys | None = None,
    ) -> None:
        self.settings = settings  # !model, !persona (bot.commands_settings)
        self.trust = trust or SenderPolicy(operators=frozenset(operators))  # who may do what
        self._links = links
        self._store = store
        self.facts = facts  # !remember, !facts, !unremember (bot.commands_facts)
        self.prefix = prefix
        self._model_name = model_name
        self._clock = clock
        self._started = clock()
        self._forget_pending: dict[tuple[str, str], float] = {}
        self._handlers: dict[str, Handler] = {
            "help": self._help,
            "reset": self._reset,
            "forget": self._forget,
            "history": self._history,
            "summary": self._summary,
            "remember": self._remember,
            "facts": self._facts,
            "unremember": self._unremember,
            "status": self._status,
            "export": self._export,
            "more": self._more,
            "sessions": self._sessions,
            "pin": self._pin,
            "link": self._link,
            "unlink": self._unlink,
            "incognito": self._incognito,
        }
        self._operator_handlers: dict[str, Handler] = {"stats": self._stats}
        self._pins = pins  # mesh key pins (bot.identity): the operator's !repin
        if pins is not None:
            self._operator_handlers["repin"] = self._repin
        if settings is not None:
            self.enable_settings()
        self.stat_sources: list[Callable[[], Mapping[str, int]]] = []  # e.g. relay counters

    @property
    def names(self) -> tuple[str, ...]:
        """Every command name, user commands first, then operator commands."""
        return (*self._handlers, *self._operator_handlers)

    def parse(self, text: str) -> tuple[str, str] | None:
        """(name, argument) when ``text`` is a command, else None."""
        if not text.startswith(self.prefix):
            return None
        body = text[len(self.prefix) :].strip()
        name, _, arg = body.partition(" ")
        name = name.lower()
        if not name or not name.isalpha():
            return None  # "!!!" or "!?" is a message, not a command
        return name, arg.strip()

    def is_operator(self, inbound: Inbound) -> bool:
        return self.trust.is_operator(inbound)

    async def run(
        self,
        inbound: Inbound,
        name: str,
        arg: str,
        *,
        room: int = MESH_COMMAND_BYTES,
        command_id: int | None = None,
    ) -> CommandResult:
        """Run one command. ``command_id``: its row in ``held_commands``; the write that is
        the command's effect marks it done in the same transaction (``done=``), so a replay
        after a kill never applies it twice."""
        return await self._run(inbound, name, arg, room, command_id)

    def allowed(self, inbound: Inbound, name: str) -> bool:
        """Whether ``bot.trust`` lets this sender run ``name`` (``run`` refuses it otherwise)."""
        return self._refusal(inbound, name) is None

    def _refusal(self, inbound: Inbound, name: str) -> str | None:
        return self.trust.refusal(
            inbound, name, prefix=self.prefix, operator_commands=self._operator_handlers
        )

    async def _run(
        self, inbound: Inbound, name: str, arg: str, room: int, held: int | None
    ) -> CommandResult:
        refused = self._refusal(inbound, name)
        if refused is not None:
            if name == "link" and arg:  # used up: a forged packet gets no second try
                await self._links.burn(arg, inbound.transport)
            return CommandResult(fit_bytes(refused, room))
        handler = self._handlers.get(name)
        if handler is None and self.is_operator(inbound):
            handler = self._operator_handlers.get(name)
        if handler is None:
            unknown = f"Unknown command {self.prefix}{name}. Send {self.prefix}help."
            return CommandResult(fit_bytes(unknown, room))
        result = await handler(inbound, arg, room, held)
        if result.more:
            return result
        return replace(result, text=fit_bytes(result.text, room))

    def _say(self, text: str) -> CommandResult:
        return CommandResult(text)  # ``run`` fits it to the transport

    # --- handlers ---------------------------------------------------------------------------
    async def _help(self, inbound: Inbound, arg: str, room: int, held: int | None) -> CommandResult:
        p = self.prefix
        names = ["help", "reset", "forget", "history [n]", "summary", "remember <fact>",
                 "facts", "unremember <n>", "status", "export", "more", "sessions", "pin",
                 "link [code]", "unlink", "incognito [off]"]  # fmt: skip
        text = "Commands: " + " ".join(p + n for n in names)
        if self.settings is not None:
            text += f" {p}persona"
        if self.is_operator(inbound):
            text += f" | operator: {p}stats" + (f" {p}model" if self.settings else "")
            text += f" {p}repin [node]" if self._pins is not None else ""
        return self._say(text)

    async def _reset(
        self, inbound: Inbound, arg: str, room: int, held: int | None
    ) -> CommandResult:
        conv = await self._store.conversation(inbound.key)
        # Inferred facts came from what was said before now: they go with it. Pinned facts
        # are the person's own notes (!remember): they stay, and the reply says so. Dropped
        # first: the reset is the effect marked done (a replay after a kill between the two
        # runs both again, and dropping twice is dropping once).
        dropped = 0
        for fact in await self._store.facts(conv.id):
            if not fact.pinned:
                dropped += await self._store.remove_fact(conv.id, fact.id, extracted_only=True)
        await self._store.reset(conv.id, done=held)
        n = sum(f.pinned for f in await self._store.facts(conv.id))
        p = self.prefix
        kept = (
            f"{counted(n, 'fact')} you asked me to remember ({p}facts)"
            if n
            else ("no facts (none pinned)")
        )
        gone = f" Dropped: {counted(dropped, 'fact')} I had inferred." if dropped else ""
        return self._say(
            f"Fresh start: nothing said before now is used again. Kept: {kept}.{gone} Old "
            f"messages stay stored ({p}forget deletes them)."
        )

    async def _forget(
        self, inbound: Inbound, arg: str, room: int, held: int | None
    ) -> CommandResult:
        who = (inbound.transport, inbound.sender)
        now = self._clock()
        asked = self._forget_pending.get(who)
        if arg.lower() == "yes":
            if asked is None or (asked != float("inf") and now - asked > FORGET_CONFIRM_SECONDS):
                self._forget_pending.pop(who, None)
                return self._say(f"Nothing to confirm. Send {self.prefix}forget first.")
            self._forget_pending.pop(who, None)
            report = await self._store.forget_person(inbound.transport, inbound.sender)
            if not inbound.is_dm:  # the counts include DMs: not for a shared channel
                return CommandResult(
                    "Deleted everything I kept about you. I no longer remember you.", forgot=True
                )
            return CommandResult(
                f"Deleted everything I kept about you: {counted(report.messages, 'message')}, "
                f"{counted(report.summaries, 'summary')}, {counted(report.facts, 'fact')}. I no "
                "longer remember you.",
                forgot=True,
            )
        if arg:
            return self._say(f"Usage: {self.prefix}forget, then {self.prefix}forget yes")
        # The window opens when the prompt reaches the person (a busy mesh can take a minute);
        # until then, an early "yes" still counts.
        self._forget_pending[who] = float("inf")

        def opened() -> None:
            if self._forget_pending.get(who) == float("inf"):
                self._forget_pending[who] = self._clock()

        return CommandResult(
            "This deletes all I keep about you: messages, summaries, facts. "
            f"Send {self.prefix}forget yes within 60 s to confirm.",
            on_delivered=opened,
        )

    async def _history(
        self, inbound: Inbound, arg: str, room: int, held: int | None
    ) -> CommandResult:
        n = HISTORY_DEFAULT
        if arg:
            number = small_number(arg)
            if number is None or not 1 <= number <= HISTORY_MAX:
                return self._say(f"Usage: {self.prefix}history [n], n from 1 to {HISTORY_MAX}")
            n = number
        conv = await self._store.find_conversation(inbound.key)
        msgs = [] if conv is None else await self._store.recent_messages(conv, limit=n)
        if not msgs:  # after !forget there is no conversation at all, so no reset either
            if conv is not None and await self._store.reset_mark(conv.id):
                return self._say(f"No messages since your last {self.prefix}reset.")
            return self._say("I keep no messages of ours here.")
        msgs.reverse()
        each = max(20, (room - 10) // len(msgs))
        lines = [
            f"{'you' if m.role == 'user' else 'me'}: " + fit_bytes(" ".join(m.text.split()), each)
            for m in msgs
        ]
        return self._say("\n".join(lines))

    async def _summary(
        self, inbound: Inbound, arg: str, room: int, held: int | None
    ) -> CommandResult:
        conv = await self._store.find_conversation(inbound.key)
        chapters = [] if conv is None else await self._store.summaries(conv)
        # A chapter stored before bot.memory.chapter_check existed may be an echoed instruction.
        shown = [c for c in chapters if not chapter_check.echoes(c.text, instructions=PROMPTS)]
        if not shown:
            return self._say("No summary yet: our conversation is still short.")
        return self._say("Summary: " + " ".join(c.text for c in shown))

    async def _remember(
        self, inbound: Inbound, arg: str, room: int, held: int | None
    ) -> CommandResult:
        return self._say(await self.facts.remember(inbound, arg, held=held))

    async def _facts(
        self, inbound: Inbound, arg: str, room: int, held: int | None
    ) -> CommandResult:
        return self._say(await self.facts.facts(inbound, room))

    async def _unremember(
        self, inbound: Inbound, arg: str, room: int, held: int | None
    ) -> CommandResult:
        return self._say(await self.facts.unremember(inbound, arg, held=held))

    async def _more(self, inbound: Inbound, arg: str, room: int, held: int | None) -> CommandResult:
        rest = await self._store.take_more(inbound.key)
        if rest:
            return CommandResult(rest, more=True)
        conv = await self._store.find_conversation(inbound.key)
        last = [] if conv is None else await self._store.recent_messages(conv, limit=1)
        if last and last[0].role != "user" and last[0].text.endswith(TRUNCATED_MARK):
            return CommandResult(GO_ON, go_on=True)  # cut at max_tokens: the model goes on
        return self._say("Nothing more: my last answer was complete.")

    async def _status(
        self, inbound: Inbound, arg: str, room: int, held: int | None
    ) -> CommandResult:
        up = int(self._clock() - self._started)
        if inbound.space == DM_SPACE:  # private: the whole picture on this transport
            count = await self._store.count_person_messages(inbound.transport, inbound.sender)
            where = ""
        else:  # a shared space: nothing derived from the person's DMs
            count = await self._store.count_person_messages(
                inbound.transport, inbound.sender, space=inbound.space
            )
            where = " here"
        conv = await self._store.find_conversation(inbound.key)
        incognito = conv is not None and await self._store.is_incognito(conv.id)
        model = self._model_name() if self.settings is None else self.settings.model_here(inbound)
        persona = None if self.settings is None else self.settings.persona_here(inbound)
        shown = f"Model {model}" + (f", persona {persona}" if persona else "")
        text = f"{shown}, up {_duration(up)}, you sent {counted(count, 'message')}{where}."
        if incognito:
            text += f" Incognito is ON here: nothing new is stored ({self.prefix}incognito off)."
        return self._say(text)

    async def _export(
        self, inbound: Inbound, arg: str, room: int, held: int | None
    ) -> CommandResult:
        if inbound.transport in NO_FILES:
            return self._say(
                "Files cannot travel over the mesh. Get your export from the operator "
                f"(meshsage export {inbound.sender} --format md), or {self.prefix}link your "
                f"Discord account and send {self.prefix}export there."
            )
        markdown, doc = await export_person(self._store, inbound.transport, inbound.sender)
        stem = f"meshsage-export-{inbound.transport}"
        said = "Your export (Markdown and JSON) is on its way to you privately."
        if inbound.transport == "console":  # the console saves the files and prints the paths
            said = "Your export, saved as Markdown and as JSON (`meshsage import` reads the JSON):"
        return CommandResult(
            said,
            (
                Attachment(f"{stem}.md", markdown.encode("utf-8")),
                Attachment(f"{stem}.json", doc.encode("utf-8")),
            ),
        )

    async def _sessions(
        self, inbound: Inbound, arg: str, room: int, held: int | None
    ) -> CommandResult:
        conv = await self._store.find_conversation(inbound.key)
        sessions = [] if conv is None else await self._store.sessions(conv.id, limit=20)
        done = [s for s in sessions if s.title][-SESSIONS_SHOWN:]
        waiting = conv is not None and (
            any(not s.title for s in sessions)
            or await self._store.reset_mark(conv.id) > await self._store.session_end(conv.id)
        )  # a session ended (a !reset, a pause) whose summary is not written yet
        if not done and waiting:
            return self._say("The session you ended is being summarized while I am idle (a "
                             f"minute or so); {self.prefix}sessions lists it then.")  # fmt: skip
        if not done:
            return self._say("No past sessions yet: a session closes after a long pause or "
                             f"{self.prefix}reset, and I summarize it then.")  # fmt: skip
        each = max(24, (room - 20) // len(done))
        lines = [
            fit_bytes(f"{time.strftime('%d %b', time.gmtime(s.started_at))} {s.title}", each)
            for s in reversed(done)
        ]
        later = " (the newest is still being summarized)" if waiting else ""
        return self._say("Sessions: " + "; ".join(lines) + later)

    async def _pin(self, inbound: Inbound, arg: str, room: int, held: int | None) -> CommandResult:
        conv = await self._store.find_conversation(inbound.key)
        if conv is None:
            return self._say("Nothing to pin yet.")
        target: list[int] = []
        if inbound.reply_to is not None:
            found = await self._store.message_by_platform_id(conv.id, inbound.reply_to)
            if found is not None:
                target = [found]
        if not target:  # no reply: the latest exchange
            target = [m.id for m in await self._store.recent_messages(conv, limit=2)]
        n = await self._store.mark_important(conv.id, target, done=held)
        if not n:
            return self._say("Nothing to pin: reply to one of our messages with "
                             f"{self.prefix}pin.")  # fmt: skip
        what = "it is" if n == 1 else "they are"
        return self._say(
            f"Pinned {counted(n, 'message')}: {what} kept when old turns are forgotten."
        )

    async def _link(self, inbound: Inbound, arg: str, room: int, held: int | None) -> CommandResult:
        p = self.prefix
        if not inbound.is_dm:
            return self._say(f"Send {p}link in a direct message: links join DM memory only.")
        if not arg:
            code = await self._links.issue(inbound.transport, inbound.sender)
            return self._say(
                f"Your link code is {code}. Within 10 minutes, send {p}link {code} to me from "
                "your other account (other transport) to share our DM memory. Single use."
            )
        if not await self._links.allowed(inbound.transport, inbound.sender):
            return self._say("Too many link attempts. Wait 10 minutes, then try a new code.")
        home = await self._links.redeem(arg, inbound.transport, inbound.sender)
        if home is None:
            return self._say(f"No link made. A code works once, within 10 minutes, and only "
                             "from your other account (not the one that got it). Send "
                             f"{p}link again for a new code.")  # fmt: skip
        try:
            moved = await self._store.link_dm(home, inbound.key, done=held)
        except MeshsageError as exc:
            return self._say(f"Not linked: {exc}")
        return self._say(
            f"Linked with your {home.transport} account: one DM memory now "
            f"({counted(moved, 'message')} joined). {p}unlink separates them again."
        )

    async def _unlink(
        self, inbound: Inbound, arg: str, room: int, held: int | None
    ) -> CommandResult:
        if not inbound.is_dm:
            return self._say(f"Send {self.prefix}unlink in a direct message.")
        moved = await self._store.unlink_dm(inbound.key, done=held)
        if moved is None:
            return self._say("This account is not linked.")
        return self._say("Unlinked: each account keeps its own messages and facts again.")

    async def _incognito(
        self, inbound: Inbound, arg: str, room: int, held: int | None
    ) -> CommandResult:
        p = self.prefix
        if arg.lower() not in ("", "on", "off"):
            return self._say(f"Usage: {p}incognito, or {p}incognito off")
        conv = await self._store.conversation(inbound.key)
        on = arg.lower() != "off"
        await self._store.set_incognito(conv.id, on)
        if on:
            return self._say(  # one mesh packet (200 bytes): every promise, nothing cut
                "Incognito on: your new messages here and my answers are not stored or ever "
                f"recalled. I hold them only until {p}incognito off (forgets them, then stores "
                f"again), {p}reset, {p}forget or a restart."
            )
        return self._say(
            "Incognito off: what you said while incognito is forgotten; I store our new "
            "messages again."
        )

    def enable_settings(self) -> None:
        """``!persona`` and the operator's ``!model``, once ``settings`` is set."""
        self._handlers["persona"] = self._persona
        self._operator_handlers["model"] = self._model

    async def _persona(
        self, inbound: Inbound, arg: str, room: int, held: int | None
    ) -> CommandResult:
        assert self.settings is not None
        return self._say(await self.settings.persona(inbound, arg, held=held))

    async def _model(
        self, inbound: Inbound, arg: str, room: int, held: int | None
    ) -> CommandResult:
        assert self.settings is not None
        return self._say(await self.settings.model(inbound, arg, held=held))

    async def _repin(
        self, inbound: Inbound, arg: str, room: int, held: int | None
    ) -> CommandResult:
        """``!repin``: the pins (ids and fingerprints); ``!repin !id``: drop that node's pin,
        so its next PKI DM pins its new key (a reset or replaced radio)."""
        assert self._pins is not None
        node = arg.strip().lower()
        if not node:
            pins = await self._pins.describe()
            return self._say("Key pins: " + ("; ".join(pins) if pins else "none yet."))
        if not re.fullmatch(r"![0-9a-f]{8}", node):
            return self._say(f"Usage: {self.prefix}repin !1234abcd (a mesh node id)")
        return self._say(await self._pins.repin(node))

    async def _stats(
        self, inbound: Inbound, arg: str, room: int, held: int | None
    ) -> CommandResult:
        stats = dict(await self._store.stats())
        for source in self.stat_sources:
            stats.update(source())
        return self._say(", ".join(f"{k}: {v}" for k, v in stats.items()))


def _duration(seconds: int) -> str:
    d, rem = divmod(seconds, 86400)
    h, rem = divmod(rem, 3600)
    m, s = divmod(rem, 60)
    if d:
        return f"{d}d{h}h"
    if h:
        return f"{h}h{m}m"
    return f"{m}m{s}s"
