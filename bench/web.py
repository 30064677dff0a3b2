"""The web view's cost on the Pi-sized footprint (issue 31): memory with and without ``web:``,
and CPU while nobody and while one real browser watches.

Each run starts `meshsage run` in a child process against the fake TCP radio (the unmodified
meshtastic library talks to it) and a tiny OpenAI-compatible stub (bench.footprint's), with or
without a ``web:`` section (loopback, default refresh), and measures:

- idle RSS: VmRSS after --idle seconds, runs alternating without/with the web view;
- CPU at idle: the process's user+system CPU seconds over --watch seconds divided by them
  (percent of one core), with web on and no viewer, then with one headless Chromium
  (Debian's, driven by Playwright, the flags the browser tests use) showing the Airtime page,
  then the Now page (which changes at every sample: the uptime), each with its live stream
  open, and RSS once more after each watch.

It prints one line per measurement and a summary; it writes nothing.
Usage: python -m bench.web [--runs 3] [--idle 10] [--watch 60]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

from bench.footprint import READY_LINE, _Models, _rss_kb
from tests.fakes.fake_radio import FakeTcpRadio

ROOT = Path(__file__).resolve().parents[1]
FLAGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Bot:
    def __init__(self, *, tmp: str, llm_url: str, radio_port: int, web_port: int | None) -> None:
        config = Path(tmp) / "config.yaml"
        web = f"web: {{enabled: true, port: {web_port}}}\n" if web_port else ""
        config.write_text(
            f"llm: {{base_url: '{llm_url}', model: fake}}\n"
            f"meshtastic: {{connection: tcp, host: 127.0.0.1, port: {radio_port}}}\n" + web
        )
        env = {
            "PATH": os.environ.get("PATH", ""), "HOME": tmp, "PYTHONPATH": str(ROOT),
            "MESHSAGE_STATE_DIR": str(Path(tmp) / "state"), "MESHSAGE_CONFIG": str(config),
        }  # fmt: skip
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bot.cli", "run", "--config", str(config)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            env=env, cwd=tmp, text=True,
        )  # fmt: skip
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            if READY_LINE in line:
                break
        else:
            raise RuntimeError("meshsage ended before its transport started")
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()

    def rss_mb(self) -> float:
        return _rss_kb(self.proc.pid) / 1024

    def cpu_percent(self, seconds: float) -> float:
        before, t0 = _cpu_seconds(self.proc.pid), time.monotonic()
        time.sleep(seconds)
        return 100 * (_cpu_seconds(self.proc.pid) - before) / (time.monotonic() - t0)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


async def _watch(url: str, bot: Bot, seconds: float) -> tuple[float, int]:
    """CPU percent of the bot while Chromium shows ``url`` live; and the updates it got."""
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        with tempfile.TemporaryDirectory() as profile:
            context = await pw.chromium.launch_persistent_context(
                profile, executable_path="/usr/bin/chromium", headless=True, args=FLAGS
            )
            page = await context.new_page()
            await page.goto(url)
            await page.wait_for_selector("#live.on", timeout=60_000)
            await asyncio.sleep(5)  # past the first render and the stream's first event
            start = int(await page.get_attribute("body", "data-updates") or "0")
            cpu = await asyncio.to_thread(bot.cpu_percent, seconds)
            updates = int(await page.get_attribute("body", "data-updates") or "0") - start
            await context.close()
    return cpu, updates


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.web", description=__doc__)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--idle", type=float, default=10.0, help="seconds idle before sampling RSS")
    p.add_argument("--watch", type=float, default=60.0, help="seconds of CPU measurement")
    args = p.parse_args(argv)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Models)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    llm_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    rss: dict[str, list[float]] = {"off": [], "on": []}
    try:
        for i in range(args.runs):
            for mode in ("off", "on"):
                radio = FakeTcpRadio()
                with tempfile.TemporaryDirectory() as tmp:
                    bot = Bot(tmp=tmp, llm_url=llm_url, radio_port=radio.port,
                              web_port=_free_port() if mode == "on" else None)  # fmt: skip
                    try:
                        time.sleep(args.idle)
                        rss[mode].append(bot.rss_mb())
                    finally:
                        bot.stop()
                        radio.stop()
                print(f"run {i + 1}: web {mode}: idle RSS {rss[mode][-1]:.1f} MB", flush=True)
        radio = FakeTcpRadio()
        with tempfile.TemporaryDirectory() as tmp:
            cpu: dict[str, float] = {}
            port = _free_port()
            for mode in ("off", "on"):
                home = Path(tmp) / mode
                home.mkdir()
                bot = Bot(tmp=str(home), llm_url=llm_url, radio_port=radio.port,
                          web_port=port if mode == "on" else None)  # fmt: skip
                try:
                    time.sleep(args.idle)
                    cpu[mode] = bot.cpu_percent(args.watch)
                    print(f"web {mode}, no viewer: CPU {cpu[mode]:.2f}% of a core over "
                          f"{args.watch:.0f} s", flush=True)  # fmt: skip
                    if mode == "on":
                        for path in ("/airtime", "/"):  # charts; Now (changes every sample)
                            watched, updates = asyncio.run(
                                _watch(f"http://127.0.0.1:{port}{path}", bot, args.watch)
                            )
                            after = bot.rss_mb()
                            print(f"web on, one browser on {path}: CPU {watched:.2f}% of a "
                                  f"core over {args.watch:.0f} s ({updates} live updates), RSS "
                                  f"after {after:.1f} MB", flush=True)  # fmt: skip
                finally:
                    bot.stop()
            radio.stop()
    finally:
        server.shutdown()
    off, on = statistics.median(rss["off"]), statistics.median(rss["on"])
    print(
        f"idle RSS median: web off {off:.1f} MB, web on {on:.1f} MB (+{on - off:.1f} MB) over "
        f"{args.runs} runs; CPU at idle: off {cpu['off']:.2f}%, on {cpu['on']:.2f}%, one "
        f"browser watching {watched:.2f}% of a core; Python {sys.version.split()[0]}, "
        f"{os.cpu_count()} cores"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
