"""Write a synthetic dataset folder (SPEC 1) of any size, for benchmarks and manual checks.

    python bench/make_dataset.py OUT_DIR --runs 200 [--fail-share 0.6] [--steps 8] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

SKILL = """# Order support skill

## Before acting
- Look up the order and read its status before any change.
- Confirm the customer's identity for address or payment changes.

## Refunds
- Amounts passed to refund() are in cents.
- Shipping is refundable only when the delay was ours.

## When a tool fails
- Retry once after reading the error; escalate with the error text if it fails again.
"""


def conversation(rng: random.Random, index: int, steps: int) -> list:
    items: list = [{"role": "user", "content": f"Order TH-{10000 + index}: please fix my delivery."}]
    for step in range(1, steps + 1):
        if step % 3 == 0:
            items.append({"step": step, "reasoning": "Check the result.", "action": f"lookup_order(TH-{index})",
                          "env_feedback": "status: " + rng.choice(["shipped", "delivered", "pending"])})
        else:
            items.append({"type": "tool_call", "cmd": f"search_kb(query='policy {step}')",
                          "obs": "Policy text: " + " ".join(rng.choice(["refund", "cents", "carrier", "delay",
                                                                          "address", "label"]) for _ in range(40))})
    items.append({"role": "assistant", "content": "I have handled your request."})
    return items


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--fail-share", type=float, default=0.6)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "skill.md").write_text(SKILL, encoding="utf-8")
    with open(args.out / "results.jsonl", "w", encoding="utf-8") as results:
        for index in range(args.runs):
            run_id = f"gen_{index:06d}"
            failed = rng.random() < args.fail_share
            row = {"id": run_id, "hard": 0.0 if failed else 1.0, "task_description": f"Support task {index}",
                   "task_type": "support", "fail_reason": "wrong refund amount" if failed else "",
                   "n_turns": args.steps}
            results.write(json.dumps(row) + "\n")
            folder = args.out / "predictions" / run_id
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "conversation.json").write_text(json.dumps(conversation(rng, index, args.steps)),
                                                      encoding="utf-8")
    print(f"wrote {args.runs} runs to {args.out}")


if __name__ == "__main__":
    main()
