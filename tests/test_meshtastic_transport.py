"""The Meshtastic transport against the unmodified library and the fake radio."""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from typing import Any

import pytest

from bot.domain import DM_SPACE, DeliveryStatus, Reply
from bot.transports import meshtastic_link
from tests.fakes.fake_radio import ALICE, BOB, BROADCAST, MY_NUM, STRANGER
from tests.fakes.mesh_harness import mesh_harness


async def test_dm_in_answer_out() -> None:
    async with mesh_harness() as h:
        pid = h.radio.inject_text("what's the weather?", frm=ALICE)
        inbound = await h.message()
        assert inbound.transport == "meshtastic"
        assert inbound.sender == "!a11ce001"
        assert inbound.space == DM_SPACE
        assert inbound.text == "what's the weather?"
        assert inbound.sender_name == "Alice"
        assert inbound.message_id == str(pid)
        delivery = await h.reply(inbound, "Sunny, 21 C.")
        assert delivery.status is DeliveryStatus.DELIVERED
        ((_, packet),) = h.radio.sent_texts()
        assert packet.decoded.payload == b"Sunny, 21 C."
        assert (packet.to, packet.channel, packet.want_ack) == (ALICE, 0, True)
        assert packet.decoded.reply_id == pid
        assert delivery.message_ids == (str(packet.id),)


async def test_unknown_sender_is_answered_by_node_number() -> None:
    async with mesh_harness() as h:
        h.radio.inject_text("hi", frm=STRANGER)
        inbound = await h.message()
        assert (inbound.sender, inbound.sender_name) == (f"!{STRANGER:08x}", None)
        assert (await h.reply(inbound, "hello")).status is DeliveryStatus.DELIVERED
        assert h.radio.sent_packets()[-1].to == STRANGER


async def test_channel_trigger_rules_and_reply_on_the_same_channel() -> None:
    async with mesh_harness(channels=[1]) as h:
        h.radio.inject_text("hello everyone", to=BROADCAST, channel=1, frm=BOB)  # no trigger
        h.radio.inject_text("@meshsage hi", to=BROADCAST, channel=0, frm=BOB)  # channel off
        h.radio.inject_text("@MeshSage: what is LoRa?", to=BROADCAST, channel=1, frm=ALICE)
        h.radio.inject_text("!help", to=BROADCAST, channel=1, frm=BOB)
        h.radio.inject_text("email me@meshsage.org", to=BROADCAST, channel=1, frm=BOB)
        h.radio.inject_text("sentinel", frm=ALICE)  # a DM: everything before it was handled
        await h.message(3)
        assert [(m.sender, m.space, m.text) for m in h.inbox] == [
            ("!a11ce001", "ch1", "what is LoRa?"),
            ("!b0b00002", "ch1", "!help"),
            ("!a11ce001", DM_SPACE, "sentinel"),
        ]
        delivery = await h.reply(h.inbox[0], "A long-range radio.")
        assert delivery.status is DeliveryStatus.SENT  # broadcasts have no end-to-end ACK
        await h.until(lambda: len(h.radio.sent_texts()) == 1, "the broadcast on air")
        packet = h.radio.sent_packets()[-1]
        assert (packet.to, packet.channel, packet.want_ack) == (BROADCAST, 1, False)


async def test_channel_trigger_answered_by_dm_when_configured() -> None:
    async with mesh_harness(channels=[0], reply_in_channel=False) as h:
        h.radio.inject_text("@meshsage ping", to=BROADCAST, frm=ALICE)
        inbound = await h.message()
        assert inbound.space == "ch0"
        assert (await h.reply(inbound, "pong")).status is DeliveryStatus.DELIVERED
        packet = h.radio.sent_packets()[-1]
        assert (packet.to, packet.want_ack) == (ALICE, True)


async def test_copies_are_dropped_but_the_same_words_again_are_a_new_message() -> None:
    async with mesh_harness(dedup_seconds=120) as h:
        h.radio.inject_text("same question", pid=501)
        h.radio.inject_text("same question", pid=501)  # mesh rebroadcast: same id
        h.radio.inject_text("same question", pid=501, via_mqtt=False)  # another copy
        h.radio.inject_text("yes", pid=502)
        h.radio.inject_text("yes", pid=503)  # a second "yes": a new packet, a new message
        await h.message(3)
        await h.clock.sleep(5)
        assert [m.message_id for m in h.inbox] == ["501", "502", "503"]


async def test_packets_that_are_not_for_us_are_ignored_without_crashing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="bot.transport.meshtastic")
    async with mesh_harness(channels=[0], ignore_nodes=[f"!{BOB:08x}"]) as h:
        r = h.radio
        r.inject_text("echo of myself", frm=MY_NUM)
        r.inject_text("from mqtt", via_mqtt=True)
        r.inject_text("👍", emoji=1, reply_id=77)  # tapback reaction
        r.inject_text("I am another bot", frm=BOB)
        r.inject_text("(1/2) numbered output of a bot", frm=STRANGER)
        r.inject_text("for someone else", to=0x0DDBA11)
        r.inject_text(b"\x08\x01", port=3)  # POSITION_APP
        r.inject_text(b"\xde\xad\xbe\xef", encrypted=True)  # the node could not decrypt it
        r.inject_text(b"\xff\xfe\xfd", to=BROADCAST)  # nothing but invalid UTF-8 (a DM: told)
        r.inject_text("   \n ")
        r.inject_text("")
        r.inject_text(b"caf\xc3 ok?", frm=STRANGER)  # mostly text: answered, bytes repaired
        r.inject_text("@meshsage", to=BROADCAST)  # a trigger without a question
        r.inject_text("!ping", to=BROADCAST)  # another bot's command: quiet
        r.inject_text("!!! storm warning", to=BROADCAST)
        r.inject_text("ask meshsage about it", to=BROADCAST)  # the name mid-sentence
        r.inject_text("on channel 1", to=BROADCAST, channel=1)
        r.inject_text("sentinel")
        await h.message(2)
        await asyncio.sleep(0.05)
        assert [m.text for m in h.inbox] == ["caf\ufffd ok?", "sentinel"]
        r.inject_text(b"\xff\xfe\xfd")  # a DM of nothing but invalid UTF-8: handed on
        assert (await h.message(3)).text == "\ufffd\ufffd\ufffd"
    ignored = [r for r in caplog.records if r.getMessage().startswith("ignored a packet")]
    reasons = [r.getMessage().split(": ", 1)[1] for r in ignored if r.levelno == logging.INFO]
    assert reasons == [  # one INFO line per ignored text packet, with the reason, in order
        "our own packet",
        "relayed from MQTT",
        "tapback reaction",
        "ignored node",
        "numbered bot output (loop guard)",
        "addressed to another node",
        "could not decrypt (no shared channel key or PKI key)",
        "invalid UTF-8",
        "empty text",
        "empty text",
        "trigger without a question",
    ]
    assert any("not text (POSITION_APP)" in r.getMessage() for r in ignored)  # DEBUG only
    debug = [r.getMessage().split(": ", 1)[1] for r in ignored if r.levelno == logging.DEBUG]
    assert debug.count("no trigger") == 3 and "channel 1 not enabled" in debug
    info = " ".join(r.getMessage() for r in caplog.records if r.levelno >= logging.INFO)
    for text in ("echo of myself", "from mqtt", "another bot", "numbered output", "someone else"):
        assert text not in info  # never message text above DEBUG


async def test_long_reply_is_numbered_and_spaced_on_the_radio_clock() -> None:
    async with mesh_harness(spacing_seconds=3.0) as h:
        h.radio.inject_text("tell me a story")
        inbound = await h.message()
        story = " ".join(f"Sentence number {i} of the story goes here." for i in range(40))
        delivery = await h.reply(inbound, story)
        assert delivery.status is DeliveryStatus.DELIVERED
        sent = h.radio.sent_texts()
        assert [p.decoded.payload.decode()[:6] for _, p in sent] == ["(1/3) ", "(2/3) ", "(3/3) "]
        assert all(len(p.decoded.payload) <= 200 for _, p in sent)
        times = [t for t, _ in sent]
        assert [b - a >= 3.0 for a, b in itertools.pairwise(times)] == [True, True]
        stored = h.transport.fit(story)
        assert stored.endswith(" … (!more)")  # the rest waits for !more
        bodies = [p.decoded.payload.decode()[6:] for _, p in sent]
        assert " ".join(bodies) == stored


async def test_two_people_are_answered_without_interleaving() -> None:
    async with mesh_harness(spacing_seconds=4.0) as h:
        h.radio.inject_text("question from alice", frm=ALICE)
        h.radio.inject_text("question from bob", frm=BOB)
        alice, bob = await h.message(1), await h.message(2)
        long = "word " * 120
        deliveries = await asyncio.gather(h.reply(alice, long), h.reply(bob, long))
        assert [d.status for d in deliveries] == [DeliveryStatus.DELIVERED] * 2
        assert [p.to for _, p in h.radio.sent_texts()] == [ALICE] * 3 + [BOB] * 3
        times = [t for t, _ in h.radio.sent_texts()]
        assert min(b - a for a, b in itertools.pairwise(times)) >= 4.0


async def test_nak_then_ack_resends_only_the_lost_part() -> None:
    async with mesh_harness(ack_backoff=10.0) as h:
        h.radio.routing = lambda p, attempt: (
            "MAX_RETRANSMIT" if p.decoded.payload.startswith(b"(2/3)") and attempt == 0 else "NONE"
        )
        h.radio.inject_text("long answer please")
        inbound = await h.message()
        delivery = await h.reply(inbound, "Some words here. " * 30)
        assert delivery.status is DeliveryStatus.DELIVERED
        prefixes = [p.decoded.payload[:5] for _, p in h.radio.sent_texts()]
        assert prefixes == [b"(1/3)", b"(2/3)", b"(3/3)", b"(2/3)"]
        assert len(delivery.message_ids) == 4


async def test_missing_ack_is_retried_then_reported_failed() -> None:
    async with mesh_harness(ack_retries=2, ack_timeout=30.0, ack_backoff=5.0) as h:
        h.radio.routing = lambda p, attempt: None  # the person is out of range
        h.radio.inject_text("are you there?")
        inbound = await h.message()
        t0 = h.clock.monotonic()
        delivery = await h.reply(inbound, "Yes.")
        assert delivery.status is DeliveryStatus.FAILED
        # (the bot cannot tell this from a recipient that has it and stays silent on a repeat)
        assert (delivery.detail or "").startswith("part 1/1: no ACK after 3 sends")
        sent = h.radio.sent_texts()
        assert len(sent) == 3  # first try + 2 re-sends
        # each re-send waited for the ACK timeout and the (doubling) backoff
        assert sent[1][0] - t0 >= 30.0 + 5.0
        assert sent[2][0] - sent[1][0] >= 30.0 + 10.0


async def test_ack_relayed_by_a_neighbour_is_reported_as_sent() -> None:
    async with mesh_harness() as h:
        h.radio.routing = lambda p, attempt: None
        h.radio.inject_text("hello")
        inbound = await h.message()
        task = asyncio.ensure_future(h.reply(inbound, "Hi there."))
        await h.until(lambda: len(h.radio.sent_texts()) == 1, "the reply")
        h.radio.inject_routing(h.radio.sent_texts()[0][1].id, "NONE", frm=MY_NUM)  # implicit ACK
        delivery = await task
        assert delivery.status is DeliveryStatus.SENT
        assert delivery.detail and "relayed" in delivery.detail
        assert len(h.radio.sent_texts()) == 1  # no re-send


async def test_tcp_server_disappears_then_returns_and_queued_parts_go_out() -> None:
    async with mesh_harness() as h:
        h.radio.inject_text("question")
        inbound = await h.message()
        await h.server_gone()  # the node reboots: connection gone, reconnects refused
        task = asyncio.ensure_future(h.reply(inbound, "An answer. " * 30))
        await h.clock.sleep(30)  # a few failed reconnects (virtual time)
        assert not task.done() and h.radio.sent_texts() == []
        h.tcp.restart()
        delivery = await task
        assert delivery.status is DeliveryStatus.DELIVERED
        assert [p.decoded.payload[:5] for _, p in h.radio.sent_texts()] == [
            b"(1/2)",
            b"(2/2)",
        ]
        assert h.tcp.connections == 2


async def test_send_that_hangs_is_abandoned_and_the_link_rebuilt() -> None:
    # call_timeout guards a real blocked thread, so it is real time (kept short here).
    async with mesh_harness(call_timeout=0.5) as h:
        h.radio.inject_text("question")
        inbound = await h.message()
        h.radio.report_tx_queue(0)  # the node's TX queue is full: the library's send blocks
        old = h.interfaces[-1]
        await h.until(lambda: old.queueStatus is not None, "the library saw the queue status")
        task = asyncio.ensure_future(h.reply(inbound, "An answer. " * 30))
        # The hung write is abandoned, the link rebuilt, the parts sent (30 s: a hang guard).
        delivery = await asyncio.wait_for(task, 30)
        assert delivery.status is DeliveryStatus.DELIVERED
        assert h.tcp.connections == 2
        assert not old._rxThread.is_alive()  # the old interface really closed (no wedged close)
        assert [p.decoded.payload[:5] for _, p in h.radio.sent_texts()] == [b"(1/2)", b"(2/2)"]


async def test_queued_reply_waits_a_bounded_time_then_goes_back_to_the_outbox() -> None:
    async with mesh_harness(queue_wait=60.0) as h:
        h.radio.inject_text("question")
        inbound = await h.message()
        await h.server_gone()
        delivery = await h.reply(inbound, "Not lost: the durable outbox tries again later.")
        assert delivery.status is DeliveryStatus.PENDING
        assert delivery.detail and "no radio link" in delivery.detail


async def test_serial_unplug_then_replug_reconnects() -> None:
    async with mesh_harness(serial=True) as h:
        h.radio.inject_text("over serial")
        first = await h.message()
        assert (await h.reply(first, "pong")).status is DeliveryStatus.DELIVERED
        h.pty.unplug()
        await h.until(lambda: not h.transport._up.is_set(), "link down")
        h.pty.replug()  # the factory opens radio.path, which may have changed
        await h.connected(2)
        h.radio.inject_text("back again", pid=999)
        second = await h.message(2)
        assert second.text == "back again"
        assert (await h.reply(second, "welcome back")).status is DeliveryStatus.DELIVERED


async def test_startup_without_radio_keeps_retrying_with_backoff(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="bot.transport.meshtastic")
    async with mesh_harness(start_radio=False, reconnect_initial=5, reconnect_max=300) as h:
        await h.clock.sleep(1800)  # half an hour without a radio (virtual time)
        assert not h.transport._up.is_set()
        gaps = [b - a for a, b in itertools.pairwise(h.attempts)]
        bases = [5, 10, 20, 40, 80, 160, 300, 300, 300, 300]
        assert len(gaps) >= len(bases)  # still trying long after reaching the cap
        for gap, base in zip(gaps, bases, strict=False):
            assert 0.8 * base <= gap <= min(300, 1.2 * base), (gaps, base)
        assert len({round(g, 6) for g in gaps[6:]}) > 1  # jitter: no lock-step with other bots
        retries = [r for r in caplog.records if "radio not reachable" in r.getMessage()]
        assert len(retries) == len(h.attempts)  # every failed attempt logged, with its wait
        assert all("retrying in" in r.getMessage() for r in retries)
        h.tcp.restart()
        await h.connected()
        h.radio.inject_text("finally")
        assert (await h.message()).text == "finally"


async def test_connect_finishing_after_its_timeout_is_closed_not_leaked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(meshtastic_link, "CONNECT_MARGIN", 0.0)
    release = threading.Event()

    def slow_first_connect(attempt: int) -> None:
        if attempt == 0:
            release.wait(10)  # the first handshake is slow

    # connect_timeout guards a real blocked thread, so it is real time (1 s here).
    async with mesh_harness(
        start_radio=False, connect_timeout=1.0, after_connect=slow_first_connect
    ) as h:
        h.tcp.restart()
        # The second attempt waits for the node, whose one API slot the first link still holds.
        await h.until(lambda: len(h.attempts) >= 2, "a second attempt after the timeout")
        release.set()  # the first attempt completes, too late to be used: it must be closed
        await h.connected()
        late, used = h.interfaces
        assert h.transport._iface is used and h.tcp.connections == 2
        assert not late._rxThread.is_alive()
        h.radio.inject_text("hello")
        assert (await h.message()).text == "hello"


async def test_stale_link_is_probed_and_rebuilt() -> None:
    async with mesh_harness(stale_after=60.0, probe_timeout=10.0) as h:
        await h.clock.sleep(100)  # quiet but healthy: the probe is answered
        assert h.transport._generation == 1
        h.radio.freeze()  # the node stops answering; the socket stays open
        await h.connected(2)
        assert h.tcp.connections == 2
        h.radio.inject_text("alive again")
        assert (await h.message()).text == "alive again"


async def test_busy_channel_defers_sending() -> None:
    async with mesh_harness(busy_threshold=25, busy_max_wait=120, busy_poll=10) as h:
        h.radio.inject_channel_utilization(40.0)
        h.radio.inject_text("question")
        inbound = await h.message()
        t0 = h.clock.monotonic()
        task = asyncio.ensure_future(h.reply(inbound, "answer"))
        await h.clock.sleep(35)
        assert h.radio.sent_texts() == []
        h.radio.inject_channel_utilization(10.0)
        assert (await task).status is DeliveryStatus.DELIVERED
        sent_at = h.radio.sent_texts()[0][0]
        assert 35 <= sent_at - t0 < 120


async def test_per_person_cooldowns() -> None:
    async with mesh_harness(cooldown=15.0, channel_cooldown=60.0, channels=[0]) as h:
        h.radio.inject_text("@meshsage one", to=BROADCAST)
        h.radio.inject_text("@meshsage two", to=BROADCAST)  # within 60 s: ignored
        h.radio.inject_text("dm one")
        first = await h.message(1)
        dm = await h.message(2)
        assert [m.text for m in h.inbox] == ["one", "dm one"]
        await h.reply(first, "first answer")
        await h.reply(dm, "second answer")
        (t1, _), (t2, _) = h.radio.sent_texts()
        assert t2 - t1 >= 15.0


async def test_a_full_outbox_says_busy_and_stopped_replies_stay_pending() -> None:
    async with mesh_harness(outbox_limit=1) as h:
        h.radio.inject_text("q")
        inbound = await h.message()
        await h.server_gone()
        assert h.transport.busy_for() is None
        waiting = asyncio.ensure_future(h.reply(inbound, "first"))
        await h.until(lambda: len(h.transport._jobs) == 1, "queued reply")
        wait = h.transport.busy_for()
        assert wait is not None and wait > 0  # the responder answers "busy" without the LLM
    stopped = await waiting
    assert stopped.status is DeliveryStatus.PENDING  # the outbox row waits for the next run
    after = await h.transport.send(Reply(inbound=inbound, text="late"))
    assert after.status is DeliveryStatus.PENDING


async def test_listeners_are_kept_alive_and_unsubscribed_on_stop() -> None:
    import gc

    from pubsub import pub

    async with mesh_harness() as h:
        gc.collect()  # pypubsub holds weak references: our bound methods must survive this
        h.radio.inject_text("after gc")
        assert (await h.message()).text == "after gc"
        topic: Any = pub.getDefaultTopicMgr().getTopic("meshtastic.receive")
        assert topic.hasListener(h.transport._on_packet)
    assert not topic.hasListener(h.transport._on_packet)


async def test_a_part_keeps_its_planned_packet_id_through_retries_and_a_restart() -> None:
    """The id is chosen and stored before the write (``Reply.plan``); an ACK retry and a
    re-send after a crash (the id planned, the part not recorded) repeat it, and the
    receiving radio drops the copy it already has instead of showing it twice."""
    async with mesh_harness(ack_backoff=10.0) as h:
        h.radio.routing = lambda p, attempt: "MAX_RETRANSMIT" if attempt == 0 else "NONE"
        h.radio.inject_text("question")
        inbound = await h.message()
        planned: dict[int, int] = {}
        recorded: list[tuple[int, str]] = []
        on_air_at_plan: list[int] = []

        async def plan(part: int, packet_id: int) -> int:
            on_air_at_plan.append(len(h.radio.on_air))  # stored before the radio has it
            return planned.setdefault(part, packet_id)

        async def progress(part: int, platform_id: str) -> None:
            recorded.append((part, platform_id))

        text = h.transport.fit("Kept once.")
        delivery = await h.transport.send(
            Reply(inbound=inbound, text=text, plan=plan, progress=progress)
        )
        assert delivery.status is DeliveryStatus.DELIVERED
        first, retry = (p for _, p in h.radio.sent_texts())
        assert first.id == retry.id == planned[0] and on_air_at_plan == [0]
        assert [p.id for _, p in h.radio.shown] == [planned[0]]  # the NAKed copy never arrived
        # A restart after a kill between the radio taking the part and the store recording it:
        # the row has the planned id but not the part. The re-send repeats the id; the
        # recipient's radio already has it and drops it (no second answer on screen). Firmware
        # before 2.6 sends no ACK for it (2.6+ does: tests/test_mesh_repeats.py).
        h.radio.repeat_ack = None
        again = await h.transport.send(
            Reply(inbound=inbound, text=text, packet_ids=tuple(planned.items()), plan=plan)
        )
        assert again.status is DeliveryStatus.SENT  # unconfirmed: no ACK for the repeat
        assert [p.id for _, p in h.radio.repeats] == [planned[0]]
        assert len(h.radio.shown) == 1 and len(h.radio.sent_texts()) == 3
