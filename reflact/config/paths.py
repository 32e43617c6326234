"""Where the data.* settings point: the skill, the results and the predictions folder."""

from __future__ import annotations

from pathlib import Path
from typing import cast

from reflact.config.schema import DataConfig


def dataset_paths(data: DataConfig) -> tuple[Path, Path, Path]:
    """(skill, results, predictions), explicit paths winning over those inside data.dir."""
    base = Path(data.dir) if data.dir else None
    # None only when data.skill and data.results are both given (_check_data)
    inside = cast(Path, base)
    skill = Path(data.skill) if data.skill else inside / "skill.md"
    if data.results:
        results = Path(data.results)
    else:
        jsonl = inside / "results.jsonl"
        results = jsonl if jsonl.exists() or not (inside / "results.json").exists() else inside / "results.json"
    if data.predictions:
        predictions = Path(data.predictions)
    else:
        predictions = (base or results.parent) / "predictions"
    return skill, results, predictions
