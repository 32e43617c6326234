"""The sweep report: the M x L grid of the main metrics, averaged over seeds with the spread.

Runs after every multirun (from the sweep callback) and by hand for any sweep in a store:

    python -m reflact.report SWEEP_ID [--tracking-uri URI] [--out DIR]

SWEEP_ID is the sweep's folder as tagged on its runs (e.g. outputs/sweeps/demo).
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from reflact.errors import UserError, exits_on_user_error
from reflact.modes import mode_by_number

METRICS = ("edits_kept", "edits_truncated", "parse_failures", "tokens", "cost_usd", "wall_time_s")
PAGE = 1000  # runs per search request; every page is read


def sweep_runs(client, sweep_id: str):
    """The sweep's job runs (not its parent), active only, across all experiments: one row each,
    its metrics as columns (a pandas DataFrame)."""
    import pandas as pd

    experiments = [e.experiment_id for e in client.search_experiments(max_results=PAGE)]
    rows, token = [], None
    while True:
        page = client.search_runs(experiments, filter_string=f"tags.`reflact.sweep_id` = '{sweep_id}'",
                                  max_results=PAGE, page_token=token)
        rows += [{"run_id": r.info.run_id, "status": r.info.status, **r.data.metrics} for r in page
                 if r.data.tags.get("reflact.sweep_parent") != "true"]
        token = page.token
        if not token:
            return pd.DataFrame(rows)


def derived(runs):
    """The report's metrics from a DataFrame of run metrics (a missing one counts as 0)."""
    m = runs.reindex(columns=["edits_kept", "edits_truncated", "reasks", "minibatches_failed", "tokens_prompt",
                              "tokens_completion", "cost_usd", "wall_time_s"]).fillna(0.0)
    return m.assign(parse_failures=m.reasks + m.minibatches_failed, tokens=m.tokens_prompt + m.tokens_completion)


def grid_rows(runs) -> list[dict]:
    """One row per (mode, M, L): the number of seeds, and mean and spread of each metric."""
    if runs.empty or not {"M", "L", "mode"} <= set(runs.columns):
        return []
    runs = runs.dropna(subset=["M", "L", "mode"])
    cells = derived(runs)[list(METRICS)].assign(
        mode=[mode_by_number(int(n)).name for n in runs["mode"]], M=runs["M"].astype(int), L=runs["L"].astype(int))
    grouped = cells.groupby(["mode", "M", "L"], sort=True)
    means, spreads, sizes = grouped.mean(), grouped.std().fillna(0.0), grouped.size()
    rows = []
    for (mode, M, L), size in sizes.items():
        row = {"mode": mode, "M": int(M), "L": int(L), "seeds": int(size)}
        for metric in METRICS:
            row[f"{metric}_mean"] = float(means.at[(mode, M, L), metric])
            row[f"{metric}_std"] = float(spreads.at[(mode, M, L), metric])
        rows.append(row)
    return rows


def write_table(rows: list[dict], out: Path) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = out / "grid.csv", out / "grid.md"
    with open(csv_path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    header = ["mode", "M", "L", "seeds", *METRICS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [row["mode"], str(row["M"]), str(row["L"]), str(row["seeds"])]
        cells += [f"{row[f'{m}_mean']:.4g} ± {row[f'{m}_std']:.2g}" for m in METRICS]
        lines.append("| " + " | ".join(cells) + " |")
    md_path.write_text("Mean ± standard deviation over seeds.\n\n" + "\n".join(lines) + "\n", encoding="utf-8")
    return csv_path, md_path


def write_picture(rows: list[dict], out: Path) -> list[Path]:
    """One PNG per mode: a heatmap of each metric over M (rows) and L (columns)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for mode in sorted({r["mode"] for r in rows}):
        cells = [r for r in rows if r["mode"] == mode]
        ms = sorted({r["M"] for r in cells})
        ls = sorted({r["L"] for r in cells})
        fig, axes = plt.subplots(2, 3, figsize=(13, 7.5))
        for ax, metric in zip(axes.flat, METRICS):
            grid = [[float("nan")] * len(ls) for _ in ms]
            labels = [[""] * len(ls) for _ in ms]
            for r in cells:
                i, j = ms.index(r["M"]), ls.index(r["L"])
                grid[i][j] = r[f"{metric}_mean"]
                labels[i][j] = f"{r[f'{metric}_mean']:.3g}\n±{r[f'{metric}_std']:.2g}"
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
        fig.suptitle(f"{mode}: mean ± std over seeds")
        fig.tight_layout()
        path = out / f"grid_{mode}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def report_sweep(client, sweep_id: str, out: Path, parent_run_id: str | None = None) -> list[Path]:
    """Write the report under `out` and, with a parent run, log it there as `report/`."""
    rows = grid_rows(sweep_runs(client, sweep_id))
    if not rows:
        return []
    paths = [*write_table(rows, out), *write_picture(rows, out)]
    if parent_run_id:
        for path in paths:
            client.log_artifact(parent_run_id, str(path), "report")
        client.set_tag(parent_run_id, "reflact.sweep_jobs", str(sum(r["seeds"] for r in rows)))
    return paths


@exits_on_user_error
def main(argv: list[str] | None = None) -> int:
    from reflact.tracking import default_tracking_uri

    parser = argparse.ArgumentParser(description="Rebuild a sweep's M x L report from the MLflow store.")
    parser.add_argument("sweep_id", help="the sweep's reflact.sweep_id tag, e.g. outputs/sweeps/demo")
    parser.add_argument("--tracking-uri", default=default_tracking_uri(Path.cwd()))
    parser.add_argument("--out", type=Path, default=None, help="folder for the report (default: the sweep id)")
    args = parser.parse_args(argv)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=args.tracking_uri)
    parents = client.search_runs(
        [e.experiment_id for e in client.search_experiments()],
        filter_string=f"tags.`reflact.sweep_id` = '{args.sweep_id}' and tags.`reflact.sweep_parent` = 'true'",
    )
    out = args.out or Path(args.sweep_id) / "report"
    paths = report_sweep(client, args.sweep_id, out, parents[0].info.run_id if parents else None)
    if not paths:
        raise UserError(f"no runs tagged reflact.sweep_id={args.sweep_id} in {args.tracking_uri}")
    print("\n".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
