"""An endpoint that cannot be used ends the run at once with one line; retries say so as they go;
an unpriced model's cost is unknown, never $0; a mistake found before any call leaves no folder."""

from __future__ import annotations

import json
import logging
import socket
import sqlite3

import pytest

from reflact.calls.client import make_client
from reflact.calls.protocol import CallError
from reflact.config import parts as config_parts
from reflact.core.errors import UserError
from reflact.orchestration.experiment import Launch, run_experiment
from reflact.testing.optimizer_server import OptimizerServer, Response
from tests.conftest import make_config, run_cli, write_dataset

FAST = ["optimizer.retry.initial_wait_s=0.01", "optimizer.retry.max_wait_s=0.05", "optimizer.cache=off"]
MESSAGES = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]


def closed_port_url() -> str:
    with socket.socket() as sock:  # bound, then closed: nothing listens there
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


def experiment(tmp_path, data, base_url, *overrides):
    cfg = make_config(f"data.dir={data}", f"optimizer.base_url={base_url}", "optimizer.model=test",
                      "reflect.minibatch_size=4", "mlflow.enabled=false", *FAST, *overrides)
    return run_experiment(config_parts(cfg), {}, tmp_path / "run", Launch(tmp_path))


def refusing(status: int):
    return lambda request, number: Response(status, {"error": {"message": f"refused {status}"}})


# 5. a dead or wrong endpoint ---------------------------------------------------------------------


def test_a_closed_port_is_one_line_naming_the_url_and_the_run_ends_failed(tmp_path, launch_dir):
    url = closed_port_url()
    data = write_dataset(tmp_path / "d", n_fail=8, n_succ=8)
    done = run_cli(f"data.dir={data}", "optimizer=compatible", f"optimizer.base_url={url}", "optimizer.model=test",
                   "reflect.minibatch_size=4", "hydra.run.dir=outputs/runs/dead", cwd=launch_dir,
                   env={"OPENAI_COMPATIBLE_API_KEY": "sk-do-not-show-0123456789"})
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith(f"reflact: run failed: the optimizer at {url}/ did not answer"), lines[-1]
    assert "connection failed" in lines[-1] and "check optimizer.base_url" in lines[-1]
    # one line: no minibatch line repeating the cause, no end-of-run summary, no traceback, no key
    assert not [line for line in lines[:-1] if "FAILED" in line or "connection failed" in line], lines
    assert "Traceback" not in done.stderr and "sk-do-not-show" not in done.stderr
    summary = json.loads((launch_dir / "outputs/runs/dead/summary.json").read_text())
    assert summary["counts"]["minibatches_failed"] == 4 and summary["counts"]["retries"] == 0
    with sqlite3.connect(launch_dir / "outputs" / "mlflow.db") as db:
        assert db.execute("select status from runs").fetchall() == [("FAILED",)]


def test_401_on_every_first_attempt_stops_with_the_key_variable_to_check(tmp_path, caplog):
    data = write_dataset(tmp_path / "d", n_fail=16, n_succ=8)
    with OptimizerServer(refusing(401)) as server, caplog.at_level(logging.INFO, logger="reflact"):
        result = experiment(tmp_path, data, server.base_url, "reflect.workers=2")
    assert result.status == "FAILED"
    assert result.reason.startswith(f"the optimizer at {server.base_url}/ did not answer the first requests "
                                    "(HTTP 401: ")
    assert "check the key in $OPENAI_API_KEY (optimizer.api_key_env)" in result.reason
    # no retry, and no request after the first answers: at most one per worker
    assert 1 <= server.count <= 2
    minibatches = result.summary["minibatches"]
    assert len(minibatches) == 6 and all(mb["status"] == "failed" and mb["retries"] == 0 for mb in minibatches)
    assert all(mb["error"].startswith("HTTP 401") for mb in minibatches)
    assert not [r for r in caplog.records if "FAILED" in r.getMessage() or "attempt" in r.getMessage()]


def test_404_on_every_first_attempt_names_the_model(tmp_path):
    data = write_dataset(tmp_path / "d", n_fail=8, n_succ=0)
    with OptimizerServer(refusing(404)) as server:
        result = experiment(tmp_path, data, server.base_url, "optimizer.model=no-such-model")
    assert result.status == "FAILED" and "(HTTP 404: " in result.reason
    assert "check optimizer.model ('no-such-model') and optimizer.base_url" in result.reason
    assert server.count <= 2


def test_an_unknown_host_is_an_endpoint_fault(tmp_path):
    data = write_dataset(tmp_path / "d", n_fail=4, n_succ=0)
    result = experiment(tmp_path, data, "http://no-such-host.invalid/v1")
    assert result.status == "FAILED" and "http://no-such-host.invalid/v1/" in result.reason
    assert "connection failed" in result.reason and result.summary["counts"]["retries"] == 0


def test_once_the_server_answered_a_401_fails_only_its_minibatch(tmp_path):
    data = write_dataset(tmp_path / "d", n_fail=12, n_succ=0)
    # the first request is answered, then one minibatch's request is refused
    script = lambda request, number: Response(401, {"error": {"message": "no"}}) if number == 2 else None  # noqa: E731
    with OptimizerServer(script) as server:
        result = experiment(tmp_path, data, server.base_url, "reflect.workers=1")
    assert result.status == "FINISHED" and server.count == 3
    assert [mb["status"] for mb in result.summary["minibatches"]] == ["done", "failed", "done"]


def test_a_connection_lost_after_a_reply_is_retried_with_a_line_per_retry(tmp_path, caplog):
    cfg = make_config("data.dir=unused", "optimizer.model=test", "optimizer.retry.max_attempts=3", *FAST,
                      "optimizer.base_url=http://127.0.0.1:1/v1")
    with OptimizerServer() as server:
        cfg.optimizer.base_url = server.base_url
        client = make_client(cfg.optimizer, tmp_path, environ={})
        client.complete(MESSAGES, 10)
    with caplog.at_level(logging.INFO, logger="reflact"), pytest.raises(CallError) as failed:
        client.complete(MESSAGES, 10, label="minibatch_fail_001")
    assert failed.value.retries == 2 and not failed.value.fatal and not client.fault
    lines = [r.getMessage() for r in caplog.records]
    assert [line.split(" after ")[0] for line in lines] == ["minibatch_fail_001: attempt 2/3",
                                                            "minibatch_fail_001: attempt 3/3"]
    assert all("connection failed" in line for line in lines)


def test_429_then_ok_shows_the_retry_line_and_the_run_finishes(tmp_path, caplog):
    data = write_dataset(tmp_path / "d", n_fail=4, n_succ=0)
    script = lambda request, number: (  # noqa: E731
        Response(429, {"error": {"message": "slow down"}}, headers={"Retry-After": "0"}) if number == 1 else None)
    with OptimizerServer(script) as server, caplog.at_level(logging.INFO, logger="reflact"):
        result = experiment(tmp_path, data, server.base_url)
    assert result.status == "FINISHED" and server.count == 2
    retries = [r.getMessage() for r in caplog.records if "attempt" in r.getMessage()]
    assert retries == ["minibatch_fail_000: attempt 2/6 after HTTP 429 (Retry-After 0 s)"]


def test_a_500_before_any_reply_is_still_retried(tmp_path, caplog):
    data = write_dataset(tmp_path / "d", n_fail=4, n_succ=0)
    script = lambda request, number: Response(500, {"error": {"message": "busy"}}) if number < 3 else None  # noqa: E731
    with OptimizerServer(script) as server, caplog.at_level(logging.INFO, logger="reflact"):
        result = experiment(tmp_path, data, server.base_url)
    assert result.status == "FINISHED" and server.count == 3
    retries = [r.getMessage() for r in caplog.records if "attempt" in r.getMessage()]
    assert [line.split(" (waiting")[0] for line in retries] == ["minibatch_fail_000: attempt 2/6 after HTTP 500",
                                                                "minibatch_fail_000: attempt 3/6 after HTTP 500"]


# 6. a model without a price ----------------------------------------------------------------------


@pytest.mark.parametrize("model", ["openai/gpt-4o-mini", "my-model"])
def test_an_unpriced_model_says_so_once_and_its_cost_is_unknown(tmp_path, caplog, model):
    data = write_dataset(tmp_path / "d", n_fail=8, n_succ=4)
    with OptimizerServer() as server, caplog.at_level(logging.INFO, logger="reflact"):
        result = experiment(tmp_path, data, server.base_url, f"optimizer.model={model}")
    assert result.status == "FINISHED"
    counts = result.summary["counts"]
    assert counts["cost_usd"] is None and counts["spent_usd"] is None and result.summary["cost_known"] is False
    assert all(mb["cost_usd"] is None for mb in result.summary["minibatches"])
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert saved["counts"]["cost_usd"] is None and saved["cost_known"] is False
    messages = [r.getMessage() for r in caplog.records]
    warnings = [m for m in messages if "has no price" in m]
    assert len(warnings) == 1 and repr(model) in warnings[0] and "optimizer.prices" in warnings[0]
    assert not [m for m in messages if "$0.0000" in m], messages
    [end] = [m for m in messages if m.startswith("done:")]
    assert "cost unknown" in end
    report = (tmp_path / "run" / "report.md").read_text()
    assert "| cost_usd | unknown (no price for the model) |" in report


def test_a_priced_model_keeps_its_dollars(tmp_path, caplog):
    data = write_dataset(tmp_path / "d", n_fail=4, n_succ=0)
    with OptimizerServer() as server, caplog.at_level(logging.INFO, logger="reflact"):
        result = experiment(tmp_path, data, server.base_url, "+optimizer.prices.test={input:1,output:10}")
    assert result.summary["cost_known"] is True and result.summary["counts"]["cost_usd"] > 0
    assert not [r for r in caplog.records if "has no price" in r.getMessage()]


def test_unknown_costs_are_left_out_of_metrics_and_the_grid_report():
    import pandas as pd

    from reflact.sweeps.grid_report import derived
    from reflact.tracking.store import minibatch_metrics, total_metrics

    assert total_metrics({"calls": 3, "cost_usd": None, "spent_usd": None}, False) == {"calls": 3.0}
    record = {"proposed": 2, "cost_usd": None, "usage": {"prompt": 1, "completion": 2}}
    assert "minibatch/cost_usd" not in minibatch_metrics(record)
    runs = pd.DataFrame([{"edits_kept": 3.0, "M": 4, "L": 2, "mode": 0}])  # no cost metric was logged
    assert derived(runs)["cost_usd"].isna().all() and derived(runs)["edits_kept"].tolist() == [3.0]


@pytest.mark.parametrize("override", ["optimized_metric=cost_usd", "optimizer.max_cost_usd=1"])
def test_what_needs_a_price_stops_before_any_call_without_one(override):
    with pytest.raises(UserError, match=r"optimizer.prices"):
        make_config("data.dir=unused", "optimizer.model=openai/gpt-4o-mini", override)


# 7. a mistake found before any call leaves no folder ---------------------------------------------


def bad_results(data):
    with open(data / "results.jsonl", "a", encoding="utf-8") as handle:
        handle.write("{not json\n")


def duplicate_id(data):
    first = (data / "results.jsonl").read_text().splitlines()[0]
    with open(data / "results.jsonl", "a", encoding="utf-8") as handle:
        handle.write(first + "\n")


MISTAKES = {
    "unknown key": (["+reflect.nope=1"], None),
    "bad mode": (["reflect.update_mode=bogus"], None),
    "M < 1": (["reflect.minibatch_size=0"], None),
    "missing data dir": (["data.dir=no/such/folder"], None),
    "bad results line": ([], bad_results),
    "duplicate id": ([], duplicate_id),
    "bad base_url": (["optimizer.base_url=ftp://127.0.0.1/v1"], None),
    "no model": (["optimizer=compatible", "optimizer.model="], None),
    "missing prompt file": (["prompts.error=no/such/template.md"], None),
    "no key": (["optimizer=openai", "~optimizer.base_url"], None),
}
QUICK = {"bad mode", "missing data dir"}  # the rest: in the slow set


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in QUICK else pytest.mark.slow) for n in MISTAKES])
def test_a_mistake_before_any_call_leaves_no_new_folder(tmp_path, name):
    overrides, spoil = MISTAKES[name]
    data = write_dataset(tmp_path / "d", n_fail=4, n_succ=0)
    if spoil:
        spoil(data)
    launch = tmp_path / "launch"
    launch.mkdir()
    base = [] if "optimizer=openai" in overrides else ["optimizer=compatible", "optimizer.base_url=http://127.0.0.1:9/v1",
                                                        "optimizer.model=test"]
    done = run_cli(f"data.dir={data}", *base, *overrides, "mlflow.enabled=false", cwd=launch)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("reflact: error: ") and "Traceback" not in done.stderr
    assert not (launch / "outputs" / "runs").exists(), sorted(p.name for p in (launch / "outputs").rglob("*"))


def test_a_rerun_with_a_mistake_leaves_the_existing_run_dir_as_it_was(tmp_path, server):
    data = write_dataset(tmp_path / "d", n_fail=4, n_succ=0)
    launch = tmp_path / "launch"
    launch.mkdir()
    common = [f"data.dir={data}", "optimizer=compatible", f"optimizer.base_url={server.base_url}",
              "optimizer.model=test", "mlflow.enabled=false", "hydra.run.dir=outputs/runs/mine"]
    assert run_cli(*common, cwd=launch).returncode == 0
    run_dir = launch / "outputs" / "runs" / "mine"
    before = {p.relative_to(run_dir): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    done = run_cli(*common, "reflect.update_mode=bogus", cwd=launch)
    assert done.returncode == 2
    assert {p.relative_to(run_dir): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before
    # an empty folder of the user's, given as the run dir, stays too, and empty
    (launch / "empty").mkdir()
    assert run_cli(*common[:-1], "hydra.run.dir=empty", "reflect.update_mode=bogus", cwd=launch).returncode == 2
    assert (launch / "empty").is_dir() and not any((launch / "empty").iterdir())


def test_reflect_api_leaves_no_folder_after_a_mistake(tmp_path):
    import reflact

    launch = tmp_path / "launch"
    with pytest.raises(UserError):
        reflact.reflect(results=[{"id": "r1", "task_description": "no score"}], skill="# s\n",
                        conversations={"r1": []}, overrides=["optimizer=dry_run"], launch_dir=launch)
    assert not (launch / "outputs" / "runs").exists()
    kept = tmp_path / "kept"
    (kept / "inputs").mkdir(parents=True)
    (kept / "notes.txt").write_text("mine")
    with pytest.raises(UserError):
        reflact.reflect(results=[{"id": "r1"}], skill="# s\n", conversations={"r1": []},
                        overrides=["optimizer=dry_run"], run_dir=kept, launch_dir=launch)
    assert (kept / "notes.txt").read_text() == "mine"
