"""The after-the-fact tools' options (issue 36, items 14 and 17): `python -m reflact.analyze --set`
takes what `python -m reflact.run` takes (Hydra's override grammar), the examples of docs/agreement.md
work as written, analyze prints reflact's own lines only, and an --out naming a file is one line, exit 2."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import reflact
from reflact import analyze
from reflact.config import CacheMode, Price
from reflact.core.errors import UserError
from reflact.sweeps import grid_report
from reflact.testing.optimizer_server import OptimizerServer, Response
from tests.conftest import PROJECT, write_dataset

# the page whose `python -m reflact.analyze` examples a user copies (the README links it)
AGREEMENT_PAGE = (PROJECT / "docs" / "agreement.md").read_text(encoding="utf-8")


def embeddings_too(request: dict, number: int) -> Response | None:
    """The stand-in answering /embeddings as well (a request with `input`): one small vector a text."""
    if "input" not in request:
        return None
    rows = [{"object": "embedding", "index": i, "embedding": [1.0, float(len(text) % 7), 0.5]}
            for i, text in enumerate(request["input"])]
    return Response(body={"object": "list", "data": rows, "model": request["model"],
                          "usage": {"prompt_tokens": 3 * len(rows), "total_tokens": 3 * len(rows)}})


@pytest.fixture
def stand_in():
    with OptimizerServer(script=embeddings_too) as server:
        yield server


@pytest.fixture
def finished(tmp_path, stand_in) -> Path:
    """A finished run dir with its saved config, as `reflect()` leaves it."""
    reflact.reflect(write_dataset(tmp_path / "d", n_fail=4, n_succ=2), run_dir=tmp_path / "run_a",
                    launch_dir=tmp_path, overrides=["optimizer=compatible", f"optimizer.base_url={stand_in.base_url}",
                                                    "optimizer.model=test", "mlflow.enabled=false",
                                                    "reflect.minibatch_size=2"])
    return tmp_path / "run_a"


def test_analyze_set_reads_settings_as_the_command_line_does(finished):
    cfg = analyze.settings([finished], None, [
        "optimizer.cache=off",  # YAML would read `off` as false
        "+optimizer.prices.test={input:1.25,cached_input:0.125,output:10}",  # YAML: three keys without values
        "analysis.embedding.base_url=http://127.0.0.1:8001/v1",
        "analysis.embedding.model='text-embedding-3-large'",
    ])
    assert cfg.optimizer.cache is CacheMode.off
    assert cfg.optimizer.prices["test"] == Price(input=1.25, cached_input=0.125, output=10.0)
    assert cfg.analysis.embedding.base_url == "http://127.0.0.1:8001/v1"
    assert cfg.analysis.embedding.model == "text-embedding-3-large"


@pytest.mark.parametrize("item,names", [
    ("data.dir=x", "a key under analysis. or optimizer."),
    ("optimizer=dry_run", "not a config group"),
    ("analysis.matcher=lexical,embedding", "a sweep"),
    ("+optimizer.cache=off", "already set"),
    ("optimizer.cache=maybe", "Invalid value 'maybe'"),
    ("optimizer.no_such_key=1", "no_such_key"),
    ("optimizer.model='unclosed", "optimizer.model='unclosed"),
])
def test_analyze_set_mistakes_name_the_option_and_the_override(finished, item, names):
    with pytest.raises(UserError) as mistake:
        analyze.settings([finished], None, [item])
    assert str(mistake.value).startswith(f"--set {item}: ") and names in str(mistake.value)


def test_a_config_objects_overrides_read_as_the_command_line_does():
    """reflect(config=..., overrides=[...]) and SkillOpt's install(overrides=[...]), whose docs/skillopt.md example
    is `["optimizer.cache=off"]`: the same grammar as the command line, not YAML's."""
    from reflact.api import compose, with_overrides

    cfg = with_overrides(compose(["optimizer=dry_run"]), [
        "optimizer.cache=off", "+optimizer.prices.my-model={input:1,cached_input:0.1,output:4}"])
    assert cfg.optimizer.cache is CacheMode.off
    assert cfg.optimizer.prices["my-model"] == {"input": 1, "cached_input": 0.1, "output": 4}
    with pytest.raises(UserError, match=r"^overrides: optimizer.cache=maybe: Invalid value 'maybe'"):
        with_overrides(cfg, ["optimizer.cache=maybe"])


def shown_set_values() -> list[str]:
    """Every `--set VALUE` docs/agreement.md shows, unquoted as a shell would."""
    found = re.findall(r"--set\s+('[^']*'|[^\s`]+)", AGREEMENT_PAGE)
    assert found, "docs/agreement.md shows no --set"
    return [shlex.split(value)[0] for value in found]


def test_every_set_the_docs_show_is_taken(finished):
    cfg = analyze.settings([finished], None, shown_set_values())
    assert cfg.analysis.embedding.base_url  # the page's endpoint example


def test_the_docs_analyze_example_works_as_written_and_prints_only_reflacts_lines(tmp_path, finished, stand_in):
    """`python -m reflact.analyze run_a --matcher embedding --set analysis.embedding.base_url=URL`,
    the URL being the stand-in's: the analysis asks it for embeddings, and the console holds no line of
    the HTTP client's (httpx logs one per request at INFO)."""
    [example] = [line for line in AGREEMENT_PAGE.splitlines()
                 if line.startswith("python -m reflact.analyze") and "--set" in line]
    argv = shlex.split(example.split("#")[0])[3:]
    argv = [re.sub(r"http://127\.0\.0\.1:\d+/v1", stand_in.base_url, arg) for arg in argv]
    before = stand_in.count
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    done = subprocess.run([sys.executable, "-m", "reflact.analyze", *argv], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert stand_in.count > before  # the embeddings were asked there
    assert json.loads((tmp_path / "analysis" / "analysis.json").read_text())["matcher"] == "embedding"
    assert "HTTP Request" not in done.stderr and "httpx" not in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def one_line_exit_2(command, argv, capsys) -> str:
    with pytest.raises(SystemExit) as ended:
        command(argv)
    err = capsys.readouterr().err.strip()
    assert ended.value.code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("out", ["a_file", "a_file/below"])
def test_an_out_naming_a_file_is_one_line_naming_the_option(tmp_path, finished, capsys, out):
    (tmp_path / "a_file").write_text("mine")
    err = one_line_exit_2(analyze.main, [str(finished), "--out", str(tmp_path / out)], capsys)
    assert err.startswith("reflact: error: --out: ") and "a_file is a file, not a folder" in err
    assert (tmp_path / "a_file").read_text() == "mine"
    err = one_line_exit_2(grid_report.main, ["outputs/sweeps/x", "--out", str(tmp_path / out),
                                             "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"], capsys)
    assert err.startswith("reflact: error: --out: ") and "a_file is a file, not a folder" in err
