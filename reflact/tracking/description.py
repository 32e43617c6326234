"""A run's and a sweep parent's description: MLflow's `mlflow.note.content` tag, the markdown its UI
shows at the top of a run's page and in the runs table's Description column. It says what a
researcher looks for first (the setting, the model, what was proposed and kept, what it cost) and,
when MLflow lacks part of the run, what and the one command that writes it.

A sweep's parent is written again by each sweep into its dir and by relog: a description a user
wrote there in the UI is kept (reflact knows its own by their first and last lines, so that no tag
of its own shows the same text again among the run's tags).
"""

from __future__ import annotations

from dataclasses import dataclass

NOTE_TAG = "mlflow.note.content"  # the run's description in MLflow's UI
PARENT_START = "Sweep over "  # how a parent's description by reflact starts
WHOLLY, NOT_WHOLLY = "Wholly in MLflow.", "**Not wholly in MLflow**: "  # and how its last line starts
ENDED = ("finished", "failed", "killed")  # a sweep's jobs, as its parent counts them


@dataclass(frozen=True)
class Setting:
    """What a run's description names of its settings."""

    mode: str  # short name: patch, rewrite, full_rewrite
    minibatch_size: int
    edit_budget: int
    seed: int
    model: str
    dry_run: bool = False


def setting_line(s: Setting) -> str:
    dry = " (dry run)" if s.dry_run else ""
    return f"{s.mode} mode, M={s.minibatch_size}, L={s.edit_budget}, seed {s.seed}, model `{s.model}`{dry}"


def run_description(s: Setting, counts: dict | None, missing: str = "") -> str:
    """The run's description: its setting, and once minibatches settled (`counts`: summary.json's,
    or the totals so far) how many, the edits proposed and kept, and the cost; `missing`: what MLflow
    lacks of it, with the command that writes it."""
    if counts is None:  # as the run opens: its setting alone
        return setting_line(s) + "."
    outcome = f"{_minibatches(counts)}; {_edits(counts)}; {_cost(counts, s.dry_run)}."
    return "\n\n".join([setting_line(s) + ".", outcome, _repair(missing)])


def parent_description(fixed: dict[str, str], swept: dict[str, list[str]], metrics: dict, missing: str = "") -> str:
    """A sweep parent's description: its grid (M, L, mode, seeds, model: swept or fixed), its jobs
    and how they ended, edits proposed and kept over its finished jobs, what it cost in all, and
    what MLflow lacks of the sweep (`missing`)."""

    def values(key: str) -> str:
        return ",".join(swept[key]) if key in swept else fixed.get(key, "?")

    grid = (
        f"{PARENT_START}M={values('reflect.minibatch_size')}, L={values('reflect.edit_budget')}, "
        f"mode {values('reflect.update_mode')}, seed {values('reflect.seed')}, model `{values('optimizer.model')}`."
    )
    jobs = int(metrics.get("jobs", 0))
    ended = ", ".join(f"{int(metrics[f'jobs_{s}'])} {s}" for s in ENDED if metrics.get(f"jobs_{s}"))
    lines = [grid, f"{jobs} jobs ({ended or 'none ended'})."]
    if "edits_kept_mean" in metrics:
        lines.append(f"Edits kept per finished job: {metrics['edits_kept_mean']:.4g} on average.")
    # no job's cost is known: a model without a price (or no job got as far as its summary)
    lines.append(f"Cost ${metrics['cost_usd_sum']:.4f} in all." if "cost_usd_sum" in metrics else "Cost unknown.")
    lines.append(_repair(missing))
    return "\n\n".join(lines)


def note_tags(text: str, held: dict[str, str] | None = None) -> dict[str, str]:
    """The tag that sets the description to `text`, none when `held` (the run's tags) shows the
    user wrote one of their own."""
    note = (held or {}).get(NOTE_TAG)
    return {} if note is not None and not _reflacts(note, held or {}) else {NOTE_TAG: text}


def _reflacts(note: str, held: dict[str, str]) -> bool:
    """Whether a parent's description is reflact's: one it wrote, or (before descriptions) the line
    saying what MLflow lacked."""
    last = note.rsplit("\n\n", 1)[-1]
    written = note.startswith(PARENT_START) and (last == WHOLLY or last.startswith(NOT_WHOLLY))
    return written or note == held.get("reflact.needs_relog")


def _minibatches(counts: dict) -> str:
    total = int(counts.get("minibatches", counts.get("minibatches_ended", 0)))
    others = [
        f"{int(counts[f'minibatches_{s}'])} {s.replace('_', ' ')}"
        for s in ("failed", "not_run", "skipped", "reused")
        if counts.get(f"minibatches_{s}")
    ]
    return f"{total} minibatches" + (f" ({', '.join(others)})" if others else "")


def _edits(counts: dict) -> str:
    return f"{int(counts.get('edits_proposed', 0))} edits proposed, {int(counts.get('edits_kept', 0))} kept"


def _cost(counts: dict, dry_run: bool) -> str:
    cost = counts.get("cost_usd")
    if cost is None:
        return "cost unknown (no price for the model)"
    if dry_run:
        return f"estimated cost ${cost:.4f}"
    spent = counts.get("spent_usd")
    # the rest was answered by the response cache or an earlier run's patches
    earlier = f", ${spent:.4f} of it spent by this run" if spent is not None and spent < cost else ""
    return f"cost ${cost:.4f}{earlier}"


def _repair(missing: str) -> str:
    return f"{NOT_WHOLLY}{missing}." if missing else WHOLLY
