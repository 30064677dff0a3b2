"""The Meshtastic transport's view for the operator (bot.transports.mesh_view): the library's
node table merged with what the transport heard, a thousand nodes, and a bounded book."""

from __future__ import annotations

from bot.transports.mesh_view import NodeBook, nodes_seen


def test_a_thousand_nodes_merge_with_signal_and_counts_newest_first() -> None:
    table: dict[object, object] = {
        num: {
            "num": num,
            "user": {"longName": f"Hiker {num}", "shortName": f"H{num % 100}"},
            "lastHeard": 1_800_000_000 + num,
            "snr": 4.5,
            "hopsAway": num % 4,
            "deviceMetrics": {"batteryLevel": 101 if num % 2 else 55},
        }
        for num in range(1, 1001)
    }
    table[7] = {"num": 7}  # a node that never sent its user info
    table["junk"] = "not a node"
    book = NodeBook()
    book.heard("!00000005", snr=-3.0, rssi=-110, at=1_900_000_000.0)
    book.message_from("!00000005")
    book.reply_to("!00000005")
    book.heard("!deadbeef", snr=None, rssi=-70, at=1_800_000_500.0)  # heard, not in the table
    nodes = nodes_seen(table, book, my_id="!00000001")
    assert len(nodes) == 1000  # 1000 in the table, minus the bot's own, plus one heard
    first = nodes[0]
    assert (first.id, first.rssi, first.from_node, first.to_node) == ("!00000005", -110, 1, 1)
    assert first.last_heard == 1_900_000_000.0 and first.snr == 4.5  # the table's SNR first
    assert first.name == "Hiker 5 (H5)" and first.hops == 1 and first.battery == 101
    assert "!00000001" not in {n.id for n in nodes}
    seven = next(n for n in nodes if n.id == "!00000007")
    assert seven.name == "" and seven.last_heard is None
    assert any(n.id == "!deadbeef" and n.rssi == -70 for n in nodes)


def test_the_book_keeps_the_most_recently_heard_nodes_only() -> None:
    book = NodeBook(size=3)
    for i in range(5):
        book.heard(f"!0000000{i}", snr=1.0, rssi=-80, at=float(i))
    book.message_from("!00000002")  # heard again: kept
    book.heard("!00000009", snr=None, rssi=None, at=9.0)
    assert book.ids() == ["!00000004", "!00000002", "!00000009"]
