"""What a huge answer body costs the bot's memory (issue 43). Not a test.

A server (tests/fakes/flood_llm.py, in this process) answers one chat request with ``--mb``
megabytes: as server-sent events (a delta per event, the way llama.cpp streams) or as one
plain JSON completion (a server that ignores ``stream: true``). A child process (``--code
DIR`` runs another checkout's bot/ with this interpreter, for a before/after comparison)
builds the real ``OpenAICompatLLM`` and asks once; it reports its VmRSS before the request,
its peak RSS (``ru_maxrss``) after it, what the call returned, and this process reports how
much of the body the server managed to write before the client hung up.

It prints one line per case and writes nothing.
Usage: python -m bench.llm_body [--mb 10 100] [--code /other/checkout]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

from tests.fakes.flood_llm import FloodLLM, serve_forever

ROOT = Path(__file__).resolve().parents[1]
CHILD = """
import asyncio, json, resource, sys
from bot.config import LLMConfig
from bot.llm.openai_compat import OpenAICompatLLM
from bot.llm.port import ChatMessage

def vm_rss_kb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])

async def main():
    config = LLMConfig(base_url=sys.argv[1], model="fake", retries=0, read_timeout=120)
    llm = OpenAICompatLLM(config=config, env={})
    before = vm_rss_kb()
    try:
        done = await llm.complete([ChatMessage(role="user", content="hi")], max_tokens=100)
        said = f"an answer of {len(done.text)} chars, truncated={done.truncated}"
    except Exception as exc:
        said = f"{type(exc).__name__}: {str(exc)[:90]}"
    await llm.close()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"before_kb": before, "peak_kb": peak, "said": said}))

asyncio.run(main())
"""


def one_case(code: Path, *, mb: int, stream: bool) -> dict[str, object]:
    flood = FloodLLM(total=mb * 1024 * 1024, stream=stream)
    started = threading.Event()
    threading.Thread(target=serve_forever, args=(flood, started), daemon=True).start()
    started.wait(10)
    env = {**os.environ, "PYTHONPATH": str(code)}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, flood.base_url], capture_output=True, text=True,
        env=env, timeout=600, check=True, cwd=code,  # cwd: python -c puts it first on the path
    )  # fmt: skip
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    result["sent_mb"] = flood.sent / (1024 * 1024)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.llm_body", description=__doc__)
    p.add_argument("--mb", type=int, nargs="+", default=[10, 100])
    p.add_argument("--code", type=Path, default=ROOT, help="checkout whose bot/ to run")
    args = p.parse_args(argv)
    print(f"code {args.code}, Python {sys.version.split()[0]}")
    for mb in args.mb:
        for stream in (True, False):
            r = one_case(args.code, mb=mb, stream=stream)
            before, peak = int(str(r["before_kb"])) / 1024, int(str(r["peak_kb"])) / 1024
            kind = "SSE stream" if stream else "plain JSON"
            print(
                f"  {mb:>4} MB {kind}: RSS before {before:.1f} MB, peak {peak:.1f} MB "
                f"(+{peak - before:.1f} MB); server wrote {float(str(r['sent_mb'])):.1f} MB; "
                f"{r['said']}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
