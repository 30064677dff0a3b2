"""Scripted answers of the fake LLM for the memory tiers: a session summary, a long-term
summary, fact extraction JSON, or a chat reply, chosen by the request's system prompt.

``MemoryScript.facts`` is the next extraction answer (raw text: tests feed invalid JSON,
fenced JSON, 500 items or injected instructions through it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class MemoryScript:
    title: str = "Radio antennas"
    summary: str = "They compared antennas. The person chose a 5 dBi whip."
    longterm: str = "LONGTERM: the person compared radio antennas and chose a 5 dBi whip."
    facts: str = '{"facts": []}'
    reply: str = "ok"
    seen: list[str] = field(default_factory=list)

    def __call__(self, body: dict[str, Any]) -> str:
        system = body["messages"][0]["content"]
        if system.startswith("Summarize this chat session"):
            self.seen.append("session")
            return f"{self.title}\n{self.summary}"
        if system.startswith("You keep a long-term summary"):
            self.seen.append("longterm")
            return self.longterm
        if system.startswith("You keep a short list of durable facts"):
            self.seen.append("facts")
            return self.facts
        self.seen.append("chat")
        return self.reply
