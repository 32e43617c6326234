"""The names of what a run counts: minibatch statuses and the run metrics of summary.json and
MLflow (config checks `optimized_metric` against them before any call)."""

# done: a new patch; reused: a matching saved patch; failed: no usable reply; skipped: nothing to
# show; not_run: the cost limit was reached first; dry_run: estimated, not called
STATUSES = ("done", "reused", "failed", "skipped", "not_run", "dry_run")

# every run count in summary.json and MLflow; the apply counts in patch mode only
APPLY_METRICS = ("edits_applied", "edits_fallback", "edits_skipped", "apply_share")
PROVENANCE_METRICS = ("edits_supported", "support_share", "trajectories_unused")  # with reflect.provenance
TRACE_METRICS = ("unlabelled",)  # with data.source=mlflow
RUN_METRICS = (
    "results",
    "failures",
    "successes",
    "skipped",
    "minibatches",
    *(f"minibatches_{s}" for s in STATUSES),
    "calls",
    "failed_calls",
    "reasks",
    "retries",
    "cache_hits",
    "edits_proposed",
    "edits_kept",
    "edits_truncated",
    "tokens_prompt",
    "tokens_cached",
    "tokens_completion",
    "tokens_reasoning",
    "cost_usd",
    "spent_usd",
    "wall_time_s",
    *APPLY_METRICS,
    *PROVENANCE_METRICS,
    *TRACE_METRICS,
)
