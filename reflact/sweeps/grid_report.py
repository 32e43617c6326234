"""The sweep report: the M x L grid of the main metrics, averaged over seeds with the spread.

Runs after every multirun (from the sweep callback) and by hand for any sweep in a store:

    python -m reflact.report SWEEP_ID [--tracking-uri URI] [--out DIR]

SWEEP_ID is the sweep's folder as tagged on its runs (e.g. outputs/sweeps/demo). A cell's figures
are over its FINISHED jobs only; beside them, how many of its jobs finished, failed (FAILED, KILLED,
left RUNNING) or are missing (fewer than the fullest cell has, or none), and a cell without a
finished job says failed or missing instead of a figure. Next to M and L come the analysis figures
(reflact.analysis.figures): agreement over draws, redundancy and distinct items (mean and spread of
the jobs' metrics), and the seed agreement of the cell, computed from the jobs' run dirs when they
are on this machine (else left empty) and logged to the parent run.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path
from typing import Any

from reflact.core.errors import UserError, exits_on_user_error
from reflact.core.files import usable_folder
from reflact.core.imports import one_at_a_time
from reflact.core.modes import mode_by_number
from reflact.tracking.store import PAGE, runs_tagged

# apply_share (the run's own metric: the share of kept edits that would apply) beside edits kept
METRICS = ("edits_kept", "apply_share", "edits_truncated", "parse_failures", "tokens", "cost_usd", "wall_time_s")
# the analysis's run metrics: missing is not 0 (agreement needs two draws), so never filled in
ANALYSED = ("agreement", "redundancy", "distinct_edits")
# likewise apply_share (counted in patch mode only) and cost_usd (unknown for a model without a price)
UNFILLED = ("apply_share", "cost_usd", *ANALYSED)
JOBS = ("finished", "failed", "missing")  # a cell's jobs by how they ended
SEED_AGREEMENT = "seed_agreement"


def sweep_runs(client, sweep_id: str):
    """The sweep's job runs (not its parent), active only, across all experiments: one row each,
    its metrics as columns (a pandas DataFrame)."""
    with one_at_a_time():
        import pandas as pd

    experiments = [e.experiment_id for e in client.search_experiments(max_results=PAGE)]
    rows, token = [], None
    while True:
        page, token = runs_tagged(client, experiments, "reflact.sweep_id", sweep_id, page_token=token)
        rows += [
            {
                "run_id": r.info.run_id,
                "status": r.info.status,
                "run_dir": r.data.tags.get("reflact.run_dir"),
                **r.data.metrics,
            }
            for r in page
            if r.data.tags.get("reflact.sweep_parent") != "true"
        ]
        if not token:
            return pd.DataFrame(rows)


def derived(runs):
    """The report's metrics from a DataFrame of run metrics (a missing one counts as 0, but for the
    cost: a run of an unpriced model logs none, and its cost is unknown, not 0)."""
    m = runs.reindex(
        columns=[
            "edits_kept",
            "edits_truncated",
            "reasks",
            "minibatches_failed",
            "tokens_prompt",
            "tokens_completion",
            "wall_time_s",
        ]
    ).fillna(0.0)
    m = m.assign(parse_failures=m.reasks + m.minibatches_failed, tokens=m.tokens_prompt + m.tokens_completion)
    return m.join(runs.reindex(columns=list(UNFILLED)))


def finished(runs):
    """The jobs that FINISHED (a store without statuses: all of them)."""
    return runs[runs["status"] == "FINISHED"] if "status" in runs else runs


def grid_rows(runs) -> list[dict]:
    """One row per (mode, M, L): its jobs finished, failed and missing, and the mean and spread of
    each metric over the finished ones (NaN when none finished); also a row for each cell of the
    M x L grid of a mode that has no job at all."""
    if runs.empty or not {"M", "L", "mode"} <= set(runs.columns):
        return []
    runs = runs.dropna(subset=["M", "L", "mode"])
    cells = derived(runs)[[*ANALYSED, *METRICS]].assign(
        mode=[mode_by_number(int(n)).name for n in runs["mode"]],
        M=runs["M"].astype(int),
        L=runs["L"].astype(int),
        done=runs["status"] == "FINISHED" if "status" in runs else True,
    )
    groups = dict(iter(cells.groupby(["mode", "M", "L"], sort=True)))
    fullest = max(len(group) for group in groups.values())
    rows = []
    for mode in sorted({key[0] for key in groups}):
        ms, ls = (sorted({key[i] for key in groups if key[0] == mode}) for i in (1, 2))
        rows += [_cell_row(mode, M, L, groups.get((mode, M, L)), fullest) for M in ms for L in ls]
    return rows


def _cell_row(mode: str, M: int, L: int, group, fullest: int) -> dict:
    done: Any = group[group["done"]] if group is not None else None
    n_done, n_jobs = (0, 0) if group is None else (len(done), len(group))
    # the seed agreement is one figure per cell, filled in from the run dirs (add_seed_agreement)
    row = {
        "mode": mode,
        "M": int(M),
        "L": int(L),
        "finished": n_done,
        "failed": n_jobs - n_done,
        "missing": fullest - n_jobs,
        SEED_AGREEMENT: float("nan"),
    }
    for metric in (*ANALYSED, *METRICS):
        mean = spread = float("nan")  # no finished job: no figure
        if n_done:
            mean, spread = float(done[metric].mean()), float(done[metric].std())
            # one job has no spread; a figure no finished job has stays empty (NaN)
            spread = 0.0 if n_done == 1 and mean == mean else spread
        row[f"{metric}_mean"], row[f"{metric}_std"] = mean, spread
    return row


def add_seed_agreement(rows: list[dict], runs) -> dict[str, float]:
    """Fills in each grid row's seed agreement from the jobs' run dirs (those on this machine);
    returns it as the parent's metrics: `seed_agreement/<mode>_M<M>_L<L>` and the mean over cells.
    Also names the matcher the jobs' own analyses used (the seed agreement here is lexical: the
    report makes no call; python -m reflact.analyze --matcher computes it with another)."""
    from reflact.analysis.figures import load_runs_quietly, seed_agreement, seed_by_cell, seed_metrics, usual_threshold

    loaded = load_runs_quietly([Path(d) for d in runs.get("run_dir", []) if isinstance(d, str)])
    by_cell = seed_by_cell(seed_agreement(loaded, usual_threshold(loaded)))
    matchers: dict[tuple, set] = {}
    for run in loaded:
        label = run.label()
        matchers.setdefault((label["update_mode"], label["M"], label["L"]), set()).add(run.matcher or "–")
    for row in rows:
        row[SEED_AGREEMENT] = by_cell.get((row["mode"], row["M"], row["L"]), float("nan"))
        row["matcher"] = ",".join(sorted(matchers.get((row["mode"], row["M"], row["L"]), {"–"})))
    return seed_metrics(by_cell)


def write_table(rows: list[dict], out: Path) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = out / "grid.csv", out / "grid.md"
    with open(csv_path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows({k: "" if _missing(v) else v for k, v in row.items()} for row in rows)
    header = ["mode", "M", "L", "jobs finished/failed/missing", "matcher", *PANELS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [
            row["mode"],
            str(row["M"]),
            str(row["L"]),
            "/".join(str(row[key]) for key in JOBS),
            row.get("matcher", "–"),
        ]
        cells += [_shown(row, metric, "{:.4g} ± {:.2g}") for metric in PANELS]
        lines.append("| " + " | ".join(cells) + " |")
    md_path.write_text(
        "Mean ± standard deviation over each cell's finished jobs (seeds); seed_agreement is one "
        "figure per cell; a cell with no finished job shows failed or missing (missing: fewer jobs "
        "than the fullest cell); – where a figure is not defined (agreement needs "
        "optimizer.samples >= 2, apply_share patch mode, seed agreement two seeds and the run "
        "dirs); matcher: the one the jobs' analyses used for agreement, redundancy and distinct "
        "edits (seed_agreement here is lexical).\n\n" + "\n".join(lines) + "\n",
        encoding="utf-8",
    )
    return csv_path, md_path


PANELS = (SEED_AGREEMENT, *ANALYSED, *METRICS)  # the report's columns after M, L and the seeds


def _missing(value: object) -> bool:
    return isinstance(value, float) and value != value  # NaN


def _value(row: dict, metric: str) -> tuple[float, float | None]:
    """(mean, spread) of a metric in a grid row; the seed agreement has no spread."""
    if metric == SEED_AGREEMENT:
        return row[SEED_AGREEMENT], None
    return row[f"{metric}_mean"], row[f"{metric}_std"]


def _shown(row: dict, metric: str, form: str) -> str:
    mean, spread = _value(row, metric)
    if not row["finished"]:
        return "failed" if row["failed"] else "missing"
    if _missing(mean):
        return "–"
    return f"{mean:.4g}" if spread is None else form.format(mean, spread)


def write_picture(rows: list[dict], out: Path) -> list[Path]:
    """One PNG per mode, `grid_<mode>.png`: a heatmap of each metric over M (rows) and L (columns)."""
    return _pictures(rows, out, "grid", PANELS, (3, 4), (17, 11), "{}: mean ± std over each cell's finished jobs")


# what a researcher looks at first, one picture per mode large enough to read in MLflow's artifact view
OUTCOMES = ("edits_kept", "agreement", "cost_usd")
OUTCOMES_SIZE = (15, 4.6)  # inches, at 110 dpi


def write_outcomes(rows: list[dict], out: Path) -> list[Path]:
    """One PNG per mode, `outcomes_<mode>.png`: M x L heatmaps of edits kept, agreement over draws and
    cost, beside the grid of every metric (write_picture); a figure not defined reads – in its cells."""
    title = "{}: edits kept, agreement and cost over M x L (mean over each cell's finished jobs)"
    return _pictures(rows, out, "outcomes", OUTCOMES, (1, len(OUTCOMES)), OUTCOMES_SIZE, title)


def _pictures(
    rows: list[dict], out: Path, name: str, metrics: tuple[str, ...], grid: tuple[int, int], size, title: str
) -> list[Path]:
    """`<name>_<mode>.png` per mode: one heatmap per metric on a grid of panels, the rest blank."""
    # Figures of their own, not pyplot's: no backend switched for the whole process (a notebook
    # calling reflact keeps its own), and pyplot's import (~0.3 s) and figure manager saved
    with one_at_a_time():
        from matplotlib.figure import Figure

    paths = []
    for mode in sorted({r["mode"] for r in rows}):
        cells = [r for r in rows if r["mode"] == mode]
        fig = Figure(figsize=size)
        axes = fig.subplots(*grid, squeeze=False)
        for ax, metric in zip(axes.flat, metrics, strict=False):
            _heatmap(fig, ax, cells, metric)
        for ax in axes.flat[len(metrics) :]:
            ax.axis("off")
        fig.suptitle(title.format(mode))
        fig.tight_layout()
        path = out / f"{name}_{mode}.png"
        fig.savefig(path, dpi=110)
        paths.append(path)
    return paths


def load_drawing() -> None:
    """Imports what drawing the pictures takes (~0.5 s, with the font list), for a process that
    only waits for the sweep's end until then (reflact.sweeps.keeper)."""
    with one_at_a_time():
        from matplotlib.backends import backend_agg  # noqa: F401
        from matplotlib.figure import Figure  # noqa: F401


def _heatmap(fig, ax, cells: list[dict], metric: str) -> None:
    ms, ls = sorted({r["M"] for r in cells}), sorted({r["L"] for r in cells})
    grid = [[float("nan")] * len(ls) for _ in ms]
    labels = [[""] * len(ls) for _ in ms]
    for r in cells:
        i, j = ms.index(r["M"]), ls.index(r["L"])
        grid[i][j] = _value(r, metric)[0]
        labels[i][j] = _shown(r, metric, "{:.3g}\n±{:.2g}")
    image = ax.imshow(grid, cmap="viridis", aspect="auto")
    fig.colorbar(image, ax=ax)
    ax.set_xticks(range(len(ls)), [str(v) for v in ls])
    ax.set_yticks(range(len(ms)), [str(v) for v in ms])
    ax.set_xlabel("L (edit budget)")
    ax.set_ylabel("M (minibatch size)")
    ax.set_title(metric)
    for i in range(len(ms)):
        for j in range(len(ls)):
            ax.text(j, i, labels[i][j], ha="center", va="center", color="white", fontsize=8)


def report_sweep(client, sweep_id: str, out: Path, parent_run_id: str | None = None) -> list[Path]:
    """Write the report under `out` and, with a parent run, log it there as `report/`."""
    runs = sweep_runs(client, sweep_id)
    rows = grid_rows(runs)
    if not rows:
        return []
    seed_metrics = add_seed_agreement(rows, finished(runs))
    paths = [*write_table(rows, out), *write_outcomes(rows, out), *write_picture(rows, out)]
    if parent_run_id:
        for path in paths:
            client.log_artifact(parent_run_id, str(path), "report")
        for key, value in seed_metrics.items():
            client.log_metric(parent_run_id, key, value)
        client.set_tag(parent_run_id, "reflact.sweep_jobs", str(sum(r["finished"] + r["failed"] for r in rows)))
    return paths


def _check_store(uri: str) -> None:
    """A report only reads: a local sqlite store that is not there has no sweep (opening it would
    make an empty one, outputs/mlflow.db, in whatever folder the command ran)."""
    if uri.startswith("sqlite:///") and uri != "sqlite:///:memory:":
        path = Path(uri.removeprefix("sqlite:///").split("?", 1)[0])
        if not path.is_file():
            raise UserError(f"no MLflow store at {path}: run from the sweep's launch folder or pass --tracking-uri")


@exits_on_user_error
def main(argv: list[str] | None = None) -> int:
    from reflact.tracking.store import default_tracking_uri

    parser = argparse.ArgumentParser(description="Rebuild a sweep's M x L report from the MLflow store.")
    parser.add_argument("sweep_id", help="the sweep's reflact.sweep_id tag, e.g. outputs/sweeps/demo")
    parser.add_argument("--tracking-uri", default=default_tracking_uri(Path.cwd()))
    parser.add_argument("--out", type=Path, default=None, help="folder for the report (default: the sweep id)")
    args = parser.parse_args(argv)
    out = usable_folder(args.out or Path(args.sweep_id) / "report", "--out")
    _check_store(args.tracking_uri)
    with one_at_a_time():
        from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=args.tracking_uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    parents, _ = runs_tagged(
        client, experiments, "reflact.sweep_id", args.sweep_id, "tags.`reflact.sweep_parent` = 'true'"
    )
    paths = report_sweep(client, args.sweep_id, out, parents[0].info.run_id if parents else None)
    if not paths:
        raise UserError(f"no runs tagged reflact.sweep_id={args.sweep_id} in {args.tracking_uri}")
    print("\n".join(str(p) for p in paths))
    return 0
