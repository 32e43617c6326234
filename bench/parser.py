"""Time of reflact.replies.parse.extract_object on adversarial replies as they double in size.

    python bench/parser.py [--sizes 10,20,40,80,160] [--budget 30] [--repeat 3]

Inputs (each cut to exactly the size, in KB of 1,024 characters):
  all {          "{{{{..."                      braces that never close
  {"a": x N      '{"a": {"a": ...'              an object start repeated, never closed (a cut-off reply)
  nested [       "[[[[..."                      deep nesting outside any object
  {" x N         '{"{"{"...'                    quotes and braces interleaved
  {"a" x N       '{"a" {"a" ...'                keys without a colon: JSON-like, never an object
  fences         "```json\n{```json\n{..."      fences that hold unclosed braces
  long valid     prose + one object with N edits + prose: the ordinary path, a dict comes back
Per input and size: seconds of one call (the minimum of --repeat calls while a call takes under
1 s) and, from the second size on, the ratio to the previous size; "per doubling" is the growth
from the first to the last size measured, per doubling: ~2 is linear, ~4 quadratic. An input
stops growing once one call took longer than --budget seconds. The last column says what the
largest size returned. Which reflact is timed is the one Python imports (PYTHONPATH picks a
checkout).
"""

from __future__ import annotations

import argparse
import json
import math
import time

from reflact.replies import parse


def _cut(unit: str, size: int) -> str:
    return (unit * (size // len(unit) + 1))[:size]


def _long_reply(size: int) -> str:
    edits, text = [], ""
    while len(text) < size:
        edits.append({"op": "append", "content": f"Rule {len(edits)}: check the {{name}} field twice."})
        text = "Here is my patch:\n" + json.dumps({"patch": {"reasoning": "r", "edits": edits}}) + "\nDone."
    return text


INPUTS = {
    "all {": lambda n: _cut("{", n),
    '{"a": x N': lambda n: _cut('{"a": ', n),
    "nested [": lambda n: _cut("[", n),
    '{" x N': lambda n: _cut('{"', n),
    '{"a" x N': lambda n: _cut('{"a" ', n),
    "fences": lambda n: _cut("```json\n{", n),
    "long valid": _long_reply,
}


def _one_call(text: str) -> tuple[float, str]:
    started = time.perf_counter()
    try:
        result = f"dict ({len(parse.extract_object(text))} keys)"
    except parse.ParseError as exc:
        result = f"ParseError: {str(exc)[:48]}"
    return time.perf_counter() - started, result


def _timed(text: str, repeat: int) -> tuple[float, str]:
    best, result = _one_call(text)
    for _ in range(repeat - 1):
        if best >= 1.0:  # slow enough to read from one call; repeating would only cost time
            break
        seconds, result = _one_call(text)
        best = min(best, seconds)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,20,40,80,160", help="KB, comma-separated, ascending")
    parser.add_argument("--budget", type=float, default=30.0, help="stop growing an input after a call this long (s)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"reflact.replies.parse from {parse.__file__}")
    print(f"{'input':12s}" + "".join(f"{f'{s} KB':>18s}" for s in sizes) + "   per doubling   largest size returned")
    for label, make in INPUTS.items():
        cells, measured, result = [], [], ""
        for size in sizes:
            if measured and measured[-1][1] > args.budget:
                cells.append(f"{'-':>18s}")
                continue
            seconds, result = _timed(make(size * 1024), args.repeat)
            ratio = f" (x{seconds / measured[-1][1]:4.1f})" if measured else ""
            cells.append(f"{f'{seconds:.4f}{ratio}':>18s}")
            measured.append((size, seconds))
        print(f"{label:12s}" + "".join(cells) + f"   {_per_doubling(measured):>12s}   {result}", flush=True)


def _per_doubling(measured: list[tuple[int, float]]) -> str:
    """The growth per doubling from the first to the last size: steadier than one step's ratio."""
    (small, fast), (large, slow) = measured[0], measured[-1]
    if large == small or fast <= 0:
        return "-"
    return f"x{(slow / fast) ** (1 / math.log2(large / small)):.1f}"


if __name__ == "__main__":
    main()
