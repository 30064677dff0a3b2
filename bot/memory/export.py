"""Export of a person's conversations (every space on one transport) as JSON and Markdown.

Invariant: an export contains only rows of the requesting person, and it is only ever sent to
that person privately (``Attachment.dm_only``).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from bot.memory.store import SqliteStore


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds")


async def export_person(store: SqliteStore, transport: str, person: str) -> tuple[str, str]:
    """Return (markdown, json) documents."""
    convs: list[dict[str, Any]] = []
    for conv in await store.conversations_of(transport, person):
        messages = await store.all_messages(conv.id)
        facts = await store.facts(conv.id)
        summary = await store.latest_summary(conv)
        convs.append(
            {
                "space": conv.key.space,
                "reset_after_message_id": conv.reset_after,
                "facts": [f.text for f in facts],
                "summary": None
                if summary is None
                else {
                    "text": summary.text,
                    "covers": [summary.first_message_id, summary.last_message_id],
                },
                "messages": [
                    {
                        "id": m.id,
                        "role": m.role,
                        "author": m.author,
                        "text": m.text,
                        "created_at": _iso(m.created_at),
                        "status": m.status,
                        "reply_to": m.parent_id,
                    }
                    for m in messages
                ],
            }
        )
    doc = {
        "transport": transport,
        "person": person,
        "exported_at": _iso(datetime.now(UTC).timestamp()),
        "conversations": convs,
    }
    md = [f"# meshsage export for {person} ({transport})", ""]
    for conv_doc in convs:
        md += [f"## Space: {conv_doc['space']}", ""]
        if conv_doc["facts"]:
            md += ["Remembered facts:", *[f"- {f}" for f in conv_doc["facts"]], ""]
        if conv_doc["summary"]:
            md += [f"Summary: {conv_doc['summary']['text']}", ""]
        for m in conv_doc["messages"]:
            md.append(f"**{m['author']}** ({m['created_at']}): {m['text']}")
            md.append("")
    return "\n".join(md), json.dumps(doc, ensure_ascii=False, indent=2)
