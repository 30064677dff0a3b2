"""The MeshCore transport against the fake companion, through the unmodified meshcore library."""

from __future__ import annotations

import asyncio
import contextlib
import itertools

from bot.domain import DM_SPACE, DeliveryStatus, Reply
from tests.fakes.meshcore_harness import meshcore_run


async def test_a_dm_is_answered_by_dm_and_acked() -> None:
    async with meshcore_run() as run:
        alice = run.radio.person("Alice")
        run.radio.dm_from(alice, "hello bot")
        await run.until(lambda: len(run.inbox) == 1)
        inbound = run.inbox[0]
        assert inbound.sender == alice.key.hex()
        assert inbound.authenticated and inbound.space == DM_SPACE
        assert inbound.sender_name == "Alice" and inbound.text == "hello bot"
        delivery = await run.transport.send(Reply(inbound=inbound, text="Hi Alice!"))
        assert delivery.status is DeliveryStatus.DELIVERED
        assert alice.shown == ["Hi Alice!"]


async def test_a_channel_text_is_answered_only_with_the_trigger_on_an_allowed_slot() -> None:
    async with meshcore_run(channels=(0,)) as run:
        run.radio.channel_text(0, "Bob", "just chatting")
        run.radio.channel_text(1, "Bob", "@meshsage not this slot")
        run.radio.channel_text(0, "Bob", "@meshsage what is LoRa?")
        await run.until(lambda: len(run.inbox) == 1)
        await asyncio.sleep(0.2)
        assert len(run.inbox) == 1
        inbound = run.inbox[0]
        assert inbound.space == "ch0" and inbound.text == "what is LoRa?"
        assert inbound.sender == "~Bob" and not inbound.authenticated
        delivery = await run.transport.send(Reply(inbound=inbound, text="Long range radio."))
        assert delivery.status is DeliveryStatus.SENT
        assert run.radio.channel_shown(0) == [b"meshsage: Long range radio."]


async def test_own_echoes_other_bots_and_numbered_parts_are_ignored() -> None:
    async with meshcore_run(channels=(0,), ignore_names=("WeatherBot",)) as run:
        run.radio.channel_text(0, "meshsage", "@meshsage echo of ourselves")
        run.radio.channel_text(0, "WeatherBot", "@meshsage rain at 5")
        run.radio.channel_text(0, "OtherBot", "(1/2) @meshsage a numbered part")
        run.radio.channel_text(0, "Carol", "@meshsage real question")
        await run.until(lambda: len(run.inbox) == 1)
        await asyncio.sleep(0.2)
        assert [i.sender for i in run.inbox] == ["~Carol"]


async def test_a_copy_delivered_again_is_dropped_but_the_same_words_later_are_not() -> None:
    async with meshcore_run() as run:
        alice = run.radio.person("Alice")
        run.radio.dm_from(alice, "yes", ts=5000)
        run.radio.dm_from(alice, "yes", ts=5000)  # the same message again (a re-sync)
        run.radio.dm_from(alice, "yes", ts=5007)  # a second "yes"
        await run.until(lambda: len(run.inbox) == 2)
        await asyncio.sleep(0.2)
        assert len(run.inbox) == 2


async def test_long_answers_are_byte_exact_numbered_parts_within_the_limits() -> None:
    text = ("Café crème, naïve façade: 🚀🇫🇷👩‍👩‍👧 " * 12).strip()
    async with meshcore_run(channels=(0,), max_parts=9) as run:
        alice = run.radio.person("Alice")
        run.radio.dm_from(alice, "tell me")
        run.radio.channel_text(0, "Bob", "@meshsage tell us")
        await run.until(lambda: len(run.inbox) == 2)
        dm, chan = run.inbox
        fitted = run.transport.fit(text)
        assert (await run.transport.send(Reply(inbound=dm, text=fitted))).status is (
            DeliveryStatus.DELIVERED
        )
        assert (await run.transport.send(Reply(inbound=chan, text=fitted))).status is (
            DeliveryStatus.SENT
        )
        parts = alice.shown
        assert len(parts) > 2 and parts[0].startswith(f"(1/{len(parts)}) ")
        assert all(len(p.encode()) <= 158 for p in parts)
        on_channel = run.radio.channel_shown(0)
        assert all(len(p) <= 160 for p in on_channel)
        bodies = [p.decode().removeprefix("meshsage: ").split(" ", 1)[1] for p in on_channel]
        assert " ".join(bodies) == fitted  # nothing cut by the firmware, nothing lost
        assert " ".join(p.split(" ", 1)[1] for p in parts) == fitted


async def test_an_unacked_dm_part_is_resent_with_backoff_then_the_person_is_told() -> None:
    async with meshcore_run(ack_retries=2, ack_backoff=10.0, ack_timeout=30.0) as run:
        alice = run.radio.person("Alice")
        run.radio.dm_from(alice, "hi")
        await run.until(lambda: len(run.inbox) == 1)
        alice.lose_acks = 3  # the first write and both re-sends get no ACK; the notice does
        delivery = await run.transport.send(Reply(inbound=run.inbox[0], text="An answer."))
        assert delivery.status is DeliveryStatus.FAILED
        dms = [a for a in run.radio.on_air if a.kind == "dm"]
        assert [a.attempt for a in dms[:3]] == [0, 1, 2]
        gaps = [b.at - a.at for a, b in itertools.pairwise(dms[:3])]
        assert gaps[0] >= 30.0 + 10.0 - 1e-6  # ACK wait, then the backoff
        assert gaps[1] >= 30.0 + 20.0 - 1e-6  # the backoff doubled
        assert alice.shown[0] == "An answer."  # the receiver dropped the re-sent copies
        await run.until(lambda: len(alice.shown) == 2)
        assert "did not reach you after 3 tries" in alice.shown[1]
        assert alice.out_path_len == -1  # the path was reset: the re-sends flooded


async def test_a_late_ack_of_an_earlier_attempt_still_counts() -> None:
    radio = {"ack_delay": 40.0}  # later than the ACK wait: the first re-send is under way
    async with meshcore_run(radio_kwargs=radio, ack_timeout=30.0, ack_backoff=5.0) as run:
        alice = run.radio.person("Alice")
        run.radio.dm_from(alice, "hi")
        await run.until(lambda: len(run.inbox) == 1)
        delivery = await run.transport.send(Reply(inbound=run.inbox[0], text="Slow ack."))
        assert delivery.status is DeliveryStatus.DELIVERED
        assert alice.shown == ["Slow ack."]


async def test_a_hung_companion_is_detected_by_the_probe_and_reopened() -> None:
    async with meshcore_run(probe_every=60.0, probe_timeout=0.5) as run:
        assert run.radio.connections == 1
        run.radio.hang()
        await run.virtual(61.0)
        await run.until(lambda: run.transport.hung == 1)
        await run.until(lambda: run.radio.connections == 2 and run.transport.health().link == "up")
        assert "stopped answering" in run.transport.health().detail
        alice = run.radio.person("Alice")  # it serves again
        run.radio.dm_from(alice, "are you back?")
        await run.until(lambda: len(run.inbox) == 1)


async def test_a_dropped_link_reconnects_with_backoff_and_queued_answers_go_out() -> None:
    async with meshcore_run() as run:
        alice = run.radio.person("Alice")
        run.radio.dm_from(alice, "hi")
        await run.until(lambda: len(run.inbox) == 1)
        run.radio.drop()
        await run.until(lambda: run.transport.health().link != "up")
        sending = asyncio.ensure_future(
            run.transport.send(Reply(inbound=run.inbox[0], text="After the outage."))
        )
        await run.until(lambda: run.radio.connections == 2, seconds=20)
        assert (await sending).status is DeliveryStatus.DELIVERED
        assert alice.shown == ["After the outage."]
        assert run.transport.reconnects == 1


async def test_after_a_restart_queued_parts_are_delivered_once() -> None:
    planned: dict[int, int] = {}
    done: set[int] = set()

    async def plan(i: int, ts: int) -> int:
        return planned.setdefault(i, ts)

    async def progress(i: int, platform_id: str) -> None:
        done.add(i)

    text = " ".join(["word"] * 60)
    async with meshcore_run(max_parts=3) as run:
        alice = run.radio.person("Alice")
        run.radio.dm_from(alice, "hi")
        await run.until(lambda: len(run.inbox) == 1)
        inbound = run.inbox[0]
        fitted = run.transport.fit(text)
        first = asyncio.ensure_future(
            run.transport.send(Reply(inbound=inbound, text=fitted, plan=plan, progress=progress))
        )
        await run.until(lambda: len(done) >= 1)
        first.cancel()  # the process dies after part 1 went out
        with contextlib.suppress(asyncio.CancelledError):
            await first
        shown = list(alice.shown)
        # the next run offers the reply again: the durable outbox's done parts and planned ids
        again = Reply(
            inbound=inbound, text=fitted, done_parts=frozenset(done),
            packet_ids=tuple(planned.items()), plan=plan, progress=progress,
        )  # fmt: skip
        assert (await run.transport.send(again)).status is DeliveryStatus.DELIVERED
        assert alice.shown[: len(shown)] == shown
        assert len(alice.shown) == 3 and len(set(alice.shown)) == 3


async def test_a_node_heard_but_not_added_is_added_so_it_can_dm() -> None:
    async with meshcore_run(radio_kwargs={"manual_add": True}) as run:
        dave = run.radio.person("Dave", contact=False)
        run.radio.dm_from(dave, "not decryptable yet")  # no key: the firmware drops it
        run.radio.advert(dave)
        await run.until(lambda: dave.contact)
        run.radio.dm_from(dave, "now?")
        await run.until(lambda: len(run.inbox) == 1)
        assert run.inbox[0].text == "now?" and run.inbox[0].authenticated


async def test_a_full_contact_table_is_an_operator_problem() -> None:
    async with meshcore_run() as run:
        run.radio.contacts_full()
        await run.until(lambda: run.transport.contacts_full)
        assert "contact table is full" in run.transport.health().problem


async def test_doctor_opens_a_session_and_reports_the_companion() -> None:
    from bot.ops.doctor import Level
    from bot.ops.doctor_meshcore import check_companion

    async with meshcore_run(start=False, radio_kwargs={"name": "MeshBot", "sf": 11}) as run:
        checks = await check_companion(run.config)
    (check,) = checks
    assert check.level is Level.OK, check
    assert "'MeshBot'" in check.detail and "SF11" in check.detail and "v1.9.0" in check.detail
    assert run.radio.commands.count(1) == 1 and 2 not in run.radio.commands  # nothing sent


async def test_doctor_says_when_no_companion_answers() -> None:
    from bot.config import MeshCoreConfig
    from bot.ops.doctor import Level
    from bot.ops.doctor_meshcore import check_companion

    cfg = MeshCoreConfig(connection="tcp", host="127.0.0.1", port=1, connect_timeout=2)
    (check,) = await check_companion(cfg)
    assert check.level is Level.FAIL and "cannot open tcp 127.0.0.1:1" in check.detail


async def test_a_lost_reply_frame_reopens_the_link_and_the_part_is_shown_once() -> None:
    async with meshcore_run() as run:
        alice = run.radio.person("Alice")
        run.radio.dm_from(alice, "hi")
        await run.until(lambda: len(run.inbox) == 1)
        run.radio.lose_replies = 1  # MSG_SENT for the first write never reaches the library
        delivery = await run.transport.send(Reply(inbound=run.inbox[0], text="Once only."))
        assert delivery.status is DeliveryStatus.DELIVERED
        assert alice.shown == ["Once only."]  # on air twice, the same packet: shown once
        assert len([a for a in run.radio.on_air if a.kind == "dm"]) == 2
        assert run.radio.connections == 2


async def test_the_operators_view_shows_contacts_counts_and_the_channel() -> None:
    async with meshcore_run(probe_every=60.0, probe_timeout=2.0) as run:
        alice = run.radio.person("Alice")
        run.radio.others_share = 12.0
        run.radio.dm_from(alice, "hi")
        await run.until(lambda: len(run.inbox) == 1)
        await run.transport.send(Reply(inbound=run.inbox[0], text="hello"))
        await run.virtual(121.0)  # two radio-counter readings: the channel's use is known
        view = run.transport.mesh_view()
        assert view.link == "up" and view.outbox_waiting == 0
        (node,) = [n for n in view.nodes if n.id == alice.prefix]
        assert node.name == "Alice" and node.from_node == 1 and node.to_node == 1
        assert view.channel_utilization is not None and 11.0 <= view.channel_utilization <= 14.0
        health = run.transport.health()
        assert health.link == "up" and "node 'meshsage', v1.9.0" in health.detail
