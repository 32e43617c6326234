"""Reliability: a SIGKILL mid-stage and the rerun, tracking failures and relog, the API key never
written anywhere, many concurrent calls, oversized inputs, and a bad rerun that must not damage a
finished run dir.

The subprocess tests run `python -m reflact.run` (or `python -m reflact.relog`) as a user types it,
from a launch directory whose outputs/mlflow.db is an already migrated store, against the loopback
optimizer server of reflact/testing/optimizer_server.py.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from reflact.calls.client import make_client
from reflact.calls.protocol import CallError
from reflact.core.errors import UserError
from reflact.core.files import read_json
from reflact.inputs.dataset import load_dataset
from reflact.prompting.plan import plan_minibatches
from reflact.running.rundir import RunDir
from reflact.running.stage import Stage
from reflact.running.summary import summarize
from reflact.testing.optimizer_server import OptimizerServer, Response, chat_body, default_reply
from tests.conftest import (
    file_bytes,
    make_config,
    ok,
    output,
    patches_of,
    run_cli,
    stage_settings,
    summary_of,
    write_dataset,
)

CANARY = "sk-canary-7f3a9c1e5b2d4a6f8e0c"
IDS = re.compile(r"^### Trajectory \d+ of \d+ \(id: (.+)\)$", re.M)
NO_RETRY_WAIT = ["optimizer.retry.initial_wait_s=0.01", "optimizer.retry.max_wait_s=0.05"]


# ---------------------------------------------------------------------------------------------
# helpers


def run_args(dataset: Path, server: OptimizerServer, run_dir: Path, *extra: str) -> list[str]:
    return [f"data.dir={dataset}", f"optimizer.base_url={server.base_url}", "optimizer.model=test",
            "optimizer.cache=off", f"hydra.run.dir={run_dir}", *extra]


def cli_env(extra: dict | None = None) -> dict:
    """The environment run_cli gives a run: no real key unless the test sets one."""
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", **(extra or {})}
    if not extra or "OPENAI_API_KEY" not in extra:
        env.pop("OPENAI_API_KEY", None)
    return env


def relog_cli(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "reflact.relog", *args], cwd=cwd, env=cli_env(env),
                          capture_output=True, text=True, timeout=120)







def slow_default(delay_s: float):
    return lambda request, number: Response(body=chat_body(json.dumps(default_reply(request))), delay_s=delay_s)


def request_ids(request: dict) -> tuple[str, ...]:
    return tuple(IDS.findall(request["messages"][1]["content"]))


def assert_no_torn_file(run_dir: Path) -> list[str]:
    """Every file in the run dir is whole: JSON parses, YAML parses, text decodes; the only
    other files allowed are temp files of an interrupted atomic write. Returns those."""
    temps = []
    for path in sorted(run_dir.rglob("*")):
        if not path.is_file():
            continue
        name = str(path.relative_to(run_dir))
        if path.name.endswith(".tmp"):
            temps.append(name)
            continue
        data = path.read_bytes()
        if path.suffix == ".json":
            try:
                json.loads(data)
            except ValueError as exc:
                pytest.fail(f"torn JSON file {name}: {exc}; content {data[:200]!r}")
        elif path.suffix == ".yaml":
            yaml.safe_load(data)
        else:
            data.decode("utf-8")
    return temps


def mlflow_runs_of(uri: str, run_dir: Path) -> list:
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=uri)
    ids = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(ids) if ids else []
    return [r for r in runs if r.data.tags.get("reflact.run_dir") == str(run_dir.resolve())]


# ---------------------------------------------------------------------------------------------
# 1. SIGKILL mid-stage, then the same command again


N_KILL_RESULTS = 24  # 12 failures + 12 successes, M=2: 6 + 6 = 12 minibatches
N_KILL_MINIBATCHES = 12
MEASURED: dict[str, object] = {}  # numbers worth reporting (printed with -s)


@pytest.fixture(scope="module")
def killed_and_rerun(tmp_path_factory, migrated_store):
    """Start a run against a server that answers after 0.3 s, SIGKILL it once >= 3 patches are on
    disk, snapshot the run dir, rerun the same command to completion; then the same command
    uninterrupted into another run dir against a fresh server."""
    root = tmp_path_factory.mktemp("kill")
    launch = root / "launch"
    (launch / "outputs").mkdir(parents=True)
    shutil.copy(migrated_store, launch / "outputs" / "mlflow.db")
    dataset = write_dataset(root / "ds", n_fail=N_KILL_RESULTS // 2, n_succ=N_KILL_RESULTS // 2)
    run_dir, clean_dir = root / "run", root / "clean"
    # MLflow is not the subject here and costs seconds per run; the tracking tests cover it
    extra = ("reflect.minibatch_size=2", "reflect.workers=2", "mlflow.enabled=false")
    result: dict = {"run_dir": run_dir, "clean_dir": clean_dir}
    with OptimizerServer(script=slow_default(0.3)) as server:
        args = run_args(dataset, server, run_dir, *extra)
        with open(root / "killed.out", "w") as out, open(root / "killed.err", "w") as err:
            proc = subprocess.Popen([sys.executable, "-m", "reflact.run", *args], cwd=launch, env=cli_env(),
                                    stdout=out, stderr=err)
            try:
                deadline = time.monotonic() + 120
                patches = run_dir / "patches"
                while not (patches.is_dir() and len(list(patches.glob("*.json"))) >= 3):
                    assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before it could be killed"
                    assert time.monotonic() < deadline, "no 3 patches within 120 s"
                    time.sleep(0.005)
                os.kill(proc.pid, signal.SIGKILL)
            finally:
                if proc.poll() is None and proc.returncode is None:
                    try:
                        proc.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
        result["kill_returncode"] = proc.returncode
        result["requests_before_kill"] = server.count
        result["present"] = sorted(p.stem for p in (run_dir / "patches").glob("*.json"))
        result["snapshot"] = file_bytes(run_dir)
        result["temps"] = assert_no_torn_file(run_dir)
        before = server.count
        result["rerun"] = run_cli(*args, cwd=launch)
        result["rerun_requests"] = server.requests[before:]
    with OptimizerServer() as fresh:
        result["clean"] = run_cli(*run_args(dataset, fresh, clean_dir, *extra), cwd=launch)
        result["clean_requests"] = fresh.count
    MEASURED["patches at kill"] = len(result["present"])
    MEASURED["requests before kill"] = result["requests_before_kill"]
    MEASURED["rerun requests"] = len(result["rerun_requests"])
    MEASURED["temp files at kill"] = result["temps"]
    print(f"\nkill test: {MEASURED}")
    return result


def test_kill_leaves_no_torn_file(killed_and_rerun):
    k = killed_and_rerun
    assert k["kill_returncode"] == -signal.SIGKILL
    assert 3 <= len(k["present"]) < N_KILL_MINIBATCHES, k["present"]
    # temp files of an interrupted write may remain, but only as *.tmp, never as a patch
    assert all(name.endswith(".tmp") for name in k["temps"])
    for name, data in k["snapshot"].items():
        if name.startswith("patches/") and name.endswith(".json"):
            patch = json.loads(data)
            assert patch["fingerprint"] and len(patch["trajectory_ids"]) == 2
            assert len(patch["patch"]["edits"]) == 4


def test_files_present_at_the_kill_are_whole_copies_of_the_finished_ones(killed_and_rerun):
    """Atomic writes: a file that exists after the kill is exactly what an uninterrupted run writes."""
    k = killed_and_rerun
    ok(k["clean"])
    clean = file_bytes(k["clean_dir"])
    compared = 0
    for name, data in k["snapshot"].items():
        if name.endswith(".tmp"):
            continue  # a write the kill interrupted; the rerun removes it
        if name.startswith("patches/") or re.fullmatch(r"calls/[^/]+/(system\.md|user\.md|reply_\d+\.txt)", name):
            assert name in clean, name
            assert data == clean[name], f"{name} differs from the uninterrupted run's"
            compared += 1
    assert compared >= 3 * 4


def test_rerun_calls_only_the_minibatches_without_a_patch(killed_and_rerun):
    k = killed_and_rerun
    ok(k["rerun"])
    present = k["present"]
    assert len(k["rerun_requests"]) == N_KILL_MINIBATCHES - len(present)
    final = patches_of(k["run_dir"])
    assert len(final) == N_KILL_MINIBATCHES
    missing_ids = {tuple(final[tag]["trajectory_ids"]) for tag in final if tag not in present}
    # the server sees a minibatch's trajectories in the order of the patch's trajectory_ids
    assert {request_ids(r) for r in k["rerun_requests"]} == missing_ids


def test_rerun_logs_the_reused_patches_as_reused(killed_and_rerun):
    k = killed_and_rerun
    ok(k["rerun"])
    text = output(k["rerun"])
    for tag in k["present"]:
        assert re.search(rf"{tag} \(2 trajs\): reused saved patch", text), f"{tag} not logged as reused\n{text}"
    summary = summary_of(k["run_dir"])
    status = {mb["tag"]: mb["status"] for mb in summary["minibatches"]}
    assert {t for t, s in status.items() if s == "reused"} == set(k["present"])
    assert {t for t, s in status.items() if s == "done"} == set(status) - set(k["present"])
    c = summary["counts"]
    assert c["minibatches_reused"] == len(k["present"])
    assert c["calls"] == N_KILL_MINIBATCHES - len(k["present"])
    assert c["minibatches_failed"] == 0 and c["edits_kept"] == N_KILL_MINIBATCHES * 4


def test_resumed_patches_equal_an_uninterrupted_runs(killed_and_rerun):
    k = killed_and_rerun
    ok(k["rerun"])
    ok(k["clean"])
    assert k["clean_requests"] == N_KILL_MINIBATCHES
    resumed, clean = patches_of(k["run_dir"]), patches_of(k["clean_dir"])
    assert sorted(clean) == ([f"minibatch_fail_{i:03d}" for i in range(6)]
                             + [f"minibatch_succ_{i:03d}" for i in range(6)])
    assert resumed == clean


# ---------------------------------------------------------------------------------------------
# 2. the tracking store fails: the run still completes; relog puts it in a working store


MLFLOW_FAST_FAIL = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "2"}


@pytest.fixture(scope="module", params=["sqlite_not_a_database", "http_unreachable"])
def tracking_failure(request, tmp_path_factory, migrated_store):
    """A run whose tracking store is broken, then the store fixed and the run dir relogged."""
    root = tmp_path_factory.mktemp(request.param)
    launch = root / "launch"
    (launch / "outputs").mkdir(parents=True)
    store = launch / "outputs" / "mlflow.db"
    good_uri = f"sqlite:///{store}"
    if request.param == "sqlite_not_a_database":
        store.write_bytes(b"not a database")
        broken_uri = good_uri
    else:
        shutil.copy(migrated_store, store)
        broken_uri = "http://127.0.0.1:9"
    dataset = write_dataset(root / "ds", n_fail=4, n_succ=4)
    run_dir = root / "run"
    with OptimizerServer() as server:
        proc = run_cli(*run_args(dataset, server, run_dir, "reflect.minibatch_size=4",
                                 f"mlflow.tracking_uri={broken_uri}"), cwd=launch, env=MLFLOW_FAST_FAIL)
    before_relog = file_bytes(run_dir)
    if request.param == "sqlite_not_a_database":
        shutil.copy(migrated_store, store)  # the user repairs the store
    relog = relog_cli(str(run_dir), "--tracking-uri", good_uri, cwd=launch, env=MLFLOW_FAST_FAIL)
    return {"kind": request.param, "launch": launch, "run_dir": run_dir, "proc": proc, "relog": relog,
            "good_uri": good_uri, "broken_uri": broken_uri, "before_relog": before_relog}


def test_tracking_failure_still_completes_the_run(tracking_failure):
    t = tracking_failure
    ok(t["proc"])
    assert sorted(patches_of(t["run_dir"])) == ["minibatch_fail_000", "minibatch_succ_000"]
    counts = summary_of(t["run_dir"])["counts"]
    assert counts["minibatches_done"] == 2 and counts["calls"] == 2 and counts["edits_kept"] == 8
    assert "Traceback" not in output(t["proc"])
    # it was logged nowhere, and the run dir says so (relog logs it later)
    record = json.loads(t["before_relog"]["mlflow_run.json"])
    assert record["run_id"] is None and record["status"] == "INCOMPLETE"


def test_tracking_failure_warns_naming_mlflow_and_relog(tracking_failure):
    t = tracking_failure
    warnings = [line for line in output(t["proc"]).splitlines() if "MLflow" in line and "WARNING" in line]
    assert warnings, output(t["proc"])
    assert any(f"python -m reflact.relog {t['run_dir']}" in line for line in warnings), warnings


def test_tracking_failure_warning_is_on_stderr(tracking_failure):
    t = tracking_failure
    assert "MLflow" in t["proc"].stderr and "python -m reflact.relog" in t["proc"].stderr


def test_relog_puts_the_run_in_the_repaired_store(tracking_failure):
    t = tracking_failure
    ok(t["relog"])
    runs = mlflow_runs_of(t["good_uri"], t["run_dir"])
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.info.run_id in t["relog"].stdout
    assert run.data.metrics["calls"] == 2 and run.data.metrics["edits_kept"] == 8
    assert run.data.params["reflect.minibatch_size"] == "4"
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=t["good_uri"])
    assert {Path(a.path).name for a in client.list_artifacts(run.info.run_id, "patches")} == {
        "minibatch_fail_000.json", "minibatch_succ_000.json"}
    record = json.loads((t["run_dir"] / "mlflow_run.json").read_text())
    assert (record["run_id"], record["tracking_uri"], record["status"]) == (run.info.run_id, t["good_uri"], "FINISHED")


def test_relog_changes_nothing_in_the_run_dir_but_its_mlflow_record(tracking_failure):
    t = tracking_failure
    ok(t["relog"])
    after = file_bytes(t["run_dir"])
    assert set(after) == set(t["before_relog"])  # the record of the failed logging is replaced
    assert {k: v for k, v in after.items() if k != "mlflow_run.json"} == {
        k: v for k, v in t["before_relog"].items() if k != "mlflow_run.json"}
    assert json.loads(after["mlflow_run.json"])["status"] == "FINISHED"


@pytest.mark.parametrize("what", ["dataset_folder", "empty_folder", "missing_folder"])
def test_relog_of_a_folder_that_is_not_a_run_dir_exits_2_with_one_line(tmp_path, launch_dir, what):
    folder = {"dataset_folder": write_dataset(tmp_path / "ds", 1, 1), "empty_folder": tmp_path / "empty",
              "missing_folder": tmp_path / "nope"}[what]
    if what == "empty_folder":
        folder.mkdir()
    proc = relog_cli(str(folder), cwd=launch_dir)
    assert proc.returncode == 2, output(proc)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("reflact: error:"), proc.stderr
    assert str(folder) in lines[0]
    assert mlflow_runs_of(f"sqlite:///{launch_dir}/outputs/mlflow.db", folder) == []


# ---------------------------------------------------------------------------------------------
# 3. the API key never reaches a file, the store or the console, even when a server echoes it


def key_fragments() -> list[str]:
    return [CANARY, CANARY[-8:]]


@pytest.mark.slow
def test_echoed_api_key_is_found_nowhere(tmp_path, launch_dir):
    dataset = write_dataset(tmp_path / "ds", n_fail=4, n_succ=4)
    run_dir = tmp_path / "run"
    echo = {"error": {"message": f"Incorrect API key provided: {CANARY}", "type": "invalid_request_error"}}

    def script(request, number):  # after a first answer: a 401 before any would stop the run (a dead endpoint)
        if number == 2:
            return Response(status=401, body=echo)
        return None

    with OptimizerServer(script=script) as server:
        auth = server.authorizations
        args = [f"data.dir={dataset}", f"optimizer.base_url={server.base_url}", "optimizer.model=test",
                f"hydra.run.dir={run_dir}", "reflect.minibatch_size=2", "mlflow.trace_calls=true",
                "reflect.workers=1"]
        proc = run_cli(*args, cwd=launch_dir, env={"OPENAI_API_KEY": CANARY})  # response cache on: cache.db
    ok(proc)
    # meaningful: the client sent the key, and the server's echo of it was received and recorded
    assert auth and set(auth) == {f"Bearer {CANARY}"}
    summary = summary_of(run_dir)
    assert summary["counts"]["minibatches_failed"] == 1 and summary["counts"]["minibatches_done"] == 3
    [failed] = [mb for mb in summary["minibatches"] if mb["status"] == "failed"]
    assert "401" in failed["error"] and "Incorrect API key provided" in failed["error"]
    assert (launch_dir / "outputs" / "cache.db").is_file()
    assert mlflow_runs_of(f"sqlite:///{launch_dir}/outputs/mlflow.db", run_dir)
    assert (run_dir / ".hydra" / "config.yaml").is_file() and (run_dir / "run.log").is_file()
    assert (launch_dir / "outputs" / "mlartifacts").is_dir()
    searched = {**{f"run/{k}": v for k, v in file_bytes(run_dir).items()},
                **{f"launch/{k}": v for k, v in file_bytes(launch_dir).items()},
                "stdout": proc.stdout.encode(), "stderr": proc.stderr.encode()}
    for fragment in key_fragments():
        found = [name for name, data in searched.items() if fragment.encode() in data]
        assert not found, f"{fragment!r} found in {found}"


def test_a_key_cut_by_the_error_length_limit_leaks_no_part_of_it(tmp_path, server):
    """An error body long enough that the 300-character cut falls inside the echoed key."""
    pad = {"n": 0}

    def script(request, number):
        if number == 1:  # answered once: a 401 later is the request's failure, not a dead endpoint's
            return None
        return Response(status=401, body={"error": {"message": "x" * pad["n"] + f" key provided: {CANARY}.",
                                                    "type": "invalid_request_error"}})

    server.script = script
    cfg = make_config("data.dir=unused", f"optimizer.base_url={server.base_url}", "optimizer.model=test",
                      "optimizer.cache=off", *NO_RETRY_WAIT)
    client = make_client(cfg.optimizer, tmp_path, environ={"OPENAI_API_KEY": CANARY})
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    client.complete(messages, 10)
    with pytest.raises(CallError) as first:
        client.complete(messages, 10)
    # where the (redacted) key starts in the cut text, then pad the message to put the cut mid-key
    prefix = len("HTTP 401: ")
    start = first.value.cause.index("***") - prefix
    # cut 9 characters before the key's end: the text keeps neither the whole key nor its last 8
    pad["n"] = 300 - start - (len(CANARY) - 9)
    with pytest.raises(CallError) as second:
        client.complete(messages, 10)
    cause = second.value.cause
    assert "x" * 10 in cause and pad["n"] > 0  # unredacted, this text is cut 9 characters before the key's end
    secret = CANARY[len("sk-canary-"):]  # the part of a key that is not a public prefix
    windows = {secret[i:i + 8] for i in range(len(secret) - 7)}
    assert not sorted(w for w in windows if w in cause), cause


# ---------------------------------------------------------------------------------------------
# 4. many concurrent calls with random latency


@pytest.mark.slow
def test_500_minibatches_with_64_workers_and_random_latency(tmp_path, server):
    n_fail = n_succ = 250
    budget = 4
    rng, rng_lock = random.Random(1234), threading.Lock()

    def script(request, number):
        with rng_lock:
            delay = rng.uniform(0, 0.05)
        return Response(body=chat_body(json.dumps(default_reply(request))), delay_s=delay)

    server.script = script
    server._httpd.socket.listen(256)  # room for 64 connections at once (the default backlog is 5)
    data = write_dataset(tmp_path / "d", n_fail=n_fail, n_succ=n_succ)
    cfg = make_config(f"data.dir={data}", f"optimizer.base_url={server.base_url}", "optimizer.model=test",
                      "optimizer.cache=off", "reflect.minibatch_size=1", "reflect.workers=64",
                      f"reflect.edit_budget={budget}", *NO_RETRY_WAIT)
    dataset = load_dataset(cfg.data)
    run_dir = tmp_path / "run"
    started = time.monotonic()
    stage = Stage(stage_settings(cfg), dataset, make_client(cfg.optimizer, tmp_path, environ={}), run_dir)
    outcomes = stage.run()
    elapsed = time.monotonic() - started
    MEASURED["500 minibatches, 64 workers: stage seconds"] = round(elapsed, 2)
    plan = plan_minibatches(dataset.results, cfg.reflect)
    assert len(plan) == 500 and [o.tag for o in outcomes] == [mb.tag for mb in plan]
    assert server.count == 500
    assert sorted(request_ids(r) for r in server.requests) == sorted((r.id,) for r in dataset.results)
    patches = sorted((run_dir / "patches").iterdir())
    assert [p.name for p in patches] == sorted(f"{mb.tag}.json" for mb in plan)  # nothing else, no *.tmp
    for mb in plan:
        patch = json.loads((run_dir / "patches" / f"{mb.tag}.json").read_text(encoding="utf-8"))
        ids = [r.id for r in mb.results]
        assert patch["trajectory_ids"] == ids and patch["source_type"] == mb.group
        # the reply saved is the one made for this minibatch's own request
        assert [e["content"] for e in patch["patch"]["edits"]] == [f"- rule {i} from {ids[0]}" for i in range(budget)]
        assert patch["n_proposed"] == budget + 2
    assert not list(run_dir.rglob("*.tmp"))
    assert {o.status for o in outcomes} == {"done"}
    summary, _ = summarize(stage.run_dir, cfg.reflect, cfg.optimizer, dataset, stage.mode, outcomes, stage.patches,
                           stage.system.hashes(),
                           started, time.monotonic)
    c = summary["counts"]
    assert c["calls"] == 500 and c["minibatches_done"] == 500 and c["failed_calls"] == 0
    assert c["edits_kept"] == 500 * budget and c["edits_proposed"] == 500 * (budget + 2)
    assert len(list(RunDir(run_dir).kept_items())) == 500 * budget


# ---------------------------------------------------------------------------------------------
# 5. oversized input files


TINY_MB = "0.001"  # 1048 bytes


def test_oversized_results_file_is_a_user_error_naming_file_and_key(tmp_path):
    data = write_dataset(tmp_path / "d", n_fail=10, n_succ=10)
    assert (data / "results.jsonl").stat().st_size > 0.001 * 2**20
    cfg = make_config(f"data.dir={data}", "optimizer.base_url=http://127.0.0.1:9", f"data.max_file_mb={TINY_MB}")
    with pytest.raises(UserError) as err:
        load_dataset(cfg.data)
    assert str(data / "results.jsonl") in str(err.value) and "data.max_file_mb" in str(err.value)


def test_oversized_results_file_exits_2_naming_file_and_key(tmp_path, server, launch_dir):
    data = write_dataset(tmp_path / "d", n_fail=10, n_succ=10)
    run_dir = tmp_path / "run"
    proc = run_cli(*run_args(data, server, run_dir, f"data.max_file_mb={TINY_MB}", "mlflow.enabled=false"),
                   cwd=launch_dir)
    assert proc.returncode == 2, output(proc)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("reflact: error:"), proc.stderr
    assert str(data / "results.jsonl") in lines[0] and "data.max_file_mb" in lines[0]
    assert server.count == 0 and not (run_dir / "patches").exists()


def oversized_conversation(tmp_path) -> tuple[Path, str]:
    data = write_dataset(tmp_path / "d", n_fail=2, n_succ=2)
    big = "run_00001"
    conv = [{"role": "user", "content": "x" * 4000}]
    (data / "predictions" / big / "conversation.json").write_text(json.dumps(conv), encoding="utf-8")
    assert (data / "results.jsonl").stat().st_size < 0.001 * 2**20  # only the conversation is too large
    return data, big


def test_oversized_conversation_is_bad_input_by_default(tmp_path):
    data, big = oversized_conversation(tmp_path)
    cfg = make_config(f"data.dir={data}", "optimizer.base_url=http://127.0.0.1:9", f"data.max_file_mb={TINY_MB}")
    with pytest.raises(UserError) as err:
        load_dataset(cfg.data)
    message = str(err.value)
    assert str(data / "predictions" / big / "conversation.json") in message and "data.max_file_mb" in message
    assert "data.on_bad_conversation=skip" in message


def test_oversized_conversation_is_skipped_when_asked(tmp_path, server):
    data, big = oversized_conversation(tmp_path)
    cfg = make_config(f"data.dir={data}", f"optimizer.base_url={server.base_url}", "optimizer.model=test",
                      "optimizer.cache=off", f"data.max_file_mb={TINY_MB}", "data.on_bad_conversation=skip",
                      "reflect.minibatch_size=1")
    dataset = load_dataset(cfg.data)
    assert list(dataset.skipped) == [big] and "data.max_file_mb" in dataset.skipped[big]
    client = make_client(cfg.optimizer, tmp_path, environ={})
    outcomes = Stage(stage_settings(cfg), dataset, client, tmp_path / "run").run()
    assert server.count == 3
    assert sorted(o.status for o in outcomes) == ["done", "done", "done", "skipped"]
    assert all(big not in request_ids(r) for r in server.requests)


def test_oversized_extras_file_is_found_before_any_call(tmp_path, server):
    data = write_dataset(tmp_path / "d", n_fail=4, n_succ=0)
    cfg = make_config(f"data.dir={data}", f"optimizer.base_url={server.base_url}", "optimizer.model=test",
                      "optimizer.cache=off", f"data.max_file_mb={TINY_MB}", "reflect.minibatch_size=1",
                      "reflect.workers=1")
    dataset = load_dataset(cfg.data)
    last = plan_minibatches(dataset.results, cfg.reflect)[-1].results[0].id
    (data / "predictions" / last / "target_system_prompt.txt").write_text("y" * 4000, encoding="utf-8")
    with pytest.raises(UserError, match="max_file_mb"):
        dataset = load_dataset(cfg.data)
        Stage(stage_settings(cfg), dataset, make_client(cfg.optimizer, tmp_path, environ={}), tmp_path / "run").run()
    assert server.count == 0  # SPEC 1.2: inputs are validated before the first call


# ---------------------------------------------------------------------------------------------
# 6. a bad rerun damages nothing of an earlier run


def test_rerun_with_a_bad_results_line_leaves_the_run_dir_byte_identical(tmp_path, server, launch_dir):
    bad_line = '{"id": "run_99999", "hard": 0'  # cut short: not JSON
    data = write_dataset(tmp_path / "d", n_fail=4, n_succ=4)
    run_dir = tmp_path / "run"
    args = run_args(data, server, run_dir, "reflect.minibatch_size=4", "mlflow.enabled=false")
    ok(run_cli(*args, cwd=launch_dir))
    assert len(patches_of(run_dir)) == 2 and (run_dir / "summary.json").is_file()
    (run_dir / "mlflow_run.json").write_text('{"run_id": "r", "tracking_uri": "u"}\n')  # as a logged run has
    before = file_bytes(run_dir)
    results = data / "results.jsonl"
    lines = results.read_text(encoding="utf-8").splitlines()
    lines.insert(3, bad_line)
    results.write_text("\n".join(lines) + "\n", encoding="utf-8")
    requests = server.count
    proc = run_cli(*args, cwd=launch_dir)
    assert proc.returncode == 2, output(proc)
    assert proc.stderr.strip().startswith("reflact: error:") and f"{results}:4" in proc.stderr
    assert server.count == requests
    assert file_bytes(run_dir) == before
    assert read_json(run_dir / "summary.json")["counts"]["calls"] == 2
