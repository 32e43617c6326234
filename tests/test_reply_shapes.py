"""Replies of odd shapes through the stage and the run report: nothing of value is lost, nothing crashes."""

from __future__ import annotations

import json

import pytest

from reflact.running.outcome import Outcome
from reflact.running.run_report import minibatch_section
from reflact.testing.optimizer_server import Response, chat_body
from tests.conftest import write_dataset
from tests.test_stage import run_stage


def test_notes_survive_a_failure_reply_whose_edits_do_not_validate(tmp_path, server):
    data = write_dataset(tmp_path / "d", n_fail=2, n_succ=0)
    reply = {"failure_summary": [{"pattern": "units"}], "appendix_notes": ["Amounts are in cents: re-read rule 2."],
             "patch": {"reasoning": "one defect", "edits": [{"op": "replace", "content": "no target"}]}}
    server.script = lambda request, number: Response(body=chat_body(json.dumps(reply)))
    [o] = run_stage(tmp_path, server, data, "reflect.skill_aware.enabled=true")
    patch = json.loads((tmp_path / "run" / "patches" / f"{o.tag}.json").read_text())
    assert o.status == "done" and server.count == 1 and (o.proposed, o.kept) == (0, 0)
    assert patch["appendix_notes"] == ["Amounts are in cents: re-read rule 2."] and patch["patch"]["edits"] == []
    assert "target" in patch["patch"]["unusable"]
    assert (tmp_path / "run" / "calls" / o.tag / "reply_1.txt").read_text() == json.dumps(reply)


@pytest.mark.parametrize("notes,shown", [
    (5, []), (None, []), ({"note": "one"}, ["one"]), (["a", 3, {"content": "b"}], ["a", "b"]), ("single", ["single"]),
], ids=["a number", "null", "an object", "a mixed list", "a string"])
def test_run_report_shows_notes_of_any_shape_without_crashing(notes, shown):
    # with skill-aware reflection off the model's appendix_notes are kept as sent, whatever their shape
    outcome = Outcome(tag="minibatch_fail_000", group="failure", index=0, ids=["a"])
    section = minibatch_section(outcome, {"patch": {"reasoning": "r", "edits": []}, "appendix_notes": notes}, [],
                                "edits")
    assert section.startswith("\n### minibatch_fail_000: done")
    listed = section.split("**Appendix notes**\n\n")[1].splitlines() if shown else []
    assert [line.removeprefix("- ") for line in listed] == shown
    assert ("**Appendix notes**" in section) == bool(shown)
