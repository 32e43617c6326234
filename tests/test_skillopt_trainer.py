"""SkillOpt 0.2.0's own training loop with reflact as its reflect stage, installed by the documented line.

`ReflACTTrainer.train` runs two steps on a replay environment (tests/skillopt_replay.py), its
optimizer the loopback server, configured only the way SkillOpt users configure SkillOpt (its
config's optimizer endpoint, auth mode, key, model, reasoning effort, skill-aware switch; no
OPENAI_* variable). Once with SkillOpt's own reflect, once after `reflact.compat.skillopt.install()`:
every file the trainer writes is byte for byte the same (timing values aside), in every update mode,
with skill-aware reflection on and off, at SkillOpt's default number of workers and at one, each run
in its own process as a user runs it (tests/skillopt_fidelity.py). With `support_counts=True` the same
apart from the support counts; the analyst requests carry the same reasoning_effort, and the trainer's
call and token totals count reflact's analyst calls.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from reflact.testing.optimizer_server import OptimizerServer
from tests import skillopt_fidelity as fidelity
from tests import skillopt_replay as replay

pytest.importorskip("skillopt.engine.trainer")
pytest.importorskip("skillopt.envs.base")
import skillopt.engine.trainer as trainer_module
import skillopt.gradient.reflect as skillopt_reflect
import skillopt.model.azure_openai as skillopt_openai
import skillopt.optimizer.skill_aware as skill_aware
import skillopt.prompts as skillopt_prompts

from reflact.compat import skillopt as compat

TIMINGS = {"timing", "wall_time_s", "total_wall_time_s", "total_wall_s", "wall_s", "elapsed_s", "timestamp"}
# the one documented difference: reflact's patches say how many trajectories each stands on
# (`batch_size`, which SkillOpt's trainer reads as an item's support); SkillOpt's own leave it at 1
SUPPORT = {"support_count", "support_counts"}
# what the reflect stage itself leaves: its patches (reflact's carry more bookkeeping) and reflact's record
OWN = ("patches", "patches.reflact")


# one worker: SkillOpt's own reflect returns its patches in completion order, which is then its
# order by index only with one worker (reflact's order is the plan's with any number)
ReplayAdapter = replay.adapter_class(workers=1, minibatch_size=3)


def trainer_config(out_root: Path, server: OptimizerServer, mode: str) -> dict:
    """As a SkillOpt user writes it: the optimizer endpoint and auth in SkillOpt's own keys."""
    skill = out_root.parent / "skill_init.md"
    skill.write_text(replay.SKILL)
    return {
        "out_root": str(out_root), "skill_init": str(skill), "env": "replay",
        "optimizer_azure_openai_endpoint": server.base_url, "optimizer_azure_openai_auth_mode": "openai_compatible",
        "optimizer_azure_openai_api_key": "sk-local-test", "optimizer_model": "skillopt-test-model",
        "target_model": "unused", "reasoning_effort": "medium",
        "batch_size": 6, "num_epochs": 1, "accumulation": 1, "seed": 7, "train_size": 12,
        "merge_batch_size": 2, "edit_budget": 3, "min_edit_budget": 2, "sel_env_num": 4, "analyst_workers": 1,
        "skill_update_mode": mode, "use_skill_aware_reflection": True, "skill_aware_appendix_source": "both",
        "rewrite_reasoning_effort": "high", "eval_test": False, "use_gate": True,
    }


@pytest.fixture
def skillopt_process(monkeypatch, tmp_path):
    """SkillOpt's process-wide settings put back after the test; its prompts are our stand-ins."""
    for name in [n for n in os.environ if n.startswith(("OPENAI_", "AZURE_OPENAI", "OPTIMIZER_", "TARGET_"))]:
        monkeypatch.delenv(name)
    for name in ("OPTIMIZER_AZURE_OPENAI_ENDPOINT", "OPTIMIZER_AZURE_OPENAI_API_KEY",
                 "OPTIMIZER_AZURE_OPENAI_AUTH_MODE",
                 "OPTIMIZER_AZURE_OPENAI_API_VERSION", "OPTIMIZER_DEPLOYMENT", "TARGET_DEPLOYMENT",
                 "AZURE_OPENAI_DEPLOYMENT", "REFLACT_CODEX_TRACE_TO_OPTIMIZER"):
        monkeypatch.setenv(name, "")  # the trainer writes these; monkeypatch removes them afterwards
        monkeypatch.delenv(name)
    for attr in [a for a in vars(skillopt_openai) if a.isupper() or a.startswith("_optimizer")]:
        monkeypatch.setattr(skillopt_openai, attr, getattr(skillopt_openai, attr))
    monkeypatch.setattr(skill_aware, "_RUNTIME", dict(skill_aware._RUNTIME))
    monkeypatch.setattr(skillopt_reflect, "run_minibatch_reflect", skillopt_reflect.run_minibatch_reflect)
    replay.write_templates(tmp_path / "prompts")
    monkeypatch.setattr(skillopt_prompts, "_PROMPTS_DIR", str(tmp_path / "prompts"))
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    compat.uninstall()


def train(server: OptimizerServer, out_root: Path, mode: str, with_reflact: bool) -> tuple[dict, list[dict]]:
    """The trainer's token summary and the requests the server saw during the run."""
    skillopt_openai.reset_token_tracker()
    cfg = trainer_config(out_root, server, mode)
    before = server.count
    if with_reflact:
        compat.install(support_counts=True)
    try:
        trainer_module.ReflACTTrainer(cfg, ReplayAdapter()).train()
    finally:
        compat.uninstall()
    return skillopt_openai.get_token_summary(), server.requests[before:]


def written(out_root: Path) -> dict[str, object]:
    """Every file the trainer wrote (not the reflect stage's own), timings left out."""
    files = {}
    for path in sorted(out_root.rglob("*")):
        rel = path.relative_to(out_root)
        if path.is_dir() or any(part in OWN for part in rel.parts):
            continue
        text = path.read_text().replace(str(out_root), "<out_root>")
        files[str(rel)] = _without_timings(json.loads(text)) if path.suffix == ".json" else text
    return files


def _without_timings(value, leave=TIMINGS | SUPPORT):
    if isinstance(value, dict):
        return {k: _without_timings(v, leave) for k, v in value.items() if k not in leave}
    if isinstance(value, list):
        return [_without_timings(v, leave) for v in value]
    return value


def support_counts(out_root: Path) -> list[list[int]]:
    return [step.get("support_counts", []) for step in json.loads((out_root / "history.json").read_text())]


def analyst_requests(requests: list[dict]) -> list[dict]:
    return [r for r in requests if "ROLE analyst" in r["messages"][0]["content"]]


# SkillOpt's default workers and M (one failure and one success minibatch a step); seed 4 gives a step
# whose failures are execution lapses only (SkillOpt's carrier) and a step that changes the skill
DEFAULT = {"workers": fidelity.DEFAULT_WORKERS, "minibatch_size": 8, "seed": 4}
ONE_WORKER = {"workers": 1, "minibatch_size": 3, "seed": 7}  # two failure minibatches a step, two carriers


@pytest.mark.slow
@pytest.mark.parametrize("setup", [
    *(fidelity.Setup(mode, aware, **DEFAULT) for mode in fidelity.MODES for aware in (True, False)),
    fidelity.Setup("rewrite_from_suggestions", True, **ONE_WORKER),
], ids=str)
def test_every_file_skillopts_trainer_writes_is_the_same_byte_for_byte_with_reflact(tmp_path, setup):
    with OptimizerServer(script=replay.answer) as server:
        pair = fidelity.train_both(tmp_path, server.base_url, setup)

    compared = fidelity.compare(pair.theirs, pair.ours)
    assert [c for c in compared if not c.identical] == []
    assert len(compared) > 40 and len(json.loads((pair.ours / "history.json").read_text())) == 2
    # timing values are the only thing set aside, in the trainer's records alone
    records = {"history.json", "step_record.json", "summary.json"}
    assert {c.name.rsplit("/", 1)[-1] for c in compared if c.why} <= records
    # reflact made the patches: its record beside each step's, and none from SkillOpt's reflect
    for step in ("step_0001", "step_0002"):
        assert (pair.ours / "steps" / step / "patches.reflact" / "summary.json").exists()
    assert not list(pair.theirs.rglob("patches.reflact"))
    patches = {path.relative_to(pair.ours): path.read_text() for path in pair.ours.glob("steps/*/patches/*.json")}
    assert patches
    carriers = [text for text in patches.values() if '"reasoning": "execution-lapse only"' in text]
    if setup.skill_aware and setup.mode != "full_rewrite_minibatch":
        # SkillOpt's carrier of a lapse-only failure minibatch, its wording and its key in every mode
        assert carriers and all('"edits": []' in text for text in carriers)
    else:
        assert not carriers
    # SkillOpt sets appendix_notes whenever skill-aware is on, in full rewrite too (empty there)
    assert all(('"appendix_notes"' in text) == setup.skill_aware for text in patches.values())
    assert not any('"batch_size"' in text or text.endswith("\n") for text in patches.values())


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["patch", "rewrite_from_suggestions", "full_rewrite_minibatch"])
def test_skillopts_trainer_runs_the_same_with_reflact_installed(skillopt_process, mode):
    with OptimizerServer(script=replay.answer) as server:
        theirs, their_requests = train(server, skillopt_process / "skillopt", mode, with_reflact=False)
        ours, our_requests = train(server, skillopt_process / "reflact", mode, with_reflact=True)

    their_files, our_files = written(skillopt_process / "skillopt"), written(skillopt_process / "reflact")
    assert len([f for f in their_files if f.startswith("steps/step_")]) > 0
    assert sorted(their_files) == sorted(our_files)
    for name in their_files:
        assert our_files[name] == their_files[name], name
    # an item that kept its support through the merge: 1 from SkillOpt's reflect, its minibatch's from reflact's
    pairs = [(o, t) for ours_step, their_step in zip(support_counts(skillopt_process / "reflact"),
                                                    support_counts(skillopt_process / "skillopt"), strict=True)
             for o, t in zip(ours_step, their_step, strict=True)]
    assert all(o == t == 0 or (t == 1 and 1 <= o <= ReplayAdapter.minibatch_size) for o, t in pairs)
    assert mode == "full_rewrite_minibatch" or any(o > 1 for o, _ in pairs)
    if mode == "patch":  # the update appended the edit whose target was missing
        files = (skillopt_process / "reflact").glob("steps/*/edit_apply_report.json")
        reports = [json.loads(path.read_text()) for path in files]
        assert any(row["status"].startswith("applied_insert_after_fallback") for rows in reports for row in rows)
    history = json.loads((skillopt_process / "reflact" / "history.json").read_text())
    assert len(history) == 2
    assert (mode == "full_rewrite_minibatch") != any(step.get("n_appendix_notes_added") for step in history)

    # reflact's calls went where SkillOpt's went, as SkillOpt's would: model, effort, key
    ours_analyst, theirs_analyst = analyst_requests(our_requests), analyst_requests(their_requests)
    assert ours_analyst and len(ours_analyst) == len(theirs_analyst)
    assert {(r["model"], r.get("reasoning_effort")) for r in ours_analyst} == {("skillopt-test-model", "medium")}
    assert {(r["model"], r.get("reasoning_effort")) for r in theirs_analyst} == {("skillopt-test-model", "medium")}
    assert all("## Skill-Aware Reflection" in r["messages"][0]["content"] for r in ours_analyst
               if "ROLE analyst error" in r["messages"][0]["content"] and mode != "full_rewrite_minibatch")

    # the trainer's totals: the same calls; its tokens hold what the server reported for reflact's calls
    assert ours["_total"]["calls"] == theirs["_total"]["calls"] == len(our_requests)
    assert ours["analyst"] == theirs["analyst"]
    assert ours["analyst"]["prompt_tokens"] == 100 * len(ours_analyst)  # the server's usage, per call
    # reflact's record stays beside the patches; nothing in the trainer's working directory
    for step in ("step_0001", "step_0002"):  # each step its own record and MLflow run, in its folder
        record = skillopt_process / "reflact" / "steps" / step / "patches.reflact"
        assert (record / "summary.json").exists() and (record / "outputs" / "mlflow.db").exists()
        assert json.loads((record / "mlflow_run.json").read_text())["status"] == "FINISHED"
    assert not (skillopt_process / "outputs").exists()
    if mode != "full_rewrite_minibatch":  # skill-aware reflection is not applied there, by either
        assert_same_carriers(skillopt_process)


def assert_same_carriers(root: Path) -> None:
    """A failure minibatch of execution lapses only leaves SkillOpt's carrier: notes, no edits, no patterns."""
    carriers = {}
    for side in ("skillopt", "reflact"):
        for path in sorted((root / side).glob("steps/*/patches/minibatch_fail_*.json")):
            patch = json.loads(path.read_text())
            if not next(v for k, v in patch["patch"].items() if k != "reasoning"):
                carriers.setdefault(side, []).append(patch)
    assert carriers.get("skillopt"), "the stand-in optimizer sends a lapse-only reply at least once"
    assert [sorted(p) for p in carriers["reflact"]] == [sorted(p) for p in carriers["skillopt"]]
    assert [p["appendix_notes"] for p in carriers["reflact"]] == [p["appendix_notes"] for p in carriers["skillopt"]]
