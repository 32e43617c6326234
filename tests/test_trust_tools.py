"""The after-the-fact tools on damaged input: analyze and relog on damaged run dirs, the importer's
file sizes, the report on a sweep that is not there, a whitespace-led results.json, and the
analysis's budget in work."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reflact
from reflact import analyze, relog
from reflact.analysis.figures import analyse_run_dir, load_run
from reflact.analysis.matching import MAX_COMPARED_CHARS, item_key, match, match_chunks
from reflact.config import DataConfig
from reflact.core.shipped import demo_dir
from reflact.inputs.dataset import load_dataset, load_results
from reflact.inputs.importers import main as import_main
from reflact.running.rundir import RunDir
from reflact.sweeps.grid_report import main as report_main
from tests.conftest import write_dataset


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished run dir of the demo (kept items, analysis.json, saved config), made once."""
    from reflact.testing.optimizer_server import OptimizerServer

    root = tmp_path_factory.mktemp("finished")
    with OptimizerServer() as server:
        done = reflact.reflect(demo_dir(), run_dir=root / "run", launch_dir=root, overrides=[
            "optimizer=compatible", f"optimizer.base_url={server.base_url}", "optimizer.model=test",
            "mlflow.enabled=false"])
    assert done.status == "FINISHED" and (root / "run" / "kept_items.jsonl").is_file()
    return root / "run"


def summary_edit(change):
    def damage(rd: Path) -> None:
        summary = json.loads((rd / "summary.json").read_text())
        change(summary)
        (rd / "summary.json").write_text(json.dumps(summary))
    return damage


def replaced(name: str, text: str | bytes):
    def damage(rd: Path) -> None:
        path = rd / name
        path.write_bytes(text) if isinstance(text, bytes) else path.write_text(text)
    return damage


DAMAGE = {
    "minibatch not an object": summary_edit(lambda s: s["minibatches"].__setitem__(0, 5)),
    "minibatch without status": summary_edit(lambda s: s["minibatches"][0].pop("status")),
    "usage with an unknown key": summary_edit(lambda s: s["minibatches"][0].__setitem__("usage", {"bogus": 1})),
    "counts a list": summary_edit(lambda s: s.__setitem__("counts", [])),
    "counts missing": summary_edit(lambda s: s.pop("counts")),
    "cost a word": summary_edit(lambda s: s["counts"].__setitem__("cost_usd", "abc")),
    "settings a list": summary_edit(lambda s: s.__setitem__("settings", [1])),
    "seed a word": summary_edit(lambda s: s["settings"].__setitem__("seed", "abc")),
    "times a word": summary_edit(lambda s: s.__setitem__("times", "x")),
    "saved threshold 0": replaced("analysis.json", json.dumps({"matcher": "lexical", "threshold": 0})),
    "saved threshold a list": replaced("analysis.json", json.dumps({"matcher": "lexical", "threshold": [1]})),
    "kept items nested too deep": replaced("kept_items.jsonl", "[" * 100_000 + "]" * 100_000 + "\n"),
    "kept items not UTF-8": replaced("kept_items.jsonl", b"\xff\xfe\n"),
    "config not YAML": replaced(".hydra/config.yaml", "a: [\n"),
    "config a list": replaced(".hydra/config.yaml", "- 1\n"),
    "config not UTF-8": replaced(".hydra/config.yaml", b"\xff\xfe\x00"),
    "config with an unknown key": replaced(".hydra/config.yaml", "bogus: 1\n"),
}
# what relog reads that analyze does not, and the other way round
RELOG_ONLY = {"hydra.yaml not YAML": replaced(".hydra/hydra.yaml", "hydra: [\n"),
              "started_at a word": summary_edit(lambda s: s.__setitem__("times", {"started_at": "x"}))}
ANALYZE_ONLY = ("saved threshold 0", "saved threshold a list", "kept items nested too deep", "kept items not UTF-8")


def one_line_exit_2(command, argv, capsys) -> str:
    with pytest.raises(SystemExit) as ended:
        command(argv)
    err = capsys.readouterr().err.strip()
    assert ended.value.code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def damaged_copy(finished: Path, tmp_path: Path, damage) -> Path:
    rd = tmp_path / "run"
    shutil.copytree(finished, rd)
    damage(rd)
    return rd


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_analyze_on_a_damaged_run_dir_is_one_line_and_exit_2(finished, tmp_path, capsys, kind):
    rd = damaged_copy(finished, tmp_path, DAMAGE[kind])
    err = one_line_exit_2(analyze.main, [str(rd), "--out", str(tmp_path / "out")], capsys)
    assert str(rd) in err and not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", [k for k in DAMAGE if k not in ANALYZE_ONLY] + list(RELOG_ONLY))
def test_relog_on_a_damaged_run_dir_is_one_line_and_exit_2(finished, tmp_path, capsys, kind):
    rd = damaged_copy(finished, tmp_path, {**DAMAGE, **RELOG_ONLY}[kind])
    before = (rd / "mlflow_run.json").read_bytes() if (rd / "mlflow_run.json").exists() else None
    one_line_exit_2(relog.main, [str(rd), "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"], capsys)
    assert not (tmp_path / "mlflow.db").exists()  # stopped before the store was opened
    assert ((rd / "mlflow_run.json").read_bytes() if (rd / "mlflow_run.json").exists() else None) == before


def test_a_saved_threshold_of_0_is_no_obstacle_when_one_is_given(finished, tmp_path, capsys):
    rd = damaged_copy(finished, tmp_path, DAMAGE["saved threshold 0"])
    assert analyze.main([str(rd), "--out", str(tmp_path / "out"), "--threshold", "0.9"]) == 0
    assert json.loads((tmp_path / "out" / "analysis.json").read_text())["threshold"] == 0.9


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(
        ["minibatches", "counts", "settings", "times", "tag", "group", "index", "status", "usage", "seed",
         "threshold", "matcher", "cost_usd", "item", "position", "minibatch", "op", "content", "x"]), inner,
        max_size=5),
    max_leaves=20,
)


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(["summary.json", "analysis.json", "kept_items.jsonl", ".hydra/config.yaml"]),
       content=JSON, raw=st.one_of(st.none(), st.binary(max_size=30), st.text(max_size=30)))
def test_random_records_in_a_run_dir_give_a_report_or_one_line(finished, tmp_path_factory, name, content, raw):
    """A record replaced by random JSON, text or bytes: analyze writes its report or says in one line
    what is wrong (exit 2); relog's reading of it is pinned by the cases above."""
    import contextlib
    import io

    work = tmp_path_factory.mktemp("fuzz")
    rd = work / "run"
    shutil.copytree(finished, rd)
    path = rd / name
    if raw is None:
        path.write_text(json.dumps(content) + "\n")
    else:
        path.write_bytes(raw) if isinstance(raw, bytes) else path.write_text(raw, encoding="utf-8",
                                                                              errors="surrogatepass")
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = analyze.main([str(rd), "--out", str(work / "out")])
        except SystemExit as exc:
            code = exc.code
    assert code in (0, 2) and (code == 0 or len(err.getvalue().strip().splitlines()) == 1), err.getvalue()


# ---------------------------------------------------------------- the importer, the report, results.json


def test_the_importer_never_writes_a_file_reflact_would_refuse(tmp_path, capsys):
    runs = [{"id": f"r{n}", "score": n % 2, "messages": [{"role": "system", "content": "skill"},
                                                        {"role": "user", "content": "x" * 40_000}]}
            for n in range(4)]
    source = tmp_path / "runs.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in runs))
    one_line_exit_2(import_main, ["chat_jsonl", str(source), str(tmp_path / "small"), "--max-file-mb", "0.1"], capsys)
    assert not (tmp_path / "small").exists()  # nothing written, not even the conversations
    assert import_main(["chat_jsonl", str(source), str(tmp_path / "ok"), "--max-file-mb", "0.2"]) == 0
    # what it wrote is what a run with the same limit reads
    dataset = load_dataset(DataConfig(dir=str(tmp_path / "ok"), max_file_mb=0.2))
    assert [r.id for r in dataset.results] == ["r0", "r1", "r2", "r3"]


def test_the_report_on_an_unknown_sweep_creates_no_store(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    err = one_line_exit_2(report_main, ["outputs/sweeps/nope"], capsys)
    assert "no MLflow store" in err and not (tmp_path / "outputs").exists()


@pytest.mark.parametrize("blank", [0, 4095, 4096, 70_000])
def test_a_results_json_after_any_amount_of_whitespace_is_read_as_json(tmp_path, blank):
    path = tmp_path / "results.json"
    path.write_text(" \n\t" * (blank // 3) + json.dumps([{"id": "b", "hard": 1}, {"id": "a", "hard": 0}]))
    assert [r.id for r in load_results(path, 10**8)] == ["a", "b"]


def test_a_mistyped_predictions_folder_is_a_user_error(tmp_path):
    data = write_dataset(tmp_path / "d", 2, 1)
    with pytest.raises(reflact.core.errors.UserError, match="data.predictions: no such folder"):
        load_dataset(DataConfig(dir=str(data), predictions=str(data / "predictons")))


# ---------------------------------------------------------------- the analysis's budget in work


def write_items(root: Path, texts: list[str]) -> RunDir:
    root.mkdir(parents=True)
    tags = [f"minibatch_{'fail' if n % 2 == 0 else 'succ'}_{n // 2:03d}" for n in range(len(texts))]
    with open(root / "kept_items.jsonl", "w", encoding="utf-8") as out:
        for tag, text in zip(tags, texts, strict=True):
            item = {"op": "append", "content": text}
            out.write(json.dumps({"minibatch": tag, "position": 0, "trajectory_ids": [], "item": item}) + "\n")
    records = [{"tag": t, "group": "failure" if "fail" in t else "success", "index": int(t[-3:]), "status": "done"}
               for t in tags]
    (root / "summary.json").write_text(json.dumps({"settings": {}, "counts": {}, "minibatches": records}))
    return RunDir(root)


def words(n: int, seed: int) -> str:
    import random

    rng = random.Random(seed)
    return " ".join("".join(rng.choice("abcdefgh") for _ in range(rng.randint(2, 8))) for _ in range(n))


def test_long_items_are_compared_by_their_beginning_and_different_ones_stay_apart(tmp_path):
    same, other = words(30_000, 1), words(30_000, 2)
    assert len(same) > 20 * MAX_COMPARED_CHARS
    rd = write_items(tmp_path / "run", [same, same + " tail", other, words(30_000, 3)])
    figures = analyse_run_dir(rd, 0.85, 20_000)
    assert figures["edits"] == 4 and figures["distinct_edits"] == 3  # the two alike match, the others do not


def test_a_run_whose_items_are_too_long_to_compare_in_budget_skips_its_own_analysis(tmp_path):
    rd = write_items(tmp_path / "long", [words(3_000, n) for n in range(16)])
    figures = analyse_run_dir(rd, 0.85, max_items=20)
    assert "more work than analysis.max_items=20" in figures["skipped"] and "python -m reflact.analyze" in \
        figures["skipped"]
    short = write_items(tmp_path / "short", [words(20, n) for n in range(16)])
    assert "skipped" not in analyse_run_dir(short, 0.85, max_items=20)
    assert "skipped" not in analyse_run_dir(rd, 0.85, max_items=20_000)  # the default allows 16 long ones


def test_long_texts_are_matched_in_small_chunks_with_the_same_result(tmp_path):
    """Chunks sized by characters, not by items: SIGTERM and Ctrl-C act between chunks."""
    texts = [words(2_000, n % 20) for n in range(60)]  # each text three times
    keys = [item_key({"op": "append", "content": text}) for text in texts]
    chunks = list(match_chunks(keys, 0.85))
    assert len(chunks) > 1
    pairs = {tuple(sorted(p)) for a, b in chunks for p in zip(a.tolist(), b.tolist(), strict=True)}
    assert pairs == {(i, j) for i in range(60) for j in range(i + 1, 60) if texts[i] == texts[j]}
    assert match(keys, 0.85, {}).distinct() == 20


def test_load_run_names_the_run_dir_of_a_damaged_summary(tmp_path):
    rd = write_items(tmp_path / "run", ["a b c"])
    (rd.root / "summary.json").write_text(json.dumps({"settings": {}, "counts": {}, "minibatches": [{"tag": 1}]}))
    with pytest.raises(reflact.core.errors.UserError, match=r"summary.json: minibatches\[0\]"):
        load_run(rd.root)
