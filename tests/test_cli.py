"""End to end through the real entry point: `python -m reflact.run ...` in a subprocess.

Every run points at the loopback optimizer server, writes into its own `hydra.run.dir`, and is
started from a launch directory whose `outputs/mlflow.db` is an already migrated MLflow store,
as a user's `outputs/` folder would be.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from reflact.testing.optimizer_server import OptimizerServer
from tests.conftest import PROJECT, file_bytes, ok, output, patches_of, run_cli, summary_of

CANARY = "sk-canary-123"
PROMPTS = PROJECT / "prompts"
DEMO_TAGS = ["minibatch_fail_000", "minibatch_fail_001", "minibatch_succ_000", "minibatch_succ_001"]


# ---------------------------------------------------------------------------------------------
# helpers


def cli(server, launch_dir: Path, run_dir: Path, *args: str, env: dict | None = None, base_url: bool = True):
    """One run of the CLI against `server`, started from `launch_dir`, writing into `run_dir`."""
    point = [f"optimizer.base_url={server.base_url}", "optimizer.model=test"] if base_url else []
    return run_cli(*args, f"hydra.run.dir={run_dir}", *point, cwd=launch_dir, env=env)







def mlflow_client(launch_dir: Path):
    import mlflow

    return mlflow.MlflowClient(tracking_uri=f"sqlite:///{launch_dir}/outputs/mlflow.db")


def all_runs(launch_dir: Path) -> list:
    client = mlflow_client(launch_dir)
    ids = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(ids) if ids else []


def mlflow_state(launch_dir: Path, experiment: str) -> list[dict]:
    """The experiment's active runs, oldest first, with what the tests look at (read at once:
    a later rerun of the same run dir may replace a run)."""
    client = mlflow_client(launch_dir)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return []
    state = []
    for run in client.search_runs([found.experiment_id], order_by=["attribute.start_time ASC"]):
        run_id = run.info.run_id

        def listing(path=None, run_id=run_id):
            return {a.path for a in client.list_artifacts(run_id, path)}

        state.append({
            "run_id": run_id,
            "status": run.info.status,
            "artifact_uri": run.info.artifact_uri,
            "params": dict(run.data.params),
            "metrics": dict(run.data.metrics),
            "tags": dict(run.data.tags),
            "kept_history": sorted((m.step, m.value) for m in client.get_metric_history(run_id, "minibatch/kept")),
            "artifacts": {p: listing(p) for p in (None, "patches", "calls/minibatch_fail_000", "run")},
        })
    return state


def is_failure_call(request: dict) -> bool:
    return "## Failed Trajectories" in request["messages"][1]["content"]


def assert_complete_run_dir(run_dir: Path, tags=DEMO_TAGS) -> None:
    assert sorted(patches_of(run_dir)) == sorted(tags)
    for tag in tags:
        for name in ("system.md", "user.md", "reply_1.txt"):
            assert (run_dir / "calls" / tag / name).is_file(), f"calls/{tag}/{name} missing"
    assert (run_dir / "summary.json").is_file()


# ---------------------------------------------------------------------------------------------
# the demo run, its resume behaviour and what MLflow holds (one sequence of runs, shared)


@pytest.fixture(scope="module")
def demo(tmp_path_factory, migrated_store):
    """In one launch dir and run dir, against one server, with a canary key in the environment:
    1. `+exp=demo`; 2. the same command again; 3. the same with a bad override;
    4. the same with another edit budget. Each step's output, request count and files are kept."""
    root = tmp_path_factory.mktemp("demo")
    launch = root / "launch"
    (launch / "outputs").mkdir(parents=True)
    shutil.copy(migrated_store, launch / "outputs" / "mlflow.db")
    run_dir = root / "run"
    env = {"OPENAI_API_KEY": CANARY}
    steps = {}
    with OptimizerServer() as server:
        auth = server.authorizations

        def step(name: str, *args: str) -> None:
            before = server.count
            proc = cli(server, launch, run_dir, "+exp=demo", *args, env=env)
            steps[name] = {
                "proc": proc,
                "new_requests": server.count - before,
                "requests": server.requests[before:],
                "summary": summary_of(run_dir) if (run_dir / "summary.json").is_file() else None,
                "patch_bytes": file_bytes(run_dir / "patches") if (run_dir / "patches").is_dir() else {},
                "patches": patches_of(run_dir) if (run_dir / "patches").is_dir() else {},
                "summary_bytes": ((run_dir / "summary.json").read_bytes() if (run_dir / "summary.json").is_file()
                                  else b""),
                "hydra_bytes": file_bytes(run_dir / ".hydra") if (run_dir / ".hydra").is_dir() else {},
                "mlflow": mlflow_state(launch, "reflact-demo"),
            }

        step("first")
        step("again")
        step("bad", "prompts.error=missing.md")
        step("budget", "reflect.edit_budget=2")
        yield {"launch": launch, "run_dir": run_dir, "steps": steps, "auth": auth}


def test_demo_run_writes_patches_calls_and_summary(demo):
    first = demo["steps"]["first"]
    ok(first["proc"])
    assert_complete_run_dir(demo["run_dir"])  # still complete after all four steps
    counts = first["summary"]["counts"]
    assert counts["results"] == 30
    assert counts["skipped"] == 2
    assert counts["failures"] + counts["successes"] == 30
    assert counts["minibatches"] == first["new_requests"] == 4
    assert counts["calls"] == 4 and counts["minibatches_done"] == 4
    assert counts["edits_kept"] == 4 * 4  # L=4 of the L + 2 the server proposes
    assert counts["edits_proposed"] == 4 * 6 and counts["edits_truncated"] == 4 * 2
    # patches hold the payload cut to L and say which trajectories they came from
    assert sorted(first["patches"]) == DEMO_TAGS
    for tag, patch in first["patches"].items():
        assert len(patch["patch"]["edits"]) == 4
        assert patch["n_proposed"] == 6
        assert patch["source_type"] == ("failure" if "_fail_" in tag else "success")
        assert patch["trajectory_ids"] and patch["n_analysed"] <= len(patch["trajectory_ids"])
    assert all("at most L=4" in r["messages"][1]["content"] for r in first["requests"])


def test_demo_run_shows_progress(demo):
    text = output(demo["steps"]["first"]["proc"])
    for n in range(1, 5):
        assert f"reflact: {n} of 4 ended" in text
    assert "Traceback" not in text


def test_identical_rerun_reuses_every_patch(demo):
    again = demo["steps"]["again"]
    ok(again["proc"])
    assert again["new_requests"] == 0
    assert "reused" in output(again["proc"])
    counts = again["summary"]["counts"]
    assert counts["minibatches_reused"] == 4 and counts["calls"] == 0
    assert again["patch_bytes"] == demo["steps"]["first"]["patch_bytes"]


def test_config_error_leaves_a_finished_run_dir_alone(demo):
    bad, again = demo["steps"]["bad"], demo["steps"]["again"]
    assert bad["proc"].returncode == 2, output(bad["proc"])
    assert bad["new_requests"] == 0
    assert bad["proc"].stderr.strip().startswith("reflact: error:")
    assert bad["patch_bytes"] == again["patch_bytes"]
    assert bad["summary_bytes"] == again["summary_bytes"]


def test_config_error_leaves_the_recorded_config_alone(demo):
    # docs/errors.md: "earlier outputs ... are left as they were"; .hydra/ is the record of the config that
    # made the patches beside it
    bad, again = demo["steps"]["bad"], demo["steps"]["again"]
    assert bad["proc"].returncode == 2
    assert bad["hydra_bytes"] == again["hydra_bytes"]


def test_other_edit_budget_redoes_every_minibatch(demo):
    budget = demo["steps"]["budget"]
    ok(budget["proc"])
    assert budget["new_requests"] == 4
    counts = budget["summary"]["counts"]
    assert counts["minibatches_done"] == 4 and counts["minibatches_reused"] == 0
    assert "reused saved patch" not in output(budget["proc"])
    assert sorted(budget["patches"]) == DEMO_TAGS
    assert all(len(p["patch"]["edits"]) == 2 for p in budget["patches"].values())
    assert budget["summary"]["settings"]["edit_budget"] == 2
    # what the server saw last is what calls/ now records
    user_messages = sorted(r["messages"][1]["content"] for r in budget["requests"])
    recorded = sorted((demo["run_dir"] / "calls" / t / "user.md").read_text(encoding="utf-8") for t in DEMO_TAGS)
    assert user_messages == recorded
    assert all("at most L=2" in m for m in user_messages)


def test_demo_run_is_logged_to_mlflow(demo):
    launch = demo["launch"]
    state = demo["steps"]["first"]["mlflow"]
    assert len(state) == 1
    run = state[0]
    assert run["status"] == "FINISHED"
    assert run["tags"].get("reflact.run_dir") == str(demo["run_dir"])

    params = run["params"]
    assert params["reflect.minibatch_size"] == "8"
    assert params["reflect.edit_budget"] == "4"
    assert params["reflect.seed"] == "42"
    assert params["optimizer.model"] == "test"
    assert params["mlflow.experiment"] == "reflact-demo"
    assert params["template_hash.failure"] and params["template_hash.success"]
    assert params["template_hash.failure"] != params["template_hash.success"]

    metrics = run["metrics"]
    for key in ("M", "L", "seed", "mode", "calls", "edits_kept", "edits_proposed", "edits_truncated",
                "tokens_prompt", "wall_time_s"):
        assert key in metrics, key
    assert "cost_usd" not in metrics and "spent_usd" not in metrics  # `test` has no price: unknown, not 0
    assert (metrics["M"], metrics["L"], metrics["seed"], metrics["mode"]) == (8, 4, 42, 0)
    assert metrics["calls"] == 4 and metrics["edits_kept"] == 16
    assert metrics["edits_proposed"] == 24 and metrics["edits_truncated"] == 8
    assert metrics["tokens_prompt"] == 4 * 100  # the server reports 100 prompt tokens per call
    assert metrics["wall_time_s"] > 0

    # one point per minibatch, step = its position in the run
    assert run["kept_history"] == [(0, 4.0), (1, 4.0), (2, 4.0), (3, 4.0)]

    artifacts = run["artifacts"]
    assert {"patches", "calls", "run"} <= artifacts[None]
    assert {f"patches/{t}.json" for t in DEMO_TAGS} <= artifacts["patches"]
    assert {"calls/minibatch_fail_000/system.md", "calls/minibatch_fail_000/user.md",
            "calls/minibatch_fail_000/reply_1.txt"} <= artifacts["calls/minibatch_fail_000"]
    assert "run/summary.json" in artifacts["run"]

    # artifacts live beside the store under outputs/, not in a ./mlruns of the launch dir
    outputs = (launch / "outputs").resolve()
    assert run["artifact_uri"].startswith(outputs.as_uri())
    assert any(p.name == "minibatch_fail_000.json" for p in outputs.rglob("*.json"))
    assert not (launch / "mlruns").exists()
    assert not (launch / "mlflow.db").exists()


def test_a_run_describes_its_setting_and_outcome_in_mlflow(demo):
    """The run's description (what MLflow's UI shows on its page and in the runs table) names its
    setting, model, minibatches, edits proposed and kept, cost, and that MLflow holds all of it."""
    from reflact.tracking.description import NOTE_TAG

    run = demo["steps"]["first"]["mlflow"][0]
    assert run["tags"][NOTE_TAG] == (
        "patch mode, M=8, L=4, seed 42, model `test`.\n\n"
        "4 minibatches; 24 edits proposed, 16 kept; cost unknown (no price for the model).\n\n"
        "Wholly in MLflow."
    )


def test_reruns_of_a_run_dir_show_once_in_mlflow(demo):
    steps = demo["steps"]
    first, again, bad, budget = (steps[k]["mlflow"] for k in ("first", "again", "bad", "budget"))
    assert [len(s) for s in (first, again, bad, budget)] == [1, 1, 1, 1]
    # nothing new (every patch reused, the same settings): the run that made the patches stays as it is
    assert again[0]["run_id"] == first[0]["run_id"] and again[0]["status"] == "FINISHED"
    assert again[0]["metrics"] == first[0]["metrics"]
    assert bad == again  # a config error logs nothing and replaces nothing
    assert budget[0]["metrics"]["L"] == 2 and budget[0]["metrics"]["edits_kept"] == 8
    assert budget[0]["params"]["reflect.edit_budget"] == "2"


def test_api_key_is_never_written_anywhere(demo):
    # the canary was the key the client really used
    assert demo["auth"] and set(demo["auth"]) == {f"Bearer {CANARY}"}
    canary = CANARY.encode()
    for folder in (demo["run_dir"], demo["launch"]):
        for name, data in file_bytes(folder).items():
            assert canary not in data, f"the API key was written to {folder / name}"
    for run in all_runs(demo["launch"]):
        for key, value in run.data.params.items():
            assert CANARY not in value, key
        for key, value in run.data.tags.items():
            assert CANARY not in value, key
    for step in demo["steps"].values():
        assert CANARY not in output(step["proc"])


# ---------------------------------------------------------------------------------------------
# config errors: exit 2, one line naming the key, nothing called


ERROR_CASES = [
    pytest.param(["+exp=demo", "reflect.minibatch_sz=3"], ["reflect.minibatch_sz"], id="unknown-key"),
    pytest.param(["+exp=demo", "reflect.minibatch_size=abc"], ["reflect.minibatch_size"], id="wrong-type"),
    pytest.param(["+exp=demo", "reflect.minibatch_size=0"], ["reflect.minibatch_size"], id="minibatch-size-0"),
    pytest.param(["+exp=demo", "reflect.update_mode=bogus"], ["reflect.update_mode", "bogus"], id="unknown-mode"),
    pytest.param(["+exp=demo", "reflect.skill_aware.appendix_source=x"], ["reflect.skill_aware.appendix_source"],
                 id="unknown-appendix-source"),
    pytest.param(["+exp=nope"], ["exp", "nope"], id="unknown-exp"),
    pytest.param([], ["data.dir"], id="no-dataset"),
    pytest.param(["+exp=demo", "prompts.error=missing.md"], ["prompts.error", "missing.md"], id="missing-prompt-file"),
]


def assert_one_line_error(proc, names: list[str]) -> str:
    assert proc.returncode == 2, f"exit {proc.returncode}\nSTDOUT:\n{proc.stdout}\nSTDERR:\n{proc.stderr}"
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("reflact: error:"), lines[0]
    for name in names:
        assert name in lines[0], (name, lines[0])
    assert "Traceback" not in proc.stdout + proc.stderr
    return lines[0]


@pytest.mark.parametrize("args,names", ERROR_CASES)
def test_config_error_is_one_line_with_exit_code_2(tmp_path, server, launch_dir, args, names):
    proc = cli(server, launch_dir, tmp_path / "run", *args)
    assert_one_line_error(proc, names)
    assert server.count == 0
    assert not (tmp_path / "run" / "patches").exists()
    assert all_runs(launch_dir) == []


def test_unknown_key_with_plus_prefix_is_an_error(tmp_path, server, launch_dir):
    # Hydra's own advice for a new key is the '+' prefix; the schema has no such key all the same
    proc = cli(server, launch_dir, tmp_path / "run", "+exp=demo", "+reflect.minibatch_sz=3", "mlflow.enabled=false")
    assert server.count == 0
    assert_one_line_error(proc, ["reflect.minibatch_sz"])


def test_no_key_and_no_base_url_is_an_error(tmp_path, server, launch_dir):
    # OPENAI_BASE_URL points the SDK at the test server: nothing may reach it all the same
    proc = cli(server, launch_dir, tmp_path / "run", "+exp=demo", "optimizer.model=test", base_url=False,
               env={"OPENAI_BASE_URL": server.base_url})
    line = assert_one_line_error(proc, ["OPENAI_API_KEY", "optimizer.base_url"])
    assert "key" in line.lower()
    assert server.count == 0
    assert all_runs(launch_dir) == []


# ---------------------------------------------------------------------------------------------
# modes, templates and contexts as the user sets them on the command line


def test_mode_alias_rewrite_and_no_mlflow(tmp_path, server, launch_dir):
    run_dir = tmp_path / "run"
    proc = cli(server, launch_dir, run_dir, "+exp=demo", "reflect.update_mode=rewrite", "mlflow.enabled=false")
    ok(proc)
    assert_complete_run_dir(run_dir)
    assert server.count == 4
    summary = summary_of(run_dir)
    assert summary["settings"]["update_mode"] == "rewrite_from_suggestions"
    for patch in patches_of(run_dir).values():
        assert "edits" not in patch["patch"]
        assert len(patch["patch"]["revise_suggestions"]) == 4
        assert {s["type"] for s in patch["patch"]["revise_suggestions"]} == {"clarify"}
    # the mode's own templates were used
    system = (run_dir / "calls" / "minibatch_fail_000" / "system.md").read_text(encoding="utf-8")
    assert system == (PROMPTS / "analyst_error_rewrite.md").read_text(encoding="utf-8")
    system = (run_dir / "calls" / "minibatch_succ_000" / "system.md").read_text(encoding="utf-8")
    assert system == (PROMPTS / "analyst_success_rewrite.md").read_text(encoding="utf-8")
    # mlflow.enabled=false: nothing in the store
    assert all_runs(launch_dir) == []

    # the alias and the canonical name are one mode: the canonical spelling reuses every patch
    proc = cli(server, launch_dir, run_dir, "+exp=demo_rewrite", "mlflow.enabled=false")
    ok(proc)
    assert server.count == 4
    assert summary_of(run_dir)["counts"]["minibatches_reused"] == 4


def test_skill_aware_saves_appendix_notes(tmp_path, server, launch_dir):
    run_dir = tmp_path / "run"
    ok(cli(server, launch_dir, run_dir, "+exp=demo_skill_aware", "mlflow.enabled=false"))
    assert_complete_run_dir(run_dir)
    patches = patches_of(run_dir)
    for tag in ("minibatch_fail_000", "minibatch_fail_001"):
        # normalised: the object's note kept, the empty string dropped
        assert patches[tag]["appendix_notes"] == ["Follow the verification rule.", "Check units."]
    failure_calls = [r for r in server.requests if is_failure_call(r)]
    assert failure_calls and all("SKILL_DEFECT" in r["messages"][0]["content"] for r in failure_calls)
    assert all("EXECUTION_LAPSE" in r["messages"][0]["content"] for r in failure_calls)


def test_inline_prompt_override_and_meta_skill_file_reach_the_server(tmp_path, server, launch_dir):
    run_dir = tmp_path / "run"
    inline = "You are the failure analyst INLINE-SYS-PROMPT-7; reply with exactly one JSON object"
    meta = tmp_path / "meta_skill.md"
    meta.write_text("- Prefer the smallest edit that fixes a pattern (META-LESSON-42).\n", encoding="utf-8")
    ok(cli(server, launch_dir, run_dir, "+exp=demo", f"prompts.error='{inline}'", f"reflect.meta_skill={meta}",
           "mlflow.enabled=false"))
    assert_complete_run_dir(run_dir)
    assert server.count == 4
    failure_calls = [r for r in server.requests if is_failure_call(r)]
    success_calls = [r for r in server.requests if not is_failure_call(r)]
    assert len(failure_calls) == 2 and len(success_calls) == 2
    for request in failure_calls:
        assert request["messages"][0]["role"] == "system"
        assert request["messages"][0]["content"] == inline
    for request in success_calls:  # only the failure template was replaced
        assert request["messages"][0]["content"] == (PROMPTS / "analyst_success.md").read_text(encoding="utf-8")
    for request in server.requests:
        user = request["messages"][1]["content"]
        heading = user.index("## Optimizer Meta Skill")
        lesson = user.index("META-LESSON-42")
        trajectories = max(user.find("## Failed Trajectories"), user.find("## Successful Trajectories"))
        assert heading < lesson < trajectories
        assert str(meta) not in user  # the file's content, not its path
    assert (run_dir / "calls" / "minibatch_fail_000" / "system.md").read_text(encoding="utf-8") == inline


# ---------------------------------------------------------------------------------------------
# dry run and tracking trouble


def test_dry_run_calls_nothing_and_estimates(tmp_path, server, launch_dir):
    run_dir = tmp_path / "run"
    # no key and no base_url; OPENAI_BASE_URL would lead any stray SDK call to the test server
    proc = cli(server, launch_dir, run_dir, "+exp=demo", "optimizer=dry_run", base_url=False,
               env={"OPENAI_BASE_URL": server.base_url})
    ok(proc)
    assert server.count == 0
    for tag in DEMO_TAGS:
        assert (run_dir / "calls" / tag / "user.md").is_file()
        assert (run_dir / "calls" / tag / "system.md").is_file()
        assert not (run_dir / "calls" / tag / "reply_1.txt").exists()
    assert patches_of(run_dir) == {}
    counts = summary_of(run_dir)["counts"]
    assert counts["minibatches_dry_run"] == 4
    assert counts["calls"] == 0
    assert counts["tokens_prompt"] > 0
    assert counts["cost_usd"] > 0  # the default model has a price


@pytest.mark.slow
def test_unreachable_tracking_server_keeps_local_outputs(tmp_path, server, launch_dir):
    run_dir = tmp_path / "run"
    proc = cli(server, launch_dir, run_dir, "+exp=demo", "mlflow.tracking_uri=http://127.0.0.1:9",
               env={"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "2"})
    ok(proc)
    assert_complete_run_dir(run_dir)
    assert summary_of(run_dir)["counts"]["minibatches_done"] == 4
    warnings = [line for line in output(proc).splitlines() if "MLflow" in line]
    assert warnings, output(proc)
    assert any("WARNING" in line or "warning" in line.lower() for line in warnings)
    assert "Traceback" not in output(proc)
    assert all_runs(launch_dir) == []  # no silent fallback to the local store


# ---------------------------------------------------------------------------------------------
# a dataset with no results (SPEC 2: the stage still logs its empty summary)


@pytest.mark.parametrize("content", ["", pytest.param("\n  \n", marks=pytest.mark.slow),
                                     pytest.param("[]\n", marks=pytest.mark.slow)],
                         ids=["empty", "blank-lines", "empty-array"])
def test_empty_results_file_makes_no_call_and_logs_an_empty_summary(tmp_path, server, launch_dir, content):
    data = tmp_path / "data"
    shutil.copytree(PROJECT / "examples" / "demo", data)
    (data / "results.jsonl").write_text(content, encoding="utf-8")
    run_dir = tmp_path / "run"
    proc = cli(server, launch_dir, run_dir, f"data.dir={data}", "mlflow.experiment=empty")
    ok(proc)
    assert server.count == 0 and "Traceback" not in output(proc)
    summary = summary_of(run_dir)
    assert summary["minibatches"] == [] and summary["skipped"] == {}
    counts = summary["counts"]
    assert {key: counts[key] for key in ("results", "failures", "successes", "minibatches", "calls", "edits_kept")} \
        == dict.fromkeys(("results", "failures", "successes", "minibatches", "calls", "edits_kept"), 0)
    assert counts["cost_usd"] is None and counts["apply_share"] == 0  # `test` has no price
    assert (run_dir / "report.md").is_file() and (run_dir / "kept_items.jsonl").read_text() == ""
    assert not list((run_dir / "patches").iterdir())
    [run] = mlflow_state(launch_dir, "empty")
    assert run["status"] == "FINISHED"
    assert run["metrics"]["results"] == 0 and run["metrics"]["minibatches"] == 0
