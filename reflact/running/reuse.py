"""Whether a minibatch's saved patch is reused: the stage decides, the run dir only reads (see
reflact.running.rundir for what a saved patch and record hold)."""

from __future__ import annotations

from pydantic import ValidationError

from reflact.calls.protocol import Usage
from reflact.core.modes import MODES
from reflact.running.outcome import Outcome
from reflact.running.rundir import RunDir


def reused(run_dir: RunDir, outcome: Outcome, fingerprint: str, payload_key: str) -> dict | None:
    """The saved patch when it was made from the same prompt and settings (then `outcome`
    becomes its reused record, keeping what the patch cost when it was made, so a resumed
    run still compares on tokens and cost); None when the minibatch must be (re)done.
    A patch whose payload is not what the stage saves is redone too, never trusted."""
    saved = run_dir.patch(outcome.tag)
    if saved is None or saved["fingerprint"] != fingerprint:
        return None
    items = saved["patch"].get(payload_key)
    if not _kept_items_ok(items, payload_key) or len(items) > saved["n_proposed"]:
        return None
    outcome.status, outcome.parse = "reused", "ok"
    outcome.proposed, outcome.kept = saved["n_proposed"], len(items)
    _take_figures(outcome, run_dir.outcome_record(outcome.tag))
    return saved


def _kept_items_ok(items: object, payload_key: str) -> bool:
    """A list of items that each fit the schema of the mode whose payload this is."""
    mode = next((m for m in MODES.values() if m.payload_key == payload_key), None)
    if mode is None or not isinstance(items, list):
        return False
    try:
        for item in items:
            mode.item.model_validate(item)  # a non-object fails too
    except ValidationError:
        return False
    return True


def _take_figures(outcome: Outcome, earlier: dict | None) -> None:
    """A reused patch's figures from the record of the run that made it (none without one)."""
    if earlier is not None:
        outcome.usage = Usage(**earlier.get("usage", {}))
        outcome.cost_usd = float(earlier.get("cost_usd", 0.0))
        outcome.reasks = int(earlier.get("reasks", 0))
        outcome.latency_s = float(earlier.get("latency_s", 0.0))
