"""The checks of .ci/wheel_surface.sh: what each command of an installed wheel left behind.

Run with the wheel's venv python from the launch directory: `python <checkout>/.ci/wheel_checks.py
CHECK ARGS...`. Only this file's folder joins the import path, so `reflact` is the wheel's. Each
check prints one line when it passes and fails with the evidence when it does not. Standard
library and reflact only (the MLflow store is read as the sqlite file it is).
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from pathlib import Path

STORE = Path("outputs/mlflow.db")
SWEEP_ID = "outputs/sweeps/demo_grid"
GRID_JOBS = 12  # conf/exp/demo_grid.yaml's 3 seeds over the 2 x 2 M x L cells .ci/wheel_surface.sh picks


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))


def mlflow_status(run_id: str) -> str:
    with sqlite3.connect(STORE) as db:
        (status,) = db.execute("SELECT status FROM runs WHERE run_uuid = ?", (run_id,)).fetchone()
    return status


def logged_status(run_dir: Path) -> str:
    """The run's own record of its MLflow run, and that run's status in the store."""
    record = json.loads((run_dir / "mlflow_run.json").read_text(encoding="utf-8"))
    status = mlflow_status(record["run_id"])
    assert status == record["status"] == "FINISHED", (run_dir, record, status)
    return record["run_id"]


def check_installed() -> None:
    import reflact
    import reflact.compat.skillopt
    import reflact.testing.optimizer_server

    assert reflact.__file__.startswith(sys.prefix), f"reflact imported from {reflact.__file__}, not the wheel"
    print(f"installed: reflact {reflact.__file__}")


def check_dry_run() -> None:
    (run_dir,) = Path("outputs/runs").glob("*/*/summary.json")  # the default run dir, under the launch dir
    counts = summary(run_dir.parent)["counts"]
    assert counts["minibatches_dry_run"] == 4 and counts["calls"] == 0, counts
    print("dry run: 4 minibatches estimated, no call")


def check_served(run_dir: str) -> None:
    counts = summary(Path(run_dir))["counts"]
    assert counts["minibatches_done"] == counts["minibatches"] == 4 and counts["calls"] >= 4, counts
    print(f"demo run: {counts['calls']} calls, {counts['edits_kept']} edits kept, MLflow run "
          f"{logged_status(Path(run_dir))} FINISHED")


def check_reused(run_dir: str) -> None:
    """A rerun of a finished run dir reuses every saved patch and makes no call."""
    counts = summary(Path(run_dir))["counts"]
    assert counts["minibatches_reused"] == counts["minibatches"] == 4 and counts["calls"] == 0, counts
    print(f"rerun: {counts['minibatches_reused']} patches reused, no call")


def check_analyzed(run_dir: str, printed: str) -> None:
    written = [Path(line) for line in printed.splitlines() if line.strip()]
    assert written and all(path.is_file() for path in written), printed
    (figures,) = [path for path in written if path.suffix == ".json"]
    data = json.loads(figures.read_text(encoding="utf-8"))
    assert run_dir in json.dumps(data) and "redundancy" in json.dumps(data), data
    print(f"analyze: {', '.join(path.name for path in written)}")


def check_relogged(run_dir: str, printed: str) -> None:
    run_id = logged_status(Path(run_dir))
    assert printed.strip() == f"logged {run_dir} as MLflow run {run_id}", printed
    print(f"relog: MLflow run {run_id} FINISHED")


def write_chat_log(path: str) -> None:
    """A small chat log of the kind `python -m reflact.importers chat_jsonl` reads: 6 runs, 3 failed."""
    lines = []
    for i in range(6):
        messages = [{"role": "system", "content": "# Skill\n- Look the order up first.\n"},
                    {"role": "user", "content": f"Where is order {i}?"},
                    {"role": "assistant", "content": f"Order {i} is on its way."}]
        lines.append(json.dumps({"id": f"chat_{i}", "messages": messages, "score": i % 2}))
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")


def check_imported(dataset: str) -> None:
    root = Path(dataset)
    results = [json.loads(line) for line in (root / "results.jsonl").read_text(encoding="utf-8").splitlines()]
    assert sorted(r["id"] for r in results) == [f"chat_{i}" for i in range(6)], results
    assert "Look the order up first" in (root / "skill.md").read_text(encoding="utf-8")
    assert len(list((root / "predictions").rglob("*"))) >= 6
    print(f"importers: {len(results)} runs in {dataset}")


def check_reflect(dataset: str, base_url: str) -> None:
    import reflact

    done = reflact.reflect(dataset, overrides=["optimizer=compatible", f"optimizer.base_url={base_url}",
                                               "optimizer.model=test", "reflect.minibatch_size=2"])
    assert done.status == "FINISHED", (done.status, done.reason)
    assert len(done.patches) == done.summary["counts"]["minibatches"] == 2 + 2, done.summary["counts"]
    print(f"reflact.reflect(): {len(done.patches)} patches, {done.run_dir}")


def check_skillopt(base_url: str) -> None:
    from reflact.compat.skillopt import run_minibatch_reflect
    from reflact.core.shipped import demo_dir

    demo = demo_dir()
    results = [json.loads(line) for line in (demo / "results.jsonl").read_text(encoding="utf-8").splitlines()]
    os.environ.update(OPENAI_BASE_URL=base_url, OPTIMIZER_DEPLOYMENT="test")  # as a SkillOpt user sets them
    patches = run_minibatch_reflect(results, (demo / "skill.md").read_text(encoding="utf-8"),
                                    str(demo / "predictions"), "skillopt_step/patches", 4, False,
                                    minibatch_size=8, edit_budget=2, random_seed=1)
    written = sorted(path.name for path in Path("skillopt_step/patches").iterdir())
    assert len(patches) == len(written) == 4 and written[0] == "minibatch_fail_000.json", written
    # SkillOpt's own patch shape: no reflact bookkeeping unless support_counts=True asks for batch_size
    assert all(p["source_type"] in ("failure", "success") and "batch_size" not in p for p in patches), patches
    print(f"compat.skillopt.run_minibatch_reflect: {len(patches)} patches in skillopt_step/patches")


def sweep_runs() -> list[tuple[str, bool]]:
    """(status, is the parent) of every active MLflow run of the demo grid's sweep."""
    query = ("SELECT r.status, p.run_uuid IS NOT NULL FROM runs r"
             " JOIN tags t ON t.run_uuid = r.run_uuid AND t.key = 'reflact.sweep_id' AND t.value = ?"
             " LEFT JOIN tags p ON p.run_uuid = r.run_uuid AND p.key = 'reflact.sweep_parent'"
             " WHERE r.lifecycle_stage = 'active'")
    with sqlite3.connect(STORE) as db:
        return [(status, bool(parent)) for status, parent in db.execute(query, (SWEEP_ID,))]


def check_sweep(round_name: str) -> None:
    """Every job done and its MLflow run FINISHED; a resume makes no call; one parent, FINISHED."""
    jobs = sorted(path.parent for path in Path(SWEEP_ID).glob("*/summary.json"))
    assert len(jobs) == GRID_JOBS, jobs
    for job in jobs:
        counts = summary(job)["counts"]
        # a fresh job asks for every minibatch; a resumed one reuses every saved patch, with no call
        key = "minibatches_done" if round_name == "fresh" else "minibatches_reused"
        assert counts[key] == counts["minibatches"] > 0 and counts["minibatches_failed"] == 0, (job, counts)
        assert round_name == "fresh" or counts["calls"] == 0, (job, counts)
        logged_status(job)
    runs = sweep_runs()
    assert sorted(runs) == [("FINISHED", False)] * GRID_JOBS + [("FINISHED", True)], runs
    print(f"sweep ({round_name}): {GRID_JOBS} jobs and the parent FINISHED in MLflow")


def check_report() -> None:
    grid = Path(SWEEP_ID, "report", "grid.md").read_text(encoding="utf-8")
    cells = [line for line in grid.splitlines() if line.startswith("|") and "patch" in line]
    assert len(cells) == GRID_JOBS // 3, grid  # one row per M x L, over the 3 seeds
    print(f"report: {len(cells)} M x L cells in {SWEEP_ID}/report/grid.md")


def check_soak(root: str, runs: str, kind: str) -> None:
    """Each soak run finished every minibatch; a rerun's answers all came from the cache."""
    for i in range(int(runs)):
        counts = summary(Path(root) / str(i))["counts"]
        assert counts["minibatches_done"] == counts["minibatches"] == 4, (i, counts)
        if kind == "cached":
            assert counts["calls"] == 0 and counts["cache_hits"] == 4, (i, counts)
        else:
            assert counts["calls"] >= 4, (i, counts)
    print(f"soak: {runs} {kind} runs in {root}, every minibatch done")


def main(name: str, *args: str) -> None:
    action = write_chat_log if name == "write-chat-log" else globals()[f"check_{name.replace('-', '_')}"]
    action(*args)


if __name__ == "__main__":
    main(*sys.argv[1:])
