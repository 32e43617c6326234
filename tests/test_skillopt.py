"""reflact as SkillOpt's reflect stage (reflact.compat.skillopt), proven with SkillOpt itself.

SkillOpt 0.2.0 (a test-only dependency) reads reflact's patches with its own code: the trainer's
support counts (`_normalise_patches`, from `batch_size`, given with `support_counts=True`) and failure patterns
(`_extract_failure_patterns`, from `failure_summary` in minibatch_fail_*.json), and its
`merge_patches`. Its wheel ships no prompt files: its `load_prompt` gets a stand-in template of
ours. Every model call, reflact's and SkillOpt's merge calls, goes to the loopback test server.
"""

from __future__ import annotations

import inspect
import json
import os
import warnings

import pytest

from reflact.compat.skillopt import run_minibatch_reflect
from reflact.core.errors import UserError
from tests.conftest import PROJECT, write_dataset

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


@pytest.mark.slow
def test_skillopt_reads_support_counts_and_failure_descriptions_from_reflacts_patches(tmp_path, endpoint):
    data, results, skill = inputs(tmp_path)
    step_dir = tmp_path / "step_1"
    patches = run_minibatch_reflect(results, skill, str(data / "predictions"), str(step_dir / "patches"), 4, False,
                                    minibatch_size=4, edit_budget=2, random_seed=3, support_counts=True)
    assert len(patches) == 3 + 2  # ceil(11/4) failure and ceil(6/4) success minibatches, in plan order
    assert [p["source_type"] for p in patches] == ["failure"] * 3 + ["success"] * 2
    assert sorted(f.name for f in (step_dir / "patches").iterdir()) == [
        "minibatch_fail_000.json", "minibatch_fail_001.json", "minibatch_fail_002.json",
        "minibatch_succ_000.json", "minibatch_succ_001.json"]

    failure, success = trainer._normalise_patches(patches, "patch")
    assert len(failure) == 3 and len(success) == 2
    for inner in failure + success:
        for item in inner["edits"]:  # the stand-in's edit names the minibatch's trajectories
            assert item["support_count"] == len(item["content"].split(" from ")[1].split(", "))
    assert sorted(item["support_count"] for inner in failure for item in inner["edits"]) == [3, 3, 4, 4, 4, 4]

    patterns = trainer._extract_failure_patterns(results, str(step_dir))
    assert patterns and all(": the agent got the amount wrong" in p["pattern"] for p in patterns)


@pytest.mark.slow
def test_skillopt_merges_reflacts_patches_and_keeps_their_support(tmp_path, endpoint, monkeypatch):
    import skillopt.model as skillopt_model

    data, results, skill = inputs(tmp_path)
    patches = run_minibatch_reflect(results, skill, str(data / "predictions"), str(tmp_path / "patches"), 4, False,
                                    minibatch_size=4, edit_budget=2, random_seed=3, support_counts=True)
    failure, success = trainer._normalise_patches(patches, "patch")
    monkeypatch.setattr(aggregate, "load_prompt", lambda name, env=None: f"Merge the {name} patches into one.")
    skillopt_model.configure_azure_openai(endpoint=endpoint.base_url, api_key="dummy", auth_mode="openai_compatible")
    skillopt_model.set_optimizer_deployment("test")
    before = endpoint.count
    merged = aggregate.merge_patches(skill, failure, success, batch_size=8, verbose=False, workers=2)
    assert endpoint.count > before  # SkillOpt's own merge calls reached the test server
    assert len(merged["edits"]) == 2 * len(patches)  # every kept edit, failures first (its fallback merge)
    for item in merged["edits"]:
        assert item["support_count"] == len(item["content"].split(" from ")[1].split(", ")) > 1


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_rerun_resumes_and_returns_the_same_patches(tmp_path, endpoint):
    data, results, skill = inputs(tmp_path, n_fail=5, n_succ=3)
    args = (results, skill, str(data / "predictions"), str(tmp_path / "patches"), 2, False, 4, 1, 9)
    first = run_minibatch_reflect(*args)
    calls = endpoint.count
    again = run_minibatch_reflect(*args)
    assert endpoint.count == calls and again == first


# ------------------------------------------------------------------ installed into SkillOpt, its settings read

NO_MLFLOW = ["mlflow.enabled=false"]  # a plain override over what is read from SkillOpt (and quicker)


@pytest.fixture
def skillopt_settings(monkeypatch, tmp_path):
    """SkillOpt's process-wide optimizer and skill-aware settings, put back after the test; no OPENAI_*."""
    import skillopt.model.azure_openai as so
    import skillopt.optimizer.skill_aware as sa

    for name in [n for n in os.environ if n.startswith(("OPENAI_", "AZURE_OPENAI", "OPTIMIZER_"))]:
        monkeypatch.delenv(name)
    for name in ("OPTIMIZER_AZURE_OPENAI_ENDPOINT", "OPTIMIZER_AZURE_OPENAI_API_KEY",
                 "OPTIMIZER_AZURE_OPENAI_AUTH_MODE", "OPTIMIZER_AZURE_OPENAI_API_VERSION", "OPTIMIZER_DEPLOYMENT"):
        monkeypatch.setenv(name, "")  # SkillOpt writes these: removed again after the test
        monkeypatch.delenv(name)
    for attr in [a for a in vars(so) if a.isupper() or a.startswith("_optimizer")]:
        monkeypatch.setattr(so, attr, getattr(so, attr))
    monkeypatch.setattr(sa, "_RUNTIME", dict(sa._RUNTIME))
    monkeypatch.chdir(tmp_path)
    so.reset_token_tracker()
    return so


def configure(so, endpoint: str, auth_mode: str, key: str = "", deployment: str = "so-model") -> None:
    """As SkillOpt's trainer does from its config."""
    so.configure_azure_openai(optimizer_endpoint=endpoint, optimizer_auth_mode=auth_mode, optimizer_api_key=key or None)
    so.set_optimizer_deployment(deployment)


def test_install_is_what_skillopts_adapters_call_and_uninstall_puts_skillopts_back():
    from reflact.compat import skillopt as compat

    own = skillopt_reflect.run_minibatch_reflect
    with compat.installed():
        import skillopt.gradient
        from skillopt.gradient.reflect import run_minibatch_reflect as seen  # as EnvAdapter.reflect imports it

        assert seen is not own and seen.__wrapped__ is run_minibatch_reflect
        assert skillopt.gradient.run_minibatch_reflect is seen
        compat.install()  # twice: still one level deep
        assert getattr(skillopt_reflect, compat.REPLACED) is own
    assert skillopt_reflect.run_minibatch_reflect is own and skillopt.gradient.run_minibatch_reflect is own


def test_skillopts_openai_compatible_settings_model_key_effort_and_skill_aware_switch_are_used(
        tmp_path, server, skillopt_settings):
    from skillopt.optimizer.skill_aware import configure_skill_aware_reflection

    configure(skillopt_settings, server.base_url + "/", "openai_compatible", key="sk-skillopt-local")
    skillopt_settings.set_reasoning_effort("low")
    configure_skill_aware_reflection(True, "failure_only")
    data, results, skill = inputs(tmp_path, n_fail=2, n_succ=2)
    patches = run_minibatch_reflect(results, skill, str(data / "predictions"), str(tmp_path / "patches"), 2, False,
                                    minibatch_size=2, edit_budget=1, random_seed=1, overrides=NO_MLFLOW)
    assert {(r["model"], r["reasoning_effort"], r["max_completion_tokens"]) for r in server.requests} == {
        ("so-model", "low", 16384)}
    assert set(server.authorizations) == {"Bearer sk-skillopt-local"}
    failure, success = (r["messages"][0]["content"] for r in sorted(
        server.requests, key=lambda r: "## Failed Trajectories" not in r["messages"][1]["content"]))
    assert "## Skill-Aware Reflection" in failure and "## Skill-Aware Reflection" not in success  # failure_only
    assert [p["appendix_notes"] for p in patches if p["source_type"] == "failure"] == [
        ["Follow the verification rule.", "Check units."]]
    summary = skillopt_settings.get_token_summary()  # the trainer's totals hold reflact's calls
    assert summary["analyst"] == {"calls": 2, "prompt_tokens": 200, "completion_tokens": 100, "total_tokens": 300}
    assert not (tmp_path / "outputs").exists() and (tmp_path / "patches.reflact" / "outputs" / "cache.db").exists()


def test_skillopts_azure_key_settings_reach_the_azure_deployment(tmp_path, server, skillopt_settings):
    configure(skillopt_settings, server.base_url.removesuffix("/v1"), "api_key", key="azure-key-123", deployment="dep1")
    data, results, skill = inputs(tmp_path, n_fail=1, n_succ=0)
    run_minibatch_reflect(results, skill, str(data / "predictions"), str(tmp_path / "patches"), 1, True,
                          overrides=NO_MLFLOW)
    assert [r["model"] for r in server.requests] == ["dep1"]
    assert server.authorizations == [None]  # Azure sends its key as api-key, never as a bearer token


def test_skillopts_token_auth_is_refused_in_one_line_before_any_call(tmp_path, server, skillopt_settings):
    from reflact.core.errors import UserError

    configure(skillopt_settings, server.base_url, "azure_cli")
    data, results, skill = inputs(tmp_path, n_fail=1, n_succ=0)
    with pytest.raises(UserError, match="auth mode is 'azure_cli'"):
        run_minibatch_reflect(results, skill, str(data / "predictions"), str(tmp_path / "patches"), 1, True)
    assert server.count == 0


@pytest.mark.parametrize("mode,says", [("azure_ad", "(Azure AD token auth)"),
                                       ("managed_identity", "(Azure AD token auth)"),
                                       ("apikey", "(not a mode SkillOpt knows)")])
def test_an_auth_mode_reflact_cannot_use_is_named_for_what_it_is(tmp_path, server, skillopt_settings, mode, says):
    configure(skillopt_settings, server.base_url, mode)
    data, results, skill = inputs(tmp_path, n_fail=1, n_succ=0)
    with pytest.raises(UserError, match=f"auth mode is '{mode}' ") as refused:
        run_minibatch_reflect(results, skill, str(data / "predictions"), str(tmp_path / "patches"), 1, True)
    assert says in str(refused.value) and "optimizer_azure_openai_auth_mode" in str(refused.value)
    assert server.count == 0


@pytest.mark.parametrize("attribute,key", [("OPTIMIZER_DEPLOYMENT", "optimizer_model"),
                                           ("OPTIMIZER_API_VERSION", "optimizer_azure_openai_api_version"),
                                           ("OPTIMIZER_AUTH_MODE", "optimizer_azure_openai_auth_mode")])
@pytest.mark.parametrize("missing", [None, ""])
def test_a_missing_skillopt_setting_is_named_by_skillopts_key_never_sent_as_none(
        tmp_path, server, skillopt_settings, monkeypatch, attribute, key, missing):
    configure(skillopt_settings, server.base_url.removesuffix("/v1"), "api_key", key="azure-key-123")
    monkeypatch.setattr(skillopt_settings, attribute, missing)
    data, results, skill = inputs(tmp_path, n_fail=1, n_succ=0)
    with pytest.raises(UserError, match=f"SkillOpt's {key} is not set"):
        run_minibatch_reflect(results, skill, str(data / "predictions"), str(tmp_path / "patches"), 1, True,
                              overrides=NO_MLFLOW)
    assert server.count == 0


def test_openai_base_url_and_an_explicit_argument_still_win_over_skillopts_settings(
        tmp_path, server, skillopt_settings, monkeypatch):
    from skillopt.optimizer.skill_aware import configure_skill_aware_reflection

    configure(skillopt_settings, "http://127.0.0.1:9/v1", "openai_compatible")  # nothing listens there
    configure_skill_aware_reflection(True)
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    data, results, skill = inputs(tmp_path, n_fail=1, n_succ=0)
    run_minibatch_reflect(results, skill, str(data / "predictions"), str(tmp_path / "patches"), 1, True,
                          skill_aware_reflection=False, overrides=NO_MLFLOW)
    assert server.count == 1 and server.requests[0]["model"] == "so-model"
    assert "## Skill-Aware Reflection" not in server.requests[0]["messages"][0]["content"]


@pytest.mark.parametrize("source", ["both", "failure_only"])
def test_skillopts_appendix_source_decides_the_success_prompt(tmp_path, server, skillopt_settings, source):
    """SkillOpt's process-wide appendix source is a plain string: `both` gives the success
    template its skill-aware part too, `failure_only` leaves it plain."""
    from skillopt.optimizer.skill_aware import configure_skill_aware_reflection

    configure(skillopt_settings, server.base_url + "/", "openai_compatible", key="sk-skillopt-local")
    configure_skill_aware_reflection(True, source)
    data, results, skill = inputs(tmp_path, n_fail=2, n_succ=2)
    run_minibatch_reflect(results, skill, str(data / "predictions"), str(tmp_path / "patches"), 2, False,
                          minibatch_size=2, edit_budget=1, random_seed=1, overrides=NO_MLFLOW)
    [success] = [r["messages"][0]["content"] for r in server.requests
                 if "## Failed Trajectories" not in r["messages"][1]["content"]]
    plain = (PROJECT / "prompts" / "analyst_success.md").read_text(encoding="utf-8").strip()
    assert (success.strip() != plain) is (source == "both")


def test_an_unknown_appendix_source_is_one_clear_error(tmp_path, server):
    data, results, skill = inputs(tmp_path, n_fail=1, n_succ=1)
    with pytest.raises(UserError, match="skill_aware_appendix_source: 'neither' is not one of both, failure_only"):
        run_minibatch_reflect(results, skill, str(data / "predictions"), str(tmp_path / "patches"), 1, False,
                              skill_aware_reflection=True, skill_aware_appendix_source="neither",
                              overrides=[*NO_MLFLOW, f"optimizer.base_url={server.base_url}", "optimizer.model=t"])


# ---------------------------------------------------------- the patch files, as SkillOpt's own reflect writes them

SUGGESTION = {"type": "clarify", "title": "Units", "motivation": "seen", "instruction": "Say cents.",
              "priority_hint": "high"}
CANDIDATE = {"title": "tighter", "change_summary": ["cents"], "new_skill": "# Skill\n- Amounts are in cents.\n"}
REPLIES = {  # (mode, group) -> the model's reply; a failure of execution lapses only sends notes and no patch
    ("rewrite_from_suggestions", "failure"): {"appendix_notes": ["Re-read the status line."]},
    ("rewrite_from_suggestions", "success"): {"patch": {"reasoning": "r", "revise_suggestions": [SUGGESTION]},
                                              "appendix_notes": []},
    ("full_rewrite_minibatch", "failure"): {"failure_summary": [{"failure_type": "units", "count": 2,
                                                                 "description": "cents"}],
                                            "patch": {"reasoning": "r", "skill_candidates": [CANDIDATE]}},
    ("full_rewrite_minibatch", "success"): {"patch": {"reasoning": "r", "skill_candidates": [CANDIDATE]}},
    ("patch", "failure"): {"patch": {"reasoning": "r", "edits": [{"op": "append", "content": "- é cents"}]},
                           "appendix_notes": [{"note": " Check units. "}, ""]},
    ("patch", "success"): {"patch": {"reasoning": "r", "edits": [{"op": "append", "content": "- keep it"}]}},
    ("rewrite", "failure"): {"patch": {"reasoning": "r", "revise_suggestions": [SUGGESTION]}},  # no notes sent
    ("rewrite", "success"): {"appendix_notes": "not a lapse", "patch": {"reasoning": "r", "revise_suggestions": []}},
}


@pytest.mark.parametrize("mode,source", [("rewrite_from_suggestions", "both"), ("full_rewrite_minibatch", "both"),
                                         ("patch", "failure_only"), ("rewrite", "both")])
def test_the_patch_files_are_byte_for_byte_skillopts_for_the_same_replies(tmp_path, skillopt_settings, mode, source):
    """SkillOpt's lapse-only carrier (its wording, its `edits` key in every mode), `appendix_notes` set
    whenever skill-aware is on (full rewrite included; successes not with `failure_only`), none of
    reflact's bookkeeping, SkillOpt's JSON layout: the files its trainer reads are the ones it would write."""
    from skillopt.optimizer.skill_aware import configure_skill_aware_reflection

    from reflact.testing.optimizer_server import OptimizerServer, Response, chat_body

    def script(request, number):
        group = "failure" if "ROLE failure" in request["messages"][0]["content"] else "success"
        return Response(body=chat_body(json.dumps(REPLIES[mode, group])))

    data, results, skill = inputs(tmp_path, n_fail=2, n_succ=2)
    results.sort(key=lambda r: r["id"])  # reflact sorts before its seeded shuffle; SkillOpt keeps the order given
    args = (results, skill, str(data / "predictions"))
    kwargs = dict(minibatch_size=2, edit_budget=2, random_seed=1, update_mode=mode,
                  error_system="ROLE failure: answer in JSON.", success_system="ROLE success: answer in JSON.")
    with OptimizerServer(script=script) as server:
        configure(skillopt_settings, server.base_url, "openai_compatible")
        configure_skill_aware_reflection(True, source)
        skillopt_reflect.run_minibatch_reflect(*args, str(tmp_path / "theirs"), 1, False, **kwargs)
        ours = run_minibatch_reflect(*args, str(tmp_path / "ours"), 1, False, **kwargs, overrides=NO_MLFLOW)

    names = ["minibatch_fail_000.json", "minibatch_succ_000.json"]
    assert sorted(p.name for p in (tmp_path / "theirs").iterdir()) == names
    for name, patch in zip(names, ours, strict=True):
        theirs = (tmp_path / "theirs" / name).read_bytes()
        assert (tmp_path / "ours" / name).read_bytes() == theirs, name
        assert json.loads(theirs) == patch  # and what reflact returns to the trainer is that patch
    if mode == "rewrite_from_suggestions":
        assert ours[0]["patch"] == {"reasoning": "execution-lapse only", "edits": []}
    if mode == "full_rewrite_minibatch":
        assert [list(p)[-2:] for p in ours] == [["source_type", "appendix_notes"]] * 2
    if source == "failure_only":
        assert "appendix_notes" in ours[0] and "appendix_notes" not in ours[1]
    if mode == "rewrite":  # notes the model did not send: after source_type, as SkillOpt assigns them
        assert list(ours[0])[-2:] == ["source_type", "appendix_notes"] and ours[1]["appendix_notes"] == ["not a lapse"]


@pytest.mark.parametrize("skillopt_on,config_on", [(True, False), (False, True)])
def test_with_a_reflact_config_skillopts_skill_aware_switch_is_not_read(
        tmp_path, server, skillopt_settings, skillopt_on, config_on):
    """The reflact config decides the skill-aware prompt, whatever SkillOpt's process-wide switch says."""
    from skillopt.optimizer.skill_aware import configure_skill_aware_reflection

    from reflact.api import compose

    configure_skill_aware_reflection(skillopt_on, "both")
    cfg = compose(["optimizer=compatible", f"optimizer.base_url={server.base_url}", "optimizer.model=test",
                   *NO_MLFLOW, f"reflect.skill_aware.enabled={str(config_on).lower()}"])
    data, results, skill = inputs(tmp_path, n_fail=1, n_succ=0)
    run_minibatch_reflect(results, skill, str(data / "predictions"), str(tmp_path / "patches"), 1, True, config=cfg)
    [request] = server.requests
    assert ("## Skill-Aware Reflection" in request["messages"][0]["content"]) is config_on
