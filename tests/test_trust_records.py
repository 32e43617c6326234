"""What relog and the tools read back from a run dir, damaged or hostile (issue 36, items 1, 6, 8, 9):
a name read from a record never becomes a path out of the run dir (nor does the artifact store
delete a file it links), saved YAML never expands without bound, a damaged trace record is left out
with one line while the run is logged whole, and every other damaged file is one line and exit
code 2 before any MLflow run exists."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import reflact
from reflact import relog
from reflact.core.errors import UserError
from reflact.core.shipped import demo_dir
from reflact.running.rundir import RunDir, SweepDir
from reflact.testing.optimizer_server import OptimizerServer
from tests.test_trust_tools import one_line_exit_2

TAGS = ("minibatch_fail_000", "minibatch_fail_001", "minibatch_succ_000", "minibatch_succ_001")


def demo_run(launch: Path, server: OptimizerServer, *extra: str):
    return reflact.reflect(demo_dir(), run_dir=launch / "run", launch_dir=launch, overrides=[
        "optimizer=compatible", f"optimizer.base_url={server.base_url}", "optimizer.model=test", *extra])


@pytest.fixture(scope="module")
def traced(tmp_path_factory, migrated_store) -> Path:
    """A launch dir holding a finished demo run logged to MLflow (so with its traces.jsonl), made once."""
    launch = tmp_path_factory.mktemp("traced") / "launch"
    (launch / "outputs").mkdir(parents=True)
    shutil.copy(migrated_store, launch / "outputs" / "mlflow.db")
    with OptimizerServer() as server:
        done = demo_run(launch, server)
    assert done.status == "FINISHED" and (launch / "run" / "traces.jsonl").is_file()
    return launch


@pytest.fixture
def launch(traced, tmp_path) -> Path:
    """A copy of the traced launch dir (run dir and store) of the test's own."""
    shutil.copytree(traced, tmp_path / "launch")
    return tmp_path / "launch"


def summary_change(change):
    def damage(rd: Path) -> None:
        summary = json.loads((rd / "summary.json").read_text())
        change(summary)
        (rd / "summary.json").write_text(json.dumps(summary))
    return damage


def replaced(name: str, text: str):
    def damage(rd: Path) -> None:
        (rd / name).parent.mkdir(parents=True, exist_ok=True)
        (rd / name).write_text(text)
    return damage


def first_minibatch(key: str, value):
    return summary_change(lambda s: s["minibatches"][0].__setitem__(key, value))


def kept_line(change):
    def damage(rd: Path) -> None:
        lines = (rd / "kept_items.jsonl").read_text().splitlines()
        row = json.loads(lines[0])
        change(row)
        (rd / "kept_items.jsonl").write_text("\n".join([json.dumps(row), *lines[1:]]) + "\n")
    return damage


def priced_with_unknown_cost(rd: Path) -> None:
    config = yaml.safe_load((rd / ".hydra" / "config.yaml").read_text())
    config["optimizer"]["prices"] = {"test": {"input": 1.0, "cached_input": 0.5, "output": 2.0}}
    (rd / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))  # the summary's costs stay null


def hydra_yaml(mode: str, task, num) -> str:
    return yaml.safe_dump({"hydra": {"mode": mode, "overrides": {"task": task}, "job": {"num": num}}})


# ------------------------------------------------------------------ item 1: names read back are plan tags


def test_a_minibatch_tag_that_leads_out_of_the_run_dir_deletes_and_copies_nothing(
        launch, tmp_path, capsys, monkeypatch):
    """The repro: a tag of "../" * 40 + a folder made relog delete that folder's first file; an
    absolute one copied every file of the folder into the run's artifacts."""
    monkeypatch.chdir(launch)  # the run's own store: its artifacts are under outputs/
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "a.txt").write_text("mine")
    rd = launch / "run"
    record = (rd / "mlflow_run.json").read_bytes()
    for tag in ("../" * 40 + str(victim).lstrip("/"), str(victim), "minibatch_fail_000/../../../victim"):
        first_minibatch("tag", tag)(rd)
        err = one_line_exit_2(relog.main, [str(rd)], capsys)
        assert "summary.json: minibatches[0].tag is damaged" in err
        assert (victim / "a.txt").read_text() == "mine" and os.listdir(victim) == ["a.txt"]
    assert not list((launch / "outputs").rglob("a.txt"))  # nothing copied into the artifacts
    assert (rd / "mlflow_run.json").read_bytes() == record


@pytest.mark.parametrize("name", ["../x", "/etc", "minibatch_fail_000/../../x", "minibatch_fail_1", "", "."])
def test_the_run_dir_builds_no_path_from_a_name_that_is_no_plan_tag(tmp_path, name):
    """The run dir's own hold, for a name a tool did not check: one line naming the run dir."""
    rd = RunDir(tmp_path / "run")
    for build in (rd.patch_path, rd.call_dir, rd.preview_paths, rd.patch, rd.outcome_record,
                  lambda tag: rd.minibatch_files(tag, True)):
        with pytest.raises(UserError, match="which is no plan tag"):
            build(name)


def test_a_file_linked_from_outside_the_run_dir_is_not_logged(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("not the run's")
    rd = RunDir(tmp_path / "run")
    rd.call_dir(TAGS[0]).mkdir(parents=True)
    (rd.call_dir(TAGS[0]) / "reply_1.txt").write_text("{}")
    (rd.call_dir(TAGS[0]) / "link.txt").symlink_to(outside / "secret.txt")
    (rd.calls / TAGS[1]).symlink_to(outside, target_is_directory=True)
    rd.preview.mkdir()
    (rd.preview / "evil.diff").symlink_to(outside / "secret.txt")
    assert [path.name for path, _ in rd.minibatch_files(TAGS[0], False)] == ["reply_1.txt"]
    assert rd.minibatch_files(TAGS[1], False) == []
    assert rd.run_files() == []


@pytest.fixture
def store(tmp_path, migrated_store):
    """A run in a local store whose artifacts are files: the store that hard-links them."""
    import time

    from reflact.tracking.store import Store

    shutil.copy(migrated_store, tmp_path / "mlflow.db")
    store = Store(f"sqlite:///{tmp_path / 'mlflow.db'}", "records", tmp_path)
    store.create("run", {}, int(time.time() * 1000))
    assert store._artifact_dir is not None
    return store


def test_the_artifact_store_never_unlinks_a_target_that_is_its_source(store):
    target_dir = store._artifact_dir / "calls" / TAGS[0]
    target_dir.mkdir(parents=True)
    source = target_dir / "reply_1.txt"
    source.write_text("the only copy")
    store.log_files([(source, f"calls/{TAGS[0]}")])  # the target is the source itself
    assert source.read_text() == "the only copy"
    elsewhere = store._artifact_dir.parent / "linked.txt"
    elsewhere.write_text("linked")
    (store._artifact_dir / "run").mkdir()
    os.link(elsewhere, store._artifact_dir / "run" / "linked.txt")  # a link logged before
    store.log_files([(elsewhere, "run")])
    assert elsewhere.read_text() == "linked" and (store._artifact_dir / "run" / "linked.txt").read_text() == "linked"


@pytest.mark.parametrize("folder", ["../../../escaped", "<absolute>", "calls/../../escaped", "linked", "linked/x"])
def test_the_artifact_store_writes_nothing_outside_the_runs_artifacts(store, tmp_path, folder, caplog):
    """Whatever folder it is given: one climbing out, absolute, or a folder of the artifacts that
    links out of them."""
    outside = tmp_path / "outside"
    outside.mkdir()
    store._artifact_dir.mkdir(parents=True, exist_ok=True)
    (store._artifact_dir / "linked").symlink_to(outside, target_is_directory=True)
    source = tmp_path / "file.txt"
    source.write_text("x")
    before = set(tmp_path.parent.rglob("*"))
    with caplog.at_level(logging.WARNING, logger="reflact"):
        store.log_files([(source, folder.replace("<absolute>", str(tmp_path / "escaped")))])
    assert set(tmp_path.parent.rglob("*")) == before
    assert [r.getMessage() for r in caplog.records if "leads out of the run's artifacts" in r.getMessage()]


@pytest.mark.parametrize("folder", ["../escaped", "/escaped", "calls/../../escaped", "a\\..\\..\\escaped"])
def test_a_remote_artifact_store_is_sent_no_folder_outside_the_runs_artifacts(store, tmp_path, folder):
    sent = []

    class Client:  # the store's client for a server's artifacts: what it would be asked to upload
        def log_artifact(self, *args) -> None:
            sent.append(args)

    store.client, store._artifact_dir = Client(), None
    (tmp_path / "file.txt").write_text("x")
    store.log_files([(tmp_path / "file.txt", folder), (tmp_path / "file.txt", f"calls/{TAGS[0]}")])
    assert sent == [(store.run_id, str(tmp_path / "file.txt"), f"calls/{TAGS[0]}")]


def test_sweep_records_that_are_damaged_are_left_out(tmp_path):
    sweep = SweepDir(tmp_path / "sweep")
    sweep.root.mkdir()
    (sweep.root / "mlflow_parent.json").write_text(json.dumps({"run_id": ["x"], "tracking_uri": "u", "sweep_id": "s"}))
    assert sweep.parent_record() == {}
    for number, record in enumerate([{"overrides": "a=1", "reason": "x"}, {"overrides": [1]}, {"reason": 5}]):
        sweep.write_failed_job(number, record)
    sweep.write_failed_job(3, {"overrides": ["a=1"], "run_dir": "r", "reason": "why"})
    assert [r["job"] for r in sweep.failed_jobs()] == [3]


def test_clearing_failed_jobs_deletes_nothing_through_a_link(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.json").write_text("{}")
    sweep = SweepDir(tmp_path / "sweep")
    sweep.root.mkdir()
    (sweep.root / "failed_jobs").symlink_to(mine, target_is_directory=True)
    sweep.clear_failed_jobs()
    assert (mine / "notes.json").is_file()


# ------------------------------------------------------------------ item 9: damage found before a run exists

DAMAGE = {
    # the repro, and the rest of analysis.json
    "analysis minibatches an object": replaced("analysis.json", json.dumps({"minibatches": {"a": 1}})),
    "analysis minibatch a path": replaced("analysis.json", json.dumps({"minibatches": [{"minibatch": "../x"}]})),
    "analysis agreement a word": replaced("analysis.json", json.dumps(
        {"minibatches": [{"minibatch": TAGS[0], "agreement": "x"}]})),
    "analysis figure infinite": replaced("analysis.json", '{"redundancy": Infinity}'),
    "analysis figure too large": replaced("analysis.json", '{"redundancy": 1' + "0" * 400 + "}"),
    "analysis not an object": replaced("analysis.json", "[1]"),
    # kept_items.jsonl, which the run's table is made of
    "kept item not JSON": replaced("kept_items.jsonl", "{\n"),
    "kept item minibatch a path": kept_line(lambda row: row.__setitem__("minibatch", "../x")),
    "kept item trajectory ids a text": kept_line(lambda row: row.__setitem__("trajectory_ids", "abc")),
    "kept item apply a text": kept_line(lambda row: row.__setitem__("apply", "x")),
    # summary.json beyond what analyze needs
    "tag of another group": first_minibatch("tag", TAGS[2]),
    "tag absolute": first_minibatch("tag", "/etc"),
    "usage incomplete": first_minibatch("usage", {"prompt": 1}),
    "usage too large": first_minibatch("usage", {"prompt": 10**400, "cached": 0, "completion": 0, "reasoning": 0}),
    "kept too large": first_minibatch("kept", 10**400),
    "apply a text": first_minibatch("apply", "x"),
    "a status count missing": summary_change(lambda s: s["counts"].pop("minibatches_done")),
    "a count a word": summary_change(lambda s: s["counts"].__setitem__("calls", "many")),
    "ended_at 1e300": summary_change(lambda s: s["times"].__setitem__("ended_at", 1e300)),
    "template hashes a list": summary_change(lambda s: s["settings"].__setitem__("template_hashes", ["x"])),
    "cost null for a priced model": priced_with_unknown_cost,
    # Hydra's record of the run
    "job number a word": replaced(".hydra/hydra.yaml", hydra_yaml("MULTIRUN", [], "x")),
    "overrides a text": replaced(".hydra/hydra.yaml", hydra_yaml("RUN", "a=1", 0)),
    "hydra.yaml without hydra": replaced(".hydra/hydra.yaml", "mode: RUN\n"),
}


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_relog_of_a_damaged_file_is_one_line_and_creates_no_run(launch, capsys, kind):
    rd = launch / "run"
    DAMAGE[kind](rd)
    record = (rd / "mlflow_run.json").read_bytes()
    store = launch / "fresh.db"
    one_line_exit_2(relog.main, [str(rd), "--tracking-uri", f"sqlite:///{store}"], capsys)
    assert not store.exists()  # stopped before the store was opened: no run was created
    assert (rd / "mlflow_run.json").read_bytes() == record


# ------------------------------------------------------------------ item 6: saved YAML expands within bounds

ALIAS_BOMB = "".join(
    [f"a0: &a0 [{', '.join(['x'] * 9)}]\n"]
    + [f"a{n}: &a{n} [{', '.join([f'*a{n - 1}'] * 9)}]\n" for n in range(1, 9)]
)


def interpolation_bomb(rd: Path) -> None:
    """A saved config whose texts each name the one before three times (only keys reflact knows:
    3^12 resolutions, minutes)."""
    config = yaml.safe_load((rd / ".hydra" / "config.yaml").read_text())
    chain = [("reflect", "step_buffer"), ("reflect", "meta_skill"), ("optimizer", "api_key_env"),
             ("mlflow", "experiment"), ("name",), ("optimizer", "azure", "endpoint"),
             ("optimizer", "azure", "deployment"), ("optimizer", "cache_path"), ("analysis", "embedding", "base_url"),
             ("analysis", "embedding", "model"), ("analysis", "embedding", "api_key_env"),
             ("optimizer", "azure", "api_version"), ("optimizer", "token_limit_param")]
    for before, key in zip([None, *chain], chain, strict=False):
        node = config
        for part in key[:-1]:
            node = node[part]
        node[key[-1]] = "x" if before is None else ("${" + ".".join(before) + "}") * 3
    (rd / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))


def bomb_in(name: str):
    def damage(rd: Path) -> None:
        path = rd / ".hydra" / name
        text = path.read_text() if path.exists() else "hydra: {mode: RUN, overrides: {task: []}}\n"
        path.write_text(text + ALIAS_BOMB)
    return damage


@pytest.mark.parametrize(("tool", "damage"), [
    ("relog", bomb_in("config.yaml")),
    ("relog", bomb_in("hydra.yaml")),
    ("analyze", bomb_in("config.yaml")),
    ("relog", interpolation_bomb),
    ("analyze", interpolation_bomb),
], ids=["relog config alias", "relog hydra.yaml alias", "analyze config alias", "relog interpolations",
        "analyze interpolations"])
def test_saved_yaml_that_would_expand_without_bound_is_one_line(launch, tool, damage):
    """Nine lines of aliases hold 9^9 leaves; thirteen texts naming the one before thrice resolve
    3^12 times: refused in one line, exit 2, where they used to run until killed."""
    rd = launch / "run"
    damage(rd)
    argv = [str(rd), "--tracking-uri", f"sqlite:///{launch / 'fresh.db'}"] if tool == "relog" else [
        str(rd), "--out", str(launch / "out")]
    done = subprocess.run([sys.executable, "-m", f"reflact.{tool}", *argv], cwd=launch, capture_output=True,
                          text=True, timeout=30, env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"})
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr[-2000:]
    assert "config.yaml" in done.stderr or "hydra.yaml" in done.stderr
    assert not (launch / "fresh.db").exists() and not (launch / "out").exists()


# ------------------------------------------------------------------ item 8: a damaged trace record is left out

TRACE_DAMAGE = {  # the kind -> (its request number, the damage); each record a copy of a real one
    "started_at a word": (101, lambda r: r["reply"].__setitem__("started_at", "x")),
    "ended_at NaN": (102, lambda r: r.__setitem__("ended_at", float("nan"))),
    "ended_at 1e300": (103, lambda r: r.__setitem__("ended_at", 1e300)),
    "tag a list": (104, lambda r: r.__setitem__("tag", [TAGS[0]])),
    "latency_s a text": (105, lambda r: r["reply"].__setitem__("latency_s", "1.5")),
    "usage.prompt a text": (106, lambda r: r["reply"]["usage"].__setitem__("prompt", "10")),
    "tag a path": (107, lambda r: r.__setitem__("tag", "../" * 8 + "etc")),
    "started_at negative": (108, lambda r: r["reply"].__setitem__("started_at", -5.0)),
    "reply a text": (109, lambda r: r.__setitem__("reply", "oops")),
    "messages an object": (110, lambda r: r.__setitem__("messages", {"role": "user"})),
    "cost infinite": (111, lambda r: r.__setitem__("cost_usd", float("inf"))),
    "retries negative": (112, lambda r: r["reply"].__setitem__("retries", -1)),
    "reply without text": (113, lambda r: r["reply"].pop("text")),
}


def damage_traces(rd: Path) -> None:
    """Appends a damaged copy of the first minibatch's request for each kind, under its own number."""
    good = next(r for r in map(json.loads, (rd / "traces.jsonl").read_text().splitlines()) if r["tag"] == TAGS[0])
    assert good["reply"] is not None
    with open(rd / "traces.jsonl", "a", encoding="ascii") as out:
        for number, change in TRACE_DAMAGE.values():
            record = json.loads(json.dumps(good))
            record["number"] = number
            change(record)
            out.write(json.dumps(record) + "\n")


def lines_left_out(caplog) -> dict[int, list[str]]:
    """Each damaged record's lines (by its request number) that say it was left out."""
    said = [r.getMessage() for r in caplog.records if "is damaged" in r.getMessage() and "left out" in r.getMessage()]
    return {number: [line for line in said if f"request {number} " in line] for number, _ in TRACE_DAMAGE.values()}


def logged_run(launch: Path):
    """The run dir's MLflow run and the (minibatch, request) of each of its traces."""
    import mlflow

    record = json.loads((launch / "run" / "mlflow_run.json").read_text())
    client = mlflow.MlflowClient(record["tracking_uri"])
    run = client.get_run(record["run_id"])
    traces = client.search_traces(locations=[run.info.experiment_id], run_id=run.info.run_id, max_results=500)
    return run, sorted((t.info.tags["reflact.minibatch"], t.info.tags["reflact.request"]) for t in traces)


def test_relog_leaves_each_damaged_trace_record_out_with_one_line_and_finishes(launch, caplog, monkeypatch):
    damage_traces(launch / "run")
    monkeypatch.chdir(launch)
    with caplog.at_level(logging.INFO, logger="reflact"):
        assert relog.main([str(launch / "run")]) == 0
    assert all(len(lines) == 1 for lines in lines_left_out(caplog).values()), lines_left_out(caplog)
    run, traces = logged_run(launch)
    assert run.info.status == "FINISHED"
    assert traces == [(tag, "1") for tag in sorted(TAGS)]


def test_a_rerun_reusing_minibatches_leaves_their_damaged_trace_records_out_and_finishes(launch, caplog):
    """The tracker traces a reused minibatch's requests again from traces.jsonl: a damaged record
    there used to fail every write of the run's logging, leaving it RUNNING."""
    damage_traces(launch / "run")
    (launch / "run" / "patches" / f"{TAGS[3]}.json").unlink()  # one request: the run is logged again
    with caplog.at_level(logging.INFO, logger="reflact"), OptimizerServer() as server:
        done = demo_run(launch, server)
    assert done.status == "FINISHED"
    left_out = lines_left_out(caplog)
    read_back = {n for n, change in TRACE_DAMAGE.values() if n not in (104, 107)}  # those of a reused minibatch
    assert all(len(left_out[n]) == (1 if n in read_back else 0) for n in left_out), left_out
    run, traces = logged_run(launch)
    assert run.info.status == "FINISHED" and run.info.run_id == done.mlflow_run_id
    assert traces == [(tag, "1") for tag in sorted(TAGS)]
