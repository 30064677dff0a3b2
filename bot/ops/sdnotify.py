"""systemd's notification protocol (sd_notify), spoken directly over the datagram socket.

Invariants:
- No dependency: one ``AF_UNIX``/``SOCK_DGRAM`` send per message to ``$NOTIFY_SOCKET`` (a path,
  or ``@name`` for the abstract namespace). Without the variable every call does nothing, so the
  same code runs in a terminal, a container and under systemd.
- Sending never raises: a failed notification is logged once at WARNING and never stops the bot.
- ``watchdog_interval`` honours ``WATCHDOG_USEC`` and ``WATCHDOG_PID`` (the pings must come from
  the main process).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

log = logging.getLogger("bot.ops.sdnotify")


class Notifier:
    def __init__(self, *, env: Mapping[str, str]) -> None:
        address = env.get("NOTIFY_SOCKET", "")
        self._address = "\0" + address[1:] if address.startswith("@") else address
        self._sock: socket.socket | None = None
        self._warned = False
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        mine = not pid or pid == str(os.getpid())
        self.watchdog_interval: float | None = (
            int(usec) / 1e6 if usec.isdigit() and int(usec) > 0 and mine else None
        )

    @property
    def enabled(self) -> bool:
        return bool(self._address)

    def notify(self, *lines: str) -> bool:
        """Send ``KEY=value`` lines as one datagram; True when it was sent."""
        if not self._address:
            return False
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto("\n".join(lines).encode("utf-8"), self._address)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                log.warning("cannot notify systemd at %s: %s", self._address, exc)
            return False
        return True

    def ready(self, status: str) -> bool:
        return self.notify("READY=1", f"STATUS={status}")

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")

    def status(self, status: str) -> bool:
        return self.notify(f"STATUS={status}")

    def stopping(self, status: str = "stopping: finishing replies in flight") -> bool:
        return self.notify("STOPPING=1", f"STATUS={status}")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
