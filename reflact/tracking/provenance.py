"""Provenance on the source traces: a `reflact.edit` feedback on each trace of a kept edit's minibatch.

When the run's task ids are MLflow trace ids (data read from traces), each kept item leaves a
feedback (source CODE) on every trace of its minibatch: its value the item, its metadata the run,
the minibatch and the item's index. `search_traces` with a filter on `feedback.reflact.edit` then
finds the traces that caused edits. A task id that is no trace of the store is left alone; a
feedback already there (a rerun, a relog) is not written again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re

from reflact.core.imports import one_at_a_time
from reflact.tracking.process import RunContext

log = logging.getLogger("reflact")

NAME = "reflact.edit"
SOURCE_ID = "reflact"
# MLflow 3's trace ids; any other task id is no trace and is never looked up
TRACE_ID = re.compile(r"tr-[0-9a-f]{32}")


def edit_feedback(store, c: RunContext) -> int:
    """Writes the missing feedback; returns how many were written."""
    with one_at_a_time():
        from mlflow.entities import AssessmentSource, Feedback
        from mlflow.tracing.client import TracingClient

    # the traces' own store: data.mlflow.tracking_uri when they were read from another one
    tracing = TracingClient(c.data.mlflow.tracking_uri or store.uri)
    traces: dict[str, set[tuple[str, str, str]] | None] = {}  # trace id -> its reflact.edit keys (None: no trace)
    written = 0
    for row in c.run_dir.kept_items():
        item = json.dumps(row["item"], ensure_ascii=False, sort_keys=True)
        key = (row["minibatch"], str(row["position"]), hashlib.sha256(item.encode("utf-8")).hexdigest()[:16])
        for trace_id in row["trajectory_ids"]:
            if not TRACE_ID.fullmatch(trace_id):
                continue
            if trace_id not in traces:
                traces[trace_id] = _held(tracing, trace_id)
            held = traces[trace_id]
            if held is None or key in held:
                continue
            metadata = {"run_id": store.run_id, "minibatch": key[0], "edit_index": key[1], "edit_hash": key[2]}
            feedback = Feedback(
                name=NAME,
                value=item,
                source=AssessmentSource(source_type="CODE", source_id=SOURCE_ID),
                rationale=f"kept by reflact run {store.run_id} from minibatch {key[0]} (item {key[1]})",
                metadata=metadata,
            )
            tracing.log_assessment(trace_id, feedback)
            held.add(key)
            written += 1
    if written:
        log.info("%d %s feedback(s) on the source traces", written, NAME)
    return written


def _held(tracing, trace_id: str) -> set[tuple[str, str, str]] | None:
    """The (minibatch, index, hash) of the reflact.edit feedback the trace holds; None when no such trace."""
    try:
        info = tracing.get_trace_info(trace_id)  # its assessments, not its spans
    except Exception:  # noqa: BLE001  # not a trace of this store
        return None
    return {
        (a.metadata.get("minibatch", ""), a.metadata.get("edit_index", ""), a.metadata.get("edit_hash", ""))
        for a in info.assessments
        if a.name == NAME and a.metadata
    }
