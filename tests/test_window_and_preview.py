"""The context-window guard, patch previews and the run report, through the stage and pipeline."""

from __future__ import annotations

import json

from reflact.config import parts as config_parts
from reflact.orchestration.experiment import Launch, run_experiment
from reflact.running.rundir import RunDir
from reflact.testing.optimizer_server import Response, chat_body
from tests.conftest import long_dataset, make_config, stage_for, write_dataset


def test_a_minibatch_too_large_for_the_window_is_split_and_merged(tmp_path, server):
    data = long_dataset(tmp_path / "d", n_fail=4, obs_chars=8000)  # ~2,000 tokens per trajectory
    stage = stage_for(tmp_path, server, data, "optimizer.context_window=8000", "optimizer.max_output_tokens=1000",
                      "reflect.edit_budget=3")
    [outcome] = stage.run()
    assert server.count == outcome.parts > 1
    for request in server.requests:
        assert sum(len(m["content"]) for m in request["messages"]) // 4 + 1000 <= 0.9 * 8000
    patch = json.loads((tmp_path / "run" / "patches" / f"{outcome.tag}.json").read_text())
    shown = [i for r in server.requests for i in r["messages"][1]["content"].split("(id: ")[1:]]
    assert len(shown) == 4  # every trajectory went to exactly one part
    assert len(patch["patch"]["edits"]) == 3 and patch["n_proposed"] == 5 * outcome.parts
    assert patch["trajectory_ids"] == outcome.ids


def test_shorten_keeps_one_call_and_cuts_long_items_in_the_middle(tmp_path, server):
    data = long_dataset(tmp_path / "d", n_fail=4, obs_chars=8000)
    stage = stage_for(tmp_path, server, data, "optimizer.context_window=8000", "optimizer.max_output_tokens=1000",
                      "optimizer.context_overflow=shorten")
    [outcome] = stage.run()
    user = server.requests[0]["messages"][1]["content"]
    assert server.count == 1 and outcome.shortened > 0
    assert "characters cut" in user and "HEAD" in user and "TAIL" in user


def test_prompts_that_fit_are_untouched(tmp_path, server):
    data = long_dataset(tmp_path / "d", n_fail=4, obs_chars=100)
    [outcome] = stage_for(tmp_path, server, data, "optimizer.context_window=400000").run()
    assert server.count == 1 and outcome.parts == 1 and not outcome.shortened
    assert "characters cut" not in server.requests[0]["messages"][1]["content"]


def test_preview_and_report_show_what_each_edit_would_do(tmp_path, server):
    data = write_dataset(tmp_path / "d", n_fail=2, n_succ=0)
    edits = [
        {"op": "append", "content": "- Re-read the refund amount before calling refund()."},
        {"op": "replace", "target": "Look up the order before acting on it.", "content": "Look up the order first."},
        {"op": "delete", "target": "not in the skill"},
        {"op": "replace", "target": "Never refund an order with an open dispute.", "content": "x"},
    ]
    reply = {"failure_summary": [{"pattern": "wrong amounts", "trajectories": ["run_00000"]}],
             "patch": {"reasoning": "amounts", "edits": edits}}
    server.script = lambda r, n: Response(body=chat_body(json.dumps(reply)))
    cfg = make_config(f"data.dir={data}", f"optimizer.base_url={server.base_url}", "optimizer.model=test",
                      "optimizer.cache=off", "mlflow.enabled=false")
    summary = run_experiment(config_parts(cfg), {}, tmp_path / "run", Launch(tmp_path)).summary
    run = tmp_path / "run"
    candidate = (run / "preview" / "minibatch_fail_000.skill.md").read_text()
    assert "Look up the order first." in candidate and "Re-read the refund amount" in candidate
    assert candidate.index("Re-read the refund amount") < candidate.index("<!-- SLOW_UPDATE_START -->")
    assert "Never refund an order with an open dispute." in candidate
    diff = (run / "preview" / "minibatch_fail_000.diff").read_text()
    assert "+- Look up the order first." in diff and "-- Look up the order before acting on it." in diff
    statuses = [row["apply"]["status"] for row in RunDir(run).kept_items()]
    assert statuses == ["applied", "applied", "skipped", "skipped"]
    c = summary["counts"]
    assert (c["edits_applied"], c["edits_skipped"], c["apply_share"]) == (2, 2, 0.5)
    report = (run / "report.md").read_text()
    assert "minibatch_fail_000" in report and "wrong amounts" in report and "[skipped: target not found]" in report
    assert "run_00000" in report and "| edit_budget | 4 |" in report
