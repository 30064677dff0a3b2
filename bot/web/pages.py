"""The four pages as server-rendered HTML: Now, Airtime, Nodes heard, People and queues.

Each page is a set of *fragments* (element id -> inner HTML); the full page wraps them in the
layout, and the live stream (``bot.web.server``) sends the fragments that changed.

Invariants:
- Pure: from a ``Snapshot`` (and the ``History``) to strings; every value from outside is
  escaped. No message text exists in a snapshot, so none can reach a page.
- The Now page shows the lines ``meshsage status`` prints (``bot.ops.status.render``), so the
  browser and the terminal tell the same truth.
- The People page shows counts only (no person, no space, no text).
- Without a radio the Airtime and Nodes pages say so in one sentence, with no empty charts
  or cards.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from html import escape

from bot.ops import status as status_file
from bot.web.charts import Limit, Line, bar_chart, line_chart
from bot.web.history import Bucket, History, Ring
from bot.web.model import Snapshot

PAGES = {"now": "Now", "airtime": "Airtime", "nodes": "Nodes heard", "people": "People and queues"}
PATHS = {"now": "./", "airtime": "airtime", "nodes": "nodes", "people": "people"}
NO_RADIO = (
    "No radio is configured (no meshtastic: section, or it is disabled), so there is no airtime "
    "to show. Fix: add a meshtastic: section to the config (docs/meshtastic.md)."
)


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(max(0.0, seconds))
    if s < 90:
        return f"{s} s ago"
    if s < 5400:
        return f"{s // 60} min ago"
    if s < 172_800:
        return f"{s // 3600} h ago"
    return f"{s // 86_400} d ago"


def _when(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(epoch))


def _sec(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f} s"


def _pct(v: float | None) -> str:
    return "not reported" if v is None else f"{v:.1f}%"


def _dl(rows: list[tuple[str, str]]) -> str:
    return "<dl>" + "".join(f"<dt>{escape(k)}</dt><dd>{v}</dd>" for k, v in rows) + "</dl>"


# --- Now ---------------------------------------------------------------------------------------
def now_fragments(snap: Snapshot) -> dict[str, str]:
    st = snap.status
    lines, ok = status_file.render(st, now=snap.at)
    state = '<span class="ok">healthy</span>' if ok else '<span class="bad">NOT HEALTHY</span>'
    rows = "".join(
        f"<tr><td>{escape(name)}</td><td>{escape(t.link)}</td>"
        f"<td>{'ok' if t.ok else '<span class=bad>loop not ok</span>'}</td>"
        f'<td class="num">{t.outbox}</td><td>{escape(t.detail)}</td></tr>'
        for name, t in sorted(st.transports.items())
    )
    problems = "".join(f'<li class="bad">{escape(p)}</li>' for p in st.problems)
    health = (
        f"<p>{state} &middot; version {escape(st.version)} &middot; pid {st.pid} &middot; "
        f"up {escape(status_file._age(st.written_at - st.started_at))}</p>"
        + (f"<ul>{problems}</ul>" if problems else "")
        + "<table><tr><th>transport</th><th>link</th><th>loops</th><th class=num>outbox</th>"
        f"<th>why</th></tr>{rows}</table>"
        + "<details><summary>as <code>meshsage status</code> prints it</summary><pre>"
        + escape("\n".join(lines))
        + "</pre></details>"
    )
    ctx = ", ".join(f"{escape(k)} {v}" for k, v in sorted(snap.context_tokens.items()))
    llm = _dl(
        [
            (
                "reachable",
                {
                    None: "no call yet",
                    True: '<span class="ok">yes</span> (the latest call answered)',
                    False: '<span class="bad">no</span> (the latest call '
                    "failed; see the last errors)",
                }[snap.llm_last_ok],
            ),
            ("model", escape(snap.model)),
            (
                "latency",
                f"p50 {_sec(st.llm_p50_seconds)}, p95 {_sec(st.llm_p95_seconds)} "
                f"(last {st.llm_calls} calls)",
            ),
            ("calls", f"{snap.llm_total} answered, {snap.llm_failures} failed since start"),
            (
                "queue",
                f"{snap.turns_waiting} turn(s) queued or running for "
                f"{snap.people_waiting} person(s)",
            ),
            ("context window", f"{ctx} tokens (configured per transport)" if ctx else "-"),
        ]
    )
    backup = snap.last_backup
    store = _dl(
        [
            ("store", escape(st.store or "-")),
            ("size", f"{st.database_bytes / 1e6:.1f} MB"),
            (
                "last backup",
                "none yet (the daily timer writes one; or: meshsage backup DIR/)"
                if backup is None
                else f"{escape(backup[0])} ({_ago(snap.at - backup[1])})",
            ),
            ("today", f"{st.messages_in_today} in, {st.messages_out_today} out"),
        ]
        + (
            [("problem", f'<span class="bad">{escape(snap.store_problem)}</span>')]
            if snap.store_problem
            else []
        )
    )
    errors = (
        "<ul>"
        + "".join(
            f"<li><span class=muted>{escape(_when(at))}</span> {escape(text)}</li>"
            for at, text in reversed(snap.errors)
        )
        + "</ul>"
        if snap.errors
        else "<p class=muted>No errors since start.</p>"
    )
    return {"f-health": health, "f-llm": llm, "f-store": store, "f-errors": errors}


def now_body(f: dict[str, str]) -> str:
    return (
        f'<section><h2>Health</h2><div id="f-health">{f["f-health"]}</div></section>'
        f'<section><h2>LLM</h2><div id="f-llm">{f["f-llm"]}</div></section>'
        f'<section><h2>Store</h2><div id="f-store">{f["f-store"]}</div></section>'
        f'<section><h2>Last errors</h2><div id="f-errors">{f["f-errors"]}</div></section>'
    )


# --- Airtime -----------------------------------------------------------------------------------
def _values(ring: Ring, now: float, pick: Callable[[Bucket], float | None]) -> list[float | None]:
    return [None if b is None else pick(b) for b in ring.series(now)]


def airtime_fragments(snap: Snapshot, history: History) -> dict[str, str]:
    m = snap.mesh
    if m is None:
        empty = f"<p>{escape(NO_RADIO)}</p>"
        return {"f-air-now": empty, "f-air-hour": "", "f-air-day": "", "f-air-counts": ""}
    now_rows = [
        ("link", escape(m.link)),
        ("channel utilisation", f"{_pct(m.channel_utilization)} (limit {m.channel_limit:g}%)"),
        ("others on the channel", _pct(m.others)),
        ("bot's airtime, last hour", f"{m.bot_hour_share:.2f}% (duty cycle {m.duty_cycle:g}%)"),
        ("node's TX, last hour", _pct(m.air_util_tx)),
        ("holding now", f'<span class="warn">{escape(m.holding)}</span>' if m.holding else "no"),
        (
            "holds since start",
            f"{m.holds.get('hold', 0)} channel busy, {m.holds.get('duty', 0)} duty cycle spent",
        ),
        ("outbox", f"{m.outbox_waiting} repl(ies) waiting to go on air"),
        (
            "unconfirmed senders, last hour",
            f"{m.stranger_airtime:.0f} of {m.stranger_allowance:.0f} s on air; "
            f"{m.strangers_refused} repl(ies) not sent since start",
        ),
    ]
    limits = [Limit("channel limit", m.channel_limit), Limit("duty cycle", m.duty_cycle)]
    charts = {}
    for key, ring, left in (("hour", history.hour, "-60 min"), ("day", history.day, "-24 h")):
        lines = [
            Line("channel utilisation", "channel", _values(ring, snap.at, _mean("channel"))),
            Line("others", "others", _values(ring, snap.at, _mean("others"))),
            Line("bot's airtime (hour)", "bot_share", _values(ring, snap.at, _mean("bot_share"))),
        ]
        charts[f"f-air-{key}"] = line_chart(
            f"chart-{key}",
            f"Airtime, last {'hour' if key == 'hour' else 'day'}",
            lines,
            limits=limits,
            left=left,
        )
    day = history.day
    counts = bar_chart(
        "chart-counts",
        "Answers, notices and holds per 15 minutes, last day",
        [
            Line("answers", "answers", _values(day, snap.at, _count("answers"))),
            Line("notices", "notices", _values(day, snap.at, _count("notices"))),
            Line("holds: channel", "hold_channel", _values(day, snap.at, _count("hold_channel"))),
            Line("holds: duty", "hold_duty", _values(day, snap.at, _count("hold_duty"))),
        ],
        left="-24 h",
    )
    hour = history.hour.series(snap.at)
    answers = sum(b.counts.get("answers", 0) for b in hour if b is not None)
    notices = sum(b.counts.get("notices", 0) for b in hour if b is not None)
    latency = line_chart(
        "chart-latency",
        "Time to reply, last day",
        [
            Line(
                "message to first part sent",
                "first_part",
                _values(day, snap.at, _mean("first_part")),
            ),
            Line("message to whole reply sent", "latency", _values(day, snap.at, _mean("latency"))),
        ],
        unit="s",
        floor=5.0,
        left="-24 h",
    )
    charts["f-air-counts"] = (
        f"<p>Last hour: <b id=answers-hour>{answers}</b> answers, {notices} notices.</p>"
        + counts
        + latency
    )
    return {"f-air-now": _dl(now_rows), **charts}


def _mean(name: str) -> Callable[[Bucket], float | None]:
    return lambda b: b.mean(name)


def _count(name: str) -> Callable[[Bucket], float | None]:
    return lambda b: float(b.counts.get(name, 0))


def airtime_body(f: dict[str, str]) -> str:
    if not f["f-air-hour"]:  # no radio: the sentence that says so, no empty cards below it
        return f'<section><div id="f-air-now">{f["f-air-now"]}</div></section>'
    return (
        f'<section><h2>Now</h2><div id="f-air-now">{f["f-air-now"]}</div></section>'
        f'<section><h2>Last hour</h2><div id="f-air-hour">{f["f-air-hour"]}</div></section>'
        f'<section><h2>Last day</h2><div id="f-air-day">{f["f-air-day"]}</div></section>'
        f'<section><h2>Answers, notices, holds</h2><div id="f-air-counts">{f["f-air-counts"]}'
        "</div></section>"
    )


# --- Nodes -------------------------------------------------------------------------------------
def nodes_fragments(snap: Snapshot) -> dict[str, str]:
    m = snap.mesh
    if m is None:
        return {"f-nodes": f"<p>{escape(NO_RADIO.replace('airtime', 'node list'))}</p>"}
    head = (
        "<tr><th>id</th><th>name</th><th>last heard</th><th class=num>SNR</th>"
        "<th class=num>RSSI</th><th class=num>hops</th><th class=num>battery</th>"
        "<th class=num>from</th><th class=num>to</th></tr>"
    )

    def cell(v: object, fmt: str = "{}") -> str:
        return '<td class="num">' + ("-" if v is None else escape(fmt.format(v))) + "</td>"

    rows = "".join(
        f"<tr><td><code>{escape(n.id)}</code></td><td>{escape(n.name)}</td>"
        f"<td>{escape(_when(n.last_heard))}</td>{cell(n.snr, '{:.1f}')}{cell(n.rssi)}"
        f"{cell(n.hops)}{cell(None if n.battery is None else ('powered' if n.battery > 100 else f'{n.battery}%'))}"  # noqa: E501
        f"{cell(n.from_node)}{cell(n.to_node)}</tr>"
        for n in m.nodes
    )
    return {
        "f-nodes": f"<p><b id=node-count>{len(m.nodes)}</b> node(s) heard (newest first). "
        "<span class=muted>from/to: messages to and from the bot since it started.</span></p>"
        f"<table>{head}{rows}</table>"
    }


def nodes_body(f: dict[str, str]) -> str:
    return f'<section><h2>Nodes heard</h2><div id="f-nodes">{f["f-nodes"]}</div></section>'


# --- People and queues ---------------------------------------------------------------------------
def people_fragments(snap: Snapshot) -> dict[str, str]:
    rows = "".join(
        f"<tr><td>{escape(o.state)}</td><td class=num>{o.rows}</td>"
        f"<td>{'-' if o.oldest_age is None else escape(_ago(o.oldest_age))}</td></tr>"
        for o in snap.outbox
    )
    t = snap.totals
    held = snap.mesh.outbox_waiting if snap.mesh else 0
    people = _dl(
        [
            (
                "people waiting",
                f"<b id=people-waiting>{snap.people_waiting}</b> "
                f"({snap.turns_waiting} turn(s) queued or running)",
            ),
            ("rate-limited", f"{t.get('limited', 0)} message(s) over a limit since start"),
            (
                "held on the radio",
                f"{held} repl(ies) waiting for airtime"
                + (f" ({escape(snap.mesh.holding)})" if snap.mesh and snap.mesh.holding else ""),
            ),
            ("answered", f"{t.get('answers', 0)} since start; {t.get('notices', 0)} notices"),
        ]
    )
    where = f"this gateway's rows ({escape(snap.gateway)})" if snap.gateway else "all rows"
    outbox = (
        f"<p class=muted>The durable outbox, {where}: replies by state, with the age of the "
        "oldest. No text is shown.</p><table><tr><th>state</th><th class=num>rows</th>"
        f"<th>oldest</th></tr>{rows}</table>"
        + (f'<p class="bad">{escape(snap.store_problem)}</p>' if snap.store_problem else "")
    )
    return {"f-people": people, "f-outbox": outbox}


def people_body(f: dict[str, str]) -> str:
    return (
        f'<section><h2>People</h2><div id="f-people">{f["f-people"]}</div></section>'
        f'<section><h2>Outbox</h2><div id="f-outbox">{f["f-outbox"]}</div></section>'
    )


# --- layout --------------------------------------------------------------------------------------
def header_fragment(snap: Snapshot) -> str:
    if snap.gateway is None:
        return ""
    others = ", ".join(f"{escape(n)} ({_ago(age)})" for n, age in snap.other_gateways)
    return f"gateway <b>{escape(snap.gateway)}</b>; other gateways on this store: " + (
        others or "none seen in the last day"
    )


def fragments(page: str, snap: Snapshot, history: History) -> dict[str, str]:
    if page == "airtime":
        out = airtime_fragments(snap, history)
    elif page == "nodes":
        out = nodes_fragments(snap)
    elif page == "people":
        out = people_fragments(snap)
    else:
        out = now_fragments(snap)
    out["f-gateways"] = header_fragment(snap)
    return out


BODIES = {"now": now_body, "airtime": airtime_body, "nodes": nodes_body, "people": people_body}


def page_html(page: str, snap: Snapshot, history: History, *, name: str) -> str:
    f = fragments(page, snap, history)
    nav = "".join(
        f'<a href="{PATHS[p]}"{" class=here" if p == page else ""}>{escape(title)}</a>'
        for p, title in PAGES.items()
    )
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta name="referrer" content="no-referrer">'
        f"<title>{escape(PAGES[page])} - {escape(name)}</title>"
        '<link rel="stylesheet" href="static/app.css"></head>'
        f'<body data-page="{page}"><header><h1>{escape(name)}</h1>'
        f'<span id="live" class="live off">connecting</span><nav>{nav}</nav>'
        f'<div id="f-gateways" class="muted">{f["f-gateways"]}</div></header>'
        f"<main>{BODIES[page](f)}</main>"
        '<script src="static/app.js"></script></body></html>'
    )
