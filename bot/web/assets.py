"""The web view's only assets, served by the bot itself (field Pis are offline: no CDN, no
build step, no fonts or images from anywhere else).

Invariants:
- ``APP_JS`` is the whole client: it opens one server-sent-events stream for the page, swaps
  the fragments the server sends into the elements with the same ids, and reconnects after any
  error (a bot restart, a closed laptop, a week on a wall screen) with a capped back-off. It
  keeps no history, so a page left open for days holds only what is on screen.
- ``APP_CSS`` is small, mobile-first, and follows the system's light or dark scheme.
- The Content-Security-Policy allows scripts, styles and connections from the bot only.
"""

from __future__ import annotations

APP_JS = r"""'use strict';
(function () {
  var page = document.body.getAttribute('data-page');
  var badge = document.getElementById('live');
  var source = null, wait = 2000, timer = null;
  function show(text, on) {
    if (badge) { badge.textContent = text; badge.className = on ? 'live on' : 'live off'; }
  }
  function apply(ev) {
    var parts = JSON.parse(ev.data);
    for (var id in parts) {
      var el = document.getElementById(id);
      if (el) { el.innerHTML = parts[id]; }
    }
    wait = 2000;
    show('live', true);
    document.body.setAttribute('data-updates',
      String(Number(document.body.getAttribute('data-updates') || '0') + 1));
  }
  function connect() {
    timer = null;
    if (!window.EventSource) { show('no live updates in this browser', false); return; }
    source = new EventSource('events?page=' + encodeURIComponent(page));
    source.addEventListener('update', apply);
    source.onopen = function () { show('live', true); };
    source.onerror = function () {
      show('reconnecting', false);
      if (source.readyState === EventSource.CLOSED && timer === null) {
        source = null;  // the server refused (restarting, too many viewers): try again later
        timer = setTimeout(connect, wait);
        wait = Math.min(wait * 2, 60000);
      }
    };
  }
  connect();
})();
"""

APP_CSS = """
:root { color-scheme: light dark; --fg: #1b1f24; --bg: #fafafa; --muted: #6a737d;
  --card: #fff; --line: #d0d7de; --bad: #c62828; --ok: #2e7d32; --warn: #b26a00;
  --a: #1565c0; --b: #ef6c00; --c: #6a1b9a; --d: #2e7d32; }
@media (prefers-color-scheme: dark) { :root { --fg: #e6edf3; --bg: #0d1117; --muted: #8b949e;
  --card: #161b22; --line: #30363d; --a: #58a6ff; --b: #ffa657; --c: #d2a8ff; --d: #56d364; } }
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.45 system-ui, sans-serif; color: var(--fg); background: var(--bg); }
header { padding: .6rem 1rem; border-bottom: 1px solid var(--line); background: var(--card); }
header h1 { font-size: 1.05rem; margin: 0 .6rem 0 0; display: inline; }
nav a { margin-right: .8rem; color: var(--a); text-decoration: none; white-space: nowrap; }
nav a.here { font-weight: 600; text-decoration: underline; }
main { padding: .6rem 1rem 2rem; max-width: 60rem; }
section { background: var(--card); border: 1px solid var(--line); border-radius: 6px;
  padding: .6rem .8rem; margin: .7rem 0; overflow-x: auto; }
h2 { font-size: 1rem; margin: 0 0 .4rem; }
table { border-collapse: collapse; width: 100%; font-size: .9rem; }
th, td { text-align: left; padding: .2rem .5rem .2rem 0; border-bottom: 1px solid var(--line);
  white-space: nowrap; }
td.num, th.num { text-align: right; }
.muted, .axis, .limit-label { color: var(--muted); fill: var(--muted); }
.bad { color: var(--bad); font-weight: 600; } .ok { color: var(--ok); font-weight: 600; }
.warn { color: var(--warn); }
.live { font-size: .8rem; margin-left: .5rem; } .live.on { color: var(--ok); }
.live.off { color: var(--warn); }
svg.chart { width: 100%; height: auto; max-height: 16rem; display: block; }
svg .grid { stroke: var(--line); stroke-width: 1; }
svg .axis, svg .limit-label { font-size: 14px; }
svg .limit { stroke: var(--bad); stroke-dasharray: 5 4; stroke-width: 1.2; }
svg path.series { fill: none; stroke-width: 2; vector-effect: non-scaling-stroke; }
.s-channel { stroke: var(--a); fill: var(--a); color: var(--a); }
.s-bot_share { stroke: var(--b); fill: var(--b); color: var(--b); }
.s-others { stroke: var(--c); fill: var(--c); color: var(--c); }
.s-latency, .s-answers { stroke: var(--d); fill: var(--d); color: var(--d); }
.s-first_part { stroke: var(--a); fill: var(--a); color: var(--a); }
.s-notices, .s-hold_channel { stroke: var(--b); fill: var(--b); color: var(--b); }
.s-limited, .s-hold_duty { stroke: var(--c); fill: var(--c); color: var(--c); }
svg path.series { fill: none; }
.legend { font-size: .8rem; margin: .1rem 0 .3rem; }
.legend .key { margin-right: .8rem; fill: none; }
.legend .key::before { content: "\\25A0 "; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: .15rem .8rem; margin: 0; }
dt { color: var(--muted); } dd { margin: 0; }
"""

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)
