"""What a researcher sees of a sweep logged to a tracking server: reflact's own lines on the
terminal, and MLflow's UI opening on outcomes (read through the REST API the UI itself reads).

One small sweep (M=2, L=1,2 on a 4-run dataset) against a loopback `mlflow server`, shared by
the tests here: slow (the server's start and the sweep take ~15 s on a busy machine).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import urllib.parse
import urllib.request

import pytest

from reflact.testing.optimizer_server import OptimizerServer
from tests.conftest import docs_script, ok, run_cli, start_mlflow_server, stop, write_dataset

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served_sweep(tmp_path_factory, migrated_store):
    root = tmp_path_factory.mktemp("dashboard")
    data = write_dataset(root / "data", n_fail=2, n_succ=2)
    launch = root / "launch"
    launch.mkdir()
    proc, url = start_mlflow_server(root, migrated_store)
    try:
        with OptimizerServer() as server:
            run = run_cli("-m", "name=dash", f"data.dir={data}", f"optimizer.base_url={server.base_url}",
                          "optimizer.model=test", "reflect.minibatch_size=2", "reflect.edit_budget=1,2",
                          f"mlflow.tracking_uri={url}", cwd=launch, timeout=300)
        ok(run)
        runs = rest(url, "runs/search", {"experiment_ids": [experiment_id(url)], "max_results": 100})["runs"]
        yield {"run": run, "runs": runs, "url": url, "sweep_dir": launch / "outputs" / "sweeps" / "dash",
               "root": root}
    finally:
        stop(proc)


def rest(url: str, endpoint: str, body: dict) -> dict:
    """One call of MLflow's REST API, as the UI makes it."""
    request = urllib.request.Request(f"{url}/api/2.0/mlflow/{endpoint}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


def experiment_id(url: str) -> str:
    found = rest(url, "experiments/search", {"max_results": 100, "filter": "name = 'reflact'"})["experiments"]
    return found[0]["experiment_id"]


def test_a_sweep_against_a_tracking_server_prints_only_reflacts_lines(served_sweep):
    """MLflow prints "View run ... at" and "View experiment at" when a run on a server ends: neither
    the sweep's parent (ended in the launching process, on stdout) nor its jobs (ended by their
    tracker process) may put them in reflact's output."""
    run = served_sweep["run"]
    for stream in (run.stdout, run.stderr):
        assert "View run" not in stream and "View experiment" not in stream, stream[-3000:]
    # what is left on stdout is Hydra's launch lines and reflact's own (the parent run it opened)
    assert all("[HYDRA]" in line for line in run.stdout.splitlines()), run.stdout
    parent = json.loads((served_sweep["sweep_dir"] / "mlflow_parent.json").read_text())
    assert f"MLflow parent run {parent['run_id']} for sweep" in run.stdout
    assert len(served_sweep["runs"]) == 3  # the parent and its two jobs did end, on the server


def test_the_compare_view_opens_on_edits_kept_not_on_a_setting(served_sweep):
    """MLflow 3.17's compare view opens on its parallel coordinates plot, whose one metric is the
    first the compared runs share in the order the REST API lists the first run's metrics (lodash's
    intersection of each run's keys), plotted against the params that differ: the jobs list
    edits_kept first, ahead of M, L, seed and mode; the sweep's parent its mean."""
    runs = served_sweep["runs"]
    jobs = [r for r in runs if tag(r, "reflact.sweep_parent") != "true"]
    [parent] = [r for r in runs if tag(r, "reflact.sweep_parent") == "true"]
    listed = [[m["key"] for m in r["data"]["metrics"]] for r in jobs]
    assert all(keys[0] == "edits_kept" for keys in listed), [keys[:6] for keys in listed]
    shared = [key for key in listed[0] if all(key in keys for keys in listed[1:])]
    assert shared[0] == "edits_kept" and {"M", "L"} <= set(shared)
    assert parent["data"]["metrics"][0]["key"] == "edits_kept_mean"
    assert tag(parent, "mlflow.note.content") == (  # the parent's description, through the server
        "Sweep over M=2, L=1,2, mode patch, seed 42, model `test`.\n\n2 jobs (2 finished).\n\n"
        "Edits kept per finished job: 3 on average.\n\nCost unknown.\n\nWholly in MLflow."
    )
    # the value it opens on is the run's outcome, not the 0 logged as the run opened
    kept = {int(metric(r, "L")): metric(r, "edits_kept") for r in jobs}
    assert kept == {1: 2.0, 2: 4.0}  # L of the L + 2 the stand-in proposes, in each of 2 minibatches


def tag(run: dict, key: str) -> str | None:
    return next((t["value"] for t in run["data"].get("tags", []) if t["key"] == key), None)


def metric(run: dict, key: str) -> float:
    return next(m["value"] for m in run["data"]["metrics"] if m["key"] == key)


def screenshots_module():
    """docs/screenshots.py, whose headless Chromium drives the UI here too."""
    return docs_script("screenshots")


def test_the_ui_opens_the_compare_view_on_edits_kept_and_shows_each_runs_description(served_sweep):
    """In MLflow's own UI, in headless Chromium: the compare view of the sweep's jobs plots edits_kept
    against the swept setting, and a job's page shows its description, not "No description"."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium on PATH (Debian: apt-get install chromium)")
    shots = screenshots_module()
    url, root = served_sweep["url"] + "/", served_sweep["root"]
    jobs = [r for r in served_sweep["runs"] if tag(r, "reflact.sweep_parent") != "true"]
    experiment = jobs[0]["info"]["experiment_id"]

    def q(value) -> str:
        return urllib.parse.quote(json.dumps(value, separators=(",", ":")), safe="")

    with contextlib.ExitStack() as stack:
        tab = shots.Tab(shots.Chromium(stack, chromium, root / "chromium-profile", root / "chromium.log"))
        tab.open(url + f"#/compare-runs?runs={q([r['info']['run_id'] for r in jobs])}&experiments={q([experiment])}")
        tab.settle(shots.READY["compare"], "compare")
        assert shots.compared_metrics(tab) == ["edits_kept"]
        job = jobs[0]
        run_id = job["info"]["run_id"]
        tab.open(url + f"#/experiments/{experiment}/runs/{run_id}")
        tab.settle(shots.READY["run"].format(run=run_id), "run")
        text = tab.js("document.body.innerText")
    assert "No description" not in text
    first, outcome, whole = tag(job, "mlflow.note.content").split("\n\n")
    assert first.replace("`", "") in text and outcome in text and whole in text
