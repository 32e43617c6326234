"""The run's summary.json (settings, counts, one record per minibatch) and kept_items.jsonl
(every kept item with its minibatch, trajectory ids and apply status)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from reflact.client import Usage
from reflact.config import ReflactConfig
from reflact.dataset import Dataset
from reflact.files import atomic_writer, read_json, write_json
from reflact.modes import get_mode
from reflact.preview import Preview, run_apply_counts
from reflact.stage import Outcome, split


def settings(cfg: ReflactConfig, template_hashes: dict[str, str]) -> dict:
    r = cfg.reflect
    return {
        "minibatch_size": r.minibatch_size,
        "edit_budget": r.edit_budget,
        "seed": r.seed,
        "update_mode": r.update_mode,
        "model": cfg.optimizer.model,
        "workers": r.workers,
        "failure_only": r.failure_only,
        "skill_aware": r.skill_aware.enabled,
        "template_hashes": template_hashes,
    }


def counts(cfg: ReflactConfig, dataset: Dataset, outcomes: list[Outcome], wall_time_s: float) -> dict:
    failures, successes = split(dataset.results, cfg.reflect.success_threshold, cfg.reflect.failure_only)
    usage = Usage()
    for o in outcomes:
        usage.add(o.usage)
    by_status = {status: sum(1 for o in outcomes if o.status == status) for status in
                 ("done", "reused", "failed", "skipped", "not_run", "dry_run")}
    return {
        "results": len(dataset.results),
        "failures": len(failures),
        "successes": len(successes),
        "skipped": len(dataset.skipped),
        "minibatches": len(outcomes),
        "minibatches_done": by_status["done"],
        "minibatches_reused": by_status["reused"],
        "minibatches_failed": by_status["failed"],
        "minibatches_skipped": by_status["skipped"],
        "minibatches_not_run": by_status["not_run"],
        "minibatches_dry_run": by_status["dry_run"],
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
        "cost_usd": round(sum(o.cost_usd for o in outcomes), 6),
        "spent_usd": round(sum(o.spent_usd for o in outcomes), 6),
        "wall_time_s": round(wall_time_s, 3),
    }


KEPT_ITEMS = "kept_items.jsonl"


def kept_items(cfg: ReflactConfig, patches_dir: Path, outcomes: list[Outcome], previews: dict[str, Preview]):
    """Every kept item with its minibatch, trajectory ids and (patch mode) apply status, one
    patch file at a time (a large run's items are never all in memory)."""
    key = get_mode(cfg.reflect.update_mode).payload_key
    for o in outcomes:
        patch = read_json(patches_dir / f"{o.tag}.json")
        if o.status not in ("done", "reused") or not isinstance(patch, dict):
            continue
        statuses = previews[o.tag].statuses if o.tag in previews else []
        for position, item in enumerate((patch.get("patch") or {}).get(key) or []):
            row = {"minibatch": o.tag, "position": position, "trajectory_ids": o.ids, "item": item}
            if position < len(statuses):
                row["apply"] = {"status": statuses[position]["status"], "reason": statuses[position]["reason"]}
            yield row


def read_kept_items(run_dir: Path):
    with open(run_dir / KEPT_ITEMS, encoding="utf-8") as handle:
        for line in handle:
            yield json.loads(line)


def write_summary(
    run_dir: Path,
    cfg: ReflactConfig,
    dataset: Dataset,
    outcomes: list[Outcome],
    previews: dict[str, Preview],
    template_hashes: dict,
    wall_time_s: float,
) -> dict:
    run_counts = counts(cfg, dataset, outcomes, wall_time_s)
    if cfg.reflect.update_mode == "patch":
        applied = run_apply_counts(previews)
        run_counts.update({f"edits_{k}" if k != "apply_share" else k: v for k, v in applied.items() if k != "total"})
    summary = {
        "settings": settings(cfg, template_hashes),
        "counts": run_counts,
        "skipped": dataset.skipped,
        "minibatches": [
            {**asdict(o), "truncated": o.truncated, "apply": previews[o.tag].counts if o.tag in previews else {}}
            for o in outcomes
        ],
    }
    with atomic_writer(run_dir / KEPT_ITEMS) as handle:
        for row in kept_items(cfg, run_dir / "patches", outcomes, previews):
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    # compact: json's fast encoder only runs without indent, and the file is for programs
    # (report.md is the one for people)
    write_json(run_dir / "summary.json", summary, indent=None)
    return summary
