"""bench.forged_flood measures what it says: a small flood on the fake radio, each forged id
written once (no re-sends), every write counted with the firmware's retransmissions."""

from __future__ import annotations

from bench.forged_flood import Flood, flood, table
from bench.mesh_load import ANSWER
from tests.fakes.fake_llm import FakeLLM


async def test_a_small_flood_is_measured_write_by_write(fake_llm: FakeLLM) -> None:
    fake_llm.reply = ANSWER  # how the bench tells the answer from a notice
    result = await flood(3, fake_llm)
    assert (result.forged, result.writes, result.answered) == (3, 3, 3)
    assert result.on_air > 0 and result.amplification > 1.0
    assert result.real_answer < 60.0  # the real person is answered within the bench's run
    row = table([result], label="x").splitlines()[-1]
    assert row.startswith("| x | 3 | 3 |")
    assert isinstance(result, Flood)
