"""Sweeps end to end: a 3 x 3 M x L multirun of the demo through `python -m reflact.run -m`.

Done when: the sweep leaves one MLflow parent run and nine children with every metric, the
parent holds the grid report, the same command again makes no optimizer call, a half-done cell
resumes with exactly the missing call, and the same sweep with the joblib launcher against a
loopback `mlflow server` gives the same runs. Every optimizer call goes to the loopback test
server, whose default reply proposes L + 2 items per minibatch (so L are kept).
"""

from __future__ import annotations

import csv
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reflact.running.rundir import SweepDir
from reflact.testing.optimizer_server import OptimizerServer, Response
from tests.conftest import PROJECT, ok, run_cli, start_mlflow_server, stop, summary_of, write_dataset

MS = (2, 4, 8)
LS = (1, 2, 4)
GRID = {(m, budget) for m in MS for budget in LS}
SWEEP_ARGS = ("-m", "+exp=demo", "reflect.minibatch_size=2,4,8", "reflect.edit_budget=1,2,4")
EXPERIMENT = "reflact-demo"
SWEEP_ID = "outputs/sweeps/demo"  # hydra.sweep.dir of +exp=demo, relative to the launch dir
CHILD_METRICS = ("M", "L", "seed", "mode", "edits_kept", "edits_proposed", "edits_truncated", "reasks",
                 "tokens_prompt", "cost_usd", "wall_time_s", "calls")
REPORT_FILES = ("grid.md", "grid.csv", "grid_patch.png")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------------------------------------
# helpers



# the test model priced, so that every child has its cost (an unpriced model's cost is unknown, not logged)
PRICED_TEST = "+optimizer.prices.test={input:1,cached_input:0.1,output:4}"


def sweep(server: OptimizerServer, launch: Path, *extra: str):
    # nine jobs one after another, beside three other test workers on two cores: minutes
    return run_cli(*SWEEP_ARGS, f"optimizer.base_url={server.base_url}", "optimizer.model=test", PRICED_TEST, *extra,
                   cwd=launch, timeout=900)


def sqlite_uri(launch: Path) -> str:
    return f"sqlite:///{launch}/outputs/mlflow.db"


def mlflow_state(uri: str, download_to: Path | None = None) -> dict:
    """What the store holds for the demo experiment, read at once (a later sweep replaces runs)."""
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(EXPERIMENT)
    assert exp is not None, f"no experiment {EXPERIMENT} in {uri}"
    runs = client.search_runs([exp.experiment_id], run_view_type=ViewType.ALL, max_results=1000)
    active = [r for r in runs if r.info.lifecycle_stage == "active"]
    parents = [r for r in active if r.data.tags.get("reflact.sweep_parent") == "true"]
    children = [r for r in active if r.data.tags.get("reflact.sweep_parent") != "true"]
    state = {
        "parents": [_run(r) for r in parents],
        "children": [_run(r) for r in children],
        "deleted": [_run(r) for r in runs if r.info.lifecycle_stage != "active"],
        "parent_report": {},
        "parent_png": b"",
        "child_patches": {},
    }
    if len(parents) == 1:
        parent_id = parents[0].info.run_id
        state["parent_report"] = {a.path for a in client.list_artifacts(parent_id, "report")}
        if download_to is not None and "report/grid_patch.png" in state["parent_report"]:
            download_to.mkdir(parents=True, exist_ok=True)
            local = client.download_artifacts(parent_id, "report/grid_patch.png", str(download_to))
            state["parent_png"] = Path(local).read_bytes()
    for child in children:
        key = (int(child.data.metrics.get("M", -1)), int(child.data.metrics.get("L", -1)))
        state["child_patches"][key] = {a.path for a in client.list_artifacts(child.info.run_id, "patches")}
    return state


def _run(run) -> dict:
    return {
        "run_id": run.info.run_id,
        "status": run.info.status,
        "artifact_uri": run.info.artifact_uri,
        "tags": dict(run.data.tags),
        "params": dict(run.data.params),
        "metrics": dict(run.data.metrics),
    }


def by_cell(children: list[dict]) -> dict[tuple[int, int], dict]:
    return {(int(c["metrics"]["M"]), int(c["metrics"]["L"])): c for c in children}


def job_dirs(launch: Path) -> dict[tuple[int, int], list[Path]]:
    """The sweep's job dirs by (M, L), read from their summaries (one each, unless the override
    set changed between sweeps)."""
    found: dict[tuple[int, int], list[Path]] = {}
    for summary in sorted((launch / SWEEP_ID).glob("*/summary.json")):
        settings = json.loads(summary.read_text(encoding="utf-8"))["settings"]
        found.setdefault((settings["minibatch_size"], settings["edit_budget"]), []).append(summary.parent)
    return found


def one_dir_each(jobs: dict[tuple[int, int], list[Path]]) -> dict[tuple[int, int], Path]:
    assert set(jobs) == GRID
    doubled = {cell: [d.name for d in dirs] for cell, dirs in jobs.items() if len(dirs) != 1}
    assert not doubled, f"more than one job dir per cell: {doubled}"
    return {cell: dirs[0] for cell, dirs in jobs.items()}



def all_patch_bytes(launch: Path) -> dict[str, bytes]:
    sweep_dir = launch / SWEEP_ID
    return {str(p.relative_to(sweep_dir)): p.read_bytes() for p in sorted(sweep_dir.glob("*/patches/*.json"))}


def assert_sweep_shape(state: dict) -> None:
    """1 finished parent and 9 finished children of it, one per grid cell, sharing its sweep id."""
    assert len(state["parents"]) == 1, [p["tags"] for p in state["parents"]]
    parent = state["parents"][0]
    assert parent["status"] == "FINISHED", [(c["tags"].get("mlflow.runName"), c["status"]) for c in state["children"]]
    sweep_id = parent["tags"]["reflact.sweep_id"]
    assert len(state["children"]) == 9, sorted(c["tags"].get("mlflow.runName", "") for c in state["children"])
    for child in state["children"]:
        assert child["status"] == "FINISHED"
        assert child["tags"].get("mlflow.parentRunId") == parent["run_id"]
        assert child["tags"].get("reflact.sweep_id") == sweep_id
    assert set(by_cell(state["children"])) == GRID


def assert_child_metrics(child: dict) -> None:
    metrics, params = child["metrics"], child["params"]
    missing = [k for k in CHILD_METRICS if k not in metrics]
    assert not missing, f"{child['tags'].get('mlflow.runName')}: missing metrics {missing}"
    assert metrics["M"] == float(params["reflect.minibatch_size"])
    assert metrics["L"] == float(params["reflect.edit_budget"])
    assert metrics["seed"] == float(params["reflect.seed"])
    assert metrics["mode"] == 0  # patch
    # the test server proposes L + 2 per minibatch; L are kept, 2 cut
    n = metrics["minibatches"]
    assert n > 0
    assert metrics["edits_kept"] == metrics["L"] * n
    assert metrics["edits_proposed"] == (metrics["L"] + 2) * n
    assert metrics["edits_truncated"] == 2 * n
    assert metrics["reasks"] == 0


# ---------------------------------------------------------------------------------------------
# one launch dir, one optimizer server, a sequence of sweeps (each step's state kept)


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory, migrated_store):
    """In one launch dir, against one optimizer server: 1. the 3 x 3 sweep; 2. the same command
    again; 3. again after deleting one patch (its reply is in the response cache); 4. again after
    deleting another patch, with optimizer.cache=off; 5. the report CLI for the sweep and for an
    unknown sweep id. Each step's exit, new requests, files and MLflow state are kept."""
    root = tmp_path_factory.mktemp("sweep")
    launch = root / "launch"
    (launch / "outputs").mkdir(parents=True)
    shutil.copy(migrated_store, launch / "outputs" / "mlflow.db")
    uri = sqlite_uri(launch)
    steps: dict[str, dict] = {}
    jobs: dict[tuple[int, int], Path] = {}
    deleted: dict[str, Path] = {}

    def step(name: str, *extra: str) -> None:
        before = server.count
        started = time.monotonic()
        proc = sweep(server, launch, *extra)
        found = job_dirs(launch)
        steps[name] = {
            "proc": proc,
            "seconds": time.monotonic() - started,
            "new_requests": server.count - before,
            "requests": server.requests[before:],
            "patches": all_patch_bytes(launch),
            "jobs": found,
            "summaries": {cell: summary_of(dirs[0]) for cell, dirs in found.items() if len(dirs) == 1},
            "mlflow": mlflow_state(uri, root / "download" / name),
        }
        print(f"sweep step {name}: exit {proc.returncode}, {steps[name]['new_requests']} new requests, "
              f"{steps[name]['seconds']:.1f} s")

    with OptimizerServer() as server:
        step("first")
        jobs.update(one_dir_each(steps["first"]["jobs"]))
        step("again")

        # a half-done cell whose reply is still in outputs/cache.db
        deleted["cached"] = jobs[(4, 2)] / "patches" / "minibatch_fail_001.json"
        deleted["cached"].unlink()
        step("resume_cached")

        # a half-done cell, rerun without the cache: exactly the one missing call
        deleted["cache_off"] = jobs[(8, 1)] / "patches" / "minibatch_succ_000.json"
        deleted["cache_off"].unlink()
        step("resume_cache_off", "optimizer.cache=off")

    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    report_out = root / "report"
    report_cli = [sys.executable, "-m", "reflact.report"]
    known = subprocess.Popen([*report_cli, SWEEP_ID, "--tracking-uri", uri, "--out", str(report_out)],
                             cwd=launch, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    unknown = subprocess.Popen([*report_cli, "outputs/sweeps/nope", "--tracking-uri", uri,
                                "--out", str(root / "report_nope")],
                               cwd=launch, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    report = {"known": known, "unknown": unknown}
    for name, proc in report.items():
        stdout, stderr = proc.communicate(timeout=120)
        report[name] = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)

    yield {"launch": launch, "uri": uri, "steps": steps, "jobs": jobs, "deleted": deleted,
           "report": report["known"], "report_out": report_out, "unknown": report["unknown"], "root": root}


# ---------------------------------------------------------------------------------------------
# 1. the first sweep


def test_sweep_leaves_one_parent_and_nine_children(sweeps):
    first = sweeps["steps"]["first"]
    ok(first["proc"])
    state = first["mlflow"]
    assert_sweep_shape(state)
    assert state["parents"][0]["tags"]["reflact.sweep_id"] == SWEEP_ID
    assert not state["deleted"]
    # the sweep dir names its parent run
    parent_file = json.loads((sweeps["launch"] / SWEEP_ID / "mlflow_parent.json").read_text(encoding="utf-8"))
    assert parent_file["run_id"] == state["parents"][0]["run_id"]
    assert parent_file["sweep_id"] == SWEEP_ID


def test_every_child_has_its_metrics(sweeps):
    for child in sweeps["steps"]["first"]["mlflow"]["children"]:
        assert_child_metrics(child)
        # each minibatch asked once, or found its reply in the cache (a cell with a smaller M may
        # have asked the very same minibatch: M=2 minibatches are halves of M=4 ones)
        assert child["metrics"]["calls"] + child["metrics"]["cache_hits"] == child["metrics"]["minibatches"]


def test_requests_match_the_children_calls(sweeps):
    first = sweeps["steps"]["first"]
    children = first["mlflow"]["children"]
    assert first["new_requests"] > 0
    assert first["new_requests"] == sum(c["metrics"]["calls"] for c in children)
    # each cell asked with its own budget
    budgets = sorted(int(re.search(r"at most L=(\d+)", r["messages"][1]["content"]).group(1))
                     for r in first["requests"])
    expected = sorted(int(c["metrics"]["L"]) for c in children for _ in range(int(c["metrics"]["calls"])))
    assert budgets == expected


def test_parent_holds_the_grid_report(sweeps):
    state = sweeps["steps"]["first"]["mlflow"]
    assert {f"report/{name}" for name in REPORT_FILES} <= state["parent_report"]
    assert state["parent_png"].startswith(PNG_MAGIC)
    assert state["parents"][0]["tags"].get("reflact.sweep_jobs") == "9"
    # the report is also written into the sweep dir
    report_dir = sweeps["launch"] / SWEEP_ID / "report"
    for name in REPORT_FILES:
        assert (report_dir / name).is_file(), name


def test_each_job_has_its_own_dir_with_patches(sweeps):
    launch = sweeps["launch"]
    jobs = one_dir_each(sweeps["steps"]["first"]["jobs"])
    children = by_cell(sweeps["steps"]["first"]["mlflow"]["children"])
    for (m, budget), run_dir in jobs.items():
        assert run_dir.parent == launch / SWEEP_ID
        assert f"reflect.minibatch_size={m}" in run_dir.name and f"reflect.edit_budget={budget}" in run_dir.name
        patches = sorted((run_dir / "patches").glob("*.json"))
        assert len(patches) == children[(m, budget)]["metrics"]["minibatches"]
        assert Path(children[(m, budget)]["tags"]["reflact.run_dir"]).resolve() == run_dir.resolve()
        # the child's artifacts hold the same patches
        assert (sweeps["steps"]["first"]["mlflow"]["child_patches"][(m, budget)]
                == {f"patches/{p.name}" for p in patches})


# ---------------------------------------------------------------------------------------------
# 2. the same command again


def test_same_sweep_again_makes_no_call(sweeps):
    again, first = sweeps["steps"]["again"], sweeps["steps"]["first"]
    ok(again["proc"])
    assert again["new_requests"] == 0
    assert again["patches"] == first["patches"]
    assert one_dir_each(again["jobs"]) == sweeps["jobs"]
    for summary in again["summaries"].values():
        assert summary["counts"]["calls"] == 0
        assert summary["counts"]["minibatches_reused"] == summary["counts"]["minibatches"]


def test_same_sweep_again_keeps_the_children_it_has_nothing_new_for(sweeps):
    again, first = sweeps["steps"]["again"], sweeps["steps"]["first"]
    state = again["mlflow"]
    assert_sweep_shape(state)
    # the parent is resumed, not doubled; a job that reuses every patch under the same settings
    # leaves its run as it is (that run made the patches), so nothing is deleted or doubled
    assert state["parents"][0]["run_id"] == first["mlflow"]["parents"][0]["run_id"]
    assert {c["run_id"] for c in state["children"]} == {c["run_id"] for c in first["mlflow"]["children"]}
    assert not state["deleted"]
    old = by_cell(first["mlflow"]["children"])
    for cell, child in by_cell(state["children"]).items():
        assert_child_metrics(child)
        assert child["metrics"] == old[cell]["metrics"]
    assert {f"report/{name}" for name in REPORT_FILES} <= state["parent_report"]
    assert state["parent_png"].startswith(PNG_MAGIC)


# ---------------------------------------------------------------------------------------------
# 3. a half-done cell resumes


def test_half_done_cell_is_answered_by_the_response_cache(sweeps):
    step = sweeps["steps"]["resume_cached"]
    ok(step["proc"])
    assert step["new_requests"] == 0
    assert sweeps["deleted"]["cached"].is_file()
    assert step["patches"] == sweeps["steps"]["first"]["patches"]  # the same patch, byte for byte
    counts = step["summaries"][(4, 2)]["counts"]
    assert counts["cache_hits"] == 1 and counts["calls"] == 0
    assert counts["minibatches_reused"] == counts["minibatches"] - 1
    assert_sweep_shape(step["mlflow"])


def test_half_done_cell_with_cache_off_makes_exactly_the_missing_call(sweeps):
    step = sweeps["steps"]["resume_cache_off"]
    ok(step["proc"])
    assert step["new_requests"] == 1
    user = step["requests"][0]["messages"][1]["content"]
    assert "at most L=1" in user
    assert "## Failed Trajectories" not in user  # the success minibatch that was deleted
    assert sweeps["deleted"]["cache_off"].is_file()
    # the same job dirs: optimizer.cache does not name the folder of a job
    assert one_dir_each(step["jobs"]) == sweeps["jobs"]
    counts = step["summaries"][(8, 1)]["counts"]
    assert counts["calls"] == 1 and counts["minibatches_done"] == 1 and counts["cache_hits"] == 0
    assert counts["minibatches_reused"] == counts["minibatches"] - 1
    for cell, summary in step["summaries"].items():
        if cell != (8, 1):
            assert summary["counts"]["calls"] == 0, cell
    # the redone patch holds the same edits as before (the server answers the same)
    redone = json.loads(sweeps["deleted"]["cache_off"].read_text(encoding="utf-8"))
    key = f"{sweeps['jobs'][(8, 1)].name}/patches/minibatch_succ_000.json"
    before = json.loads(sweeps["steps"]["first"]["patches"][key])
    assert redone["patch"] == before["patch"] and redone["trajectory_ids"] == before["trajectory_ids"]
    state = step["mlflow"]
    assert_sweep_shape(state)
    assert state["parents"][0]["run_id"] == sweeps["steps"]["first"]["mlflow"]["parents"][0]["run_id"]
    for cell, child in by_cell(state["children"]).items():
        assert_child_metrics(child)
        assert child["metrics"]["calls"] == (1 if cell == (8, 1) else 0)


# ---------------------------------------------------------------------------------------------
# 5. the report CLI


def test_report_cli_rebuilds_the_grid(sweeps):
    report, out = sweeps["report"], sweeps["report_out"]
    ok(report)
    for name in REPORT_FILES:
        assert (out / name).is_file(), name
    assert (out / "grid_patch.png").read_bytes().startswith(PNG_MAGIC)
    with open(out / "grid.csv", newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 9
    assert {(int(r["M"]), int(r["L"])) for r in rows} == GRID
    assert all((r["finished"], r["failed"], r["missing"]) == ("1", "0", "0") for r in rows)
    assert all(r["mode"] == "patch" for r in rows)
    children = by_cell(sweeps["steps"]["resume_cache_off"]["mlflow"]["children"])
    for row in rows:
        child = children[(int(row["M"]), int(row["L"]))]
        assert float(row["edits_kept_mean"]) == child["metrics"]["edits_kept"]
    md = (out / "grid.md").read_text(encoding="utf-8")
    table = [line for line in md.splitlines() if line.startswith("| patch |")]
    assert len(table) == 9


def test_report_cli_unknown_sweep_is_a_one_line_error(sweeps):
    unknown = sweeps["unknown"]
    assert unknown.returncode == 2, unknown.stdout + unknown.stderr
    lines = [line for line in unknown.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, unknown.stderr
    assert lines[0].startswith("reflact: error:") and "outputs/sweeps/nope" in lines[0]
    assert "Traceback" not in unknown.stderr
    assert not (sweeps["root"] / "report_nope").exists()


# ---------------------------------------------------------------------------------------------
# 4. the joblib launcher against a loopback `mlflow server`


def test_joblib_sweep_against_a_tracking_server(tmp_path, migrated_store, sweeps):
    started = time.monotonic()
    proc, url = start_mlflow_server(tmp_path, migrated_store)
    print(f"mlflow server up in {time.monotonic() - started:.1f} s")
    try:
        launch = tmp_path / "launch"
        launch.mkdir()
        with OptimizerServer() as server:
            started = time.monotonic()
            run = sweep(server, launch, "hydra/launcher=joblib", "hydra.launcher.n_jobs=3",
                        f"mlflow.tracking_uri={url}")
            requests = server.count
            print(f"joblib sweep: exit {run.returncode}, {requests} requests, {time.monotonic() - started:.1f} s")
        ok(run)
        assert "MLflow logging" not in run.stderr, [line for line in run.stderr.splitlines() if "MLflow" in line]
        state = mlflow_state(url, tmp_path / "download")
    finally:
        stop(proc)

    assert_sweep_shape(state)
    for child in state["children"]:
        assert_child_metrics(child)
    assert requests == sum(c["metrics"]["calls"] for c in state["children"])
    # the same runs as the sequential sweep on a local store
    local = by_cell(sweeps["steps"]["first"]["mlflow"]["children"])
    served = by_cell(state["children"])
    assert set(served) == set(local) == GRID
    for cell in GRID:
        for key in ("edits_kept", "edits_proposed", "edits_truncated", "minibatches", "seed", "mode"):
            assert served[cell]["metrics"][key] == local[cell]["metrics"][key], (cell, key)
    # the report went to the parent through the server
    assert {f"report/{name}" for name in REPORT_FILES} <= state["parent_report"]
    assert state["parent_png"].startswith(PNG_MAGIC)
    # artifacts are served: listed through the server, stored under --artifacts-destination
    jobs = one_dir_each(job_dirs(launch))
    for cell, listed in state["child_patches"].items():
        assert listed and listed == {f"patches/{p.name}" for p in (jobs[cell] / "patches").glob("*.json")}
    assert all(c["artifact_uri"].startswith("mlflow-artifacts:") for c in state["children"])
    assert any((tmp_path / "artifacts").rglob("minibatch_fail_000.json"))
    # nothing went to a local store
    assert not (launch / "outputs" / "mlflow.db").exists()
    assert not (launch / "mlruns").exists() and not (launch / "mlflow.db").exists()


# ---------------------------------------------------------------------------------------------
# 6. the grid preset


def test_demo_grid_preset_composes_a_sweep_over_m_l_and_seed():
    from hydra import compose, initialize_config_dir
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from reflact import config as reflact_config

    reflact_config.register()
    with initialize_config_dir(config_dir=str(PROJECT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["+exp=demo_grid"], return_hydra_config=True)
    params = dict(cfg.hydra.sweeper.params)
    assert params == {"reflect.minibatch_size": "2,4,8", "reflect.edit_budget": "1,2,4", "reflect.seed": "1,2,3"}
    assert cfg.name == "demo_grid"
    assert cfg.hydra.sweep.dir == "outputs/sweeps/demo_grid"
    assert cfg.mlflow.experiment == EXPERIMENT
    assert cfg.data.dir.endswith("examples/demo")
    # what the basic sweeper makes of it (without running it): the 27 combinations
    overrides = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()])
    batches = BasicSweeper.split_arguments(overrides, None)
    jobs = [tuple(sorted(job)) for batch in batches for job in batch]
    assert len(jobs) == 27 == len(set(jobs))
    expected = {
        tuple(sorted((f"reflect.minibatch_size={m}", f"reflect.edit_budget={budget}", f"reflect.seed={s}")))
        for m, budget, s in itertools.product(MS, LS, (1, 2, 3))
    }
    assert set(jobs) == expected


# ---------------------------------------------------------------------------------------------
# 7. a failed job is recorded and the rest of the sweep runs


def refuse_budget(budget: int):
    """A server script refusing every request of the job with L=budget (404, never retried with
    optimizer.retry.max_attempts=1): that job's run ends FAILED, the others are answered."""
    return lambda request, n: Response(status=404, body={}) if f"at most L={budget}" in request["messages"][1][
        "content"] else None


def failing_sweep(server: OptimizerServer, launch: Path, data: Path, *extra: str):
    return run_cli("-m", f"data.dir={data}", "optimizer=compatible", f"optimizer.base_url={server.base_url}",
                   "optimizer.model=test", "optimizer.retry.max_attempts=1", "reflect.minibatch_size=2",
                   "name=partial", *extra, cwd=launch)


def partial_state(launch: Path) -> tuple[list, dict]:
    """(the sweep's parents, its children's status by L)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=sqlite_uri(launch))
    runs = client.search_runs([client.get_experiment_by_name("reflact").experiment_id])
    parents = [r for r in runs if r.data.tags.get("reflact.sweep_parent") == "true"]
    children = {int(r.data.params["reflect.edit_budget"]): r.info.status for r in runs
                if r.data.tags.get("reflact.sweep_parent") != "true"}
    return parents, children


def the_one_line(stderr: str) -> str:
    [line] = [line for line in stderr.splitlines() if line.startswith("reflact: sweep failed:")]
    return line


@pytest.mark.slow
def test_a_failed_job_lets_the_others_run_and_a_fixed_rerun_resumes(tmp_path, launch_dir):
    """Four jobs, job #0 (L=1) refused by the server: the other three still run to FINISHED, the
    sweep exits 1 with one line naming job #0, the parent is FAILED and the grid marks the cell.
    The same command against a working server, with another key variable and price (settings
    that cannot change results), resumes in the same dirs: only job #0's calls, FINISHED."""
    data = write_dataset(tmp_path / "data", n_fail=3, n_succ=1)
    budgets = ("reflect.edit_budget=1,2,3,4",)
    with OptimizerServer(script=refuse_budget(1)) as server:
        failed = failing_sweep(server, launch_dir, data, *budgets, "optimizer.api_key_env=KEY_A",
                               "+optimizer.prices.test={input:1,output:2}")
    assert failed.returncode == 1, failed.stderr[-3000:]
    assert "Traceback" not in failed.stderr
    line = the_one_line(failed.stderr)
    assert "#0 " in line and "reflect.edit_budget=1" in line and "#1 " not in line, line
    [parent], children = partial_state(launch_dir)
    assert parent.info.status == "FAILED"
    assert children == {1: "FAILED", 2: "FINISHED", 3: "FINISHED", 4: "FINISHED"}
    sweep_dir = launch_dir / "outputs" / "sweeps" / "partial"
    with open(sweep_dir / "report" / "grid.csv", newline="", encoding="utf-8") as handle:
        grid = {int(r["L"]): r for r in csv.DictReader(handle)}
    assert (grid[1]["finished"], grid[1]["failed"], grid[1]["edits_kept_mean"]) == ("0", "1", "")
    assert all(grid[budget]["finished"] == "1" and float(grid[budget]["edits_kept_mean"]) > 0 for budget in (2, 3, 4))
    assert all(float(grid[budget]["apply_share_mean"]) == 1.0 for budget in (2, 3, 4))  # every test edit applies
    assert "| 0/1/0 | – | failed |" in (sweep_dir / "report" / "grid.md").read_text(encoding="utf-8")
    dirs = sorted(p.name for p in sweep_dir.iterdir() if (p / "summary.json").is_file())

    with OptimizerServer() as server:
        rerun = failing_sweep(server, launch_dir, data, *budgets, "optimizer.api_key_env=KEY_B",
                              "+optimizer.prices.test={input:3,output:4}")
        calls = server.requests
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert sorted(p.name for p in sweep_dir.iterdir() if (p / "summary.json").is_file()) == dirs
    assert calls and all("at most L=1" in r["messages"][1]["content"] for r in calls)  # only job #0 asked
    [again], children = partial_state(launch_dir)
    assert again.info.run_id == parent.info.run_id and again.info.status == "FINISHED"
    assert children == {1: "FINISHED", 2: "FINISHED", 3: "FINISHED", 4: "FINISHED"}


@pytest.mark.slow
def test_joblib_sweep_records_failed_runs_and_mistakes_and_runs_the_rest(tmp_path, launch_dir):
    """In parallel jobs too: of M=0,2 x L=1,3 the M=0 jobs stop on their own mistake (exit 2 alone)
    and the L=3 job's run fails; the one good job still finishes and the line names the other three."""
    data = write_dataset(tmp_path / "data", n_fail=3, n_succ=1)
    with OptimizerServer(script=refuse_budget(3)) as server:
        done = failing_sweep(server, launch_dir, data, "reflect.minibatch_size=0,2", "reflect.edit_budget=1,3",
                             "hydra/launcher=joblib", "hydra.launcher.n_jobs=2")
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    line = the_one_line(done.stderr)
    assert "3 job(s) failed" in line and "reflect.minibatch_size must be" in line, line
    for job in ("#0 ", "#1 ", "#3 "):
        assert job in line, line
    assert "#2 " not in line
    [parent], children = partial_state(launch_dir)
    assert parent.info.status == "FAILED"
    assert children == {1: "FINISHED", 3: "FAILED"}  # the M=0 jobs never got as far as a run


# ---------------------------------------------------------------------------------------------
# 8. settings that cannot change results never make a sweep dir refuse


def composed(*overrides: str):
    from hydra import compose, initialize_config_dir

    from reflact import config as reflact_config

    reflact_config.register()
    with initialize_config_dir(config_dir=str(PROJECT / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=["+exp=demo", *overrides], return_hydra_config=True)


NEUTRAL = ("optimizer.api_key_env=OTHER_KEY", "optimizer.prices.gpt-5.input=9", "+optimizer.prices.test={input:1}",
           "optimizer.timeout_s=5", "optimizer.retry.max_attempts=1", "optimizer.rpm=10", "optimizer.tpm=1000",
           "optimizer.base_url=http://127.0.0.1:9/v1", "optimizer.max_cost_usd=1", "optimizer.cache=off",
           "reflect.workers=2", "mlflow.trace_calls=false", "analysis.max_items=5", "analysis.match_threshold=0.5")


@pytest.mark.parametrize("override", NEUTRAL)
def test_a_setting_that_cannot_change_results_resumes_the_sweep(tmp_path, override):
    """The same sweep dir takes it, its job folder has the same name, and no patch fingerprint sees it."""
    from reflact.running.rundir import fingerprint
    from reflact.sweeps.sweep import _typed, check_identity, sweep_settings
    from tests.conftest import shape_of

    sweep = SweepDir(tmp_path)
    base, changed = composed(), composed(override)
    check_identity(sweep, *sweep_settings(base))
    check_identity(sweep, *sweep_settings(changed))  # no UserError
    assert changed.hydra.job.override_dirname == base.hydra.job.override_dirname == "+exp=demo"
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    assert fingerprint(shape_of(_typed(changed)), messages) == fingerprint(shape_of(_typed(base)), messages)


@pytest.mark.parametrize("override, key", [("optimizer.temperature=1", "optimizer.temperature"),
                                           ("optimizer.max_output_tokens=100", "optimizer.max_output_tokens"),
                                           ("reflect.failure_only=true", "reflect.failure_only"),
                                           ("optimizer.model=other", "optimizer.model")])
def test_a_setting_that_changes_results_still_refuses_naming_the_key(tmp_path, override, key):
    from reflact.core.errors import UserError
    from reflact.sweeps.sweep import check_identity, sweep_settings

    sweep = SweepDir(tmp_path)
    check_identity(sweep, *sweep_settings(composed()))
    with pytest.raises(UserError, match=re.escape(key)):
        check_identity(sweep, *sweep_settings(composed(override)))
    assert key in composed(override).hydra.job.override_dirname  # and it names its own job folder


def test_a_sweep_dir_made_before_keeps_no_unchanging_setting_against_a_rerun(tmp_path):
    """sweep.json of an older reflact fixed the key variable and prices too: they are not compared."""
    from reflact.sweeps.sweep import check_identity, sweep_settings

    sweep = SweepDir(tmp_path)
    fixed, swept = sweep_settings(composed())
    sweep.write_identity({"fixed": {**fixed, "optimizer.api_key_env": "OLD", "optimizer.prices.gpt-5.input": "1.0"},
                          "swept": swept})
    check_identity(sweep, fixed, swept)
    assert "optimizer.api_key_env" not in sweep.identity()["fixed"]


def test_the_sweep_callback_sent_to_a_launcher_s_worker_carries_no_store(launch_dir, tmp_path):
    """joblib and Ray pickle Hydra's callbacks to every worker (their jobs' on_job_end): the sweep's
    callback goes there without the parent's open store, so a worker imports no mlflow before its
    first job (seconds of CPU each, beside the jobs' own start); the launching process keeps it."""
    import pickle

    from reflact.sweeps.sweep import MlflowSweep
    from reflact.tracking.store import Store

    sweep = MlflowSweep()
    store = Store(f"sqlite:///{launch_dir / 'outputs' / 'mlflow.db'}", "sweeps", launch_dir)
    sweep._open = (store, SweepDir(tmp_path / "sweep"))
    sweep._started = True
    (tmp_path / "callback.pickle").write_bytes(pickle.dumps(sweep))
    probe = ("import pickle, sys; c = pickle.loads(open(sys.argv[1], 'rb').read()); "
             "print(c._open is None, c._started, 'mlflow' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "callback.pickle")],
                          capture_output=True, text=True, timeout=120, cwd=PROJECT)
    assert done.stdout.split() == ["True", "True", "False"], done.stderr[-3000:]
    assert sweep._open[0] is store  # pickling took nothing from the sweep that holds the parent


def test_jobs_wait_for_the_parent_run_while_it_is_opened_beside_them(tmp_path):
    """While the parent run is opened beside the jobs, a job's tracker reads no earlier sweep's
    record: it waits for the new one, bounded; once the opening ended (a failed one too: the earlier
    record is back) it reads at once what there is."""
    import threading

    sweep = SweepDir(tmp_path)
    earlier = {"run_id": "earlier", "tracking_uri": "sqlite:///x.db", "sweep_id": "outputs/sweeps/x"}
    sweep.write_parent_record(earlier)
    sweep.set_parent_aside()
    assert sweep.parent_record() == {} and sweep.parent_set_aside() == earlier
    started = time.monotonic()
    assert sweep.parent_record(wait_s=0.3) == {}  # bounded: the job's run is then one of its own
    assert time.monotonic() - started >= 0.3
    new = {**earlier, "run_id": "new"}
    writer = threading.Timer(0.3, sweep.write_parent_record, [new])
    writer.start()
    assert sweep.parent_record(wait_s=60) == new
    writer.join()
    sweep.parent_settled()
    assert sweep.parent_record() == new and sweep.parent_set_aside() == {}
    sweep.set_parent_aside()  # an opening that fails gives the earlier record back
    sweep.parent_settled()
    started = time.monotonic()
    assert sweep.parent_record(wait_s=60) == new
    assert time.monotonic() - started < 30


@pytest.mark.slow
def test_a_sweep_killed_outright_still_ends_its_parent_run(tmp_path, launch_dir):
    """SIGKILL leaves the launching process no exit handler: the parent's keeper, a process of its
    own, then ends the parent run (FAILED: its job unfinished) rather than leave it RUNNING."""
    from mlflow.tracking import MlflowClient

    data = write_dataset(tmp_path / "data", n_fail=2, n_succ=0)
    sweep_dir = launch_dir / "outputs" / "sweeps" / "killed"
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    env.pop("OPENAI_API_KEY", None)
    with OptimizerServer(script=lambda request, number: Response(body={}, delay_s=600)) as server:
        proc = subprocess.Popen(
            [sys.executable, "-m", "reflact.run", "-m", f"data.dir={data}", "optimizer=compatible",
             f"optimizer.base_url={server.base_url}", "optimizer.model=test", "name=killed",
             "reflect.seed=1,2"],
            cwd=launch_dir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 120
            while not (server.count and SweepDir(sweep_dir).parent_record()):
                assert proc.poll() is None and time.monotonic() < deadline, "no request and parent within 120 s"
                time.sleep(0.05)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        client = MlflowClient(tracking_uri=f"sqlite:///{launch_dir / 'outputs' / 'mlflow.db'}")
        parent = SweepDir(sweep_dir).parent_record()["run_id"]
        deadline = time.monotonic() + 120
        while client.get_run(parent).info.status == "RUNNING":
            assert time.monotonic() < deadline, "the parent run was left RUNNING"
            time.sleep(0.2)
    assert client.get_run(parent).info.status in ("FAILED", "KILLED")  # KILLED once the job's tracker said it was
