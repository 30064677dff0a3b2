"""Operator power follows authenticated identities (issue 44, point 3): a bot-wide setting
(``!persona bot``, ``!model NAME bot``) is as strong as the weakest sender allowed to set it,
which is an authenticated operator: the console, a Discord operator, a mesh operator in a PKI
DM. A listed mesh id without PKI, a mesh channel, a non-operator, or a transport that did not
vouch for its sender (``Inbound.authenticated`` left False) sets nothing, on any transport."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.app import build
from bot.chat_settings import BOT_SCOPE
from tests.conftest import make_config
from tests.fakes.fake_llm import FakeLLM
from tests.fakes.fake_transport import FakeTransport

OPS = 'bot:\n  operators: ["meshtastic:!20000009", "discord:op"]\n'
MESH_OP = "!20000009"

# (transport, sender, space, authenticated) -> may set the bot-wide persona and model
CASES = [
    ("console", "me", "dm", True, True),
    ("discord", "op", "dm", True, True),
    ("discord", "op", "guild:1:ch:2", True, True),
    ("meshtastic", MESH_OP, "dm", True, True),  # a PKI DM with the pinned key
    ("discord", "mallory", "dm", True, False),  # not an operator
    ("meshtastic", MESH_OP, "dm", False, False),  # the operator's id without PKI: forged
    ("meshtastic", MESH_OP, "ch0", False, False),  # a channel: never authenticated
    ("meshtastic", "!20000001", "dm", True, False),  # authenticated, not an operator
    ("console", "me", "dm", False, False),  # a transport that did not vouch for its sender
]


@pytest.mark.parametrize(("transport", "sender", "space", "authenticated", "allowed"), CASES)
async def test_bot_wide_settings_need_an_authenticated_operator(
    tmp_path: Path,
    fake_llm: FakeLLM,
    transport: str,
    sender: str,
    space: str,
    authenticated: bool,
    allowed: bool,
) -> None:
    fake = FakeTransport(name=transport)
    app = await build(make_config(tmp_path, fake_llm.base_url, OPS), env={}, transports=[fake])
    try:
        await app.start()
        for text in ("!persona bot You are EvilBot.", "!model fake bot", "!stats"):
            await fake.say(text, sender=sender, space=space, authenticated=authenticated)
            await app.responder.wait_idle()
        persona, model, stats = fake.texts()
        settings = await app.store.chat_settings()
        bot_wide = {(s.scope, s.model, s.persona) for s in settings if s.scope == BOT_SCOPE}
        if allowed:
            assert persona == "Persona for bot: custom." and model == "Model for bot: fake."
            assert bot_wide == {(BOT_SCOPE, "fake", "You are EvilBot.")}
            assert "messages" in stats
        else:
            assert bot_wide == set()
            assert "messages" not in stats  # no row counts for a forged operator
    finally:
        await app.close()
