"""The command line's config entry: `exp=` and `+exp=` both pick an experiment, Hydra's settings
live in conf/hydra/reflact.yaml, and library warnings never come between a user and the one line
a command ends with (they go to the run's log)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from reflact import config as reflact_config
from reflact.api import compose
from tests.conftest import PROJECT, ok, output, run_cli
from tests.test_cluster import composed


@pytest.mark.parametrize("exp", ["demo", "demo_grid", "demo_patch"])
def test_exp_is_picked_with_or_without_a_plus(exp):
    """Through reflact.compose, as the API and the command line compose."""
    assert compose([f"exp={exp}", "optimizer=dry_run"]) == compose([f"+exp={exp}", "optimizer=dry_run"])
    assert compose([f"exp={exp}"]).name != compose([]).name == "default"  # no experiment unless picked


def test_both_spellings_name_the_same_job_folders_as_before():
    for spelling in ("exp=demo", "+exp=demo"):
        hydra = composed(spelling, "reflect.edit_budget=2").hydra
        assert hydra.job.override_dirname == "+exp=demo,reflect.edit_budget=2"  # as sweeps always named them
    assert reflact_config.hydra_spelling(["exp=demo", "+exp=x", "exp.key=1", "-m", "cluster=ray", "name=exp=1"]) == [
        "+exp=demo", "+exp=x", "exp.key=1", "-m", "+cluster=ray", "name=exp=1"]


def test_hydras_settings_are_in_their_own_file():
    assert "hydra" not in OmegaConf.load(PROJECT / "conf/config.yaml")
    hydra = composed("+exp=demo").hydra
    assert hydra.output_subdir is None
    assert OmegaConf.to_container(hydra.run)["dir"] == "outputs/runs/${now:%Y-%m-%d}/${now:%H-%M-%S}"
    assert set(hydra.callbacks) == {"mlflow_sweep", "fresh_run_dir"}
    assert hydra.sweep.dir == "outputs/sweeps/demo" and hydra.job_logging.handlers.console.stream == "ext://sys.stderr"


def test_hydras_mode_is_read_whatever_arguments_hydra_passes(monkeypatch):
    """reflact replaces Hydra 1.3's get_mode (it composes the whole config again), never Hydra
    1.4's (it reads the overrides only, and passes `parsed_overrides`); CI's .ci/newest_stack.sh
    runs the command line on the newest Hydra."""
    from hydra._internal.hydra import Hydra

    from reflact.run import _mode_from_command_line, composes_for_mode

    monkeypatch.setattr(sys, "argv", ["reflact", "+exp=demo"])
    original = Hydra.get_mode
    with _mode_from_command_line():
        if composes_for_mode(original):  # -m alone decides, whatever Hydra passes
            assert Hydra.get_mode(object(), "config", ["+exp=demo"]) is None
            assert Hydra.get_mode(object(), config_name="config", overrides=[], parsed_overrides=[]) is None
        else:
            assert Hydra.get_mode is original
    assert Hydra.get_mode is original
    assert not composes_for_mode(lambda self, config_name, overrides, parsed_overrides=None: None)
    assert composes_for_mode(lambda self, config_name, overrides: None)


@pytest.mark.slow
def test_a_run_picked_with_exp_runs(tmp_path):
    proc = run_cli("exp=demo", "optimizer=dry_run", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert "dry run: " in ok(proc)
    assert (tmp_path / "run" / "summary.json").is_file()


# a config of the user's whose defaults list lacks `_self_`: Hydra 1.3 warns about it (UserWarning)
MINE = "defaults:\n  - config\nreflect:\n  edit_budget: 2\n"


def test_a_library_warning_does_not_come_before_the_error_line(tmp_path):
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "mine.yaml").write_text(MINE + "  no_such_key: 1\n")
    proc = run_cli("--config-dir", str(conf), "--config-name", "mine", "optimizer=dry_run", cwd=tmp_path)
    assert proc.returncode == 2, output(proc)
    assert proc.stderr.splitlines() == [
        "reflact: error: config: In 'mine': ConfigKeyError raised while composing config: Key 'no_such_key' "
        "not in 'ReflectConfig' full_key: reflect.no_such_key reference_type=ReflectConfig object_type=ReflectConfig"
    ]


@pytest.mark.slow
def test_a_library_warning_goes_to_the_runs_log(tmp_path):
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "mine.yaml").write_text(MINE)
    run = tmp_path / "run"
    proc = run_cli("--config-dir", str(conf), "--config-name", "mine", "+exp=demo", "optimizer=dry_run",
                   f"hydra.run.dir={run}", cwd=tmp_path)
    ok(proc)
    assert "Warning" not in proc.stderr and "_self_" not in proc.stderr
    log = Path(run / "run.log").read_text()
    assert "[py.warnings][WARNING]" in log and "Defaults list is missing `_self_`" in log


def test_help_lists_every_shipped_group_and_shows_the_config_with_the_overrides(tmp_path):
    text = ok(run_cli("--help", "exp=demo", "reflect.seed=7", cwd=tmp_path))
    for group in ("cluster", "exp", "optimizer"):
        options = sorted(p.stem for p in (PROJECT / "conf" / group).glob("*.yaml"))
        assert f"{group}: {', '.join(options)}" in text
    shown = OmegaConf.create(text.split("key=value\n", 1)[1].rsplit("Hydra's own options", 1)[0])
    assert shown.name == "demo" and shown.reflect.seed == 7 and "hydra" not in shown
    assert list(tmp_path.iterdir()) == []  # help writes nothing


def test_help_with_a_mistake_is_one_line(tmp_path):
    proc = run_cli("-h", "+exp=nope", cwd=tmp_path)
    [line] = proc.stderr.splitlines()
    assert proc.returncode == 2 and line.startswith("reflact: error: config: In 'config': Could not find 'exp/nope'")
    assert proc.stdout == ""


def test_help_with_configs_of_ones_own_lists_them_beside_the_shipped_ones(tmp_path):
    (tmp_path / "conf" / "exp").mkdir(parents=True)
    (tmp_path / "conf" / "exp" / "mine.yaml").write_text("# @package _global_\nname: mine\n")
    text = ok(run_cli("--config-dir", "conf", "--help", cwd=tmp_path))  # Hydra's own help, which reads them
    assert "mine" in text.split("== Config ==")[0] and "demo_grid" in text
