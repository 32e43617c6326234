"""How stable, how redundant and how many different the items of a run are: `analysis.json`.

Every figure comes from what a finished run dir holds (its summary and kept items), so a run
writes them at its end and `python -m reflact.analyze` computes the same ones later, over any run
dirs, with another threshold if asked. Items match when they change the same thing in nearly the
same words (reflact.analysis.matching, `analysis.match_threshold`), or by the matcher `analysis.matcher`
names (reflact.analysis.matchers: embeddings, a judge), which analysis.json records.

- **agreement** (`optimizer.samples` >= 2): per minibatch, the share of its kept items, over all its
  draws, that a matching item of another of its draws repeats; per run, the same share over the
  items of every minibatch with two draws or more. None with one draw.
- **redundancy**: the share of the run's kept items (all draws) that a matching item of another
  minibatch of the same group repeats: the same lesson drawn from other trajectories.
- **distinct items**: clusters of matching items (linked transitively); per dollar of `cost_usd`,
  what the run's patches cost.
- **seed agreement** (several runs that differ only in `reflect.seed`): the share of their items
  that a matching item of a run with another seed repeats; per cell of settings.
"""

from __future__ import annotations

import json
import logging
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reflact.analysis.matching import BUDGET_ITEM_CHARS, Key, Lexical, item_key, match, work, work_budget
from reflact.analysis.records import finished_summary
from reflact.config import AnalysisConfig
from reflact.core.errors import UserError
from reflact.core.groups import FAILURE
from reflact.core.modes import MODES
from reflact.prompting.plan import Minibatch, parse_tag
from reflact.running.outcome import WITH_PATCH
from reflact.running.rundir import KEPT_ITEMS, RunDir

log = logging.getLogger("reflact")
WARM_AFTER_S = 0.3  # the first requests go out before the analysis's imports compete for the GIL


@dataclass(frozen=True)
class Item:
    """One kept item and where it came from."""

    tag: str
    position: int
    group: str
    index: int
    draw: int
    key: Key


@dataclass
class Run:
    """What an analysis needs of one finished run dir."""

    path: Path
    settings: dict
    cost_usd: float
    draws: Counter  # (group, index) -> draws of that minibatch with a patch
    items: list[Item] = field(default_factory=list)
    threshold: object = None  # the one its own analysis used, if it has one, as saved (saved_threshold checks it)
    matcher: str | None = None  # the matcher its own analysis used
    support_share: float | None = None  # reflect.provenance: kept items that name a trajectory

    @property
    def seed(self) -> int:
        return int(self.settings.get("seed", 0))

    def cell(self) -> str:
        """What runs must share to be compared across seeds: every setting but the seed (and workers)."""
        return json.dumps({k: v for k, v in self.settings.items() if k not in ("seed", "workers")}, sort_keys=True)

    def label(self) -> dict:
        s = self.settings
        mode = str(s.get("update_mode"))
        return {
            "update_mode": mode,
            "mode": MODES[mode].short if mode in MODES else mode,
            "M": s.get("minibatch_size"),
            "L": s.get("edit_budget"),
            "k": s.get("samples", 1),
        }


def load_run(root: Path) -> Run:
    """A finished run dir's settings, cost, draws and kept items; a UserError naming the folder when
    it is no finished run dir or its files cannot be read."""
    rd = RunDir(root)
    summary = finished_summary(root)
    try:
        run = run_from(Path(root), summary, rd.kept_items())
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        raise UserError(f"{root}: {KEPT_ITEMS} is damaged (a line is not a kept item)") from None
    except OSError as exc:
        raise UserError(f"{root}: {KEPT_ITEMS} cannot be read ({exc.strerror or exc})") from None
    own = rd.analysis() or {}
    matcher = own.get("matcher", "lexical" if own else None)
    run.threshold, run.matcher = own.get("threshold"), None if matcher is None else str(matcher)
    return run


def run_from(root: Path, summary: dict, kept_items: Iterable[dict]) -> Run:
    """The run of a summary and its kept items' rows (as the run dir holds them, or as just written)."""
    draws: Counter = Counter()
    for record in summary["minibatches"]:
        where = parse_tag(str(record.get("tag", "")))
        if where is not None and record.get("status") in WITH_PATCH:
            draws[where[:2]] += 1
    cost = summary.get("counts", {}).get("cost_usd", 0.0)  # None: the model had no price
    run = Run(root, summary.get("settings", {}), float(cost or 0.0), draws)
    run.items = [item for row in kept_items if (item := _item(row)) is not None]
    run.support_share = summary.get("counts", {}).get("support_share")
    return run


def load_runs_quietly(paths: list[Path]) -> list[Run]:
    """The finished run dirs among `paths`; others (gone, unfinished, damaged) are left out with a note."""
    runs = []
    for path in paths:
        try:
            runs.append(load_run(path))
        except UserError as exc:
            log.info("analysis: %s; left out", exc)
    return runs


def usual_threshold(runs: list[Run]) -> float:
    """The lexical threshold most of the runs were analysed with (the default when none was)."""
    found = Counter(t for run in runs if run.matcher == "lexical" and (t := saved_threshold(run)) is not None)
    return float(found.most_common(1)[0][0]) if found else AnalysisConfig().match_threshold


def saved_threshold(run: Run) -> float | None:
    """The threshold the run's own analysis.json names, when it is one a matcher can use; None otherwise."""
    value = run.threshold
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= 1:
        return float(value)
    return None


def _item(row: dict) -> Item | None:
    where, key = parse_tag(row["minibatch"]), item_key(row["item"])
    if where is None or key is None:
        return None
    return Item(row["minibatch"], int(row["position"]), *where, key)


def as_matcher(matcher) -> object:
    """A matcher (reflact.analysis.matchers), or a threshold for the lexical one."""
    return Lexical(float(matcher)) if isinstance(matcher, (int, float)) else matcher


def analyse(run: Run, matcher) -> dict:
    """The run's figures (what analysis.json holds), by `matcher` (or a lexical threshold)."""
    items, matcher = run.items, as_matcher(matcher)
    minibatch = _codes([(i.group, i.index) for i in items])
    matched = match(
        [i.key for i in items],
        matcher,
        {
            "redundant": (_codes([i.group for i in items]), minibatch),  # same group, another minibatch
            "agreeing": (minibatch, [i.draw for i in items]),  # same minibatch, another draw
        },
    )
    redundant, distinct = int(matched.recurs["redundant"].sum()), matched.distinct()
    figures = {
        **matcher.describe(),
        "samples": int(run.settings.get("samples", 1)),
        "edits": len(items),
        "distinct_edits": distinct,
        "distinct_edits_per_usd": round(distinct / run.cost_usd, 6) if run.cost_usd > 0 else None,
        "redundant_edits": redundant,
        "redundancy": _share(redundant, len(items)),
    }
    figures.update(_agreement(run, matched.recurs["agreeing"].tolist()))
    figures["near_duplicates"] = _groups(items, matched.cluster.tolist())
    return figures


def _agreement(run: Run, agreeing: list[bool]) -> dict:
    """Per minibatch with two draws or more: its items, over its draws, and those another draw repeats."""
    counts: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])
    for item, agrees in zip(run.items, agreeing, strict=True):
        counts[(item.group, item.index)][0] += 1
        counts[(item.group, item.index)][1] += agrees
    records: list[dict[str, Any]] = []
    for (group, index), draws in sorted(run.draws.items(), key=lambda kv: (kv[0][0] != FAILURE.name, kv[0][1])):
        if draws >= 2:
            edits, agree = counts[(group, index)]
            records.append(
                {
                    "minibatch": Minibatch(group, index, []).tag,
                    "draws": draws,
                    "edits": edits,
                    "agreeing": agree,
                    "agreement": _share(agree, edits) if edits else None,
                }
            )
    if not records:
        return {"agreement": None}
    edits, agree = sum(r["edits"] for r in records), sum(r["agreeing"] for r in records)
    return {"agreement": _share(agree, edits) if edits else None, "agreeing_edits": agree, "minibatches": records}


def _groups(items: list[Item], cluster: list[int]) -> list[list[str]]:
    """The clusters of two items or more, largest first: each item as `<minibatch>#<position>`."""
    members: dict[int, list[str]] = defaultdict(list)
    for item, c in zip(items, cluster, strict=True):
        members[c].append(f"{item.tag}#{item.position}")
    return sorted((m for m in members.values() if len(m) > 1), key=len, reverse=True)


def seed_agreement(runs: list[Run], matcher) -> list[dict]:
    """Per cell of runs that differ only in their seed: the share of their items that a matching
    item of a run with another seed repeats (None with fewer than two seeds)."""
    cells: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        cells[run.cell()].append(run)
    rows = []
    for members in cells.values():
        items = [(run.seed, item) for run in members for item in run.items]
        seeds = sorted({run.seed for run in members})
        row = {
            **members[0].label(),
            "seeds": len(seeds),
            "runs": len(members),
            "edits": len(items),
            "recurring": None,
            "seed_agreement": None,
        }
        if len(seeds) >= 2:
            matched = match(
                [item.key for _, item in items],
                as_matcher(matcher),
                {"other_seed": ([0] * len(items), [seed for seed, _ in items])},
            )
            recurring = int(matched.recurs["other_seed"].sum())
            row.update(recurring=recurring, seed_agreement=_share(recurring, len(items)))
        rows.append(row)
    return sorted(rows, key=lambda r: (r["mode"], r["M"], r["L"], r["k"]))


def seed_by_cell(cells: list[dict]) -> dict[tuple[str, int, int], float]:
    """Seed agreement per (mode, M, L), as the sweep report's grid has them: the mean over cells
    that share those and differ in other settings (a swept number of draws, say)."""
    values: dict[tuple[str, int, int], list[float]] = defaultdict(list)
    for cell in cells:
        if cell["seed_agreement"] is not None:
            values[(cell["update_mode"], cell["M"], cell["L"])].append(cell["seed_agreement"])
    return {key: round(sum(v) / len(v), 6) for key, v in sorted(values.items())}


def seed_metrics(by_cell: dict[tuple[str, int, int], float]) -> dict[str, float]:
    """The sweep parent's metrics: `seed_agreement/<mode>_M<M>_L<L>` and their mean."""
    metrics = {f"seed_agreement/{mode}_M{M}_L{L}": value for (mode, M, L), value in by_cell.items()}
    if metrics:
        metrics["seed_agreement_mean"] = round(sum(metrics.values()) / len(metrics), 6)
    return metrics


def analyse_run_dir(run_dir: RunDir, chosen, max_items: int | None = None, run: Run | None = None) -> dict:
    """The figures of a finished run dir, written to its analysis.json; a run of more than
    `max_items` kept items gets only their number and why the rest was not computed, and so does
    one whose matcher's calls could not be made (the run's patches stand: a warning, no failure).
    `chosen`: a reflact.analysis.matchers.Chosen, or a lexical threshold; `run`: the run as just
    summarized (run_from), else read from the run dir."""
    from reflact.analysis.embedding import AnalysisUnavailable
    from reflact.analysis.matchers import Chosen

    chosen = chosen if isinstance(chosen, Chosen) else Chosen(as_matcher(chosen))
    run = run if run is not None else load_run(run_dir.root)
    described = chosen.matcher.describe()
    brief = {"edits": len(run.items), "matcher": described["matcher"], "threshold": described["threshold"]}
    too_much = None if max_items is None else over_budget(run.items, max_items)
    if too_much is not None:
        figures = {**brief, "skipped": f"{too_much}: run python -m reflact.analyze {run_dir.root} for the figures"}
    else:
        try:
            figures = analyse(run, chosen.matcher)
        except AnalysisUnavailable as exc:
            log.warning("%s; the run's analysis is left out (python -m reflact.analyze can make it later)", exc)
            figures = {**brief, "skipped": str(exc)}
    figures.update(chosen.usage())
    run_dir.write_analysis(figures)
    return figures


def over_budget(items: list[Item], max_items: int) -> str | None:
    """Why a run's own analysis is left out (too many items, or items too long to compare within
    the work max_items short ones would take), None when it fits."""
    if len(items) > max_items:
        return f"{len(items)} kept items, over analysis.max_items={max_items}"
    needed = work([item.key for item in items])
    if needed > work_budget(max_items):
        chars = sum(len(text) for item in items for text in item.key.texts)
        return (
            f"{len(items)} kept items of {chars} characters to compare, more work than "
            f"analysis.max_items={max_items} items of {BUDGET_ITEM_CHARS} characters"
        )
    return None


def warm() -> None:
    """Imports what the analysis needs: on a thread during the calls, once the first requests are
    out, while the process waits for replies."""
    import time

    from reflact.analysis.matching import warm_imports

    time.sleep(WARM_AFTER_S)
    try:
        warm_imports()
    except Exception as exc:  # a head start only (a Ctrl-C on the main thread may have cut an import
        # short): the analysis imports them where it uses them, and reports a failure there
        log.debug("the analysis's imports were not warmed: %s", exc)


def _codes(values: list) -> list[int]:
    """Each value as a small integer (equal values, equal numbers)."""
    numbers: dict = {}
    return [numbers.setdefault(value, len(numbers)) for value in values]


def _share(part: int, whole: int) -> float:
    return round(part / whole, 6) if whole else 0.0
