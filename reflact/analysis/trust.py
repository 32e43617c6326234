"""How far the agreement figures can be trusted: the matcher in use, measured on the labelled pairs
reflact ships (bench/data/match_pairs.jsonl in a checkout, reflact/_pairs in a wheel).

Each pair is two kept items and whether they make the same change: one change in two wordings (a
paraphrase), or two different changes on one topic (a negation, another number, target, verb or
rule). Each pair is matched as the analysis matches a run of two items. A matcher that misses
paraphrases understates agreement; one that merges different changes overstates it.
"""

from __future__ import annotations

import json
import logging

from reflact.analysis.matching import item_key
from reflact.shipped import shipped_dir

log = logging.getLogger("reflact")
PAIRS = "match_pairs.jsonl"


def labelled_pairs() -> list[dict]:
    """The shipped pairs (none when the file is missing: the figures are then left out)."""
    path = shipped_dir("pairs") / PAIRS
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        log.warning("%s: not found; the matcher's measured recall is left out of the report", path)
        return []
    return [json.loads(line) for line in lines if line.strip()]


def matched(matcher, pair: dict) -> bool:
    """Do the pair's two items match, as two kept items of one run."""
    keys = [item_key(pair["a"]), item_key(pair["b"])]
    return any(len(first) for first, _ in matcher.chunks(keys))


def measured(matcher, pairs: list[dict] | None = None) -> dict:
    """The matcher's paraphrase recall and rate of merged different changes on the labelled pairs
    (empty without pairs)."""
    rows = labelled_pairs() if pairs is None else pairs
    if not rows:
        return {}
    hits = [matched(matcher, row) for row in rows]
    same = [hit for hit, row in zip(hits, rows, strict=True) if row["same"]]
    different = [hit for hit, row in zip(hits, rows, strict=True) if not row["same"]]
    return {
        "labelled_pairs": len(rows),
        "paraphrases": len(same),
        "paraphrases_matched": sum(same),
        "paraphrase_recall": _share(sum(same), len(same)),
        "different_changes": len(different),
        "different_merged": sum(different),
        "different_merged_rate": _share(sum(different), len(different)),
    }


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def sentence(trust: dict) -> str:
    """The report's line on it."""
    if not trust:
        return "The matcher was not measured (the labelled pairs are not installed)."
    recall, merged = trust["paraphrase_recall"], trust["different_merged_rate"]
    return (
        f"On the {trust['labelled_pairs']} labelled pairs reflact ships, this matcher matches "
        f"{trust['paraphrases_matched']} of {trust['paraphrases']} paraphrases (recall {_percent(recall)}) and merges "
        f"{trust['different_merged']} of {trust['different_changes']} pairs of different changes on one topic "
        f"({_percent(merged)}): agreement and redundancy are understated by what it misses and overstated by "
        "what it merges."
    )


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{value:.0%}"
