"""Console transport: the local terminal as a chat, person = the local user, transport
``console``.

Invariants:
- Interactive (a terminal): prompt, read a line, wait for the answer, print it, repeat.
- Scripted (stdin not a terminal): one message per line; each answer is printed before the
  next line is read; at end of input the transport closes after the last answer.
- Input bytes that are not valid UTF-8 are replaced (U+FFFD), never fatal.
- Attachments (``!export``) are written under ``export_dir`` and their paths printed;
  ``!forget`` deletes them again (``forget``).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import os
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import IO

from bot.domain import (
    DM_SPACE,
    Delivery,
    DeliveryStatus,
    Inbound,
    Reply,
    ReplyKind,
    TransportLimits,
)
from bot.transports.base import OnMessage

log = logging.getLogger("bot.transport.console")

CONSOLE_MAX_CHARS = 8000  # a terminal has no hard limit; keep answers readable


class ConsoleTransport:
    name = "console"

    def __init__(
        self,
        *,
        user: str,
        context_tokens: int,
        max_tokens: int,
        wait_idle: Callable[[], Awaitable[None]],
        export_dir: Path,
        stdin: IO[bytes] | None = None,
        stdout: IO[str] | None = None,
        interactive: bool | None = None,
    ) -> None:
        self.limits = TransportLimits(
            context_tokens=context_tokens,
            max_tokens=max_tokens,
            style_hint="Answer in a few short paragraphs at most.",
        )
        self._user = user
        self._wait_idle = wait_idle
        self._export_dir = export_dir
        self._stdin = stdin if stdin is not None else sys.stdin.buffer
        self._stdout = stdout if stdout is not None else sys.stdout
        self._interactive = interactive if interactive is not None else _isatty(self._stdin)
        self._task: asyncio.Task[None] | None = None
        self._closed = asyncio.Event()
        self._counter = 0
        self._lines: asyncio.Queue[bytes] = asyncio.Queue()
        self._pump: threading.Thread | None = None

    def fit(self, text: str) -> str:
        if len(text) <= CONSOLE_MAX_CHARS:
            return text
        return text[: CONSOLE_MAX_CHARS - 1] + "…"

    @contextlib.asynccontextmanager
    async def working(self, inbound: Inbound) -> AsyncIterator[None]:
        yield

    async def start(self, on_message: OnMessage) -> None:
        loop = asyncio.get_running_loop()
        lines = self._lines

        def pump() -> None:
            # A daemon thread reading the raw descriptor: a read blocked at exit holds no
            # Python lock (a blocked BufferedReader.readline would abort interpreter shutdown).
            for raw in _raw_lines(self._stdin):
                loop.call_soon_threadsafe(lines.put_nowait, raw)
            loop.call_soon_threadsafe(lines.put_nowait, b"")

        self._pump = threading.Thread(target=pump, name="console stdin", daemon=True)
        self._pump.start()
        self._task = asyncio.create_task(self._read_loop(on_message), name="console reader")

    async def _read_loop(self, on_message: OnMessage) -> None:
        try:
            if self._interactive:
                self._print(
                    f"meshsage console; you are '{self._user}'. !help for commands, Ctrl-D to quit."
                )
            while True:
                if self._interactive:
                    self._stdout.write("you> ")
                    self._stdout.flush()
                raw = await self._lines.get()
                if not raw:
                    break
                text = raw.decode("utf-8", "replace").rstrip("\r\n")
                if not text.strip() and not self._interactive:
                    continue  # blank lines in a script separate nothing
                self._counter += 1
                await on_message(
                    Inbound(
                        transport=self.name,
                        sender=self._user,
                        sender_name=self._user,
                        space=DM_SPACE,
                        text=text,
                        message_id=f"console-{self._counter}",
                    )
                )
                await self._wait_idle()
        except Exception:  # loop boundary: a broken terminal ends the console, not the bot
            log.exception("console input failed")
        finally:
            self._closed.set()

    async def send(self, reply: Reply) -> Delivery:
        prefix = "meshsage> " if self._interactive else ""
        text = reply.text
        if reply.note:
            text += f"\n({reply.note})"
        for att in reply.attachments:
            path = self._write_attachment(att.filename, att.data)
            text += f"\n[saved {path}]"
        if reply.kind is ReplyKind.NOTICE and self._interactive:
            prefix = "meshsage (notice)> "
        try:
            self._print(prefix + text)
        except (OSError, ValueError) as exc:
            return Delivery(DeliveryStatus.FAILED, detail=str(exc))
        return Delivery(DeliveryStatus.DELIVERED, message_ids=(f"console-out-{id(reply)}",))

    def forget(self, person: str) -> int:
        """``!forget``: delete the export files written for the console user."""
        if person != self._user or not self._export_dir.is_dir():
            return 0
        removed = 0
        for path in self._export_dir.glob("meshsage-export-console.*"):
            with contextlib.suppress(OSError):
                path.unlink()
                removed += 1
        return removed

    def _write_attachment(self, filename: str, data: bytes) -> Path:
        self._export_dir.mkdir(parents=True, exist_ok=True)
        path = self._export_dir / filename
        path.write_bytes(data)
        return path

    def _print(self, text: str) -> None:
        self._stdout.write(text + "\n")
        self._stdout.flush()

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()  # the reader thread blocked in readline stays until input/EOF
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._closed.set()

    async def wait_closed(self) -> None:
        await self._closed.wait()


def _isatty(stream: IO[bytes]) -> bool:
    try:
        return stream.isatty()
    except (ValueError, io.UnsupportedOperation):
        return False


def _raw_lines(stream: IO[bytes]) -> Iterator[bytes]:
    """Lines (with their newline) from ``stream``'s file descriptor, or from the stream itself
    when it has none (tests pass BytesIO)."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError, io.UnsupportedOperation):
        yield from iter(stream.readline, b"")
        return
    pending = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            if pending:
                yield pending
            return
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for line in complete:
            yield line + b"\n"
