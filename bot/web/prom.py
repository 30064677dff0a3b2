"""``/metrics`` in the Prometheus text exposition format (version 0.0.4).

Invariants:
- Names follow Prometheus conventions: the ``meshsage_`` prefix, base units (seconds, bytes,
  ratios as ``_percent`` where the radio reports percent), ``_total`` for counters.
- Labels carry only fixed words (transport name, outbox state, hold cause, direction) and the
  version and model in ``meshsage_info``; never a person, a node id, a space or any text from a
  message. Label values are escaped as the format requires.
- Pure: from a ``Snapshot`` to text.
"""

from __future__ import annotations

from collections.abc import Iterable

from bot.ops.metrics import BUCKETS
from bot.web.model import Snapshot

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _num(v: float) -> str:
    if v == int(v) and abs(v) < 1e15:
        return str(int(v))
    return repr(float(v))


class _Out:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def metric(
        self,
        name: str,
        kind: str,
        help_text: str,
        samples: Iterable[tuple[dict[str, str], float]],
    ) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            self.sample(name, labels, value)

    def sample(self, name: str, labels: dict[str, str], value: float) -> None:
        if labels:
            inner = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
            self.lines.append(f"{name}{{{inner}}} {_num(value)}")
        else:
            self.lines.append(f"{name} {_num(value)}")


def exposition(snap: Snapshot) -> str:
    st = snap.status
    o = _Out()
    o.metric(
        "meshsage_info",
        "gauge",
        "Version and model of the running bot.",
        [({"version": st.version, "model": snap.model}, 1)],
    )
    o.metric(
        "meshsage_healthy",
        "gauge",
        "1 when every health check passes.",
        [({}, 1 if st.healthy else 0)],
    )
    o.metric(
        "meshsage_start_time_seconds",
        "gauge",
        "When the bot started (Unix time).",
        [({}, st.started_at)],
    )
    o.metric(
        "meshsage_transport_up",
        "gauge",
        "1 when the transport's link is up.",
        [
            ({"transport": n}, 1 if t.link in ("up", "running") else 0)
            for n, t in sorted(st.transports.items())
        ],
    )
    o.metric(
        "meshsage_transport_loops_ok",
        "gauge",
        "1 while the transport's loops run.",
        [({"transport": n}, 1 if t.ok else 0) for n, t in sorted(st.transports.items())],
    )
    t = snap.totals
    for key, help_text in (
        ("turns", "Questions taken to the LLM since start."),
        ("answers", "Answers handed to a transport since start."),
        ("notices", "Notices sent (busy, rate limited, LLM unavailable) since start."),
        ("limited", "Messages over a rate or queue limit since start."),
    ):
        o.metric(f"meshsage_{key}_total", "counter", help_text, [({}, t.get(key, 0))])
    o.metric(
        "meshsage_messages_today",
        "gauge",
        "Messages stored since local midnight.",
        [
            ({"direction": "in"}, st.messages_in_today),
            ({"direction": "out"}, st.messages_out_today),
        ],
    )
    # LLM latency histogram (successful calls since start) and failures
    name = "meshsage_llm_request_duration_seconds"
    o.metric(name, "histogram", "LLM call duration (successful calls).", [])
    for bound, count in zip(BUCKETS, snap.llm_buckets, strict=True):
        o.sample(f"{name}_bucket", {"le": _num(bound)}, count)
    o.sample(f"{name}_bucket", {"le": "+Inf"}, snap.llm_total)
    o.sample(f"{name}_sum", {}, round(snap.llm_seconds_total, 6))
    o.sample(f"{name}_count", {}, snap.llm_total)
    o.metric(
        "meshsage_llm_failures_total",
        "counter",
        "LLM calls that failed since start.",
        [({}, snap.llm_failures)],
    )
    answers = t.get("answers", 0)
    o.metric(
        "meshsage_reply_duration_seconds",
        "summary",
        "From a message's arrival to its answer handed to the transport.",
        [],
    )
    o.sample("meshsage_reply_duration_seconds_sum", {}, round(snap.first_reply_total, 6))
    o.sample("meshsage_reply_duration_seconds_count", {}, answers)
    o.metric(
        "meshsage_first_part_duration_seconds",
        "summary",
        "From a message's arrival to its answer's first part accepted by the platform.",
        [],
    )
    o.sample("meshsage_first_part_duration_seconds_sum", {}, round(snap.first_part_total, 6))
    o.sample("meshsage_first_part_duration_seconds_count", {}, snap.first_part_count)
    o.metric(
        "meshsage_outbox_rows",
        "gauge",
        "Outbox rows by state (this gateway's).",
        [({"state": x.state}, x.rows) for x in snap.outbox],
    )
    o.metric(
        "meshsage_outbox_oldest_age_seconds",
        "gauge",
        "Age of the oldest outbox row by state.",
        [
            ({"state": x.state}, round(x.oldest_age, 3))
            for x in snap.outbox
            if x.oldest_age is not None
        ],
    )
    o.metric(
        "meshsage_turns_waiting", "gauge", "Turns queued or running.", [({}, snap.turns_waiting)]
    )
    o.metric(
        "meshsage_people_waiting",
        "gauge",
        "People with turns queued or running.",
        [({}, snap.people_waiting)],
    )
    o.metric("meshsage_store_bytes", "gauge", "Size of the store.", [({}, st.database_bytes)])
    if snap.last_backup is not None:
        o.metric(
            "meshsage_last_backup_time_seconds",
            "gauge",
            "When the newest backup was written (Unix time).",
            [({}, snap.last_backup[1])],
        )
    if st.identity:  # the mesh's key pins (bot.identity): DMs refused as not their node's
        o.metric(
            "meshsage_mesh_refused_total",
            "counter",
            "Mesh DMs refused as not their node's (another key, or no PKI for a pinned node).",
            [
                ({"reason": "key_changed"}, st.identity.get("refused_key_changed", 0)),
                ({"reason": "no_pki"}, st.identity.get("refused_no_pki", 0)),
            ],
        )
    m = snap.mesh
    if m is not None:
        o.metric(
            "meshsage_mesh_holds_total",
            "counter",
            "Replies held for airtime, by cause.",
            [
                ({"cause": "channel"}, m.holds.get("hold", 0)),
                ({"cause": "duty_cycle"}, m.holds.get("duty", 0)),
            ],
        )
        o.metric(
            "meshsage_mesh_holding",
            "gauge",
            "1 while a reply is held for airtime.",
            [({}, 1 if m.holding else 0)],
        )
        o.metric(
            "meshsage_mesh_bot_airtime_percent",
            "gauge",
            "The bot's own time on air, percent of the last hour.",
            [({}, round(m.bot_hour_share, 4))],
        )
        if m.channel_utilization is not None:
            o.metric(
                "meshsage_mesh_channel_utilization_percent",
                "gauge",
                "Channel utilisation the radio last reported.",
                [({}, m.channel_utilization)],
            )
        if m.air_util_tx is not None:
            o.metric(
                "meshsage_mesh_air_util_tx_percent",
                "gauge",
                "The node's TX share of the hour the radio last reported.",
                [({}, m.air_util_tx)],
            )
        o.metric(
            "meshsage_mesh_channel_limit_percent",
            "gauge",
            "Configured busy_threshold.",
            [({}, m.channel_limit)],
        )
        o.metric(
            "meshsage_mesh_duty_cycle_percent",
            "gauge",
            "Configured duty_cycle.",
            [({}, m.duty_cycle)],
        )
        o.metric(
            "meshsage_mesh_outbox_waiting",
            "gauge",
            "Replies waiting to go on air.",
            [({}, m.outbox_waiting)],
        )
        o.metric(
            "meshsage_mesh_stranger_airtime_seconds",
            "gauge",
            "Seconds on air of the last hour spent on replies to unconfirmed senders.",
            [({}, round(m.stranger_airtime, 3))],
        )
        o.metric(
            "meshsage_mesh_strangers_refused_total",
            "counter",
            "Replies to unconfirmed senders not sent: their hourly allowance was spent.",
            [({}, m.strangers_refused)],
        )
        o.metric(
            "meshsage_mesh_nodes_heard",
            "gauge",
            "Nodes in the radio's node table.",
            [({}, len(m.nodes))],
        )
    return "\n".join(o.lines) + "\n"
