"""The floor under any client built on the OpenAI SDK: N bare chat requests through W threads.

    python bench/_sdk_floor.py --base-url URL --calls N --chars C --result FILE [--workers 16]

A fresh process, the SDK imported and the client built before the clock starts (as reflact's
stage is measured), then N `chat.completions.create` calls whose messages hold C characters,
W at a time; no rendering, no files. Its wall time over ceil(N/W) x latency is what the SDK and
the server alone cost, against which reflact's stage overhead is judged.
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--calls", type=int, required=True)
    parser.add_argument("--chars", type=int, required=True)
    parser.add_argument("--result", type=Path, required=True)
    parser.add_argument("--workers", type=int, default=16)
    args = parser.parse_args()

    import openai

    client = openai.OpenAI(base_url=args.base_url, api_key="not-needed", max_retries=0)
    system = "s" * min(5000, args.chars // 2)
    # the server's default reply reads the group and L off the user message
    user = "## Failed Trajectories\nProduce at most L=4 edits.\n"
    user += "u" * max(args.chars - len(system) - len(user), 0)
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]

    def call(_: int) -> None:
        client.chat.completions.create(model="bench-model", messages=messages, max_completion_tokens=16384)

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.workers) as pool:
        list(pool.map(call, range(args.calls)))
    args.result.write_text(json.dumps({"wall_s": time.perf_counter() - started, "calls": args.calls}))


if __name__ == "__main__":
    main()
