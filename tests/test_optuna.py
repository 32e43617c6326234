"""Optuna drives reflact: `python -m reflact.run -m +exp=demo_optuna` lets a sampler pick M and L.

Done when: a sampler's search space (`choice(2,4,8)`, `int(interval(1,4))`) is read as the swept
keys, so the sweep dir's identity and the parent's params name them and leave them out of the
fixed settings; the metric a job returns is not a fixed setting either; and the preset, run
through the real CLI against the loopback test server, leaves one MLflow child run per sampled
(M, L) under a FINISHED parent, with Optuna's best value equal to the best child's metric.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import open_dict

from reflact import config as reflact_config
from reflact.core.errors import UserError
from reflact.running.rundir import SweepDir
from reflact.sweeps.sweep import check_identity, sweep_settings
from reflact.testing.optimizer_server import OptimizerServer
from tests.conftest import PROJECT, run_cli

HAS_OPTUNA = importlib.util.find_spec("hydra_plugins.hydra_optuna_sweeper") is not None
OPTUNA_SPACE = {"reflect.minibatch_size": "choice(2,4,8)", "reflect.edit_budget": "int(interval(1,4))"}
SWEEP_ID = "outputs/sweeps/demo_optuna"  # hydra.sweep.dir of +exp=demo_optuna, relative to the launch dir


def multirun_config(task: list[str], sweeper_params: dict | None = None):
    """The config a sweep callback receives: the demo with these command-line overrides (the
    single values composed in, as a job's) and sweeper params."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    single = [o.input_line for o in OverridesParser.create().parse_overrides(task) if not o.is_sweep_override()]
    reflact_config.register()
    with initialize_config_dir(config_dir=str(PROJECT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["+exp=demo", *single], return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.overrides.task = ["+exp=demo", *task]
        cfg.hydra.sweeper.params = sweeper_params
    return cfg


# ---------------------------------------------------------------------------------------------
# the swept keys of a sampler's search space (no plugin needed)


def test_a_samplers_search_space_is_read_as_the_swept_keys():
    fixed, swept = sweep_settings(multirun_config([], OPTUNA_SPACE))
    assert swept == {"reflect.minibatch_size": ["2", "4", "8"], "reflect.edit_budget": ["int(interval(1,4))"]}
    assert "reflect.minibatch_size" not in fixed and "reflect.edit_budget" not in fixed
    assert fixed["reflect.seed"] == "42"


def test_command_line_sweeps_list_their_values_and_a_single_value_fixes_a_key():
    fixed, swept = sweep_settings(multirun_config(
        ["reflect.minibatch_size=choice(2,4)", "reflect.seed=range(1,4)", "reflect.edit_budget=3"], OPTUNA_SPACE))
    assert swept == {"reflect.minibatch_size": ["2", "4"], "reflect.seed": ["1", "2", "3"]}
    assert fixed["reflect.edit_budget"] == "3"  # the command line wins over the sweeper's params


def test_the_optimized_metric_is_not_a_fixed_setting(tmp_path):
    """Naming another metric to optimise changes no job's results: the same sweep dir takes it."""
    sweep = SweepDir(tmp_path / "sweep")
    for metric in ("edits_kept", "apply_share"):
        fixed, swept = sweep_settings(multirun_config([f"optimized_metric={metric}"], OPTUNA_SPACE))
        assert "optimized_metric" not in fixed
        check_identity(sweep, fixed, swept)
    fixed, swept = sweep_settings(multirun_config(["data.on_bad_conversation=skip"], OPTUNA_SPACE))
    with pytest.raises(UserError, match="data.on_bad_conversation"):  # the check still holds for real settings
        check_identity(sweep, fixed, swept)


# ---------------------------------------------------------------------------------------------
# the preset through the real CLI (needs the plugin)


def trials(stdout: str) -> list[tuple[int, int]]:
    """(M, L) of each trial, in order, from the launcher's `#<job> : <overrides>` lines."""
    found = []
    for line in re.findall(r"#\d+ : (.*)", stdout):
        size = re.search(r"reflect\.minibatch_size=(\d+)", line)
        budget = re.search(r"reflect\.edit_budget=(\d+)", line)
        found.append((int(size.group(1)), int(budget.group(1))))
    return found


def sweep_runs(launch: Path) -> tuple[list, list]:
    """(parent runs, child runs) of the demo experiment."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{launch}/outputs/mlflow.db")
    experiment = client.get_experiment_by_name("reflact-demo")
    runs = client.search_runs([experiment.experiment_id], max_results=100)
    parents = [r for r in runs if r.data.tags.get("reflact.sweep_parent") == "true"]
    return parents, [r for r in runs if r.data.tags.get("reflact.sweep_parent") != "true"]


@pytest.mark.slow
@pytest.mark.skipif(not HAS_OPTUNA, reason="hydra-optuna-sweeper is not installed (pip install -e '.[optuna]')")
def test_an_optuna_sweep_over_m_and_l(launch_dir):
    with OptimizerServer() as server:
        proc = run_cli("-m", "+exp=demo_optuna", "hydra.sweeper.n_trials=3", "optimizer=compatible",
                       f"optimizer.base_url={server.base_url}", "optimizer.model=test", cwd=launch_dir)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    sampled = trials(proc.stdout)
    assert len(sampled) == 3, proc.stdout

    parents, children = sweep_runs(launch_dir)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    parent = parents[0]
    assert parent.data.params["reflect.minibatch_size"] == "2,4,8"
    # a trial that repeats a cell reuses its job dir and run: one child per distinct (M, L)
    by_cell = {(int(c.data.metrics["M"]), int(c.data.metrics["L"])): c for c in children}
    assert len(by_cell) == len(children) == len(set(sampled)) and set(by_cell) == set(sampled)
    for child in children:
        assert child.info.status == "FINISHED"
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert child.data.tags["reflact.sweep_id"] == SWEEP_ID

    results = yaml.safe_load((launch_dir / SWEEP_ID / "optimization_results.yaml").read_text(encoding="utf-8"))
    best_cell = (results["best_params"]["reflect.minibatch_size"], results["best_params"]["reflect.edit_budget"])
    best_kept = max(c.data.metrics["edits_kept"] for c in children)
    assert results["best_value"] == best_kept == by_cell[best_cell].data.metrics["edits_kept"]
    identity = json.loads((launch_dir / SWEEP_ID / "sweep.json").read_text(encoding="utf-8"))
    assert identity["swept"] == {"reflect.minibatch_size": ["2", "4", "8"],
                                 "reflect.edit_budget": ["int(interval(1,4))"]}
