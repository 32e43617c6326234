"""`report.md` in the run dir: the run readable without MLflow.

Settings, counts, then per minibatch its trajectory ids, the model's summary of what failed
or worked, and its kept items with their apply status.
"""

from __future__ import annotations

import json
import shutil
from typing import TextIO

from reflact.core.groups import named
from reflact.core.text import markdown_table, one_line
from reflact.replies.patches import normalize_notes
from reflact.running.outcome import Outcome
from reflact.running.rundir import RunDir

SNIPPET = 400  # characters of an item's text shown; the whole item is in the patch file


def write_run_report(run_dir: RunDir, summary: dict, sections: TextIO) -> None:
    """The head (settings, counts), then the minibatches' sections, copied from `sections`."""
    with run_dir.report_writer() as handle:
        handle.write(_head(run_dir.root.name, summary))
        shutil.copyfileobj(sections, handle)


def minibatch_section(o: Outcome, patch: dict | None, rows: list[dict], payload_key: str) -> str:
    """One minibatch: status, trajectories, the model's summary and reasoning, its kept items."""
    ids = ", ".join(f"`{i}`" for i in o.ids)
    lines = [f"### {o.tag}: {o.status}", "", f"Trajectories ({o.analysed} analysed): {ids}"]
    if o.error:
        lines += ["", f"Error: {o.error}"]
    if patch is not None:
        lines += _patch_lines(o, patch, rows, payload_key)
    return "\n" + "\n".join(lines) + "\n"


def _head(name: str, summary: dict) -> str:
    s, c = summary["settings"], summary["counts"]
    lines = ["# reflact run report", "", f"Run dir: `{name}`", "", "## Settings", ""]
    lines += markdown_table(["setting", "value"], [[k, _short(v)] for k, v in s.items() if k != "template_hashes"])
    lines += ["", "Template hashes: " + ", ".join(f"{g} `{h}`" for g, h in s["template_hashes"].items()), ""]
    lines += ["## Counts", ""]
    lines += markdown_table(["count", "value"], [[k, _count(v)] for k, v in c.items()])
    if summary["skipped"]:
        lines += ["", "Skipped runs: " + ", ".join(f"`{i}` ({why})" for i, why in sorted(summary["skipped"].items()))]
    if "unused_trajectories" in summary:  # reflect.provenance
        unused = summary["unused_trajectories"]
        lines += ["", "Trajectories no kept item stands on: " + (", ".join(f"`{i}`" for i in unused) or "none")]
    lines += ["", "## Minibatches"]
    return "\n".join(lines) + "\n"


def _count(value: object) -> str:
    if value is None:  # a cost without a price for the model
        return "unknown (no price for the model)"
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def _patch_lines(o: Outcome, patch: dict, rows: list[dict], payload_key: str) -> list[str]:
    lines = []
    group = named(o.group)
    patterns = patch.get(group.summary_key)
    if patterns:
        lines += ["", f"**{group.summary_title}**", ""]
        for p in patterns if isinstance(patterns, list) else [patterns]:
            lines.append(f"- {_pattern(p)}")
    reasoning = (patch.get("patch") or {}).get("reasoning")
    if reasoning:
        lines += ["", f"**Reasoning**: {_short(reasoning)}"]
    lines += ["", f"**Kept {payload_key}** ({o.kept} of {o.proposed} proposed)", ""]
    for row in rows:
        status = row.get("apply", {})
        tag = f" [{status['status']}{': ' + status['reason'] if status.get('reason') else ''}]" if status else ""
        lines.append(f"{row['position'] + 1}. {_item(row['item'])}{tag}")
    notes = normalize_notes(patch.get("appendix_notes"))  # raw from the model when notes were not asked for
    if notes:
        lines += ["", "**Appendix notes**", ""] + [f"- {_short(n)}" for n in notes]
    return lines


def _pattern(p: object) -> str:
    if not isinstance(p, dict):
        return _short(p)
    names = ("failure_type", "pattern", "name")
    name = next((p[k] for k in names if p.get(k)), "")
    rest = {k: v for k, v in p.items() if k not in names}
    return f"**{_short(name)}**: " + "; ".join(f"{k}: {_short(v)}" for k, v in rest.items())


def _item(item: object) -> str:
    if not isinstance(item, dict):
        return _short(item)
    head = item.get("op") or item.get("type") or item.get("title") or "item"
    rest = {k: v for k, v in item.items() if k not in ("op", "type")}
    return f"`{head}` " + "; ".join(f"{k}: {_short(v)}" for k, v in rest.items())


def _short(value: object) -> str:
    return one_line(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False), SNIPPET)
