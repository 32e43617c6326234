"""How far the agreement figures can be trusted: the matcher in use, measured on the labelled pairs
reflact ships (bench/data/match_pairs.jsonl and match_pairs_heldout.jsonl in a checkout, reflact/_pairs
in a wheel). The held-out file was used to choose nothing (no threshold, no guard's constant): its
figures, given apart, are what to expect of wordings nobody tuned the matcher on.

Each pair is two kept items and whether they make the same change: one change in two wordings (a
paraphrase), or two different changes on one topic (a negation, another number, target, verb or
rule). Each pair is matched as the analysis matches a run of two items. A matcher that misses
paraphrases understates agreement; one that merges different changes overstates it.
"""

from __future__ import annotations

import json
import logging

from reflact.analysis.matching import item_key
from reflact.core.shipped import shipped_dir

log = logging.getLogger("reflact")
PAIRS = "match_pairs.jsonl"
HELD_OUT = "match_pairs_heldout.jsonl"


def labelled_pairs() -> list[dict]:
    """The shipped pairs, the held-out ones marked `held_out` (none when the file is missing: the
    figures are then left out)."""
    rows = []
    for name in (PAIRS, HELD_OUT):
        path = shipped_dir("pairs") / name
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError:
            log.warning("%s: not found; the matcher's measured recall is left out of the report", path)
            return []
        rows += [{**json.loads(line), "held_out": name == HELD_OUT} for line in lines if line.strip()]
    return rows


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
    figures = _figures(hits, rows)
    held = [i for i, row in enumerate(rows) if row.get("held_out")]
    if held:
        figures |= {f"held_out_{k}": v for k, v in _figures([hits[i] for i in held], [rows[i] for i in held]).items()}
    return figures


def _figures(hits: list[bool], rows: list[dict]) -> dict:
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
        f"({_percent(merged)}){_held_out(trust)}: agreement and redundancy are understated by what it misses "
        "and overstated by what it merges."
    )


def _held_out(trust: dict) -> str:
    if not trust.get("held_out_labelled_pairs"):
        return ""
    return (
        f"; on the {trust['held_out_labelled_pairs']} of them held out from its tuning, it matches "
        f"{trust['held_out_paraphrases_matched']} of {trust['held_out_paraphrases']} paraphrases and merges "
        f"{trust['held_out_different_merged']} of {trust['held_out_different_changes']}"
    )


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{value:.0%}"
