"""Batch execution (optimizer.execution=batch) against the stand-in's Batch API, over real HTTP.

Done when (issue 35): a batch run makes the live run's patches byte for byte at half its cost,
each distinct request sent once (the stand-in's /stats); an expired batch keeps its lines and the
next one holds exactly the rest; a command killed at any step, or returned at once, is resumed
by the next without a second batch; what cannot be batched (no Batch API, over the cap, a
request over the file limit, a dry run) is one line with nothing uploaded; faults (an upload
that fails, 5xx while polling, an output file missing or cut, stray lines, a file failing
validation, a batch past its wait) each say so and lose nothing.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from pathlib import Path

import pytest

import reflact
from reflact.core.errors import UserError
from reflact.running.batch import fingerprint
from reflact.running.batch_state import load_state
from reflact.running.rundir import BatchFiles
from reflact.testing.batch_server import BatchSettings
from reflact.testing.optimizer_server import OptimizerServer, Response, chat_body, default_reply
from tests.conftest import output, patches_of, run_cli, write_dataset

PRICE = "+optimizer.prices.test={input:1,cached_input:0.1,output:4}"


def settings(srv: OptimizerServer, *extra: str) -> list[str]:
    return ["optimizer=compatible", f"optimizer.base_url={srv.base_url}", "optimizer.model=test", PRICE,
            "optimizer.retry.initial_wait_s=0.01", "optimizer.retry.max_wait_s=0.02", "mlflow.enabled=false",
            "reflect.minibatch_size=2", *extra]


def run(tmp_path: Path, srv: OptimizerServer, name: str, *extra: str, batch: bool = True):
    data = tmp_path / "data"
    if not data.exists():
        write_dataset(data, n_fail=6, n_succ=4)
    overrides = settings(srv, *(["optimizer.execution=batch"] if batch else []), *extra)
    return reflact.reflect(data, overrides=overrides, run_dir=tmp_path / name, launch_dir=tmp_path)


def state_of(run_dir: Path):
    return load_state(BatchFiles(run_dir))


def stats(srv: OptimizerServer) -> dict:
    return srv.batches.stats(srv.count)


def sent_bodies(srv: OptimizerServer) -> list[str]:
    return sorted(json.dumps({k: v for k, v in b.items() if k != "service_tier"}, sort_keys=True)
                  for b in [*srv.requests, *srv.batches.lines])


# ---------------------------------------------------------------------------------------------
# a batch run is the live run at the batch's price


def test_a_batch_run_makes_the_live_runs_patches_at_half_the_cost_each_request_sent_once(tmp_path):
    with OptimizerServer() as live_srv:
        live = run(tmp_path / "live", live_srv, "run", batch=False)
    with OptimizerServer() as srv:
        batched = run(tmp_path / "batch", srv, "run")
        assert stats(srv) == {"requests": 0, "batches": 1, "batch_lines": 5, "distinct": 5, "sent_twice": 0,
                              "uploads": 1}
        created = srv.batches.batches["batch_0001"]
        assert created["metadata"] == {"reflact": "run", "file": "input_001.jsonl",
                                       "fingerprint": fingerprint(state_of(tmp_path / "batch/run").submissions[0])}
        assert created["endpoint"] == "/v1/chat/completions"
        # each line is the very body the live client sends (its schema in response_format)
        assert sent_bodies(srv) == sent_bodies(live_srv)
    assert batched.status == live.status == "FINISHED"
    assert patches_of(tmp_path / "batch" / "run") == patches_of(tmp_path / "live" / "run")
    for name in patches_of(tmp_path / "live" / "run"):
        a = (tmp_path / "live/run/patches" / f"{name}.json").read_bytes()
        assert a == (tmp_path / "batch/run/patches" / f"{name}.json").read_bytes()
    live_counts, batch_counts = live.summary["counts"], batched.summary["counts"]
    assert batch_counts["cost_usd"] == pytest.approx(live_counts["cost_usd"] / 2)
    assert batch_counts["spent_usd"] == pytest.approx(live_counts["spent_usd"] / 2)
    assert batch_counts["calls"] == live_counts["calls"] == 5 and batch_counts["cache_hits"] == 0
    record = json.loads((tmp_path / "batch/run/calls/minibatch_fail_000/outcome.json").read_text())
    assert record["call_log"][0]["service_tier"] == "batch" and record["call_log"][0]["batch_id"] == "batch_0001"


def test_a_batch_line_is_the_call_of_the_first_run_that_uses_it_and_a_cache_hit_after(tmp_path):
    with OptimizerServer() as srv:
        first = run(tmp_path, srv, "first")
        again = run(tmp_path, srv, "again")  # a fresh run dir, the same requests: all in the cache
        assert stats(srv)["batches"] == 1 and srv.count == 0
    assert first.summary["counts"]["calls"] == 5 and first.summary["counts"]["spent_usd"] > 0
    assert again.summary["counts"]["calls"] == 0 and again.summary["counts"]["cache_hits"] == 5
    assert again.summary["counts"]["spent_usd"] == 0
    assert again.summary["counts"]["cost_usd"] == pytest.approx(first.summary["counts"]["cost_usd"])


def test_identical_requests_of_two_runs_go_once_in_one_batch(tmp_path):
    """Two runs of one batch (as a sweep's cells are) that ask the same: one line each request."""
    from reflact.config import from_hydra
    from reflact.inputs.dataset import load_dataset
    from reflact.running.batch import Batching
    from reflact.running.batch_requests import Unit
    from tests.conftest import _compose, stage_settings

    data = write_dataset(tmp_path / "data", n_fail=4, n_succ=2)
    with OptimizerServer() as srv:
        cfg = from_hydra(_compose([f"data.dir={data}", *settings(srv, "optimizer.execution=batch")]))[0]
        dataset = load_dataset(cfg.data)
        units = [Unit(stage_settings(cfg), dataset, tmp_path / cell) for cell in ("cell_a", "cell_b")]
        batching = Batching(BatchFiles(tmp_path / "sweep"), units, "sweep", tmp_path, "the same command")
        try:
            batching.check()
            batching.first()
            assert batching.finish(lambda notes, step: None) is None
        finally:
            batching.close()
        assert stats(srv)["batch_lines"] == 3 and stats(srv)["sent_twice"] == 0


# ---------------------------------------------------------------------------------------------
# partial ends


def test_an_expired_batch_keeps_its_lines_and_the_next_holds_exactly_the_rest(tmp_path):
    with OptimizerServer(batches=BatchSettings(expire_share=0.6)) as srv:
        done = run(tmp_path, srv, "run", "reflect.minibatch_size=1")
        first, second = srv.batches.batches["batch_0001"], srv.batches.batches["batch_0002"]
        answered = {line["custom_id"] for line in first["_lines"][:6]}
        assert [line["custom_id"] for line in second["_lines"]] == [
            line["custom_id"] for line in first["_lines"] if line["custom_id"] not in answered]
        assert (len(first["_lines"]), len(second["_lines"])) == (10, 4)
        assert stats(srv)["sent_twice"] == 0 and srv.count == 0
    assert done.status == "FINISHED" and done.summary["counts"]["minibatches_done"] == 10
    state = state_of(tmp_path / "run")
    assert [(s.batch_id, s.status, s.collected) for s in state.submissions] == [
        ("batch_0001", "expired", True), ("batch_0002", "completed", True)]


def test_a_requests_own_4xx_is_reported_once_per_reason_never_sent_again_and_fails_its_minibatch(tmp_path, caplog):
    def script(request, number):
        if any(f"(id: run_0000{n})" in request["messages"][1]["content"] for n in (0, 1)):
            return Response(status=400, body={"error": {"message": "Invalid value for max_completion_tokens"}})
        return None

    caplog.set_level(logging.INFO, logger="reflact")
    with OptimizerServer(script) as srv:
        done = run(tmp_path, srv, "run", "reflect.minibatch_size=1")
        assert stats(srv)["batches"] == 1 and srv.count == 0
    reasons = [r.getMessage() for r in caplog.records if "not answered" in r.getMessage()]
    assert reasons == ["batch batch_0001: 2 request(s) not answered: HTTP 400: Invalid value for "
                       "max_completion_tokens (not sent again)"]
    failed = [m for m in done.summary["minibatches"] if m["status"] == "failed"]
    assert len(failed) == 2 and all("Invalid value for max_completion_tokens" in m["error"] for m in failed)
    assert done.status == "FINISHED"


def test_re_asks_go_as_a_follow_up_batch(tmp_path):
    asked: set[str] = set()

    def script(request, number):  # each conversation's first reply does not parse
        if len(request["messages"]) == 2 and request["messages"][1]["content"] not in asked:
            asked.add(request["messages"][1]["content"])
            return Response(body=chat_body("no JSON here"))
        return None

    with OptimizerServer(script) as srv:
        done = run(tmp_path, srv, "run")
        assert stats(srv)["batches"] == 2 and srv.count == 0
        assert [len(b["_lines"]) for b in srv.batches.batches.values()] == [5, 5]
    assert done.summary["counts"]["reasks"] == 5 and done.summary["counts"]["minibatches_done"] == 5


def test_re_asks_go_live_when_told(tmp_path):
    asked: set[str] = set()

    def script(request, number):
        if len(request["messages"]) == 2 and request["messages"][1]["content"] not in asked:
            asked.add(request["messages"][1]["content"])
            return Response(body=chat_body("no JSON here"))
        return None

    with OptimizerServer(script) as srv:
        done = run(tmp_path, srv, "run", "optimizer.batch_reasks=live")
        assert stats(srv)["batches"] == 1 and srv.count == 5
    record = json.loads((tmp_path / "run/calls/minibatch_fail_000/outcome.json").read_text())
    assert [c["service_tier"] for c in record["call_log"]] == ["batch", "default"]
    assert done.summary["counts"]["minibatches_done"] == 5


def test_files_hold_at_most_batch_max_requests_lines(tmp_path):
    with OptimizerServer() as srv:
        done = run(tmp_path, srv, "run", "optimizer.batch_max_requests=2")
        assert [len(b["_lines"]) for b in srv.batches.batches.values()] == [2, 2, 1]
    assert done.status == "FINISHED" and done.summary["counts"]["minibatches_done"] == 5


# ---------------------------------------------------------------------------------------------
# what cannot be batched: one line, nothing uploaded


def test_a_server_without_batches_is_one_line_naming_export_and_export_import_finish_the_run(tmp_path, launch_dir):
    data = write_dataset(tmp_path / "data", n_fail=4, n_succ=2)
    with OptimizerServer(batches=BatchSettings(enabled=False)) as srv:
        args = [f"data.dir={data}", *settings(srv, "optimizer.execution=batch"), "hydra.run.dir=outputs/run"]
        proc = run_cli(*args, cwd=launch_dir)
        assert proc.returncode == 2, output(proc)
        line = proc.stderr.strip().splitlines()[-1]
        assert line.startswith("reflact: error: optimizer.execution=batch: the server at ")
        assert "has no Batch API" in line and "nothing was uploaded" in line
        assert "python -m reflact.batch export" in line
        assert "Traceback" not in proc.stderr and stats(srv)["uploads"] == 0 and srv.count == 0
        run_dir = launch_dir / "outputs" / "run"
        exported = tmp_path / "in.jsonl"
        assert _tool("export", str(run_dir), "-o", str(exported), cwd=launch_dir).returncode == 0
        lines = [json.loads(line) for line in exported.read_text().splitlines()]
        assert len(lines) == 3 and {line["url"] for line in lines} == {"/v1/chat/completions"}
        out = tmp_path / "out.jsonl"  # what `vllm run-batch` writes: custom_id, response.body
        out.write_text("".join(json.dumps({"id": f"vllm-{n}", "custom_id": line["custom_id"], "error": None,
                                           "response": {"status_code": 200, "request_id": str(n),
                                                        "body": chat_body(json.dumps(default_reply(line["body"])))}})
                               + "\n" for n, line in enumerate(lines)))
        assert _tool("import", str(run_dir), str(out), cwd=launch_dir).returncode == 0
        again = run_cli(*args, cwd=launch_dir)
        assert again.returncode == 0, output(again)
        assert srv.count == 0 and stats(srv)["uploads"] == 0  # every reply came from the import
    assert len(list((run_dir / "patches").glob("*.json"))) == 3


def _tool(*args: str, cwd: Path):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "reflact.batch", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def test_a_batch_over_the_cost_cap_is_refused_in_one_line_with_nothing_uploaded(tmp_path):
    with OptimizerServer() as srv:
        with pytest.raises(UserError, match=r"worst case \$0\.\d+ for 5 requests is over optimizer.max_cost_usd=0.001; "
                                            r"nothing was uploaded"):
            run(tmp_path, srv, "run", "optimizer.max_cost_usd=0.001")
        assert stats(srv)["uploads"] == 0 and srv.count == 0
    assert not (tmp_path / "run").exists()  # a mistake leaves no folder behind


def test_the_cap_counts_the_batchs_price(tmp_path):
    """Five requests whose worst case is ~$0.33 at the listed price fit a cap of $0.2 at half."""
    with OptimizerServer() as srv:
        done = run(tmp_path, srv, "run", "optimizer.max_cost_usd=0.2", "optimizer.max_output_tokens=16000",
                   "optimizer.max_output_tokens_ceiling=64000")
        assert done.status == "FINISHED" and stats(srv)["batches"] == 1


def test_a_request_larger_than_a_batch_file_may_be_is_one_line(tmp_path):
    with OptimizerServer() as srv:
        with pytest.raises(UserError, match=r"optimizer.batch_max_mb=0.001: one request is .* MB, larger than a batch "
                                            r"file may be; nothing was uploaded"):
            run(tmp_path, srv, "run", "optimizer.batch_max_mb=0.001")
        assert stats(srv)["uploads"] == 0


@pytest.mark.parametrize("setting, message", [
    ("optimizer=dry_run", "optimizer.execution=batch with a dry run"),
    ("optimizer.cache=off", "optimizer.execution=batch needs optimizer.cache=read_write, not off"),
    ("optimizer.flex_timeout_s=0", "optimizer.flex_timeout_s must be > 0"),
    ("optimizer.flex_fallback_after=0", "optimizer.flex_fallback_after must be >= 1"),
    ("optimizer.batch_max_wait_h=0", "optimizer.batch_max_wait_h must be > 0"),
    ("optimizer.batch_max_requests=0", "optimizer.batch_max_requests must be >= 1"),
    ("optimizer.batch_max_mb=-1", "optimizer.batch_max_mb must be > 0"),
    ("+optimizer.prices.test={input:1,scale:{input:1}}", "optimizer.prices.test: expected"),
    ("+optimizer.prices.test={input:1,flex:{input:-1}}", "optimizer.prices.test.flex: expected"),
])
def test_each_batch_and_flex_setting_is_checked_in_one_line(setting, message):
    from tests.conftest import make_config

    with pytest.raises(UserError, match=message.replace(".", r"\.").replace("(", r"\(")):
        make_config("data.dir=x", "optimizer.execution=batch", setting)


def test_a_wrong_tier_or_execution_is_one_line_naming_the_key(tmp_path):
    for setting, key in (("optimizer.service_tier=cheap", "optimizer.service_tier"),
                         ("optimizer.execution=later", "optimizer.execution"),
                         ("optimizer.batch_reasks=never", "optimizer.batch_reasks")):
        proc = run_cli("data.dir=x", setting, cwd=tmp_path)
        assert proc.returncode == 2 and proc.stderr.strip().startswith(f"reflact: error: config: {key}")
        assert len(proc.stderr.strip().splitlines()) == 1


# ---------------------------------------------------------------------------------------------
# resumed from the state: killed, returned at once, faults


def test_a_command_killed_after_asking_for_its_batch_finds_that_batch_and_makes_no_second(tmp_path, monkeypatch):
    from reflact.calls.batches import BatchApi

    create = BatchApi.create

    def killed(self, file_id, metadata):
        create(self, file_id, metadata)
        raise KeyboardInterrupt  # the process dies before it notes the batch's id

    with OptimizerServer() as srv:
        monkeypatch.setattr(BatchApi, "create", killed)
        with pytest.raises(KeyboardInterrupt):
            run(tmp_path, srv, "run")
        monkeypatch.setattr(BatchApi, "create", create)
        assert len(srv.batches.batches) == 1 and state_of(tmp_path / "run").submissions[0].status == "creating"
        done = run(tmp_path, srv, "run")
        assert stats(srv)["batches"] == 1 and stats(srv)["batch_lines"] == 5
    assert done.status == "FINISHED" and state_of(tmp_path / "run").submissions[0].batch_id == "batch_0001"


def test_a_command_killed_while_polling_is_resumed_by_the_next_without_a_second_batch(tmp_path, monkeypatch):
    from reflact.calls.batches import BatchApi

    retrieve = BatchApi.retrieve

    def killed(self, batch_id):
        raise KeyboardInterrupt  # Ctrl-C while it waits for the batch

    with OptimizerServer(batches=BatchSettings(delay_s=3600)) as srv:
        monkeypatch.setattr(BatchApi, "retrieve", killed)
        with pytest.raises(KeyboardInterrupt):
            run(tmp_path, srv, "run")
        monkeypatch.setattr(BatchApi, "retrieve", retrieve)
        assert [(s.batch_id, s.status) for s in state_of(tmp_path / "run").submissions] == [
            ("batch_0001", "in_progress")]
        srv.batches.settings.delay_s = 0
        done = run(tmp_path, srv, "run")
        assert stats(srv)["batches"] == 1 and stats(srv)["batch_lines"] == 5 and stats(srv)["uploads"] == 1
    assert done.status == "FINISHED" and done.summary["counts"]["minibatches_done"] == 5


def test_a_run_told_not_to_wait_returns_at_once_and_the_same_command_finishes_it(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="reflact")
    # the batch runs until the test says it is done: a loaded machine cannot finish it early
    with OptimizerServer(batches=BatchSettings(delay_s=3600)) as srv:
        left = run(tmp_path, srv, "run", "optimizer.batch_wait=false")
        # the progress line: status, request counts, elapsed
        assert any(re.fullmatch(r"batch batch_0001: in_progress, 0/5 completed, 0 failed, .*\d+ ?s.*", r.getMessage())
                   for r in caplog.records), [r.getMessage() for r in caplog.records]
        assert left.status == "SCHEDULED" and left.reason == "" and left.patches == {}
        assert stats(srv)["batches"] == 1 and srv.count == 0
        srv.batches.settings.delay_s = 0
        done = run(tmp_path, srv, "run", "optimizer.batch_wait=false")
        assert stats(srv)["batches"] == 1 and srv.count == 0
    assert done.status == "FINISHED" and done.summary["counts"]["minibatches_done"] == 5


def test_an_upload_that_fails_loses_nothing_and_the_next_command_sends_it(tmp_path):
    with OptimizerServer(batches=BatchSettings(upload_errors=10)) as srv:
        left = run(tmp_path, srv, "run", "optimizer.retry.max_attempts=2")
        assert left.status == "SCHEDULED" and "could not upload input_001.jsonl: HTTP 500" in left.reason
        assert "go on with reflact.reflect(" in left.reason and stats(srv)["batches"] == 0
        srv.batches.settings.upload_errors = 0
        done = run(tmp_path, srv, "run")
        assert stats(srv)["batches"] == 1 and stats(srv)["uploads"] == 1
    assert done.status == "FINISHED"


def test_5xx_while_polling_is_retried_and_past_the_retries_left_to_the_next_command(tmp_path):
    with OptimizerServer(batches=BatchSettings(poll_errors=1)) as srv:
        done = run(tmp_path, srv, "run", "optimizer.retry.max_attempts=3")  # one 500: retried
        assert done.status == "FINISHED"
        srv.batches.settings.poll_errors = 10
        left = run(tmp_path, srv, "again", "optimizer.retry.max_attempts=2", "reflect.seed=7")
        assert left.status == "SCHEDULED" and "could not look at batch batch_0002: HTTP 500" in left.reason
        srv.batches.settings.poll_errors = 0
        again = run(tmp_path, srv, "again", "reflect.seed=7")
        assert stats(srv)["batches"] == 2 and again.status == "FINISHED"


def test_an_output_file_missing_is_said_and_collected_by_the_next_command(tmp_path):
    with OptimizerServer(batches=BatchSettings(output_missing=True)) as srv:
        left = run(tmp_path, srv, "run", "optimizer.retry.max_attempts=1")
        assert left.status == "SCHEDULED" and "could not read file file-batch_0001-output: HTTP 404" in left.reason
        srv.batches.settings.output_missing = False
        done = run(tmp_path, srv, "run")
        assert stats(srv)["batches"] == 1 and done.status == "FINISHED"


def test_an_output_file_cut_short_keeps_its_whole_lines_and_sends_the_rest_again(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="reflact")
    with OptimizerServer(batches=BatchSettings(output_cut=True)) as srv:
        done = run(tmp_path, srv, "run", "optimizer.batch_max_requests=5")
        lines = [len(b["_lines"]) for b in srv.batches.batches.values()]
    assert lines[:2] == [5, 1] and done.status == "FINISHED"
    assert any("1 line(s) of its output file were cut off or damaged" in r.getMessage() for r in caplog.records)


def test_stray_and_doubled_lines_are_reported_and_left_out(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="reflact")
    stray = json.dumps({"custom_id": "not-ours", "response": {"status_code": 200, "body": chat_body("{}")}})
    with OptimizerServer(batches=BatchSettings(output_extra=[stray, "not json"], output_doubled=True)) as srv:
        done = run(tmp_path, srv, "run")
        assert stats(srv)["batches"] == 1
    messages = [r.getMessage() for r in caplog.records]
    assert "batch batch_0001: 1 line(s) name no request of this batch; left out" in messages
    assert "batch batch_0001: 1 request(s) answered twice; the first answer kept" in messages
    assert ("batch batch_0001: 1 line(s) of its output file were cut off or damaged; their requests go in the next "
            "batch") in messages
    assert done.status == "FINISHED" and done.summary["counts"]["minibatches_done"] == 5
    replies = [p.read_text() for p in (tmp_path / "run/calls").glob("*/reply_1.txt")]
    assert "a second answer" not in replies and len(replies) == 5


def test_a_file_failing_validation_names_its_lines_and_fails_their_minibatches(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="reflact")
    with OptimizerServer(batches=BatchSettings(fail_validation=True)) as srv:
        done = run(tmp_path, srv, "run")
        assert stats(srv)["batches"] == 1 and srv.count == 0
    messages = [r.getMessage() for r in caplog.records]
    assert "batch batch_0001 failed validation: input_001.jsonl line 1: the body is not valid" in messages
    assert "batch batch_0001 failed validation: input_001.jsonl line 2: the body is not valid" in messages
    assert done.status == "FAILED" and done.summary["counts"]["minibatches_failed"] == 5
    assert all("failed validation: the body is not valid" in m["error"] for m in done.summary["minibatches"])


def test_a_batch_past_its_wait_is_left_to_run_with_a_message(tmp_path):
    with OptimizerServer(batches=BatchSettings(delay_s=3600)) as srv:
        left = run(tmp_path, srv, "run", "optimizer.batch_max_wait_h=0.0001")
        assert left.status == "SCHEDULED"
        assert "still unfinished after optimizer.batch_max_wait_h=0.0001 h" in left.reason
        assert "python -m reflact.batch cancel" in left.reason and stats(srv)["batches"] == 1


# ---------------------------------------------------------------------------------------------
# the tool


def test_status_collect_and_cancel(tmp_path, capsys):
    from reflact.batch import main

    with OptimizerServer(batches=BatchSettings(delay_s=3600, expire_share=0.6)) as srv:
        run(tmp_path, srv, "run", "optimizer.batch_wait=false")
        capsys.readouterr()
        main(["status", str(tmp_path / "run")])
        shown = capsys.readouterr().out
        assert "batch_0001: input_001.jsonl, round 1, in_progress, 0/5 completed, 0 failed" in shown
        assert "requests: 5 in_flight" in shown
        main(["cancel", str(tmp_path / "run")])
        shown = capsys.readouterr().out
        assert "batch_0001: collected" in shown and "requests: 5 retry" in shown
        assert srv.batches.batches["batch_0001"]["status"] == "cancelled"
        srv.batches.settings.delay_s = 0
        done = run(tmp_path, srv, "run")
        assert done.status == "FINISHED" and stats(srv)["batches"] == 2


def test_collect_puts_an_ended_batchs_lines_in_the_cache_without_running(tmp_path, capsys):
    from reflact.batch import main

    with OptimizerServer(batches=BatchSettings(delay_s=3600)) as srv:
        run(tmp_path, srv, "run", "optimizer.batch_wait=false")
        capsys.readouterr()
        main(["collect", str(tmp_path / "run")])
        assert "batch_0001: still in_progress; collect again later" in capsys.readouterr().out
        srv.batches.settings.delay_s = 0
        main(["collect", str(tmp_path / "run")])
        shown = capsys.readouterr().out
        assert "batch_0001: collected" in shown and "requests: 5 done" in shown
        assert not (tmp_path / "run/patches").exists() or not list((tmp_path / "run/patches").glob("*.json"))
        done = run(tmp_path, srv, "run")  # every reply from the cache: nothing sent again
        assert stats(srv)["batches"] == 1 and srv.count == 0
    assert done.status == "FINISHED" and done.summary["counts"]["minibatches_done"] == 5


def test_the_tool_without_a_batch_is_one_line(tmp_path):
    proc = _tool("status", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.startswith("reflact: error: ") and "no batch here" in proc.stderr


# ---------------------------------------------------------------------------------------------
# MLflow: RUNNING while it waits, SCHEDULED when left to run, FINISHED once collected


def test_mlflow_shows_the_run_running_while_it_waits_then_scheduled_then_finished(tmp_path, launch_dir, monkeypatch):
    from mlflow.tracking import MlflowClient

    from reflact.running import batch_runner

    monkeypatch.setattr(batch_runner, "LAST_POLL_S", 0.5)  # a look every half second, not every minute

    data = write_dataset(tmp_path / "data", n_fail=2, n_succ=2)
    client = MlflowClient(f"sqlite:///{launch_dir}/outputs/mlflow.db")

    def runs():
        exp = client.get_experiment_by_name("reflact")
        return client.search_runs([exp.experiment_id]) if exp else []

    with OptimizerServer(batches=BatchSettings(delay_s=3600)) as srv:
        overrides = [o for o in settings(srv, "optimizer.execution=batch") if not o.startswith("mlflow.")]
        waiting = threading.Thread(target=reflact.reflect, args=(data,), kwargs={
            "overrides": overrides, "run_dir": tmp_path / "run", "launch_dir": launch_dir})
        waiting.start()
        seen, deadline = [], time.monotonic() + 60
        while waiting.is_alive() and not seen and time.monotonic() < deadline:
            seen = [r for r in runs() if r.data.tags.get("reflact.batches")]
            time.sleep(0.2)
        srv.batches.settings.delay_s = 0  # the batch is done at the next look
        waiting.join(60)
        assert seen and seen[0].info.status == "RUNNING" and seen[0].data.tags["reflact.batches"] == "batch_0001"
        assert runs()[0].info.status == "FINISHED"
        srv.batches.settings.delay_s = 3600  # the next batch is still running when its command returns
        left = reflact.reflect(data, overrides=[*overrides, "optimizer.batch_wait=false", "reflect.seed=5"],
                               run_dir=tmp_path / "left", launch_dir=launch_dir)
        scheduled = [r for r in runs() if r.data.tags.get("reflact.run_dir") == str(tmp_path / "left")]
        assert left.status == "SCHEDULED" and [r.info.status for r in scheduled] == ["SCHEDULED"]
        assert scheduled[0].data.tags["reflact.batches"] == "batch_0002" and scheduled[0].info.end_time is None
        srv.batches.settings.delay_s = 0
        done = reflact.reflect(data, overrides=[*overrides, "reflect.seed=5"], run_dir=tmp_path / "left",
                               launch_dir=launch_dir)
    again = [r for r in runs() if r.data.tags.get("reflact.run_dir") == str(tmp_path / "left")]
    assert done.status == "FINISHED" and done.mlflow_run_id == scheduled[0].info.run_id
    assert [r.info.status for r in again] == ["FINISHED"]
    metrics = again[0].data.metrics  # one request of the two: the other was in the cache already
    assert metrics["batch_requests_completed"] == metrics["batch_requests_total"] == 1


# ---------------------------------------------------------------------------------------------
# flex: synchronous at the batch's price; its 429s cost nothing and may fall back to auto


def _calls(run_dir: Path) -> list[dict]:
    return [call for p in sorted((run_dir / "calls").glob("*/outcome.json"))
            for call in json.loads(p.read_text())["call_log"]]


def test_flex_429s_are_asked_again_cost_nothing_and_the_replies_cost_half(tmp_path):
    with OptimizerServer() as live_srv:
        live = run(tmp_path / "live", live_srv, "run", batch=False)
    with OptimizerServer(batches=BatchSettings(flex_busy=2)) as srv:
        # one attempt allowed: a 429 "resource unavailable" is no fault, so no attempt is used up
        done = run(tmp_path / "flex", srv, "run", "optimizer.service_tier=flex", "optimizer.retry.max_attempts=1",
                   batch=False)
        assert srv.count == 15 and {r["service_tier"] for r in srv.requests} == {"flex"}
    counts = done.summary["counts"]
    assert done.status == "FINISHED" and counts["failed_calls"] == 0 and counts["retries"] == 0
    assert counts["calls"] == 5 and counts["cost_usd"] == pytest.approx(live.summary["counts"]["cost_usd"] / 2)
    assert counts["spent_usd"] == pytest.approx(live.summary["counts"]["spent_usd"] / 2)
    calls = _calls(tmp_path / "flex/run")
    assert [(c["service_tier"], c["flex_unavailable"]) for c in calls] == [("flex", 2)] * 5
    assert patches_of(tmp_path / "flex/run") == patches_of(tmp_path / "live/run")


def test_flex_falls_back_to_auto_after_flex_fallback_after_429s_with_one_warning(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="reflact")
    with OptimizerServer() as live_srv:
        live = run(tmp_path / "live", live_srv, "run", batch=False)
    with OptimizerServer(batches=BatchSettings(flex_busy=100)) as srv:
        done = run(tmp_path / "flex", srv, "run", "optimizer.service_tier=flex", "optimizer.flex_fallback_after=2",
                   batch=False)
        tiers = [r.get("service_tier") for r in srv.requests]
        assert tiers.count("flex") == 10 and tiers.count(None) == 5  # two flex tries each, then auto
    warnings = [r.getMessage() for r in caplog.records if "sent at auto" in r.getMessage()]
    assert len(warnings) == 1 and "optimizer.flex_fallback_after=2" in warnings[0]
    assert done.status == "FINISHED" and done.summary["counts"]["failed_calls"] == 0
    # costed as what served it: the listed price
    assert done.summary["counts"]["cost_usd"] == pytest.approx(live.summary["counts"]["cost_usd"])
    assert [(c["service_tier"], c["flex_unavailable"]) for c in _calls(tmp_path / "flex/run")] == [("default", 2)] * 5


# ---------------------------------------------------------------------------------------------
# a 3 x 3 sweep over M and L: live, then as one batch


SWEEP = ("-m", "+exp=demo", "reflect.minibatch_size=2,4,8", "reflect.edit_budget=1,2,4")


def _sweep(srv: OptimizerServer, launch: Path, *extra: str):
    return run_cli(*SWEEP, f"optimizer.base_url={srv.base_url}", "optimizer.model=test", PRICE, *extra, cwd=launch,
                   timeout=900)


def _cells(launch: Path) -> dict[tuple[int, int], Path]:
    found = {}
    for summary in sorted((launch / "outputs/sweeps/demo").glob("*/summary.json")):
        s = json.loads(summary.read_text())["settings"]
        assert (s["minibatch_size"], s["edit_budget"]) not in found
        found[s["minibatch_size"], s["edit_budget"]] = summary.parent
    assert len(found) == 9
    return found


def _patch_bytes(run_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((run_dir / "patches").glob("*.json"))}


@pytest.mark.slow
def test_a_3x3_sweep_as_one_batch_makes_the_live_sweeps_patches_at_half_the_cost(tmp_path, launch_dir):
    from mlflow.tracking import MlflowClient

    live_launch = tmp_path / "live"
    live_launch.mkdir()
    with OptimizerServer() as live_srv:
        from tests.conftest import ok

        ok(_sweep(live_srv, live_launch, "mlflow.enabled=false"))
        live_sent = set(sent_bodies(live_srv))
    with OptimizerServer() as srv:
        ok(_sweep(srv, launch_dir, "optimizer.execution=batch"))
        # one batch for the grid, each distinct request once, nothing sent live
        assert stats(srv)["batches"] == 1 and stats(srv)["requests"] == 0 and stats(srv)["sent_twice"] == 0
        assert set(sent_bodies(srv)) == live_sent and stats(srv)["batch_lines"] == len(live_sent)
    live, batched = _cells(live_launch), _cells(launch_dir)
    for cell in live:
        assert _patch_bytes(batched[cell]) == _patch_bytes(live[cell]) != {}, cell
    cost = {name: sum(json.loads((d / "summary.json").read_text())["counts"]["cost_usd"] for d in cells.values())
            for name, cells in (("live", live), ("batch", batched))}
    assert cost["batch"] == pytest.approx(cost["live"] / 2) and cost["live"] > 0
    client = MlflowClient(f"sqlite:///{launch_dir}/outputs/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("reflact-demo").experiment_id])
    parent = [r for r in runs if r.data.tags.get("reflact.sweep_parent") == "true"]
    assert [r.info.status for r in parent] == ["FINISHED"] and parent[0].data.tags["reflact.batches"] == "batch_0001"
    assert sorted(r.info.status for r in runs) == ["FINISHED"] * 10


@pytest.mark.parametrize("setting, price", [
    ((), 0.5),  # auto: the listed price
    (("optimizer.service_tier=flex",), 0.25),  # flex, never falling back: half
    (("optimizer.service_tier=flex", "optimizer.flex_fallback_after=3"), 0.5),  # it may go at auto: listed
    (("optimizer.execution=batch",), 0.25),
    (("optimizer.execution=batch", "optimizer.batch_reasks=live"), 0.5),  # re-asks go live at the listed price
])
def test_the_cost_cap_counts_the_dearest_price_that_may_apply(setting, price):
    from reflact.running.ask import cap_price
    from tests.conftest import make_config

    cfg = make_config("data.dir=x", "optimizer=compatible", "optimizer.base_url=http://127.0.0.1:9",
                      "optimizer.model=test", "+optimizer.prices.test={input:0.5,cached_input:0.1,output:2}", *setting)
    assert cap_price(cfg.optimizer).input == price


@pytest.mark.slow
def test_a_sweep_told_not_to_wait_leaves_its_parent_scheduled_and_the_same_command_finishes_it(launch_dir):
    from mlflow.tracking import MlflowClient

    from tests.conftest import ok

    args = ("-m", "+exp=demo", "reflect.minibatch_size=4,8", "reflect.edit_budget=2", "optimizer=compatible",
            "optimizer.model=test", PRICE, "optimizer.execution=batch", "optimizer.batch_wait=false")
    client = MlflowClient(f"sqlite:///{launch_dir}/outputs/mlflow.db")

    def parents():
        runs = client.search_runs([client.get_experiment_by_name("reflact-demo").experiment_id])
        return [r for r in runs if r.data.tags.get("reflact.sweep_parent") == "true"], runs

    with OptimizerServer(batches=BatchSettings(delay_s=3600)) as srv:
        left = run_cli(*args, f"optimizer.base_url={srv.base_url}", cwd=launch_dir, timeout=600)
        said = ok(left)
        assert "python -m reflact.run -m +exp=demo" in said and "optimizer.batch_wait=false" in said
        (parent,), runs = parents()
        assert parent.info.status == "SCHEDULED" and parent.data.tags["reflact.batches"] == "batch_0001"
        assert len(runs) == 1 and not list((launch_dir / "outputs/sweeps/demo").glob("*/summary.json"))
        srv.batches.settings.delay_s = 0
        ok(run_cli(*args, f"optimizer.base_url={srv.base_url}", cwd=launch_dir, timeout=600))
        assert stats(srv)["batches"] == 1 and srv.count == 0
    (again,), runs = parents()
    assert again.info.run_id == parent.info.run_id and again.info.status == "FINISHED"
    assert sorted(r.info.status for r in runs) == ["FINISHED"] * 3
    assert again.data.metrics["batch_requests_completed"] == again.data.metrics["batch_requests_total"] > 0


@pytest.mark.slow
def test_a_sweeps_expired_batch_keeps_its_lines_and_the_next_holds_exactly_the_rest(launch_dir):
    from tests.conftest import ok

    args = ("-m", "+exp=demo", "reflect.minibatch_size=4,8", "reflect.edit_budget=2", "optimizer=compatible",
            "optimizer.model=test", PRICE, "optimizer.execution=batch", "mlflow.enabled=false")
    with OptimizerServer(batches=BatchSettings(expire_share=0.6)) as srv:
        ok(run_cli(*args, f"optimizer.base_url={srv.base_url}", cwd=launch_dir, timeout=600))
        first, second = srv.batches.batches["batch_0001"]["_lines"], srv.batches.batches["batch_0002"]["_lines"]
        kept = int(0.6 * len(first))
        assert [line["custom_id"] for line in second] == [line["custom_id"] for line in first[kept:]]
        assert stats(srv)["batches"] == 2 and stats(srv)["sent_twice"] == 0 and srv.count == 0
    summaries = sorted((launch_dir / "outputs/sweeps/demo").glob("*/summary.json"))
    assert len(summaries) == 2
    assert all(json.loads(p.read_text())["counts"]["minibatches_failed"] == 0 for p in summaries)
