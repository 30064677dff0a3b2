"""The web view's HTTP server (aiohttp, which discord.py already brings): pages, the live
stream, ``/metrics`` and the two assets.

Invariants:
- Read-only: GET and HEAD only (aiohttp answers 405 to anything else); no route changes state.
- Guarded: with a token (``web.token_env``) every request needs it: ``Authorization: Bearer``,
  the ``meshsage_web`` cookie, or ``?token=`` once (which sets the cookie and redirects to
  the same page without it). Compared with ``hmac.compare_digest`` (constant time). Without a
  token the server binds only the loopback (the config refuses anything else) and accepts only
  loopback Host headers, so a web page cannot reach it through DNS rebinding.
- Every response forbids framing and sniffing (X-Frame-Options, CSP frame-ancestors,
  nosniff), sends no referrer and is not cached.
- One sampler task (owned, stopped by ``stop``) collects a snapshot every ``web.refresh``
  seconds into the history and wakes the live streams; the streams send only fragments that
  changed (a keep-alive comment otherwise), at most ``web.max_viewers`` at once, and end when
  the server stops. Memory is flat: the history is two fixed rings, each stream holds the
  fragments it last sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from bot.config import WebConfig
from bot.errors import MeshsageError
from bot.web import pages, prom
from bot.web.assets import APP_CSS, APP_JS, CSP
from bot.web.history import History
from bot.web.model import Collects, Snapshot

log = logging.getLogger("bot.web")

COOKIE = "meshsage_web"
KEEPALIVE = 30.0  # seconds between comments on a quiet stream (proxies drop idle ones)
RETRY_MS = 5000  # EventSource reconnect delay the stream asks for
NODES_EVERY = 60.0  # the nodes table (large on a busy mesh) is re-sent at most this often
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
HEADERS = {
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": CSP,
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "Cross-Origin-Resource-Policy": "same-origin",
}


def _host_of(header: str) -> str:
    if header.startswith("["):
        return header.split("]", 1)[0] + "]"
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class WebServer:
    def __init__(
        self,
        *,
        config: WebConfig,
        token: str | None,
        collector: Collects,
        name: str = "meshsage",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._config = config
        self._token = token.encode() if token else None
        self._collector = collector
        self._name = name
        self._clock = clock
        self.history = History()
        self.snapshot: Snapshot | None = None
        self.samples = 0
        self._changed = asyncio.Event()
        self._stopping = False
        self._viewers = 0
        self._runner: web.AppRunner | None = None
        self._sampler: asyncio.Task[None] | None = None
        self._cache: dict[tuple[str, int], dict[str, str]] = {}
        self.port: int | None = None
        self.app = self._make_app()

    # --- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        """Bind and start sampling. Raises ``MeshsageError`` (with the fix) when the address
        cannot be bound."""
        await self.sample()
        runner = web.AppRunner(
            self.app, access_log=None, handle_signals=False, shutdown_timeout=1.0
        )
        await runner.setup()
        site = web.TCPSite(runner, self._config.bind, self._config.port)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            why = exc.strerror or str(exc)
            raise MeshsageError(
                f"web: cannot listen on {self._config.bind}:{self._config.port} ({why}). Fix: "
                "pick a free port (web.port) or stop what uses it, or set web.enabled: false."
            ) from None
        self._runner = runner
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or []
        self.port = sockets[0].getsockname()[1] if sockets else self._config.port
        self._sampler = asyncio.create_task(self._sample_loop(), name="web sampler")
        log.info("web view on %s", self.address)

    @property
    def address(self) -> str:
        """Where to open the view, as the operator types it: the bound address and port (this
        host's name for a bind to every interface), and who may look."""
        bind = self._config.bind
        host = socket.gethostname() if bind in ("0.0.0.0", "::", "") else bind
        host = f"[{host}]" if ":" in host else host
        who = "token required" if self._token else "loopback only"
        return f"http://{host}:{self.port or self._config.port}/ ({who})"

    async def stop(self) -> None:
        self._stopping = True
        self._wake()
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _sample_loop(self) -> None:
        while not self._stopping:
            await asyncio.sleep(self._config.refresh)
            try:
                await self.sample()
            except Exception:  # loop boundary: the view must never stop the bot; next round
                log.exception("web view: sampling failed")

    async def sample(self) -> Snapshot:
        snap = await self._collector.collect()
        self.history.add(snap)
        self.snapshot = snap
        self.samples += 1
        self._cache.clear()
        self._wake()
        return snap

    def _wake(self) -> None:
        old, self._changed = self._changed, asyncio.Event()
        old.set()

    async def _current(self) -> Snapshot:
        return self.snapshot if self.snapshot is not None else await self.sample()

    # --- the app -------------------------------------------------------------------------------
    def _make_app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard])
        for page, path in (
            ("now", "/"),
            ("airtime", "/airtime"),
            ("nodes", "/nodes"),
            ("people", "/people"),
        ):
            app.router.add_get(path, self._page_handler(page))
        app.router.add_get("/events", self._events)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/static/app.js", self._asset(APP_JS, "text/javascript"))
        app.router.add_get("/static/app.css", self._asset(APP_CSS, "text/css"))
        return app

    def _authorized(self, request: web.Request) -> bool:
        assert self._token is not None
        offered = []
        auth = request.headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            offered.append(auth[7:].strip())
        offered.append(request.cookies.get(COOKIE, ""))
        offered.append(request.query.get("token", ""))
        ok = False
        for value in offered:  # every candidate is compared: the time does not tell which
            ok |= hmac.compare_digest(value.encode(), self._token)
        return ok

    @web.middleware
    async def _guard(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[Any]]
    ) -> web.StreamResponse:
        response: web.StreamResponse
        if self._token is None and _host_of(request.host) not in LOOPBACK_HOSTS:
            response = web.Response(
                status=421, text="This web view answers only on this machine (127.0.0.1).\n"
            )
        elif self._token is not None and not self._authorized(request):
            response = web.Response(
                status=401,
                text="A token is needed. Open this address with ?token=<the value of "
                f"{self._config.token_env}> once (it is kept in a cookie), or send "
                "Authorization: Bearer <token>.\n",
                headers={"WWW-Authenticate": 'Bearer realm="meshsage"'},
            )
        elif self._token is not None and "token" in request.query:
            query = {k: v for k, v in request.query.items() if k != "token"}
            response = web.Response(
                status=303, headers={"Location": request.rel_url.with_query(query).path_qs}
            )
            response.set_cookie(
                COOKIE, self._token.decode(), httponly=True, samesite="Strict", path="/"
            )
        else:
            try:
                response = await handler(request)
            except web.HTTPException as exc:  # 404, 405, 503: answered with our headers too
                extra = {
                    k: v
                    for k, v in exc.headers.items()
                    if k.lower() not in ("content-type", "content-length")
                }
                response = web.Response(
                    status=exc.status, text=exc.text or exc.reason, headers=extra
                )
        if not response.prepared:
            response.headers.update(HEADERS)
        return response

    def _page_handler(self, page: str) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handler(request: web.Request) -> web.Response:
            snap = await self._current()
            html = pages.page_html(page, snap, self.history, name=self._name)
            return web.Response(text=html, content_type="text/html", charset="utf-8")

        return handler

    @staticmethod
    def _asset(body: str, kind: str) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handler(request: web.Request) -> web.Response:
            return web.Response(text=body, content_type=kind, charset="utf-8")

        return handler

    async def _metrics(self, request: web.Request) -> web.Response:
        snap = await self._current()
        return web.Response(
            body=prom.exposition(snap).encode(), headers={"Content-Type": prom.CONTENT_TYPE}
        )

    def _fragments(self, page: str) -> dict[str, str]:
        """This sample's fragments for ``page``, rendered once for every viewer."""
        key = (page, self.samples)
        cached = self._cache.get(key)
        if cached is None:
            assert self.snapshot is not None
            cached = pages.fragments(page, self.snapshot, self.history)
            self._cache[key] = cached
        return cached

    async def _events(self, request: web.Request) -> web.StreamResponse:
        page = request.query.get("page", "now")
        if page not in pages.PAGES:
            raise web.HTTPNotFound(text=f"no page {page!r}\n")
        if self._viewers >= self._config.max_viewers:
            raise web.HTTPServiceUnavailable(
                text=f"{self._viewers} live viewers already (web.max_viewers); try later.\n",
                headers={"Retry-After": "30"},
            )
        await self._current()
        self._viewers += 1
        resp = web.StreamResponse(
            headers={**HEADERS, "Content-Type": "text/event-stream", "X-Accel-Buffering": "no"}
        )
        sent: dict[str, str] = {}
        nodes_at = -1e18
        try:
            await resp.prepare(request)
            await resp.write(f"retry: {RETRY_MS}\n\n".encode())
            last_write = self._clock()
            while not self._stopping:
                changed = self._changed
                frags = dict(self._fragments(page))
                if "f-nodes" in frags:  # large on a busy mesh: at most once a minute
                    if self._clock() - nodes_at < NODES_EVERY and "f-nodes" in sent:
                        frags.pop("f-nodes")
                    else:
                        nodes_at = self._clock()
                delta = {k: v for k, v in frags.items() if sent.get(k) != v}
                if delta:
                    data = json.dumps(delta, separators=(",", ":"))
                    await resp.write(f"event: update\ndata: {data}\n\n".encode())
                    sent.update(delta)
                    last_write = self._clock()
                elif self._clock() - last_write >= KEEPALIVE:
                    await resp.write(b": keep-alive\n\n")
                    last_write = self._clock()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(KEEPALIVE):
                        await changed.wait()
        except (ConnectionResetError, ConnectionError):
            pass  # the viewer went away (tab closed, laptop asleep): its EventSource returns
        finally:
            self._viewers -= 1
        return resp

    @property
    def viewers(self) -> int:
        return self._viewers
