"""The skill from MLflow's Prompt Registry and the patched skill back into it (issue 34, items 3 and 4):
read verbatim by alias or version, registered as a new version with its tags and alias, no other
alias touched, nothing new on a rerun, and every bad input as one line."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from mlflow import MlflowClient

import reflact
from reflact.core.errors import UserError
from tests.conftest import SKILL, ok, output, run_cli, start_mlflow_server, stop, write_dataset
from tests.test_mlflow_provenance import dataset_with_ids, log_agent_traces

# a skill as users keep them in the registry: template variables that must never be formatted
TEMPLATED = SKILL.replace("## Orders", "## Orders for {{ customer }}\n- Greet {{customer.name}} by name.")


def settings(server, *extra):
    return ["optimizer=compatible", f"optimizer.base_url={server.base_url}", "optimizer.model=test",
            "reflect.minibatch_size=2", "reflect.edit_budget=1", *extra]


def store_of(launch: Path) -> tuple[str, MlflowClient]:
    uri = f"sqlite:///{launch / 'outputs' / 'mlflow.db'}"
    return uri, MlflowClient(tracking_uri=uri, registry_uri=uri)


@pytest.fixture
def registered(launch_dir):
    """The launch dir's store holding `support` v1 (alias production) with a templated skill."""
    _, client = store_of(launch_dir)
    client.register_prompt(name="support", template=TEMPLATED, commit_message="by hand")
    client.set_prompt_alias("support", "production", 1)
    return client


def versions(client: MlflowClient, name: str) -> list:
    return sorted(client.search_prompt_versions(name), key=lambda v: int(v.version))


@pytest.mark.slow  # three runs
def test_the_skill_is_read_by_alias_verbatim_and_the_patched_skill_comes_back_as_a_version(
    tmp_path, server, launch_dir, registered
):
    data = write_dataset(tmp_path / "d", n_fail=2, n_succ=2)
    done = reflact.reflect(data, overrides=settings(server, "data.skill=prompts:/support@production",
                                                    "mlflow.register_skill=true"),
                           run_dir=tmp_path / "run", launch_dir=launch_dir)
    assert done.status == "FINISHED"
    # the optimizer saw the template's braces as written: nothing formatted them
    user = (tmp_path / "run" / "calls" / "minibatch_fail_000" / "user.md").read_text()
    assert "## Orders for {{ customer }}" in user and "{{customer.name}}" in user

    client = registered
    v1, v2 = versions(client, "support")
    assert v1.template == TEMPLATED  # the source is left as it was
    edits = [p["patch"]["edits"] for p in done.patches.values()]
    assert v2.template.startswith(TEMPLATED.split("<!-- SLOW_UPDATE_START -->")[0].rstrip())
    assert "{{ customer }}" in v2.template and all(e[0]["content"] in v2.template for e in edits)
    assert v2.tags["reflact.run_id"] == done.mlflow_run_id
    assert {k: v2.tags[f"reflact.{k}"] for k in ("M", "L", "mode", "seed", "source_version", "edits_kept")} == {
        "M": "2", "L": "1", "mode": "patch", "seed": "42", "source_version": "prompts:/support/1",
        "edits_kept": str(len(edits))}
    n = len(edits)
    assert v2.commit_message.startswith(f"reflact: {n} kept from {n} minibatch(es) ({n} append); patch M2 L1 seed 42")
    # the candidate alias moved to it; production, the user's, did not
    assert client.get_prompt_version_by_alias("support", "reflact-candidate").version == 2
    assert client.get_prompt_version_by_alias("support", "production").version == 1
    # linked to the run, and named on it
    run = client.get_run(done.mlflow_run_id)
    assert run.data.tags["reflact.skill_version"] == "prompts:/support/2"
    linked = json.loads(run.data.tags["mlflow.linkedPrompts"])  # what the run page's prompts list reads
    assert {"name": "support", "version": "2"} in linked

    # the same run again (resumed), and the same settings in a new run dir: nothing new registered
    again = reflact.reflect(data, overrides=settings(server, "data.skill=prompts:/support@production",
                                                     "mlflow.register_skill=true"),
                            run_dir=tmp_path / "run", launch_dir=launch_dir)
    other = reflact.reflect(data, overrides=settings(server, "data.skill=prompts:/support/1",
                                                     "mlflow.register_skill=true"),
                            run_dir=tmp_path / "run2", launch_dir=launch_dir)
    assert again.status == other.status == "FINISHED"
    assert [int(v.version) for v in versions(client, "support")] == [1, 2]
    assert client.get_run(other.mlflow_run_id).data.tags["reflact.skill_version"] == "prompts:/support/2"


def test_a_skill_from_a_file_is_registered_under_skill_name_with_its_own_alias(tmp_path, server, launch_dir):
    data = write_dataset(tmp_path / "d", n_fail=2, n_succ=0)
    done = reflact.reflect(data, overrides=settings(server, "mlflow.register_skill=true",
                                                    "mlflow.skill_name=support.file", "mlflow.skill_alias=try-1"),
                           run_dir=tmp_path / "run", launch_dir=launch_dir)
    _, client = store_of(launch_dir)
    (v1,) = versions(client, "support.file")
    assert v1.tags["reflact.source_version"] == "file" and v1.tags["reflact.run_id"] == done.mlflow_run_id
    (patch,) = done.patches.values()
    assert v1.template.startswith("# Support skill") and patch["patch"]["edits"][0]["content"] in v1.template
    assert client.get_prompt_version_by_alias("support.file", "try-1").version == 1


def test_without_register_skill_nothing_is_registered(tmp_path, server, launch_dir, registered):
    data = write_dataset(tmp_path / "d", n_fail=2, n_succ=0)
    done = reflact.reflect(data, overrides=settings(server, "data.skill=prompts:/support/1"),
                           run_dir=tmp_path / "run", launch_dir=launch_dir)
    assert done.status == "FINISHED"
    assert [int(v.version) for v in versions(registered, "support")] == [1]


def test_the_dataset_input_names_the_prompt_version_it_read(tmp_path, server, launch_dir, registered):
    registered.register_prompt(name="support", template=TEMPLATED + "- One more rule.\n")
    data = write_dataset(tmp_path / "d", n_fail=2, n_succ=0)
    digests = []
    for version in (1, 2):  # the user moves production between the runs
        registered.set_prompt_alias("support", "production", version)
        done = reflact.reflect(data, overrides=settings(server, "data.skill=prompts:/support@production"),
                               run_dir=tmp_path / f"run{version}", launch_dir=launch_dir)
        (dataset_input,) = registered.get_run(done.mlflow_run_id).inputs.dataset_inputs
        digests.append(dataset_input.dataset.digest)
    assert digests[0] != digests[1]  # same folder, another skill: another input


def test_a_full_rewrite_registers_its_one_candidate_and_suggestions_register_nothing(tmp_path, server, launch_dir,
                                                                                     caplog):
    data = write_dataset(tmp_path / "d", n_fail=2, n_succ=0)
    reflact.reflect(data, overrides=settings(server, "reflect.update_mode=full_rewrite", "mlflow.register_skill=true",
                                             "mlflow.skill_name=rewritten"),
                    run_dir=tmp_path / "full", launch_dir=launch_dir)
    _, client = store_of(launch_dir)
    (v1,) = versions(client, "rewritten")
    assert v1.template == "# Skill\n- be careful\n" and v1.tags["reflact.mode"] == "full_rewrite_minibatch"
    with caplog.at_level(logging.WARNING, logger="reflact"):
        reflact.reflect(data, overrides=settings(server, "reflect.update_mode=rewrite", "mlflow.register_skill=true",
                                                 "mlflow.skill_name=suggested"),
                        run_dir=tmp_path / "suggestions", launch_dir=launch_dir)
    assert any("suggestions, not a skill; nothing registered" in r.getMessage() for r in caplog.records)
    assert client.search_prompts(filter_string="name = 'suggested'") == []


def test_a_skill_over_mlflows_limit_is_not_registered_and_one_warning_says_so(tmp_path, server, launch_dir, caplog):
    data = write_dataset(tmp_path / "d", n_fail=2, n_succ=0)
    (data / "skill.md").write_text(SKILL + "- filler line\n" * 8000)  # 112,000 characters
    with caplog.at_level(logging.WARNING, logger="reflact"):
        done = reflact.reflect(data, overrides=settings(server, "mlflow.register_skill=true",
                                                        "mlflow.skill_name=big"),
                               run_dir=tmp_path / "run", launch_dir=launch_dir)
    assert done.status == "FINISHED"
    said = [r.getMessage() for r in caplog.records if "register" in r.getMessage()]
    assert len(said) == 1 and "over MLflow's 100000" in said[0], said
    _, client = store_of(launch_dir)
    assert client.search_prompts(filter_string="name = 'big'") == []
    assert "reflact.skill_version" not in client.get_run(done.mlflow_run_id).data.tags


@pytest.mark.parametrize(("uri", "said"), [
    ("prompts:/support@staging", "alias staging not found"),
    ("prompts:/nosuch@production", "name=nosuch not found"),
    ("prompts:/support/7", "version=7) not found"),
    ("prompts:/chat/1", "is a chat prompt (a list of messages)"),
    ("prompts:/support", "is not a prompt URI"),
])
def test_a_prompt_that_is_not_there_or_not_a_text_is_one_line_naming_the_key(
    tmp_path, server, launch_dir, registered, uri, said
):
    registered.register_prompt(name="chat", template=[{"role": "system", "content": "be {{ tone }}"}])
    data = write_dataset(tmp_path / "d", n_fail=2, n_succ=0)
    with pytest.raises(UserError, match="^data.skill: ") as raised:
        reflact.reflect(data, overrides=settings(server, f"data.skill={uri}", "mlflow.register_skill=true"),
                        run_dir=tmp_path / "run", launch_dir=launch_dir)
    assert said in str(raised.value) and "\n" not in str(raised.value)
    assert server.count == 0 and not (tmp_path / "run").exists()


def test_register_skill_with_a_skill_from_a_file_needs_a_name(tmp_path, server, launch_dir):
    data = write_dataset(tmp_path / "d", n_fail=2, n_succ=0)
    with pytest.raises(UserError, match="mlflow.skill_name"):
        reflact.reflect(data, overrides=settings(server, "mlflow.register_skill=true"),
                        run_dir=tmp_path / "run", launch_dir=launch_dir)
    with pytest.raises(UserError, match="mlflow.skill_alias"):
        reflact.reflect(data, overrides=settings(server, "mlflow.skill_alias=has.dot"),
                        run_dir=tmp_path / "run", launch_dir=launch_dir)


@pytest.mark.slow  # two commands
def test_on_the_command_line_a_missing_alias_or_a_file_store_is_rc_2_and_one_line(tmp_path, server, launch_dir,
                                                                                   registered):
    data = write_dataset(tmp_path / "d", n_fail=2, n_succ=0)
    base = [f"data.dir={data}", *settings(server)]
    missing = run_cli(*base, "data.skill=prompts:/support@champion", "mlflow.register_skill=true", cwd=launch_dir)
    assert missing.returncode == 2, output(missing)
    lines = missing.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("reflact: error: data.skill: prompts:/support@champion")
    assert "Traceback" not in output(missing)
    file_store = (tmp_path / "mlruns").as_uri()
    refused = run_cli(*base, "data.skill=prompts:/support/1", f"mlflow.tracking_uri={file_store}", cwd=launch_dir,
                      env={"MLFLOW_ALLOW_FILE_STORE": ""})
    assert refused.returncode == 2, output(refused)
    assert refused.stderr.strip().splitlines() == [refused.stderr.strip()]
    assert f"data.skill: prompts:/support/1 not read from the Prompt Registry at {file_store}" in refused.stderr
    # nothing registered, no MLflow run left behind
    assert [int(v.version) for v in versions(registered, "support")] == [1]
    assert registered.search_runs([e.experiment_id for e in registered.search_experiments()]) == []
    assert server.count == 0


@pytest.mark.slow
def test_a_sweep_registers_one_version_per_job_with_an_alias_per_cell_listed_on_the_parent(
    tmp_path, server, launch_dir, registered
):
    data = write_dataset(tmp_path / "d", n_fail=4, n_succ=0)
    ok(run_cli("-m", f"data.dir={data}", *settings(server)[:3], "reflect.minibatch_size=2,4",
               "data.skill=prompts:/support@production", "mlflow.register_skill=true",
               "mlflow.skill_alias=reflact-M${reflect.minibatch_size}", cwd=launch_dir))
    client = registered
    new = [v for v in versions(client, "support") if int(v.version) > 1]
    assert len(new) == 2
    by_m = {v.tags["reflact.M"]: v for v in new}
    assert set(by_m) == {"2", "4"}
    for m, version in by_m.items():
        assert client.get_prompt_version_by_alias("support", f"reflact-M{m}").version == version.version
        assert version.tags["reflact.cell"] == f"reflect.minibatch_size={m}"
    assert client.get_prompt_version_by_alias("support", "production").version == 1
    experiment = client.get_run(new[0].tags["reflact.run_id"]).info.experiment_id
    (parent,) = client.search_runs([experiment], filter_string="tags.`reflact.sweep_parent` = 'true'")
    listed = {v for k, v in parent.data.tags.items() if k.startswith("reflact.skill_version.")}
    assert listed == {f"prompts:/support/{v.version}" for v in new}


@pytest.mark.slow  # a real tracking server
def test_through_a_tracking_server_the_skill_comes_and_goes_back_and_the_traces_get_their_feedback(
    tmp_path, server, migrated_store
):
    proc, url = start_mlflow_server(tmp_path, migrated_store)
    try:
        client = MlflowClient(tracking_uri=url, registry_uri=url)
        client.register_prompt(name="support", template=TEMPLATED)
        client.set_prompt_alias("support", "production", 1)
        traces = log_agent_traces(url, 2)
        data = dataset_with_ids(tmp_path / "d", traces)
        done = reflact.reflect(data, overrides=settings(server, "data.skill=prompts:/support@production",
                                                        "mlflow.register_skill=true", f"mlflow.tracking_uri={url}"),
                               run_dir=tmp_path / "run", launch_dir=tmp_path)
        assert done.status == "FINISHED"
        v2 = client.get_prompt_version_by_alias("support", "reflact-candidate")
        assert int(v2.version) == 2 and v2.tags["reflact.run_id"] == done.mlflow_run_id
        assert "{{ customer }}" in v2.template
        assert client.get_prompt_version_by_alias("support", "production").version == 1
        for trace_id in traces:  # both in the one minibatch of two: one feedback each
            (feedback,) = [a for a in client.get_trace(trace_id).info.assessments if a.name == "reflact.edit"]
            assert feedback.metadata["run_id"] == done.mlflow_run_id
    finally:
        stop(proc)
