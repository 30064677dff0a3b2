"""Who may do what: the one identity gate that commands and the responder consult.

A transport says whether it verified the sender (``Inbound.authenticated``, see
``bot.domain``); this module decides what follows from it. Discord and the console always
authenticate; on the mesh only a DM that arrived PKI-encrypted with the key pinned for its
node does (``bot.transports.mesh_keys``): anyone holding a channel key can put any node id
in a packet's ``from``.

Invariants:
- A command that changes or deletes memory or identity (``CHANGES``), or reads more than the
  space it was sent in (``!export``), runs only for an authenticated sender. Anyone else is
  told in one short reply (one mesh packet) what would make it work, and nothing changes.
  From a mesh channel it answers "DM me" (no mesh channel sender is ever authenticated), so a
  channel ``!forget`` never reaches DM memory.
- A ``!link <code>`` refused here still uses the code up (``Commands`` burns it), so a forged
  packet cannot try it again and then hand the code's owner's memory to its sender.
- Operator power (``is_operator``) needs an authenticated sender: the console, a Discord
  account listed in ``bot.operators``, a mesh node listed there in an authenticated DM (on
  MeshCore: a DM from the listed public key, or a key starting with a listed prefix). A
  listed mesh id without it is an ordinary person, and is told why. So a bot-wide setting
  (``!persona bot``, ``!model NAME bot``) is exactly as strong as the weakest of these: an
  authenticated operator, never a channel, never a bare ``from`` field.
- An unauthenticated DM may use its own memory (the conversation stored and recalled, the
  reading commands ``READS``) only on a transport listed in ``memory_transports``
  (``meshtastic.unauthenticated_dm: memory``); otherwise (the default, ``chat``) it is
  answered from nothing stored and nothing of it is stored (``may_use_memory``).
- Texts here never quote the message, and each fits one 200-byte mesh packet.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from bot.domain import Inbound

# Commands that change or delete memory, identity or the bot's settings, or read every space.
CHANGES = frozenset({"remember", "unremember", "forget", "reset", "link", "unlink", "pin",
                     "incognito", "persona", "model", "export", "repin"})  # fmt: skip
# Commands that read the person's own memory in the space they are sent in.
READS = frozenset({"history", "summary", "facts", "sessions", "more"})
CONSOLE = "console"  # the machine's own user: always an operator
MESHCORE = "meshcore"  # DM senders are public keys; operators may be listed by a key prefix
KEY_PREFIX_MIN = 12  # hex digits: the 6 bytes a MeshCore contact is addressed by


@dataclass(frozen=True, slots=True)
class SenderPolicy:
    """``operators``: "transport:person" ids (``bot.operators``); ``memory_transports``:
    transports whose unauthenticated DMs may use their own memory (see the docstring)."""

    operators: frozenset[str] = frozenset()
    memory_transports: frozenset[str] = frozenset()

    def listed(self, inbound: Inbound) -> bool:
        """The sender's id is an operator's (whether or not it proved it). A MeshCore
        operator may be listed by a prefix of its public key (``KEY_PREFIX_MIN`` hex digits
        or more): the key the DM resolved to starts with it."""
        if (
            inbound.transport == CONSOLE
            or f"{inbound.transport}:{inbound.sender}" in self.operators
        ):
            return True
        if inbound.transport != MESHCORE:
            return False
        head = MESHCORE + ":"
        return any(
            len(op) - len(head) >= KEY_PREFIX_MIN and inbound.sender.startswith(op[len(head) :])
            for op in self.operators
            if op.startswith(head)
        )

    def is_operator(self, inbound: Inbound) -> bool:
        return inbound.authenticated and self.listed(inbound)

    def may_use_memory(self, inbound: Inbound) -> bool:
        """Whether a chat message is answered from (and stored in) its conversation's memory.
        A channel conversation holds only what was said on that channel (never DM memory)."""
        return (
            inbound.authenticated
            or not inbound.is_dm
            or inbound.transport in self.memory_transports
        )

    def refusal(
        self, inbound: Inbound, command: str, *, prefix: str, operator_commands: Collection[str]
    ) -> str | None:
        """Why ``command`` may not run for this sender, or None when it may."""
        name = prefix + command
        if command in operator_commands:
            if self.listed(inbound) and not self.is_operator(inbound):
                return _needs_proof(name, inbound)
            return None  # an operator's, or unknown to this sender (Commands says so)
        if command in CHANGES:
            if inbound.authenticated:
                return None
            if command == "persona" and not _has_argument(inbound, prefix):
                return None  # only shows the persona in use
            return _needs_proof(name, inbound)
        if command in READS and not self.may_use_memory(inbound):
            return _needs_proof(name, inbound)
        return None


def _has_argument(inbound: Inbound, prefix: str) -> bool:
    return len(inbound.text[len(prefix) :].split(maxsplit=1)) > 1


def _needs_proof(name: str, inbound: Inbound) -> str:
    if not inbound.is_dm:
        return (
            f"DM me {name}: on a channel anyone can claim your node id, so it changes and "
            "shows nothing here."
        )
    if inbound.transport == "meshtastic":
        return (
            f"{name} needs a DM from a radio with firmware 2.5 or newer (PKI, its key known "
            "to me): without it anyone could claim your node id. Nothing changed."
        )
    if inbound.transport == MESHCORE:
        return (
            f"{name} needs a DM from a node my radio holds the key of (its advert heard, or "
            "added as a contact): then your key proves who you are. Nothing changed."
        )
    return f"{name} needs a sender this transport verified. Nothing changed."
