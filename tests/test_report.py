"""The sweep report's grid (reflact.report): grouping, mean and spread over seeds, every page read."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest
from mlflow.store.entities.paged_list import PagedList

from reflact.report import PAGE, grid_rows, sweep_runs


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
    assert cell["seeds"] == 2 and cell["edits_kept_mean"] == 4.0
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
                                                     tags={})) for i in range(n)]
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
    assert cell["seeds"] == 2 * PAGE + 500
