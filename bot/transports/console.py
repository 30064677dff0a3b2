"""Console transport: the local terminal as a chat, person = the local user, transport
``console``.

Invariants:
- Interactive (a terminal): prompt, read a line, wait for the answer, print it, repeat.
- Scripted (stdin not a terminal): one message per line; each answer is printed before the
  next line is read; at end of input the transport closes after the last answer.
- Input bytes that are not valid UTF-8 are replaced (U+FFFD), never fatal.
- Attachments (``!export``) are written under ``export_dir`` (0700) as 0600 files and their
  paths printed; ``!forget`` deletes them again (``forget``).
- On a terminal, lines are read with readline (arrow keys edit, history kept in
  ``history_file``, 0600) and the prompt is drawn only after the previous answer, so it never
  lands in the middle of one; "thinking..." shows while the model works and is erased before
  the answer. The terminal's settings are restored at stop, and again at interpreter exit
  (``atexit``: whatever ends the process, the shell gets its echo back).
- Ctrl-C is the CLI's (``bot.interrupts``): it stops the answer being written and asks
  ``interrupted`` to say so; the reader then draws the prompt again.
- A line reaches the history file only once it has been handled, and only when ``keep_line``
  said yes both before and after (the person was not incognito): an incognito line, and the
  ``!incognito`` lines around it, are dropped from the in-memory history too and never
  written. ``!forget`` deletes the file and clears the in-memory history.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import io
import logging
import os
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import IO, Any

from bot.domain import (
    DM_SPACE,
    Delivery,
    DeliveryStatus,
    Inbound,
    Reply,
    ReplyKind,
    TransportLimits,
)
from bot.files import private_dir
from bot.transports.base import OnMessage, TransportHealth

log = logging.getLogger("bot.transport.console")

CONSOLE_MAX_CHARS = 8000  # a terminal has no hard limit; keep answers readable
PROMPT = "you> "
THINKING = "meshsage is thinking... (Ctrl-C to stop)"
STOPPED = "(stopped. Ask again, or press Ctrl-C again to quit.)"
HISTORY_LINES = 1000


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
        history_file: Path | None = None,
        keep_line: Callable[[], Awaitable[bool]] | None = None,
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
        # Unique across runs and processes: a store drops a message id it heard before.
        self._id_prefix = f"console-{os.getpid()}-{time.time_ns():x}"
        self._lines: asyncio.Queue[bytes] = asyncio.Queue()
        self._pump: threading.Thread | None = None
        self._history = history_file
        self._keep_line = keep_line  # False while the console user is incognito
        self._pending = False  # pump: a line went into readline's memory, awaiting a verdict
        self._verdict = False  # reader: the handled line may be written to the history file
        # readline only on the real terminal (tests hand in their own streams)
        self._readline = self._interactive and stdin is None and _isatty(sys.stdin)
        self._want_line = threading.Event()  # the reader asks the pump for the next line
        self._thinking = False
        self._tty_state: Any = None

    def fit(self, text: str) -> str:
        if len(text) <= CONSOLE_MAX_CHARS:
            return text
        return text[: CONSOLE_MAX_CHARS - 1] + "…"

    @contextlib.asynccontextmanager
    async def working(self, inbound: Inbound) -> AsyncIterator[None]:
        if self._interactive:
            self._stdout.write(THINKING)
            self._stdout.flush()
            self._thinking = True
        try:
            yield
        finally:
            self._erase_thinking()

    @property
    def lines_read(self) -> int:
        """Lines the person sent so far (the CLI's Ctrl-C counts its presses per line)."""
        return self._counter

    def interrupted(self) -> None:
        """The answer being written was stopped (Ctrl-C): say so where it would have been."""
        self._erase_thinking()
        with contextlib.suppress(OSError, ValueError):
            self._print(STOPPED)

    def _erase_thinking(self) -> None:
        if self._thinking:
            self._thinking = False
            with contextlib.suppress(OSError, ValueError):
                self._stdout.write("\r\033[K")
                self._stdout.flush()

    async def start(self, on_message: OnMessage) -> None:
        loop = asyncio.get_running_loop()
        lines = self._lines
        if self._readline:
            self._tty_state = _tty_state()
            atexit.register(_restore_tty, self._tty_state)
            self._pump = threading.Thread(
                target=self._pump_readline, args=(loop,), name="console stdin", daemon=True
            )
            self._pump.start()
            self._task = asyncio.create_task(self._read_loop(on_message), name="console reader")
            return

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
                if self._readline:
                    self._want_line.set()  # the pump draws the prompt and reads one line
                elif self._interactive:
                    self._stdout.write(PROMPT)
                    self._stdout.flush()
                raw = await self._lines.get()
                if not raw:
                    break
                text = raw.decode("utf-8", "replace").rstrip("\r\n")
                if not text.strip() and not self._interactive:
                    continue  # blank lines in a script separate nothing
                self._counter += 1
                keep = await self._may_keep()
                await on_message(
                    Inbound(
                        transport=self.name,
                        sender=self._user,
                        sender_name=self._user,
                        space=DM_SPACE,
                        text=text,
                        message_id=f"{self._id_prefix}-{self._counter}",
                        authenticated=True,  # the machine's own user (bot.trust)
                    )
                )
                await self._wait_idle()
                self._verdict = keep and bool(text.strip()) and await self._may_keep()
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
        self._erase_thinking()
        try:
            self._print(prefix + text)
        except (OSError, ValueError) as exc:
            return Delivery(DeliveryStatus.FAILED, detail=str(exc))
        return Delivery(DeliveryStatus.DELIVERED, message_ids=(f"console-out-{id(reply)}",))

    async def _may_keep(self) -> bool:
        """May the line go to the history file? No while incognito, nor when that cannot be
        read (kept out is the safe side)."""
        if self._keep_line is None:
            return True
        try:
            return await self._keep_line()
        except Exception:  # a store error must not end the console; the line is just not kept
            log.debug("console history: incognito state unreadable; line not kept")
            return False

    def forget(self, person: str) -> int:
        """``!forget``: delete the export files written for the console user, and the line
        history (it holds what they typed)."""
        if person != self._user:
            return 0
        removed = 0
        if self._history is not None and self._history.exists():
            with contextlib.suppress(OSError):
                self._history.unlink()
                removed += 1
            if self._readline:
                with contextlib.suppress(ImportError):
                    import readline

                    readline.clear_history()
        if not self._export_dir.is_dir():
            return removed
        for path in self._export_dir.glob("meshsage-export-console.*"):
            with contextlib.suppress(OSError):
                path.unlink()
                removed += 1
        return removed

    def _write_attachment(self, filename: str, data: bytes) -> Path:
        private_dir(self._export_dir)
        path = self._export_dir / filename
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(path, 0o600)  # an older export of the same name may have been 0644
        return path

    def _pump_readline(self, loop: asyncio.AbstractEventLoop) -> None:
        """Thread: one ``input()`` per request from the reader, with readline editing."""
        lines = self._lines
        readline = _load_readline(self._history)
        try:
            while True:
                self._want_line.wait()
                self._want_line.clear()
                self._settle_last(readline)
                try:
                    line = input(PROMPT)
                except EOFError:
                    self._print("")
                    break
                except (UnicodeDecodeError, OSError, ValueError) as exc:
                    log.warning("console input unreadable (%s); stopping the console", exc)
                    break
                self._pending, self._verdict = bool(line), False  # settled once handled
                loop.call_soon_threadsafe(
                    lines.put_nowait, (line + "\n").encode("utf-8", "replace")
                )
        finally:
            loop.call_soon_threadsafe(lines.put_nowait, b"")

    def _settle_last(self, readline: Any) -> None:
        """Pump thread, before the next prompt: write the handled line to the history file,
        or take it out of readline's memory (incognito; not written)."""
        pending, self._pending = self._pending, False
        if readline is None or not pending:
            return
        if self._verdict and self._history is not None:
            _append_history(readline, self._history)
        elif not self._verdict:
            _drop_last(readline)

    def _print(self, text: str) -> None:
        self._stdout.write(text + "\n")
        self._stdout.flush()

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()  # the reader thread blocked in readline stays until input/EOF
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._erase_thinking()
        _restore_tty(self._tty_state)  # readline may hold the terminal in its own mode
        self._closed.set()

    def health(self) -> TransportHealth:
        """Running until its input ends (EOF) or it is stopped."""
        return TransportHealth(link="closed" if self._closed.is_set() else "running")

    async def wait_closed(self) -> None:
        await self._closed.wait()


def _load_readline(history: Path | None) -> Any:
    """The readline module with the history loaded, or None where it does not exist."""
    try:
        import readline
    except ImportError:  # not on every platform; plain input() still works
        return None
    readline.set_history_length(HISTORY_LINES)
    if history is not None:
        with contextlib.suppress(OSError):
            readline.read_history_file(history)
    return readline


def _drop_last(readline: Any) -> None:
    with contextlib.suppress(ValueError, AttributeError):
        n = readline.get_current_history_length()
        if n:
            readline.remove_history_item(n - 1)


def _append_history(readline: Any, history: Path) -> None:
    try:
        if not history.exists():
            os.close(os.open(history, os.O_WRONLY | os.O_CREAT, 0o600))
        readline.append_history_file(1, history)
        readline.set_history_length(HISTORY_LINES)
    except OSError as exc:
        log.debug("console history not saved: %s", exc)


def _tty_state() -> Any:
    try:
        import termios

        return termios.tcgetattr(sys.stdin.fileno())
    except (ImportError, OSError, ValueError):
        return None


def _restore_tty(state: Any) -> None:
    if state is None:
        return
    with contextlib.suppress(ImportError, OSError, ValueError):
        import termios

        termios.tcsetattr(sys.stdin.fileno(), termios.TCSADRAIN, state)


def _isatty(stream: IO[bytes] | IO[str]) -> bool:
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
