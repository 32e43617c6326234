"""Rules that no fast test held before (issue 22): each test here fails when its rule is broken
(each was checked once by breaking the rule by hand). The cost cap's reservation and its wait,
a worst case that exactly fits, the run-dir lock, the MLflow status on Ctrl-C and on a crash, a
sweep parent's status when a job was killed, a worker's bug, the tpm allowance per attempt, the retry
time budget, the draw in the fingerprint, `failed_calls` per request, and the temporaries of a killed run."""

from __future__ import annotations

import json
import signal
import threading
from contextlib import closing
from pathlib import Path
from types import SimpleNamespace

import pytest

from reflact.calls.protocol import DryRunEstimator
from reflact.config import parts as config_parts
from reflact.core.errors import Stopped, UserError
from reflact.inputs.dataset import load_dataset
from reflact.orchestration.experiment import Launch, run_experiment
from reflact.running import ask as ask_module
from reflact.running.ask import Spend, worst_cost
from reflact.running.rundir import RunDir, fingerprint, locked
from reflact.running.stage import Stage
from reflact.testing.optimizer_server import Response, chat_body, default_reply
from tests.conftest import make_config, shape_of, stage_for, stage_settings, write_dataset

PRICED = "+optimizer.prices.test={input:1,cached_input:0.1,output:4}"
ONE_EACH = "reflect.minibatch_size=1"


class Overlap:
    """A server script that holds each request until a second one is in flight (at most `wait_s`),
    and records the most requests it saw in flight at once."""

    def __init__(self, wait_s: float = 2.0) -> None:
        self.lock = threading.Condition()
        self.inflight = 0
        self.most = 0
        self.wait_s = wait_s

    def __call__(self, request: dict, number: int) -> Response:
        with self.lock:
            self.inflight += 1
            self.most = max(self.most, self.inflight)
            self.lock.notify_all()
            self.lock.wait_for(lambda: self.inflight > 1, timeout=self.wait_s)
        try:
            return Response(body=chat_body(json.dumps(default_reply(request))))
        finally:
            with self.lock:
                self.inflight -= 1


def worst_cases(tmp_path: Path, data: Path, *overrides: str) -> list[float]:
    """Each minibatch's worst case, from the prompts a dry run of the same settings writes."""
    cfg = make_config(f"data.dir={data}", "optimizer.base_url=http://127.0.0.1:9", "optimizer.model=test",
                      PRICED, *overrides)
    run_dir = RunDir(tmp_path / "dry")
    outcomes = Stage(stage_settings(cfg), load_dataset(cfg.data), DryRunEstimator(1500), run_dir.root).run()
    price = cfg.optimizer.prices["test"]
    return [worst_cost([{"role": "system", "content": run_dir.system_path(o.tag).read_text("utf-8")},
                        {"role": "user", "content": run_dir.user_path(o.tag, 1).read_text("utf-8")}],
                       cfg.optimizer.max_output_tokens, price) for o in outcomes]


# ---------------------------------------------------------------- the cost cap


@pytest.mark.parametrize(("room", "overlap"), [(1.5, False), (2.5, True)],
                         ids=["room for one worst case", "room for two"])
def test_the_cost_cap_reserves_each_requests_worst_case_and_waits_for_others(tmp_path, server, room, overlap):
    data = write_dataset(tmp_path / "d", n_fail=2, n_succ=0)
    worst = max(worst_cases(tmp_path, data, ONE_EACH))
    server.script = gate = Overlap()
    outcomes = stage_for(tmp_path, server, data, ONE_EACH, PRICED, "reflect.workers=2",
                         f"optimizer.max_cost_usd={room * worst!r}").run()
    # the second request waited for the first one's reservation to settle, then fitted
    assert [o.status for o in outcomes] == ["done", "done"] and server.count == 2
    assert gate.most == (2 if overlap else 1)


def test_a_request_whose_worst_case_exactly_fits_the_cap_may_start(tmp_path, server):
    data = write_dataset(tmp_path / "d", n_fail=1, n_succ=0)
    [worst] = worst_cases(tmp_path, data, ONE_EACH)
    [done] = stage_for(tmp_path, server, data, ONE_EACH, PRICED, f"optimizer.max_cost_usd={worst!r}").run()
    assert done.status == "done" and server.count == 1
    [refused] = stage_for(tmp_path, server, data, ONE_EACH, PRICED, f"optimizer.max_cost_usd={worst * 0.999!r}",
                          run_dir=tmp_path / "less").run()
    assert refused.status == "not_run" and server.count == 1


def test_a_reservation_that_can_never_fit_is_refused_at_once():
    spend, stopping = Spend(1.0), threading.Event()
    assert spend.reserve(1.0, stopping)
    spend.settle(1.0, 0.4)
    assert not spend.reserve(0.7, stopping)  # nothing else is out: waiting could not help
    assert spend.reserve(0.6, stopping)


# ---------------------------------------------------------------- the run dir


def test_the_run_dir_lock_refuses_a_second_process_and_goes_with_the_first(tmp_path):
    run_dir = RunDir(tmp_path / "run")
    with locked(run_dir):
        with pytest.raises(UserError, match=r"is in use by another reflact process \(pid \d+\)"), locked(run_dir):
            pass
    with locked(run_dir):  # released when the first one ended
        pass


def test_the_temporaries_of_a_killed_run_are_removed_by_the_next(tmp_path, server):
    data = write_dataset(tmp_path / "d", n_fail=1, n_succ=0)
    run = tmp_path / "run"
    left = [run / "patches" / ".minibatch_fail_000.json.0a1b2c3d.tmp",
            run / "calls" / "minibatch_fail_000" / ".reply_1.txt.0a1b2c3d.tmp",
            run / ".summary.json.0a1b2c3d.tmp", run / ".report.md.0a1b2c3d.tmp",
            run / ".kept_items.jsonl.0a1b2c3d.tmp", run / ".analysis.json.0a1b2c3d.tmp",
            run / ".hydra" / ".config.yaml.0a1b2c3d.tmp"]
    mine = run / "calls" / "notes.txt"  # not reflact's: stays
    for path in [*left, mine]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("half written")
    stage_for(tmp_path, server, data, run_dir=run).run()
    assert [path for path in left if path.exists()] == [] and mine.is_file()


# ---------------------------------------------------------------- the MLflow status of a stopped run


def mlflow_status(launch_dir: Path, run_dir: Path) -> str:
    from tests.test_live import runs_of

    [run] = runs_of(f"sqlite:///{launch_dir / 'outputs' / 'mlflow.db'}", run_dir)
    return run.info.status


def tracked(tmp_path, server, launch_dir, *overrides):
    """The run's parts, tracked in the launch dir's store."""
    data = write_dataset(tmp_path / "d", n_fail=3, n_succ=0)
    return config_parts(make_config(f"data.dir={data}", f"optimizer.base_url={server.base_url}", "optimizer.model=test",
                       "optimizer.cache=off", ONE_EACH, "reflect.workers=1", *overrides,
                       f"mlflow.tracking_uri=sqlite:///{launch_dir / 'outputs' / 'mlflow.db'}"))


def test_the_mlflow_run_is_killed_on_ctrl_c(tmp_path, server, launch_dir):
    main = threading.main_thread().ident
    assert main is not None

    armed = threading.Event()  # a Ctrl-C that came after the test would stop the whole test session
    armed.set()

    def interrupt(request, number):  # Ctrl-C while the first request is out
        if number == 1 and armed.is_set():
            armed.clear()
            signal.pthread_kill(main, signal.SIGINT)
        return Response(body=chat_body(json.dumps(default_reply(request))), delay_s=0.3)

    server.script = interrupt
    try:
        with pytest.raises(Stopped):
            run_experiment(tracked(tmp_path, server, launch_dir), {}, tmp_path / "run", Launch(launch_dir))
    finally:
        armed.clear()
    assert mlflow_status(launch_dir, tmp_path / "run") == "KILLED"


def test_the_mlflow_run_is_failed_on_a_crash(tmp_path, server, launch_dir, monkeypatch):
    def buggy(*args):
        raise TypeError("a bug in checking the reply")

    monkeypatch.setattr(ask_module, "check_reply", buggy)
    with pytest.raises(TypeError, match="a bug in checking"):
        run_experiment(tracked(tmp_path, server, launch_dir), {}, tmp_path / "run", Launch(launch_dir))
    assert mlflow_status(launch_dir, tmp_path / "run") == "FAILED"


def test_a_workers_bug_stops_new_submissions(tmp_path, server, monkeypatch):
    data = write_dataset(tmp_path / "d", n_fail=8, n_succ=0)

    def buggy(*args):
        raise TypeError("a bug in checking the reply")

    monkeypatch.setattr(ask_module, "check_reply", buggy)
    with pytest.raises(TypeError, match="a bug in checking"):
        stage_for(tmp_path, server, data, ONE_EACH, "reflect.workers=1").run()
    # one worker holds 2 prompts: the bug's and the next one's (asked, or dropped when queued). Had
    # the launcher gone on, it could only be 2 ahead of the worker: 6 or more requests
    assert server.count <= 2


# ---------------------------------------------------------------- retries and pacing


def test_every_attempt_takes_its_tokens_from_the_tpm_allowance(tmp_path, server):
    from tests.test_faults import MESSAGES, client_for

    server.script = lambda request, number: Response(status=500, body={"error": {"message": "x"}}) \
        if number <= 2 else None
    tpm, allowance = 10**8, 2 * 10**7
    with closing(client_for(tmp_path, server, f"optimizer.tpm={tpm}")) as client:
        client.complete(MESSAGES, allowance)
        level = client._limiter._tokens.level  # what is left of this minute's allowance
    assert server.count == 3
    # three attempts took ~3 x the allowance; one taken per call would leave 4/5 of it
    assert level < tpm - 2.5 * allowance


def test_retries_stop_at_the_retry_time_budget(tmp_path, server):
    from reflact.calls.protocol import CallError
    from tests.test_faults import MESSAGES, client_for

    server.script = lambda request, number: Response(status=500, body={"error": {"message": "down"}})
    with closing(client_for(tmp_path, server, "optimizer.retry.max_attempts=200", "optimizer.retry.max_seconds=0.5",
                            "optimizer.retry.initial_wait_s=0.05", "optimizer.retry.max_wait_s=0.05")) as client:
        with pytest.raises(CallError, match="HTTP 500"):
            client.complete(MESSAGES, 10)
    assert 2 <= server.count < 100  # ~10 attempts fit in 0.5 s; 200 would take 10 s and more


def test_failed_calls_count_requests_not_attempts(tmp_path, server):
    data = write_dataset(tmp_path / "d", n_fail=2, n_succ=0)
    server.script = lambda request, number: Response(status=500, body={"error": {"message": "down"}}) \
        if "id: run_00000)" in request["messages"][1]["content"] else None
    outcomes = stage_for(tmp_path, server, data, ONE_EACH, "optimizer.retry.max_attempts=3").run()
    [first] = [o for o in outcomes if o.ids == ["run_00000"]]
    [second] = [o for o in outcomes if o.ids == ["run_00001"]]
    assert (first.status, first.failed_calls, first.retries, first.calls) == ("failed", 1, 2, 0)
    assert (second.status, second.failed_calls, second.retries, second.calls) == ("done", 0, 0, 1)
    assert server.count == 4


# ---------------------------------------------------------------- the fingerprint


def test_the_fingerprint_holds_the_draws_sample_index(tmp_path, server):
    cfg = make_config("data.dir=unused", "optimizer.base_url=http://127.0.0.1:9", "optimizer.model=test")
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    assert fingerprint(shape_of(cfg), messages, 0) != fingerprint(shape_of(cfg), messages, 1)
    data = write_dataset(tmp_path / "d", n_fail=1, n_succ=0)
    draws = ["optimizer.samples=2", "optimizer.temperature=1.0"]
    outcomes = stage_for(tmp_path, server, data, ONE_EACH, *draws).run()
    patches = [json.loads(p.read_text()) for p in sorted((tmp_path / "run" / "patches").glob("*.json"))]
    assert len(patches) == len(outcomes) == 2 and patches[0]["fingerprint"] != patches[1]["fingerprint"]
    again = stage_for(tmp_path, server, data, ONE_EACH, *draws).run()  # each draw finds its own patch
    assert [o.status for o in again] == ["reused", "reused"] and server.count == 2


def job_dirs(sweep_dir: Path, records: list[str], uri: str = "sqlite:///s.db") -> None:
    """A sweep dir's job dirs, each with its MLflow record: "FINISHED", or "INCOMPLETE:FAILED" (its
    MLflow run not written whole, the run itself FAILED), or "RUNNING" (its process killed)."""
    from reflact.running.rundir import RunDir

    for number, record in enumerate(records):
        status, _, own = record.partition(":")
        rd = RunDir(sweep_dir / f"reflect.seed={number}")
        rd.root.mkdir(parents=True)
        rd.write_mlflow_record({"run_id": str(number), "tracking_uri": uri, "status": status,
                                **({"run_status": own} if own else {})})
        if status != "RUNNING":
            rd.write_summary({"counts": {"calls": 2, "edits_kept": number, "cost_usd": 0.5}})


class ParentStore:
    """What status_of_children writes to the parent run."""

    uri = "sqlite:///s.db"
    run_id = "parent"

    def __init__(self) -> None:
        self.tags: dict = {}
        self.client = SimpleNamespace(get_run=lambda run_id: SimpleNamespace(data=SimpleNamespace(tags=self.tags)),
                                      delete_tag=lambda run_id, key: self.tags.pop(key))

    def log_metrics(self, rows, at_ms, tags=None):
        self.metrics = {key: value for key, value, _ in rows}
        self.tags.update(tags or {})


@pytest.mark.parametrize("records,failed,parent", [
    (["FINISHED", "KILLED", "FINISHED"], False, "KILLED"),
    (["FAILED", "KILLED"], True, "KILLED"),  # a stopped job says more than a failed one
    (["FINISHED", "FAILED"], False, "FAILED"),
    (["FINISHED", "RUNNING"], False, "KILLED"),  # a job whose process died before its end
    (["FINISHED", "FINISHED"], True, "FAILED"),  # a job without a run dir, or the sweep aborted
    (["FINISHED", "FINISHED"], False, "FINISHED"),
    (["FINISHED", "INCOMPLETE:FINISHED"], False, "FINISHED"),  # MLflow lacks a job that finished
    (["FINISHED", "INCOMPLETE:FAILED"], False, "FAILED"),
])
def test_a_sweep_parents_status_and_counts_come_from_its_job_dirs(tmp_path, records, failed, parent):
    """Not from what the store holds: after an outage it held 3 runs of 9 jobs, RUNNING ones counted FAILED."""
    from reflact.running.rundir import SweepDir
    from reflact.sweeps import sweep
    from reflact.sweeps.jobs import NEEDS_RELOG_TAG, sweep_jobs

    job_dirs(tmp_path, records)
    store = ParentStore()
    jobs = sweep_jobs(SweepDir(tmp_path), store.uri)
    assert sweep.status_of_children(store, jobs, SweepDir(tmp_path), failed) == parent
    statuses = [r.split(":")[-1] if r != "RUNNING" else "KILLED" for r in records]
    assert store.metrics["jobs"] == len(records)
    assert [store.metrics[f"jobs_{s}"] for s in ("finished", "failed", "killed")] == [
        statuses.count(s) for s in ("FINISHED", "FAILED", "KILLED")]
    summarised = [r for r in records if r != "RUNNING"]
    assert store.metrics["calls_sum"] == 2 * len(summarised)  # what was spent counts every job
    unlogged = sum(r.startswith("INCOMPLETE") for r in records)  # a killed job's dir has nothing to relog
    if unlogged:
        assert store.tags[NEEDS_RELOG_TAG].startswith(f"{unlogged} of {len(records)} jobs not wholly in MLflow")
        assert store.tags[NEEDS_RELOG_TAG].endswith(f"python -m reflact.relog {tmp_path} writes them and this "
                                                    "sweep's figures")
    else:
        assert NEEDS_RELOG_TAG not in store.tags


def test_a_sweep_parent_describes_its_grid_jobs_edits_and_cost(tmp_path):
    """The parent's description (MLflow's run description) names the grid, model, jobs and how they
    ended, edits kept over the finished jobs and what the sweep cost; one the user wrote is kept."""
    from reflact.running.rundir import SweepDir
    from reflact.sweeps import sweep
    from reflact.sweeps.jobs import sweep_jobs
    from reflact.tracking.description import NOTE_TAG

    job_dirs(tmp_path, ["FINISHED", "FINISHED", "INCOMPLETE:FAILED"])
    SweepDir(tmp_path).write_identity({
        "fixed": {"reflect.update_mode": "patch", "reflect.seed": "42", "optimizer.model": "test",
                  "reflect.minibatch_size": "8"},
        "swept": {"reflect.edit_budget": ["1", "2", "4"]},
    })
    store = ParentStore()
    sweep.status_of_children(store, sweep_jobs(SweepDir(tmp_path), store.uri), SweepDir(tmp_path), False)
    assert store.tags[NOTE_TAG] == (
        "Sweep over M=8, L=1,2,4, mode patch, seed 42, model `test`.\n\n"
        "3 jobs (2 finished, 1 failed).\n\n"
        "Edits kept per finished job: 0.5 on average.\n\n"  # jobs 0 and 1 kept 0 and 1
        "Cost $1.5000 in all.\n\n"
        f"**Not wholly in MLflow**: 1 of 3 jobs not wholly in MLflow (the tracking store failed); "
        f"python -m reflact.relog {tmp_path} writes them and this sweep's figures."
    )
    store.tags[NOTE_TAG] = "my notes on this sweep"  # written in the UI
    sweep.status_of_children(store, sweep_jobs(SweepDir(tmp_path), store.uri), SweepDir(tmp_path), False)
    assert store.tags[NOTE_TAG] == "my notes on this sweep"


def test_a_repaired_sweep_parent_drops_what_it_said_was_missing(tmp_path):
    from reflact.running.rundir import SweepDir
    from reflact.sweeps import sweep
    from reflact.sweeps.jobs import NEEDS_RELOG_TAG, sweep_jobs
    from reflact.tracking.description import NOTE_TAG

    job_dirs(tmp_path, ["FINISHED", "INCOMPLETE:FINISHED"])
    store = ParentStore()
    sweep.status_of_children(store, sweep_jobs(SweepDir(tmp_path), store.uri), SweepDir(tmp_path), False)
    missing = store.tags[NEEDS_RELOG_TAG]
    assert store.tags[NOTE_TAG].endswith(f"**Not wholly in MLflow**: {missing}.")  # the description says it too
    (tmp_path / "reflect.seed=1" / "mlflow_run.json").write_text(
        json.dumps({"run_id": "1", "tracking_uri": store.uri, "status": "FINISHED"}))  # relogged
    sweep.status_of_children(store, sweep_jobs(SweepDir(tmp_path), store.uri), SweepDir(tmp_path), False)
    assert NEEDS_RELOG_TAG not in store.tags
    assert missing not in store.tags[NOTE_TAG] and store.tags[NOTE_TAG].endswith("Wholly in MLflow.")
    assert store.metrics["jobs_finished"] == 2
