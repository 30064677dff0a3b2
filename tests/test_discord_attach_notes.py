"""Attachment notes say the real reason a file was not read, and nothing is downloaded for
nothing (issue 30's defects: a 9 MB PNG "vision is off" with vision on, the 5th image too
and downloaded, a 2 MB .log "only text files", a PNG without content type as a file, the
long-message note said twice)."""

from __future__ import annotations

import asyncio

import pytest

from bot.responder import TRIMMED_NOTE
from bot.transports.discord import DiscordTransport
from bot.transports.discord_attach import (
    CUT,
    IMAGES_NOT_READ,
    MAX_IMAGE_BYTES,
    MAX_TEXT_BYTES,
    Incoming,
    kind,
    merge,
    merge_notes,
    wants_bytes,
)
from tests.fakes.fake_discord import FakeDiscord
from tests.test_discord_transport import CONFIG, Echo, connect

PNG = b"\x89PNG\r\n\x1a\n" + b"0" * 32


@pytest.mark.parametrize(
    ("att", "data", "vision", "note"),
    [
        (Incoming("big.png", "image/png", 9_000_000), None, True, "big.png over 8 MB: not read"),
        (Incoming("big.png", "image/png", 9_000_000), None, False, IMAGES_NOT_READ),
        (Incoming("app.log", "text/plain", 2_000_000), None, True, "app.log over 1 MB: not read"),
        (Incoming("a.bin", None, 10), None, False, "only text files are read; a.bin not read"),
        (
            Incoming("odd.tiff", "image/tiff", 10),
            None,
            True,
            "odd.tiff: an image type I cannot read",
        ),
    ],
)
def test_the_note_gives_the_real_reason(
    att: Incoming, data: bytes | None, vision: bool, note: str
) -> None:
    assert not wants_bytes(att, vision=vision)
    _, said, images = merge("look", [(att, data)], budget=1000, vision=vision)
    assert said == note and images == ()


def test_a_png_without_content_type_is_an_image() -> None:
    att = Incoming("dog.png", None, len(PNG))
    assert kind(att) == "image" and wants_bytes(att, vision=True)
    text, note, images = merge("", [(att, PNG)], budget=100, vision=True)
    assert text == "[image: dog.png]" and note is None
    assert images[0].startswith("data:image/png;base64,")


def test_a_fifth_image_is_neither_downloaded_nor_blamed_on_vision() -> None:
    atts = [Incoming(f"{i}.png", "image/png", 10) for i in range(5)]
    assert [wants_bytes(a, vision=True, images_taken=i) for i, a in enumerate(atts)] == [
        True, True, True, True, False
    ]  # fmt: skip
    found = [(a, PNG if i < 4 else None) for i, a in enumerate(atts)]
    _, note, images = merge("", found, budget=100, vision=True)
    assert len(images) == 4
    assert note == "only the first 4 images are read; 4.png not read"


def test_a_cut_is_said_once() -> None:
    assert merge_notes(TRIMMED_NOTE, CUT) == TRIMMED_NOTE
    assert merge_notes(TRIMMED_NOTE, f"{CUT}; x.bin") == f"{TRIMMED_NOTE}; x.bin"
    assert merge_notes(None, CUT) == CUT
    assert MAX_IMAGE_BYTES == 8_000_000 and MAX_TEXT_BYTES == 1_000_000


async def test_five_images_with_vision_download_four(fake_discord: FakeDiscord) -> None:
    echo = Echo()
    transport: DiscordTransport = await connect(
        fake_discord, echo, CONFIG.model_copy(update={"stream": False}), vision=True
    )
    try:
        msg = fake_discord.dm_message("what are these?")
        msg["attachments"] = [fake_discord.attachment(f"{i}.png", PNG, "image/png")
                              for i in range(5)]  # fmt: skip
        await fake_discord.say(msg)
        [sent] = await fake_discord.wait_sent(1)
        assert len(fake_discord.cdn_reads) == 4
        assert len(echo.inbox[0].images) == 4
        assert "only the first 4 images are read; 4.png not read" in sent.content
        assert "vision is off" not in sent.content
    finally:
        await transport.stop()
        await asyncio.wait_for(transport.wait_closed(), 5)
