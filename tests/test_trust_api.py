"""The Python API and the SkillOpt entry on hostile input: values from Python are data, never config
syntax; ids and keys from Python are checked like ids from files before anything is written; every
mistake is a UserError before any call; two calls in two threads; nothing left set afterwards."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

import reflact
from reflact.api import compose
from reflact.compat.skillopt import run_minibatch_reflect
from reflact.config import literal, typed
from reflact.core.errors import UserError
from reflact.core.shipped import demo_dir
from tests.conftest import write_dataset

SECRET = "sk-test-NOT-A-REAL-KEY-0123456789abcdefXYZ"
PLANTED = "Keep ${oc.env:REFLACT_TEST_SECRET} and \\${x} and $${y} and ${oc.decode:'{a: 1}'} as written"


def settings_for(server, *extra):
    return ["optimizer=compatible", f"optimizer.base_url={server.base_url}", "optimizer.model=test", *extra]


def python_inputs(data: Path):
    results = [json.loads(line) for line in (data / "results.jsonl").read_text().splitlines()]
    conversations = {
        r["id"]: json.loads((data / "predictions" / r["id"] / "conversation.json").read_text()) for r in results
    }
    return results, (data / "skill.md").read_text(), conversations


def sent_text(server) -> str:
    return "\n".join(m["content"] for request in server.requests for m in request["messages"])


# ---------------------------------------------------------------- values from Python are data


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("${}\\:.ab -'\"")), max_size=40) | st.text(max_size=40))
def test_literal_texts_come_back_from_omegaconf_verbatim(text):
    assert OmegaConf.create({"k": literal(text)}).k == text


def test_a_meta_skill_with_interpolation_syntax_reaches_the_optimizer_and_the_saved_config_verbatim(
    tmp_path, server, monkeypatch
):
    monkeypatch.setenv("REFLACT_TEST_SECRET", SECRET)
    cfg = compose(settings_for(server, "mlflow.enabled=false", "optimizer.cache=off"))
    cfg.reflect.meta_skill, cfg.reflect.step_buffer = PLANTED, "buffer ${oc.env:REFLACT_TEST_SECRET}"
    done = reflact.reflect(write_dataset(tmp_path / "d", 3, 0), config=cfg, run_dir=tmp_path / "run",
                           launch_dir=tmp_path)
    assert done.status == "FINISHED" and server.count == 1
    assert PLANTED in sent_text(server) and "buffer ${oc.env:REFLACT_TEST_SECRET}" in sent_text(server)
    written = "".join(p.read_text() for p in (tmp_path / "run").rglob("*") if p.is_file() and p.suffix != ".lock")
    assert SECRET not in written and SECRET not in sent_text(server)
    saved = typed(OmegaConf.load(tmp_path / "run" / ".hydra" / "config.yaml"))  # as relog and analyze read it
    assert saved.reflect.meta_skill == PLANTED


def test_the_skillopt_entrys_meta_skill_and_step_buffer_are_data(tmp_path, server, monkeypatch):
    monkeypatch.setenv("REFLACT_TEST_SECRET", SECRET)
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    monkeypatch.setenv("OPTIMIZER_DEPLOYMENT", "test")
    monkeypatch.chdir(tmp_path)
    data = write_dataset(tmp_path / "data", n_fail=3, n_succ=0)
    results, skill, _ = python_inputs(data)
    patches = run_minibatch_reflect(results, skill, str(data / "predictions"), str(tmp_path / "patches"), 2, True,
                                    meta_skill_context=PLANTED, step_buffer_context="step ${oc.env:HOME}",
                                    overrides=["mlflow.enabled=false"])
    assert len(patches) == 1
    assert PLANTED in sent_text(server) and "step ${oc.env:HOME}" in sent_text(server)
    assert SECRET not in sent_text(server) and os.environ["HOME"] not in sent_text(server).replace(str(tmp_path), "")


def test_a_dataset_folder_whose_name_holds_interpolation_syntax_is_read(tmp_path, server):
    data = write_dataset(tmp_path / "data_${x}", 2, 1)
    done = reflact.reflect(data, overrides=settings_for(server, "mlflow.enabled=false"), run_dir=tmp_path / "r${y}",
                           launch_dir=tmp_path)
    assert done.status == "FINISHED" and done.run_dir == tmp_path / "r${y}"
    assert typed(OmegaConf.load(tmp_path / "r${y}" / ".hydra" / "config.yaml")).data.dir == str(data)


@pytest.mark.parametrize("key", ["../../../../escaped", "ABSOLUTE", "a/b", "..", "", "x\ny", 7.5, None])
def test_conversation_keys_from_python_are_checked_before_anything_is_written(tmp_path, server, key):
    key = str(tmp_path / "escaped") if key == "ABSOLUTE" else key
    results = [{"id": "run_1", "hard": 0}]
    with pytest.raises(UserError, match="conversations"):
        reflact.reflect(results=results, skill="s", conversations={key: []}, run_dir=tmp_path / "runs" / "run",
                        overrides=settings_for(server), launch_dir=tmp_path)
    assert not (tmp_path / "escaped").exists()
    assert not (tmp_path / "runs").exists() and server.count == 0  # the run dir made for it went again


def test_ids_from_python_meet_the_checks_ids_from_files_meet(tmp_path, server):
    with pytest.raises(UserError, match="unsafe id"):
        reflact.reflect(results=[{"id": "../x", "hard": 0}], skill="s", conversations={"ok": []},
                        overrides=settings_for(server), run_dir=tmp_path / "run", launch_dir=tmp_path)
    assert not (tmp_path / "x").exists() and not (tmp_path / "run").exists() and server.count == 0


# ---------------------------------------------------------------- mistakes are UserErrors before any call


def mistakes(tmp_path: Path, server):
    """(what, the call): each a user's mistake."""
    np = pytest.importorskip("numpy")
    data = write_dataset(tmp_path / "d", 2, 1)
    results, skill, conversations = python_inputs(data)
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    no_workers = compose(settings_for(server))
    no_workers.reflect.workers = None  # type: ignore[assignment]
    numpy_scores = [{**r, "hard": np.float32(r["hard"])} for r in results]
    call = lambda **kw: lambda: reflact.reflect(launch_dir=tmp_path, **kw)  # noqa: E731
    return {
        "bytes skill": call(results=results, skill=skill.encode(), conversations=conversations,
                            overrides=settings_for(server)),
        "numpy score": call(results=numpy_scores, skill=skill, conversations=conversations,
                            overrides=settings_for(server)),
        "workers None": call(data=data, config=no_workers),
        "run_dir a file": call(data=data, run_dir=a_file, overrides=settings_for(server)),
        "run_dir inside a file": call(data=data, run_dir=a_file / "run", overrides=settings_for(server)),
        "overrides a string": call(data=data, overrides="optimizer.model=x"),
        "bad override": call(data=data, overrides=[*settings_for(server), "reflect.nope=1"]),
        "results not rows": call(results=[1, 2], skill=skill, conversations=conversations),
        "conversation not JSON": call(results=results, skill=skill, conversations={"run_00000": [object()]},
                                      overrides=settings_for(server)),
        "config not a config": call(data=data, config={"reflect": {}}),
    }


def test_every_api_mistake_is_one_user_error_before_any_call(tmp_path, server):
    for what, call in mistakes(tmp_path, server).items():
        with pytest.raises(UserError) as caught:
            call()
        assert "\n" not in str(caught.value), what
    assert server.count == 0


def skillopt_call(tmp_path, **changes):
    data = write_dataset(tmp_path / "data", n_fail=2, n_succ=0)
    results, skill, _ = python_inputs(data)
    arguments = {"results": results, "skill_content": skill, "prediction_dir": str(data / "predictions"),
                 "patches_dir": str(tmp_path / "patches"), "workers": 2, "failure_only": True,
                 "overrides": ["mlflow.enabled=false"], **changes}
    return run_minibatch_reflect(**arguments)


@pytest.mark.parametrize("what", ["patches_dir a file", "patches_dir empty", "workers None", "predictions mistyped",
                                  "reflact's record dir a file"])
def test_skillopt_entry_mistakes_are_one_user_error_before_any_call(tmp_path, server, monkeypatch, what):
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    monkeypatch.setenv("OPTIMIZER_DEPLOYMENT", "test")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "p2.reflact").write_text("x")
    changes = {
        "patches_dir a file": {"patches_dir": str(tmp_path / "a_file")},
        "patches_dir empty": {"patches_dir": ""},
        "workers None": {"workers": None},
        "predictions mistyped": {"prediction_dir": str(tmp_path / "data" / "predictons")},
        "reflact's record dir a file": {"patches_dir": str(tmp_path / "p2")},
    }[what]
    with pytest.raises(UserError):
        skillopt_call(tmp_path, **changes)
    assert server.count == 0


@pytest.mark.parametrize("url", ["https://proxy.example.com/v1?api-version=2024-10-21&x=${oc.env:HOME}",
                                 "http://127.0.0.1:9/v1?a='b',c=[d]"])
def test_openai_base_url_reaches_the_skillopt_entrys_config_as_written(monkeypatch, url):
    from reflact.compat.skillopt import _config

    monkeypatch.setenv("OPENAI_BASE_URL", url)
    assert _config(None, ()).optimizer.base_url == url


# ---------------------------------------------------------------- threads, and nothing left set


@pytest.mark.slow
def test_two_reflect_calls_in_two_threads_both_finish(tmp_path, server):
    outcomes: dict[str, object] = {}

    def one(name: str) -> None:
        try:
            outcomes[name] = reflact.reflect(demo_dir(), overrides=settings_for(server, "optimizer.cache=off"),
                                             run_dir=tmp_path / name, launch_dir=tmp_path / name)
        except BaseException as exc:  # the assertion below shows it
            outcomes[name] = exc

    threads = [threading.Thread(target=one, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert [getattr(outcomes.get(n), "status", outcomes.get(n)) for n in ("a", "b")] == ["FINISHED", "FINISHED"]
    assert server.count == 8


def test_reflect_leaves_no_mlflow_variable_behind(tmp_path, server, monkeypatch):
    for name in [k for k in os.environ if k.startswith("MLFLOW_") and k != "MLFLOW_DISABLE_TELEMETRY"]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "7")  # the user's own value stays the user's
    before = {k: v for k, v in os.environ.items() if k.startswith("MLFLOW_")}
    done = reflact.reflect(demo_dir(), overrides=settings_for(server), run_dir=tmp_path / "run", launch_dir=tmp_path)
    assert done.status == "FINISHED" and done.mlflow_run_id
    assert {k: v for k, v in os.environ.items() if k.startswith("MLFLOW_")} == before


# ---------------------------------------------------------------- random input finds no traceback

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
ANYTHING = JSON | st.binary(max_size=8) | st.just(object()) | st.sets(st.integers(), max_size=2)


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(
    results=st.lists(st.fixed_dictionaries({"id": JSON, "hard": JSON}) | ANYTHING, max_size=3) | ANYTHING,
    skill=st.text(max_size=30) | ANYTHING,
    conversations=st.dictionaries(st.text(max_size=12) | st.integers(), JSON, max_size=3) | ANYTHING,
)
def test_random_python_inputs_are_a_reflection_or_a_user_error(tmp_path_factory, results, skill, conversations):
    launch = tmp_path_factory.mktemp("fuzz")
    try:
        done = reflact.reflect(results=results, skill=skill, conversations=conversations, launch_dir=launch,
                               overrides=["optimizer.dry_run=true", "mlflow.enabled=false", "optimizer.cache=off"])
    except UserError as exc:
        assert "\n" not in str(exc)
        return
    assert done.status in ("FINISHED", "FAILED")
    assert all(p.resolve().is_relative_to(launch.resolve()) for p in launch.rglob("*"))
