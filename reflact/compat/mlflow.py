"""reflact as an optimizer for `mlflow.genai.optimize_prompts`:

    from reflact.compat.mlflow import ReflactPromptOptimizer
    result = mlflow.genai.optimize_prompts(
        predict_fn=predict, train_data=data, prompt_uris=["prompts:/support@production"],
        scorers=[correct], optimizer=ReflactPromptOptimizer(["optimizer=openai", "reflect.minibatch_size=4"]),
    )
    result.initial_eval_score, result.final_eval_score, result.optimized_prompts[0]

Each target prompt is a skill. The optimizer scores it with MLflow's `eval_fn` over the training
records, splits them by score into failures and successes (the record's inputs, outputs,
expectations and its scorers' rationales are the trajectory), runs reflact's stage on them with the
configured M, L, mode and model, applies the kept edits, and scores the patched prompt again.
MLflow then registers the version and logs both scores, as it does for GEPA. `eval_fn` is not
thread-safe: it is only ever called from the calling thread. The reflect run nests under the run
optimize_prompts keeps active (reflact.tracking.nesting).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from reflact.core.errors import UserError
from reflact.core.imports import one_at_a_time
from reflact.running.rundir import RunDir
from reflact.tracking.provenance import TRACE_ID
from reflact.tracking.registry import patched_text

with one_at_a_time():
    from mlflow.genai.optimize.optimizers import BasePromptOptimizer
    from mlflow.genai.optimize.types import EvaluationResultRecord, PromptOptimizerOutput


class ReflactPromptOptimizer(BasePromptOptimizer):
    """`overrides`: reflact's settings, as `reflact.reflect` takes them (`reflect.minibatch_size=4`,
    `optimizer=openai`...). A record scoring at or above `success_threshold` is a success.
    `launch_dir`: where the runs' outputs/ go (default: the current directory)."""

    def __init__(
        self,
        overrides: Sequence[str] = (),
        *,
        success_threshold: float = 1.0,
        launch_dir: str | Path | None = None,
    ) -> None:
        if isinstance(overrides, str):
            raise UserError('ReflactPromptOptimizer: overrides must be a list of "key=value" strings')
        self.overrides = list(overrides)
        self.success_threshold = success_threshold
        self.launch_dir = launch_dir
        self.runs: dict[str, Path] = {}  # prompt name -> the reflect run dir that patched it

    def optimize(
        self,
        eval_fn,
        train_data: list[dict[str, Any]],
        target_prompts: dict[str, str],
        enable_tracking: bool = True,
    ) -> PromptOptimizerOutput:
        if eval_fn is None or not train_data:
            raise UserError("ReflactPromptOptimizer needs train_data and scorers: it reflects on scored records")
        initial = eval_fn(dict(target_prompts), train_data)  # this thread only: eval_fn is not thread-safe
        results, conversations = trajectories(initial, self.success_threshold)
        optimized = {
            name: self._patched(name, template, results, conversations, enable_tracking)
            for name, template in target_prompts.items()
        }
        final = eval_fn(dict(optimized), train_data)
        return PromptOptimizerOutput(
            optimized_prompts=optimized,
            initial_eval_score=mean_score(initial),
            final_eval_score=mean_score(final),
            initial_eval_score_per_scorer=per_scorer(initial),
            final_eval_score_per_scorer=per_scorer(final),
        )

    def _patched(self, name: str, template: str, results: list[dict], conversations: dict, tracking: bool) -> str:
        """The prompt with the kept edits of one reflect run over the records applied."""
        from reflact.api import compose, reflect

        cfg = compose(self.overrides)
        cfg.mlflow.enabled = cfg.mlflow.enabled and tracking
        done = reflect(
            results=results, skill=template, conversations=conversations, config=cfg, launch_dir=self.launch_dir
        )
        self.runs[name] = done.run_dir
        if done.status != "FINISHED":
            raise UserError(f"ReflactPromptOptimizer: the reflect run for {name} failed: {done.reason}")
        patched, why = patched_text(template, RunDir(done.run_dir), cfg.reflect.update_mode)
        if patched is None:
            raise UserError(f"ReflactPromptOptimizer: reflect.update_mode={cfg.reflect.update_mode} makes {why}")
        return patched.text


def trajectories(records: list[EvaluationResultRecord], threshold: float) -> tuple[list[dict], dict[str, list]]:
    """The scored records as reflact's results rows and conversations: a record's trace id is its
    id when it has one (so a kept edit's feedback lands on it), else its position."""
    results, conversations = [], {}
    for number, record in enumerate(records):
        if record.score is None or not math.isfinite(float(record.score)):
            raise UserError("ReflactPromptOptimizer needs scorers: a record came back without a score")
        trace_id = getattr(getattr(record.trace, "info", None), "trace_id", None)
        run_id = trace_id if isinstance(trace_id, str) and TRACE_ID.fullmatch(trace_id) else f"record_{number:05d}"
        passed = float(record.score) >= threshold
        reasons = "; ".join(f"{scorer}: {why}" for scorer, why in (record.rationales or {}).items() if why)
        results.append(
            {
                "id": run_id,
                "hard": 1 if passed else 0,
                "score": float(record.score),
                "task_description": _text(record.inputs),
                "fail_reason": "" if passed else reasons or f"scored {float(record.score):g}",
            }
        )
        conversations[run_id] = [
            {"role": "user", "content": _text(record.inputs)},
            {"role": "assistant", "content": _text(record.outputs)},
            *([{"role": "user", "content": f"Expected: {_text(record.expectations)}"}] if record.expectations else []),
            *([{"role": "user", "content": f"Scorers: {reasons}"}] if reasons else []),
        ]
    return results, conversations


def mean_score(records: list[EvaluationResultRecord]) -> float | None:
    scores = [float(r.score) for r in records if r.score is not None]
    return sum(scores) / len(scores) if scores else None


def per_scorer(records: list[EvaluationResultRecord]) -> dict[str, float]:
    sums: dict[str, list[float]] = {}
    for record in records:
        for scorer, value in (record.individual_scores or {}).items():
            sums.setdefault(scorer, []).append(float(value))
    return {scorer: sum(values) / len(values) for scorer, values in sums.items()}


def _text(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
