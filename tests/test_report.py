"""The sweep report's grid (reflact.sweeps.grid_report): grouping, mean and spread over seeds, every page read,
failed and missing jobs marked instead of averaged in."""

from __future__ import annotations

import csv
import math
from types import SimpleNamespace

import pandas as pd
import pytest
from mlflow.store.entities.paged_list import PagedList

from reflact.sweeps.grid_report import PAGE, grid_rows, sweep_runs, write_outcomes, write_picture, write_table


def test_grid_groups_by_mode_m_l_with_mean_and_sample_spread():
    runs = pd.DataFrame([
        {"M": 4, "L": 2, "mode": 0, "edits_kept": 3, "reasks": 1, "tokens_prompt": 10, "tokens_completion": 5},
        {"M": 4, "L": 2, "mode": 0, "edits_kept": 5, "minibatches_failed": 2},
        {"M": 8, "L": 2, "mode": 1, "edits_kept": 1},
        {"edits_kept": 9},  # not a job of the grid (no M, L, mode): left out
    ])
    rows = {(r["mode"], r["M"], r["L"]): r for r in grid_rows(runs)}
    assert list(rows) == [("patch", 4, 2), ("rewrite_from_suggestions", 8, 2)]
    cell = rows[("patch", 4, 2)]
    assert cell["finished"] == 2 and cell["failed"] == cell["missing"] == 0 and cell["edits_kept_mean"] == 4.0
    assert cell["edits_kept_std"] == pytest.approx(2 ** 0.5)  # the sample standard deviation
    assert cell["parse_failures_mean"] == 1.5  # re-asks plus failed minibatches
    assert cell["tokens_mean"] == 7.5
    assert rows[("rewrite_from_suggestions", 8, 2)]["edits_kept_std"] == 0.0  # one seed: no spread


class PagedStore:
    """A stand-in MLflow client holding `n` job runs and a parent, served PAGE at a time."""

    def __init__(self, n: int) -> None:
        parent = SimpleNamespace(info=SimpleNamespace(run_id="parent", status="RUNNING"),
                                 data=SimpleNamespace(metrics={}, tags={"reflact.sweep_parent": "true"}))
        jobs = [SimpleNamespace(info=SimpleNamespace(run_id=f"r{i}", status="FINISHED"),
                                data=SimpleNamespace(metrics={"M": 4, "L": 2, "mode": 0, "edits_kept": i % 3},
                                                     tags={"reflact.sweep_id": "outputs/sweeps/x"})) for i in range(n)]
        self.runs = [parent, *jobs]
        self.requests = 0

    def search_experiments(self, max_results=None):
        return [SimpleNamespace(experiment_id="1")]

    def search_runs(self, experiments, filter_string, max_results, page_token=None):
        self.requests += 1
        start = int(page_token or 0)
        end = start + max_results
        return PagedList(self.runs[start:end], str(end) if end < len(self.runs) else None)


def test_every_page_of_runs_is_read():
    store = PagedStore(2 * PAGE + 500)
    runs = sweep_runs(store, "outputs/sweeps/x")
    assert len(runs) == 2 * PAGE + 500 and store.requests == 3
    assert "parent" not in set(runs["run_id"])
    [cell] = grid_rows(runs)
    assert cell["finished"] == 2 * PAGE + 500


@pytest.mark.parametrize("sweep,lookalike", [
    ("outputs/sweeps/o'brien", "outputs/sweeps/o_brien"),
    ('outputs/sweeps/say "hi"', "outputs/sweeps/say _hi_"),
    ("""outputs/sweeps/'a' "b" 50%""", """outputs/sweeps/_a_ "b" 50x"""),  # what wildcards would match too
])
def test_a_sweep_with_quotes_in_its_name_finds_its_jobs_and_no_other(tmp_path, migrated_store, sweep, lookalike):
    """MLflow's filter strings cannot escape quotes: the sweep's id goes inside the quote it does not
    hold, or is matched with wildcards (a name holding both) and the runs of other sweeps left out."""
    import shutil

    from mlflow.tracking import MlflowClient

    shutil.copy(migrated_store, tmp_path / "mlflow.db")
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.create_experiment("sweeps", artifact_location=(tmp_path / "artifacts").as_uri())
    for sweep_id, edits in ((sweep, 3), (lookalike, 7)):
        run = client.create_run(experiment, tags={"reflact.sweep_id": sweep_id})
        client.log_metric(run.info.run_id, "edits_kept", edits)
    runs = sweep_runs(client, sweep)
    assert list(runs["edits_kept"]) == [3]


def job(M: int, L: int, status: str = "FINISHED", **metrics) -> dict:
    return {"M": M, "L": L, "mode": 0, "status": status, **metrics}


def test_failed_and_missing_jobs_are_marked_not_averaged_as_zeros(tmp_path):
    """The issue's grid: the M=2 L=2 cell's third seed failed (its run logged no edits); it showed
    20 ± 17 truncated edits where the two good seeds had 30. Now the mean is over finished jobs,
    the cell says 2 finished and 1 failed, a cell whose every job failed says failed and one no
    job reached says missing, and apply_share stands beside edits kept."""
    runs = pd.DataFrame([
        job(2, 2, edits_kept=8, edits_truncated=30, apply_share=0.75),
        job(2, 2, edits_kept=8, edits_truncated=30, apply_share=0.25),
        job(2, 2, "FAILED", edits_kept=0, edits_truncated=0, apply_share=0.0),
        *(job(2, 4, edits_kept=16, edits_truncated=12, apply_share=1.0) for _ in range(3)),
        *(job(4, 2, status, edits_kept=0) for status in ("FAILED", "KILLED", "RUNNING")),
        # (4, 4): no job at all
    ])
    rows = {(r["M"], r["L"]): r for r in grid_rows(runs)}
    assert set(rows) == {(2, 2), (2, 4), (4, 2), (4, 4)}
    half = rows[(2, 2)]
    assert (half["finished"], half["failed"], half["missing"]) == (2, 1, 0)
    assert half["edits_truncated_mean"] == 30.0 and half["edits_truncated_std"] == 0.0
    assert half["apply_share_mean"] == 0.5 and half["apply_share_std"] == pytest.approx(0.125 ** 0.5)
    assert (rows[(4, 2)]["finished"], rows[(4, 2)]["failed"]) == (0, 3)
    assert (rows[(4, 4)]["finished"], rows[(4, 4)]["failed"], rows[(4, 4)]["missing"]) == (0, 0, 3)
    for cell in ((4, 2), (4, 4)):
        assert math.isnan(rows[cell]["edits_kept_mean"]) and math.isnan(rows[cell]["edits_kept_std"])

    csv_path, md_path = write_table(list(rows.values()), tmp_path)
    with open(csv_path, newline="", encoding="utf-8") as handle:
        table = {(int(r["M"]), int(r["L"])): r for r in csv.DictReader(handle)}
    assert table[(2, 2)]["edits_truncated_mean"] == "30.0" and table[(2, 2)]["failed"] == "1"
    assert table[(4, 2)]["edits_kept_mean"] == "" and table[(4, 4)]["missing"] == "3"  # empty, not 0
    md = md_path.read_text(encoding="utf-8").splitlines()
    header = next(line for line in md if line.startswith("| mode"))
    columns = [c.strip() for c in header.strip("|").split("|")]
    assert columns[columns.index("edits_kept") + 1] == "apply_share"
    by_cell = {(int(c[1]), int(c[2])): c for c in ([x.strip() for x in line.strip("|").split("|")]
                                                  for line in md if line.startswith("| patch"))}
    assert by_cell[(2, 2)][3] == "2/1/0"
    assert by_cell[(2, 2)][columns.index("edits_truncated")] == "30 ± 0"
    assert by_cell[(2, 2)][columns.index("apply_share")] == "0.5 ± 0.35"
    assert set(by_cell[(4, 2)][columns.index("seed_agreement"):]) == {"failed"} and by_cell[(4, 2)][3] == "0/3/0"
    assert set(by_cell[(4, 4)][columns.index("seed_agreement"):]) == {"missing"} and by_cell[(4, 4)][3] == "0/0/3"
    [png] = write_picture(list(rows.values()), tmp_path)
    assert png.read_bytes().startswith(b"\x89PNG")
    # the outcomes alone, one wide picture of three heatmaps per mode
    [outcomes] = write_outcomes(list(rows.values()), tmp_path)
    head = outcomes.read_bytes()[:24]
    assert outcomes.name == "outcomes_patch.png" and head.startswith(b"\x89PNG")
    width, height = int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
    assert (width, height) == (15 * 110, round(4.6 * 110))
