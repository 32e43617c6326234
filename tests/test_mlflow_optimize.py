"""reflact as an optimizer for mlflow.genai.optimize_prompts (issue 34, item 7): the starting prompt
scored, the records split by score, reflact's stage run on them, the patch applied, the patched
prompt scored again; MLflow registers it and gets both scores."""

from __future__ import annotations

import json

import mlflow
import pytest
from mlflow.genai.scorers import scorer

from reflact.compat.mlflow import ReflactPromptOptimizer
from reflact.core.errors import UserError


@scorer
def follows_a_rule(outputs, expectations) -> bool:
    return outputs == expectations["expected_response"]


@pytest.fixture
def store(launch_dir, tmp_path):
    """The global tracking URI (optimize_prompts writes there) on a migrated sqlite store."""
    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{launch_dir / 'outputs' / 'mlflow.db'}")
    # its artifacts under tmp_path (MLflow's default is ./mlruns of the current directory)
    mlflow.set_experiment(experiment_id=mlflow.create_experiment("optimize", (tmp_path / "art").as_uri()))
    yield
    mlflow.set_tracking_uri(before)


def predict(question: str) -> str:
    """An agent that answers well once its prompt holds a rule (the stand-in appends `- rule ...`)."""
    prompt = mlflow.genai.load_prompt("prompts:/qa/1")
    text = prompt.format(question=question)
    return "ruled" if "- rule 0" in text else "guessed"


def test_optimize_prompts_with_reflact_returns_both_scores_and_registers_the_patched_prompt(tmp_path, server, store):
    mlflow.genai.register_prompt(name="qa", template="Answer {{question}} plainly.\n- Be brief.\n")
    data = [{"inputs": {"question": f"q{i}"}, "outputs": "ruled"} for i in range(4)]
    optimizer = ReflactPromptOptimizer(
        ["optimizer=compatible", f"optimizer.base_url={server.base_url}", "optimizer.model=test",
         "reflect.minibatch_size=2", "reflect.edit_budget=1"],
        launch_dir=tmp_path,
    )
    result = mlflow.genai.optimize_prompts(predict_fn=predict, train_data=data, prompt_uris=["prompts:/qa/1"],
                                           optimizer=optimizer, scorers=[follows_a_rule])
    assert result.initial_eval_score == 0.0 and result.final_eval_score == 1.0
    assert result.initial_eval_score_per_scorer == {"follows_a_rule": 0.0}
    assert result.final_eval_score_per_scorer == {"follows_a_rule": 1.0}
    (version,) = result.optimized_prompts
    assert version.name == "qa" and int(version.version) == 2
    # the template's variable kept as written, the kept edits applied after the source's lines
    assert version.template.startswith("Answer {{question}} plainly.\n- Be brief.\n")
    assert "- rule 0 from " in version.template
    # four failures in two minibatches of two: reflact's run over them, kept beside its outputs
    assert server.count == 2 and (optimizer.runs["qa"] / "summary.json").is_file()
    # nested under the run optimize_prompts kept active, which holds both scores
    reflect_run = mlflow.get_run(json.loads((optimizer.runs["qa"] / "mlflow_run.json").read_text())["run_id"])
    outer = mlflow.get_run(reflect_run.data.tags["mlflow.parentRunId"])
    assert outer.data.metrics.get("final_eval_score") == 1.0, outer.data.metrics


def test_without_scorers_it_says_it_needs_them(tmp_path, server, store):
    optimizer = ReflactPromptOptimizer(["optimizer=compatible", f"optimizer.base_url={server.base_url}",
                                        "optimizer.model=test"], launch_dir=tmp_path)
    with pytest.raises(UserError, match="needs train_data and scorers"):
        optimizer.optimize(None, [], {"qa": "text"})
