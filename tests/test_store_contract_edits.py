"""Contract: a person's edit of a stored message (``edit_message``), SQLite and PostgreSQL.
The old words leave the text and the search index; only the newest answered question whose
words changed is reopened, and its answers are withdrawn."""

from __future__ import annotations

from bot.domain import ConversationKey
from bot.memory.port import MemoryStore

KEY = ConversationKey("discord", "930000000000000001")
FAR = 1 << 62


async def _store(
    m: MemoryStore, role: str, text: str, pid: str | None, parent_id: int | None = None
) -> int:
    conv = await m.conversation(KEY)
    status = "answered" if role == "user" else "sent"
    return await m.add_message(conv.id, role=role, author="Alice", text=text, tokens=3,
                               status=status, platform_id=pid, parent_id=parent_id)  # fmt: skip


async def test_edit_replaces_text_and_search_words(memory: MemoryStore) -> None:
    conv = await memory.conversation(KEY)
    q = await _store(memory, "user", "the code is PINEAPPLE", "111")
    await _store(memory, "assistant", "noted PINEAPPLE", None, parent_id=q)
    edited = await memory.edit_message(conv.id, "111", text="the code is secret", tokens=4,
                                       reopen=True, withdrawn="(withdrawn)")  # fmt: skip
    assert edited is not None and edited.reopened and edited.old_status == "answered"
    assert edited.message.text == "the code is secret" and edited.message.status == "pending"
    texts = [m.text for m in await memory.all_messages(conv.id)]
    assert texts == ["the code is secret", "(withdrawn)"]
    assert await memory.search_terms(conv.id, ["pineapple"], after_id=0, before_id=FAR) == [[]]
    assert (await memory.search_terms(conv.id, ["secret"], after_id=0, before_id=FAR))[0] == [q]


async def test_only_the_newest_changed_question_is_reopened(memory: MemoryStore) -> None:
    conv = await memory.conversation(KEY)
    await _store(memory, "user", "first", "1")
    await _store(memory, "user", "second", "2")
    older = await memory.edit_message(conv.id, "1", text="first!", tokens=1, reopen=True)
    assert older is not None and not older.reopened and older.message.status == "answered"
    same = await memory.edit_message(conv.id, "2", text=" second ", tokens=1, reopen=True)
    assert same is not None and not same.reopened
    assert await memory.edit_message(conv.id, "999", text="x", tokens=1) is None
    other = await memory.conversation(ConversationKey("discord", "2"))
    assert await memory.edit_message(other.id, "1", text="x", tokens=1) is None
