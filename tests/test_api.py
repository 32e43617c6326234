"""reflact.reflect: the stage in-process, on a dataset folder or on Python objects, safe to call again."""

from __future__ import annotations

import json

import pytest
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

import reflact
from reflact.api import compose
from reflact.core.errors import Stopped, UserError
from reflact.core.shipped import conf_dir, demo_dir
from tests.conftest import write_dataset


def settings(server, *extra):
    return ["optimizer=compatible", f"optimizer.base_url={server.base_url}", "optimizer.model=test", *extra]


@pytest.mark.slow
def test_the_demo_twice_in_one_process_gives_the_same_patches(tmp_path, server):
    import mlflow

    uri_before = mlflow.get_tracking_uri()
    first = reflact.reflect(demo_dir(), overrides=settings(server), run_dir=tmp_path / "a", launch_dir=tmp_path)
    again = reflact.reflect(demo_dir(), overrides=settings(server), run_dir=tmp_path / "b", launch_dir=tmp_path)
    assert first.status == again.status == "FINISHED"
    assert list(first.patches) == ["minibatch_fail_000", "minibatch_fail_001", "minibatch_succ_000",
                                   "minibatch_succ_001"]
    strip = lambda patches: {t: {k: v for k, v in p.items() if k != "fingerprint"} for t, p in patches.items()}  # noqa
    assert strip(first.patches) == strip(again.patches)
    assert first.summary["counts"]["calls"] == 4 and again.summary["counts"]["cache_hits"] == 4
    assert first.mlflow_run_id and again.mlflow_run_id and first.mlflow_run_id != again.mlflow_run_id
    # nothing global left behind: Hydra free for the caller, MLflow pointing where it pointed
    assert not GlobalHydra.instance().is_initialized()
    assert mlflow.get_tracking_uri() == uri_before
    assert (tmp_path / "a" / ".hydra" / "config.yaml").is_file()  # relog can read the run back


def test_python_objects_are_written_into_the_run_dir_and_reflected_on(tmp_path, server):
    data = write_dataset(tmp_path / "d", n_fail=3, n_succ=2)
    results = [json.loads(line) for line in (data / "results.jsonl").read_text().splitlines()]
    conversations = {r["id"]: json.loads((data / "predictions" / r["id"] / "conversation.json").read_text())
                     for r in results}
    done = reflact.reflect(results=results, skill=(data / "skill.md").read_text(), conversations=conversations,
                           overrides=settings(server, "mlflow.enabled=false", "reflect.minibatch_size=3"),
                           run_dir=tmp_path / "run", launch_dir=tmp_path)
    assert done.status == "FINISHED" and len(done.patches) == 2
    assert (tmp_path / "run" / "inputs" / "results.jsonl").is_file()
    assert {len(p["trajectory_ids"]) for p in done.patches.values()} == {3, 2}


def test_a_config_object_takes_plain_settings_but_not_config_groups(tmp_path, server):
    cfg = compose(settings(server, "mlflow.enabled=false"))
    done = reflact.reflect(write_dataset(tmp_path / "d", 4, 0), config=cfg, overrides=["reflect.edit_budget=1"],
                           run_dir=tmp_path / "run", launch_dir=tmp_path)
    assert [len(p["patch"]["edits"]) for p in done.patches.values()] == [1]
    with pytest.raises(UserError, match="optimizer=dry_run"):
        reflact.reflect(tmp_path / "d", config=cfg, overrides=["optimizer=dry_run"], launch_dir=tmp_path)


def test_a_mistake_is_a_user_error_and_nothing_is_called(tmp_path, server):
    # the public names a caller catches: reflact.UserError, and reflact.Stopped for Ctrl-C
    assert (reflact.UserError, reflact.Stopped) == (UserError, Stopped)
    with pytest.raises(reflact.UserError, match="reflect.minibatch_size"):
        reflact.reflect(demo_dir(), overrides=settings(server, "reflect.minibatch_size=0"), launch_dir=tmp_path)
    with pytest.raises(reflact.UserError, match="no such folder"):
        reflact.reflect(tmp_path / "missing", overrides=settings(server), launch_dir=tmp_path)
    assert server.count == 0


def test_it_runs_inside_a_hydra_app_and_leaves_its_state_alone(tmp_path, server):
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        outer = GlobalHydra.instance().hydra
        done = reflact.reflect(demo_dir(), overrides=settings(server, "mlflow.enabled=false"),
                               run_dir=tmp_path / "run", launch_dir=tmp_path)
        assert done.status == "FINISHED" and GlobalHydra.instance().hydra is outer
