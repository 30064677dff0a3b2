"""The operator sees who the mesh trusts (issue 44, points 1 and 2): check-config warns about
the permissive ``unauthenticated_dm`` and unpinned mesh operators, doctor shows the pins and
the refusals, ``meshsage status`` and /metrics count the refused DMs."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from bot.cli import main
from bot.config import load_config
from bot.ops import status as status_file
from bot.ops.doctor import Level
from bot.ops.doctor_identity import check_identity
from bot.web.prom import exposition
from tests.test_web_security import snapshot

RISKY = (
    "bot:\n  operators: ['meshtastic:!20000009']\n"
    "meshtastic:\n  enabled: true\n  connection: tcp\n  host: 127.0.0.1\n"
    "  unauthenticated_dm: memory\n"
)


def _config(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(f"state_dir: {tmp_path / 'state'}\nllm:\n  base_url: http://127.0.0.1:9/v1\n"
                    f"  model: m\n{body}", encoding="utf-8")  # fmt: skip
    return path


def test_check_config_warns_about_memory_for_unauthenticated_dms(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check-config", "--service", str(_config(tmp_path, RISKY))]) == 0
    err = capsys.readouterr().err
    assert "warning:" in err and "unauthenticated_dm: memory lets anyone" in err
    assert "!20000009 have no meshtastic.pinned_keys entry" in err
    careful = RISKY.replace("  unauthenticated_dm: memory\n", "").replace(
        "operators: ['meshtastic:!20000009']", "operators: []"
    )
    assert main(["check-config", "--service", str(_config(tmp_path, careful))]) == 0
    assert "warning:" not in capsys.readouterr().err


def test_doctor_counts_pins_and_refusals_and_names_the_risk(tmp_path: Path) -> None:
    config = load_config(_config(tmp_path, RISKY), env={})
    config.database_path.parent.mkdir(parents=True)
    db = sqlite3.connect(config.database_path)
    db.execute("CREATE TABLE key_pins (transport, person, public_key, pinned_at)")
    db.execute("INSERT INTO key_pins VALUES ('meshtastic', '!20000001', 'x', 1.0)")
    db.commit()
    db.close()
    now = time.time()
    report = status_file.Status(written_at=now, started_at=now, pid=1, version="x",
                                healthy=True, identity={"refused_no_pki": 3,
                                                        "refused_key_changed": 1})  # fmt: skip
    status_file.write_atomic(config.database_path.parent / status_file.STATUS_FILE,
                             report.to_json())  # fmt: skip
    check = check_identity(config)
    assert check.level is Level.WARN
    assert "1 node key(s) pinned" in check.detail and "4 DM(s) refused" in check.detail
    assert "unauthenticated_dm: memory" in check.detail
    lines, _ = status_file.render(report, now=now)
    assert any("4 mesh DM(s) refused" in line and "1 with another key" in line for line in lines)


def test_metrics_count_refused_dms_by_reason() -> None:
    snap = snapshot()
    snap.status.identity.update({"refused_no_pki": 3, "refused_key_changed": 1})
    text = exposition(snap)
    assert 'meshsage_mesh_refused_total{reason="no_pki"} 3' in text
    assert 'meshsage_mesh_refused_total{reason="key_changed"} 1' in text
