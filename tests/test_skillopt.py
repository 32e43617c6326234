"""reflact as SkillOpt's reflect stage (reflact.compat.skillopt), proven with SkillOpt itself.

SkillOpt 0.2.0 (a test-only dependency) reads reflact's patches with its own code: the trainer's
support counts (`_normalise_patches`, from `batch_size`) and failure patterns
(`_extract_failure_patterns`, from `failure_summary` in minibatch_fail_*.json), and its
`merge_patches`. Its wheel ships no prompt files: its `load_prompt` gets a stand-in template of
ours. Every model call, reflact's and SkillOpt's merge calls, goes to the loopback test server.
"""

from __future__ import annotations

import inspect
import json
import warnings

import pytest

from reflact.compat.skillopt import run_minibatch_reflect
from tests.conftest import write_dataset

skillopt_reflect = pytest.importorskip("skillopt.gradient.reflect")
aggregate = pytest.importorskip("skillopt.gradient.aggregate")
trainer = pytest.importorskip("skillopt.engine.trainer")


def inputs(tmp_path, n_fail=11, n_succ=6):
    data = write_dataset(tmp_path / "data", n_fail=n_fail, n_succ=n_succ)
    results = [json.loads(line) for line in (data / "results.jsonl").read_text().splitlines()]
    return data, results, (data / "skill.md").read_text()


@pytest.fixture
def endpoint(monkeypatch, server, tmp_path):
    """The OpenAI SDK's variables pointing at the test server, as a SkillOpt user would set them."""
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    monkeypatch.setenv("OPTIMIZER_DEPLOYMENT", "test")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.chdir(tmp_path)  # reflact's default outputs/ (MLflow store, cache) under the test's dir
    return server


def test_it_takes_the_reference_arguments_in_the_reference_order():
    ours = inspect.signature(run_minibatch_reflect).parameters
    theirs = inspect.signature(skillopt_reflect.run_minibatch_reflect).parameters
    assert list(ours)[: len(theirs)] == list(theirs)
    for name, param in theirs.items():
        assert ours[name].kind == param.kind and ours[name].default == param.default, name


def test_skillopt_reads_support_counts_and_failure_descriptions_from_reflacts_patches(tmp_path, endpoint):
    data, results, skill = inputs(tmp_path)
    step_dir = tmp_path / "step_1"
    patches = run_minibatch_reflect(results, skill, str(data / "predictions"), str(step_dir / "patches"), 4, False,
                                    minibatch_size=4, edit_budget=2, random_seed=3)
    assert len(patches) == 3 + 2  # ceil(11/4) failure and ceil(6/4) success minibatches, in plan order
    assert [p["source_type"] for p in patches] == ["failure"] * 3 + ["success"] * 2
    assert sorted(f.name for f in (step_dir / "patches").iterdir()) == [
        "minibatch_fail_000.json", "minibatch_fail_001.json", "minibatch_fail_002.json",
        "minibatch_succ_000.json", "minibatch_succ_001.json"]
    supports = {p["trajectory_ids"][0]: len(p["trajectory_ids"]) for p in patches}

    failure, success = trainer._normalise_patches(patches, "patch")
    assert len(failure) == 3 and len(success) == 2
    for inner in failure + success:
        for item in inner["edits"]:
            first_id = item["content"].split(" from ")[1].split(", ")[0]
            assert item["support_count"] == supports[first_id]  # the minibatch's analysed trajectories
    assert sorted(item["support_count"] for inner in failure for item in inner["edits"]) == [3, 3, 4, 4, 4, 4]

    patterns = trainer._extract_failure_patterns(results, str(step_dir))
    assert patterns and all(": the agent got the amount wrong" in p["pattern"] for p in patterns)


def test_skillopt_merges_reflacts_patches_and_keeps_their_support(tmp_path, endpoint, monkeypatch):
    import skillopt.model as skillopt_model

    data, results, skill = inputs(tmp_path)
    patches = run_minibatch_reflect(results, skill, str(data / "predictions"), str(tmp_path / "patches"), 4, False,
                                    minibatch_size=4, edit_budget=2, random_seed=3)
    supports = {p["trajectory_ids"][0]: p["batch_size"] for p in patches}
    failure, success = trainer._normalise_patches(patches, "patch")
    monkeypatch.setattr(aggregate, "load_prompt", lambda name, env=None: f"Merge the {name} patches into one.")
    skillopt_model.configure_azure_openai(endpoint=endpoint.base_url, api_key="dummy", auth_mode="openai_compatible")
    skillopt_model.set_optimizer_deployment("test")
    before = endpoint.count
    merged = aggregate.merge_patches(skill, failure, success, batch_size=8, verbose=False, workers=2)
    assert endpoint.count > before  # SkillOpt's own merge calls reached the test server
    assert len(merged["edits"]) == 2 * len(patches)  # every kept edit, failures first (its fallback merge)
    for item in merged["edits"]:
        assert item["support_count"] == supports[item["content"].split(" from ")[1].split(", ")[0]]


def test_deprecated_step_buffer_aliases_warn_and_reach_the_prompt(tmp_path, endpoint):
    data, results, skill = inputs(tmp_path, n_fail=2, n_succ=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_minibatch_reflect(results, skill, str(data / "predictions"), str(tmp_path / "patches"), 1, True,
                              rejection_context="tried rule X, rejected", trajectory_memory_context="run 4 looped")
    assert {str(w.message).split(" is")[0] for w in caught if w.category is DeprecationWarning} == {
        "rejection_context", "trajectory_memory_context"}
    user = endpoint.requests[-1]["messages"][1]["content"]
    assert "## Previous Steps in This Epoch\ntried rule X, rejected\nrun 4 looped" in user


def test_a_rerun_resumes_and_returns_the_same_patches(tmp_path, endpoint):
    data, results, skill = inputs(tmp_path, n_fail=5, n_succ=3)
    args = (results, skill, str(data / "predictions"), str(tmp_path / "patches"), 2, False, 4, 1, 9)
    first = run_minibatch_reflect(*args)
    calls = endpoint.count
    again = run_minibatch_reflect(*args)
    assert endpoint.count == calls and again == first
