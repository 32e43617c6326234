"""After the stage: one pass over the saved patches writes the previews, kept_items.jsonl (every
kept item with its minibatch, trajectory ids and apply status), report.md and summary.json
(settings, run counts, one record per minibatch). Each patch is read once, one at a time, so
memory stays flat however large the run."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping
from dataclasses import asdict

from reflact.calls.protocol import Usage
from reflact.config import OptimizerConfig, ReflectConfig, priced
from reflact.core.metrics import STATUSES
from reflact.core.modes import Mode
from reflact.inputs.dataset import Dataset
from reflact.prompting.plan import split
from reflact.replies.provenance import SupportTally
from reflact.running.outcome import WITH_PATCH, Outcome
from reflact.running.preview import Preview, run_apply_counts, write_preview
from reflact.running.run_report import minibatch_section, write_run_report
from reflact.running.rundir import RunDir


def apply_metrics(counts: dict) -> dict[str, float]:
    """Apply counts under their metric names: edits_applied, edits_fallback, edits_skipped, apply_share."""
    return {(key if key == "apply_share" else f"edits_{key}"): value for key, value in counts.items() if key != "total"}


def optimized_value(name: str | None, summary: dict) -> float | None:
    """The run metric named by `optimized_metric` (`name`), for sweepers that optimise it (Optuna...)."""
    if not name:
        return None
    return float(summary["counts"][name])


def usd(value: float | None) -> str:
    """A cost for a log line: `$0.0123`, or `cost unknown` for an unpriced model."""
    return "cost unknown" if value is None else f"${value:.4f}"


def run_status(
    counts: dict, reflect: ReflectConfig, o: OptimizerConfig, outcomes: list[Outcome], run_dir, fault: str = ""
) -> tuple[str, str]:
    """FINISHED, or FAILED and why (with what to check): no minibatch produced a patch, or one
    finally failed while reflect.allow_failed_minibatches=false. A dry run makes no patch by design.
    `fault`: the endpoint was judged unusable (reflact.calls.client): then that is the reason, as it is."""
    failed = [o for o in outcomes if o.status == "failed"]
    first = f"; first error: {failed[0].error}" if failed else ""
    rerun = f"rerun with hydra.run.dir={run_dir} to redo only those"
    if o.dry_run:
        return "FINISHED", ""
    nothing_made = not counts["minibatches_done"] + counts["minibatches_reused"]
    if fault and nothing_made:
        return "FAILED", fault
    if counts["minibatches"] > counts["minibatches_skipped"] and nothing_made:
        return "FAILED", (
            f"no minibatch produced a patch ({counts['minibatches_failed']} failed, "
            f"{counts['minibatches_not_run']} not run{first}); check optimizer.base_url, optimizer.model "
            f"and the key in ${o.api_key_env}, then {rerun}"
        )
    if failed and not reflect.allow_failed_minibatches:
        return "FAILED", (
            f"{len(failed)} minibatch(es) failed and reflect.allow_failed_minibatches=false{first}; {rerun}"
        )
    return "FINISHED", ""


def settings(r: ReflectConfig, o: OptimizerConfig, template_hashes: dict[str, str]) -> dict:
    shown = {
        "minibatch_size": r.minibatch_size,
        "edit_budget": r.edit_budget,
        "seed": r.seed,
        "update_mode": r.update_mode,
        "model": o.model,
        "workers": r.workers,
        "failure_only": r.failure_only,
        "skill_aware": r.skill_aware.enabled,
        "template_hashes": template_hashes,
    }
    # only when in use: a run without them keeps the summary it always had
    if o.samples > 1:
        shown["samples"] = o.samples
    if r.provenance:
        shown["provenance"] = True
    return shown


def dataset_counts(dataset: Dataset, reflect: ReflectConfig) -> dict[str, int]:
    """The dataset's runs as the stage took them (also the MLflow dataset's profile)."""
    failures, successes = split(dataset.results, reflect.success_threshold, reflect.failure_only)
    counted = {
        "results": len(dataset.results),
        "failures": len(failures),
        "successes": len(successes),
        "skipped": len(dataset.skipped),
    }
    if dataset.origin is not None:  # traces: those found without a usable label (reflact.inputs.traces)
        counted["unlabelled"] = dataset.origin.unlabelled
    return counted


def counts(reflect: ReflectConfig, priced: bool, dataset: Dataset, outcomes: list[Outcome], wall_time_s: float) -> dict:
    usage = Usage()
    for o in outcomes:
        usage.add(o.usage)
    by_status = {status: sum(1 for o in outcomes if o.status == status) for status in STATUSES}
    return {
        **dataset_counts(dataset, reflect),
        "minibatches": len(outcomes),
        **{f"minibatches_{status}": n for status, n in by_status.items()},
        "calls": sum(o.calls for o in outcomes),
        "failed_calls": sum(o.failed_calls for o in outcomes),
        "reasks": sum(o.reasks for o in outcomes),
        "retries": sum(o.retries for o in outcomes),
        "cache_hits": sum(o.cache_hits for o in outcomes),
        "edits_proposed": sum(o.proposed for o in outcomes),
        "edits_kept": sum(o.kept for o in outcomes),
        "edits_truncated": sum(o.truncated for o in outcomes),
        "tokens_prompt": usage.prompt,
        "tokens_cached": usage.cached,
        "tokens_completion": usage.completion,
        "tokens_reasoning": usage.reasoning,
        # unknown, not $0, without a price for the model
        "cost_usd": round(sum(o.cost_usd for o in outcomes), 6) if priced else None,
        "spent_usd": round(sum(o.spent_usd for o in outcomes), 6) if priced else None,
        "wall_time_s": round(wall_time_s, 3),
    }


def kept_rows(outcome: Outcome, patch: dict, mode: Mode, preview: Preview | None) -> list[dict]:
    """The minibatch's kept items with its tag, trajectory ids and (patch mode) apply status."""
    statuses = preview.statuses if preview else []
    rows = []
    for position, item in enumerate((patch.get("patch") or {}).get(mode.payload_key) or []):
        row = {"minibatch": outcome.tag, "position": position, "trajectory_ids": outcome.ids, "item": item}
        if position < len(statuses):
            row["apply"] = {"status": statuses[position]["status"], "reason": statuses[position]["reason"]}
        rows.append(row)
    return rows


def summarize(
    run_dir: RunDir,
    reflect: ReflectConfig,
    optimizer: OptimizerConfig,
    dataset: Dataset,
    mode: Mode,
    outcomes: list[Outcome],
    patches: Mapping[str, dict],
    template_hashes: dict,
    started: float,
    clock,
) -> tuple[dict, list[dict]]:
    """Writes the previews, kept items, summary and report; returns the summary and the kept items'
    rows. `patches`: each minibatch's patch as saved; `started`: when the run started by `clock`
    (epoch seconds: time.time)."""
    previews: dict[str, Preview] = {}
    kept_items: list[dict] = []
    support = SupportTally() if reflect.provenance else None
    with run_dir.kept_items_writer() as kept, tempfile.TemporaryFile("w+", encoding="utf-8") as sections:
        for o in outcomes:
            patch = patches.get(o.tag) if o.status in WITH_PATCH else None
            rows = []
            if patch is not None:
                preview = write_preview(run_dir, dataset.skill, patch, mode, o.tag)
                previews.update({o.tag: preview} if preview else {})
                rows = kept_rows(o, patch, mode, preview)
                kept.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
                kept_items.extend(rows)
                if support is not None:
                    support.add([i for i in o.ids if i not in dataset.skipped], [row["item"] for row in rows])
            sections.write(minibatch_section(o, patch, rows, mode.payload_key))
        summary = make_summary(
            reflect, optimizer, dataset, outcomes, previews, template_hashes, clock() - started, support
        )
        summary["times"] = {"started_at": started, "ended_at": clock()}
        run_dir.write_summary(summary)
        sections.seek(0)
        write_run_report(run_dir, summary, sections)
    return summary, kept_items


def make_summary(
    reflect: ReflectConfig,
    optimizer: OptimizerConfig,
    dataset: Dataset,
    outcomes: list[Outcome],
    previews: dict[str, Preview],
    template_hashes: dict,
    wall_time_s: float,
    support: SupportTally | None = None,
) -> dict:
    known = priced(optimizer)
    run_counts = counts(reflect, known, dataset, outcomes, wall_time_s)
    if reflect.update_mode == "patch":
        run_counts.update(apply_metrics(run_apply_counts(previews)))
    if support is not None:
        run_counts.update(support.counts())
    unknown = {} if known else {"cost_usd": None, "spent_usd": None}
    summary = {
        "settings": settings(reflect, optimizer, template_hashes),
        "counts": run_counts,
        "cost_known": known,  # false: the model has no price, cost_usd and spent_usd are null
        "skipped": dataset.skipped,
        "minibatches": [
            {
                **asdict(o),
                **unknown,
                "truncated": o.truncated,
                "apply": previews[o.tag].counts if o.tag in previews else {},
            }
            for o in outcomes
        ],
    }
    if support is not None:  # the shown trajectories no kept item stands on
        summary["unused_trajectories"] = support.unused()
    return summary
