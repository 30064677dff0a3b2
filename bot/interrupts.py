"""What Ctrl-C (SIGINT) does in ``meshsage run`` and ``meshsage chat``.

Invariants:
- A person chatting in a terminal (``console`` given): Ctrl-C while an answer is being
  written stops that answer (``Responder.stop_answers``: the question is settled, never
  answered later) and the prompt comes back. A Ctrl-C at the prompt quits cleanly; a second
  Ctrl-C for the same line (the answer did not stop yet, or a command is running) quits at
  once.
- Anywhere else (a service, a piped chat): the first Ctrl-C finishes the turns in flight (up
  to ``DRAIN_SECONDS``) and stops; the next one stops at once (what was not answered is
  answered at the next start).
- The handler runs in the event loop: it only sets events and calls methods that do not
  block. Every line it says goes to ``say`` (stderr), never into an answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from bot.app import DRAIN_SECONDS


class Stoppable(Protocol):
    """What the handler needs from the responder."""

    @property
    def idle(self) -> bool: ...

    def stop_answers(self, transport: str) -> int: ...


class ConsoleKeys(Protocol):
    """What the handler needs from the console transport."""

    name: str

    @property
    def lines_read(self) -> int: ...

    def interrupted(self) -> None: ...


class Interrupts:
    """The SIGINT handler: ``loop.add_signal_handler(signal.SIGINT, interrupts)``."""

    def __init__(
        self,
        *,
        stop: asyncio.Event,
        responder: Stoppable,
        hurry: Callable[[], None],
        say: Callable[[str], None],
        console: ConsoleKeys | None = None,
        tty: bool = False,
    ) -> None:
        self._stop = stop
        self._responder = responder
        self._hurry = hurry
        self._say = say
        self._console = console
        self._tty = tty  # a terminal: say what a graceful stop waits for
        self._stopped_line = -1  # the console line whose answer Ctrl-C stopped
        self._pressed_line = -1  # the console line of the last Ctrl-C
        self.hurried = asyncio.Event()

    def __call__(self) -> None:
        if self._console is not None and not self._stop.is_set():
            self._console_key(self._console)
            return
        if not self._stop.is_set():
            self._graceful()
            return
        self._now()

    def _console_key(self, console: ConsoleKeys) -> None:
        line = console.lines_read
        again = line == self._pressed_line
        self._pressed_line = line
        if line != self._stopped_line and self._responder.stop_answers(console.name):
            self._stopped_line = line
            console.interrupted()
            return
        if self._responder.idle:  # at the prompt: quit cleanly
            self._say("")  # the shell's prompt starts on a line of its own
            self._stop.set()
            return
        if again:
            self._stop.set()
            self._now()
        else:
            self._graceful()

    def _graceful(self) -> None:
        self._stop.set()
        if self._tty and not self._responder.idle:
            self._say(
                f"\n(waiting up to {DRAIN_SECONDS:.0f} s for the answer being written; "
                "press Ctrl-C again to stop now)"
            )

    def _now(self) -> None:
        if self.hurried.is_set():
            return
        self._say("\n(stopping now; unanswered messages are answered at the next start)")
        self._hurry()
        self.hurried.set()
