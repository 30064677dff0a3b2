"""Idle memory and start time of `meshsage run` with a Meshtastic radio (the Pi setup).

Starts the fake TCP radio (tests/fakes/fake_radio.py, the unmodified meshtastic library talks
to it) and a tiny OpenAI-compatible stub on 127.0.0.1, then runs `meshsage run` in a child
process (`--code DIR` runs another checkout's bot/ with this interpreter, for a before/after
comparison) and measures:

- start: seconds from spawning the process to the log line "transport meshtastic launched"
  (the transport is started; the radio link comes up in the background);
- idle RSS: VmRSS of the process after it has been idle for --idle seconds, median of --runs.

It prints one line per run and a summary; it writes nothing.
Usage: python -m bench.footprint [--runs 5] [--idle 10] [--code /path/to/other/checkout]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.fakes.fake_radio import FakeTcpRadio

ROOT = Path(__file__).resolve().parents[1]
READY_LINE = "transport meshtastic launched"


class _Models(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"object": "list", "data": [{"id": "fake", "object": "model"}]})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: object) -> None:
        return


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def one_run(
    code: Path, *, idle: float, llm_url: str, radio_port: int, extra_env: dict[str, str]
) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config.yaml"
        config.write_text(
            f"llm: {{base_url: '{llm_url}', model: fake}}\n"
            f"meshtastic: {{connection: tcp, host: 127.0.0.1, port: {radio_port}}}\n"
        )
        env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": tmp,
            "PYTHONPATH": str(code),
            "MESHSAGE_STATE_DIR": str(Path(tmp) / "state"),
            "MESHSAGE_CONFIG": str(config),
            **extra_env,
        }
        started = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "bot.cli", "run", "--config", str(config)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            env=env, cwd=tmp, text=True,
        )  # fmt: skip
        assert proc.stderr is not None
        start_s = float("nan")
        try:
            for line in proc.stderr:
                if READY_LINE in line:
                    start_s = time.monotonic() - started
                    break
            else:
                raise RuntimeError("meshsage ended before its transport started")
            drain = threading.Thread(target=proc.stderr.read, daemon=True)
            drain.start()
            time.sleep(idle)
            rss_mb = _rss_kb(proc.pid) / 1024
        finally:
            proc.terminate()
            proc.wait(60)
        return start_s, rss_mb


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.footprint", description=__doc__)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--idle", type=float, default=10.0, help="seconds idle before sampling RSS")
    p.add_argument("--code", type=Path, default=ROOT, help="checkout whose bot/ to run")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="extra environment for the bot, e.g. MALLOC_ARENA_MAX=2")  # fmt: skip
    args = p.parse_args(argv)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Models)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    llm_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    extra = dict(pair.split("=", 1) for pair in args.env)
    starts, rss = [], []
    try:
        for i in range(args.runs):
            radio = FakeTcpRadio()
            try:
                s, r = one_run(args.code, idle=args.idle, llm_url=llm_url, radio_port=radio.port,
                               extra_env=extra)  # fmt: skip
            finally:
                radio.stop()
            starts.append(s)
            rss.append(r)
            print(f"run {i + 1}: start {s:.2f} s, idle RSS {r:.1f} MB")
    finally:
        server.shutdown()
    print(
        f"code {args.code} {' '.join(args.env)}: start median {statistics.median(starts):.2f} s, "
        "idle RSS median "
        f"{statistics.median(rss):.1f} MB over {args.runs} runs (idle {args.idle:.0f} s), "
        f"Python {sys.version.split()[0]}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
