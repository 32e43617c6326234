"""The cluster presets (conf/cluster/): they compose for every provider, write no key anywhere,
leave themselves and the tracking settings out of job folder names, and run real sweeps: the
submitit launcher's local executor with +cluster=slurm, and a Ray head started elsewhere."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from reflact import config as reflact_config
from reflact.testing.optimizer_server import OptimizerServer
from tests.conftest import PROJECT, ok, output, run_cli

CANARY = "sk-canary-7f3a9c1e5b2d4068"
KEY_VARIABLES = ("OPENAI_API_KEY", "AZURE_OPENAI_API_KEY", "OPENAI_COMPATIBLE_API_KEY")
RAY = importlib.util.find_spec("hydra_plugins.hydra_ray_launcher") is not None
SUBMITIT = importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is not None


def composed(*overrides: str):
    """The whole config with Hydra's node, resolvable as in a job (`${hydra:...}` included)."""
    reflact_config.register()
    with initialize_config_dir(config_dir=str(PROJECT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=reflact_config.hydra_spelling(overrides),
                      return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    return cfg


def files_holding(folder: Path, secret: str) -> list[str]:
    """Every file under `folder` whose bytes hold `secret` (pickles, databases and logs included)."""
    return [str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


@pytest.mark.skipif(not SUBMITIT, reason="hydra-submitit-launcher is not installed (pip install 'reflact[slurm]')")
@pytest.mark.parametrize("spelling", ["+cluster=slurm", "cluster=slurm"])
def test_the_slurm_preset_composes_with_no_key_set_and_copies_none(monkeypatch, spelling):
    for name in KEY_VARIABLES:  # a plain OpenAI user has no Azure key; here none is set at all
        monkeypatch.delenv(name, raising=False)
    cfg = composed("+exp=demo", spelling, "mlflow.experiment=other", "mlflow.tracking_uri=http://127.0.0.1:5000",
                   "reflect.edit_budget=2")
    hydra = cfg.hydra
    assert hydra.launcher._target_.endswith("SlurmLauncher")
    assert not hydra.job.env_copy and not hydra.job.env_set  # no key variable is copied into the config
    assert Path(hydra.sweep.dir).is_absolute() and hydra.sweep.dir == str(Path.cwd() / "outputs/sweeps/demo")
    # the preset and the tracking settings name no job folder: the same cell locally and on the cluster
    assert hydra.job.override_dirname == "+exp=demo,reflect.edit_budget=2"


def test_the_ray_preset_attaches_and_passes_no_key():
    if RAY:
        launcher = composed("+exp=demo", "+cluster=ray").hydra.launcher
        assert launcher._target_.endswith("RayLauncher")
        init = OmegaConf.to_container(launcher.ray.init, resolve=True)
    else:  # the preset as written; composing it needs the plugin
        init = OmegaConf.to_container(OmegaConf.load(PROJECT / "conf/cluster/ray.yaml").hydra.launcher.ray.init)
    # connecting to a running cluster: Ray refuses an object store size then
    assert init == {"address": "auto", "object_store_memory": None}
    preset = OmegaConf.to_container(OmegaConf.load(PROJECT / "conf/cluster/ray.yaml"))["hydra"]
    assert "env_copy" not in preset.get("job", {}) and "runtime_env" not in init
    assert preset["sweep"]["dir"].startswith("${hydra:runtime.cwd}/")  # the jobs' cwd is the Ray node's


@pytest.mark.skipif(RAY, reason="hydra-ray-launcher is installed here")
def test_the_ray_preset_without_its_plugin_names_the_extra(tmp_path):
    proc = run_cli("-m", "+exp=demo", "+cluster=ray", "optimizer=dry_run", cwd=tmp_path)
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, output(proc)
    assert proc.stderr.strip().endswith("(install it with: pip install 'reflact[ray]')")


@pytest.mark.slow
@pytest.mark.skipif(not SUBMITIT, reason="hydra-submitit-launcher is not installed (pip install 'reflact[slurm]')")
def test_a_submitit_sweep_with_the_slurm_preset_writes_the_key_nowhere(tmp_path, launch_dir):
    with OptimizerServer() as server:
        proc = run_cli("-m", "+exp=demo", "+cluster=slurm", "hydra/launcher=submitit_local", "optimizer=compatible",
                       f"optimizer.base_url={server.base_url}", "optimizer.model=test", "reflect.edit_budget=1,2",
                       cwd=launch_dir, env={"OPENAI_COMPATIBLE_API_KEY": CANARY}, timeout=600)
        ok(proc)
        # the key reached both jobs through the environment submitit passes on
        assert server.count > 0 and set(server.authorizations) == {f"Bearer {CANARY}"}
    sweep = launch_dir / "outputs" / "sweeps" / "demo"
    jobs = sorted(p.name for p in sweep.iterdir() if p.is_dir() and p.name.startswith("+exp="))
    assert jobs == ["+exp=demo,optimizer.model=test,optimizer=compatible,reflect.edit_budget=1",
                    "+exp=demo,optimizer.model=test,optimizer=compatible,reflect.edit_budget=2"]
    assert (sweep / ".submitit").is_dir() and (sweep / "multirun.yaml").is_file()
    assert not list((sweep / ".submitit").glob("*%*"))  # no folder named by an unfilled pattern
    assert files_holding(launch_dir, CANARY) == []  # the sweep dir, its pickles, the store, the cache


RAY_SWEEP = """
import json, os, socket, subprocess, sys, tempfile
from pathlib import Path
from reflact.testing.optimizer_server import OptimizerServer

node, launch, out, canary = sys.argv[1:5]
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
temp = tempfile.mkdtemp(prefix="r", dir="/tmp")  # Ray's socket paths must stay short
ray = [sys.executable, "-m", "ray.scripts.scripts"]
node_env = {**os.environ, "OPENAI_COMPATIBLE_API_KEY": canary, "RAY_USAGE_STATS_ENABLED": "0"}
result = {"temp": temp}
with OptimizerServer() as server:
    subprocess.run([*ray, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", f"--temp-dir={temp}",
                    "--num-cpus=2", "--include-dashboard=false", "--disable-usage-stats"],
                   cwd=node, env=node_env, check=True, capture_output=True, timeout=180)
    try:
        # the submitting shell has no key: the jobs get the one their node was started with
        env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
        proc = subprocess.run([sys.executable, "-m", "reflact.run", "-m", "+exp=demo", "+cluster=ray",
                               "optimizer=compatible", f"optimizer.base_url={server.base_url}", "optimizer.model=test",
                               "reflect.edit_budget=1,2", "reflect.minibatch_size=4,8"],
                              cwd=launch, env={**env, "RAY_ADDRESS": f"127.0.0.1:{port}"},
                              capture_output=True, text=True, timeout=900)
        result.update(code=proc.returncode, stderr=proc.stderr[-4000:], authorizations=server.authorizations)
    finally:
        subprocess.run([*ray, "stop", "--force"], env=node_env, capture_output=True, timeout=120)
Path(out).write_text(json.dumps(result))
"""


@pytest.mark.slow
@pytest.mark.skipif(not RAY, reason="hydra-ray-launcher is not installed (pip install 'reflact[ray]')")
def test_a_ray_sweep_from_another_directory_lands_in_one_sweep_dir(tmp_path, launch_dir):
    """A Ray head started in its own directory, inside a loopback-only network namespace (`ray start`
    binds every interface otherwise), runs a 2x2 sweep; all four jobs write under the one sweep dir."""
    node = tmp_path / "node"
    node.mkdir()
    out = tmp_path / "result.json"
    command = ["unshare", "--net", "--map-root-user", sys.executable, "-c", RAY_SWEEP,
               str(node), str(launch_dir), str(out), CANARY]
    subprocess.run(command, env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}, check=True, timeout=1500)
    result = json.loads(out.read_text())
    temp = Path(result["temp"])
    try:
        check_ray_sweep(result, temp, node, launch_dir)
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def check_ray_sweep(result: dict, temp: Path, node: Path, launch_dir: Path) -> None:
    assert result["code"] == 0, result["stderr"]
    assert result["authorizations"] and set(result["authorizations"]) == {f"Bearer {CANARY}"}
    sweep = launch_dir / "outputs" / "sweeps" / "demo"
    jobs = [p for p in sweep.iterdir() if p.name.startswith("+exp=")]
    assert len(jobs) == 4 and all((job / "summary.json").is_file() for job in jobs)
    assert not any(node.iterdir())  # nothing landed in the node's working directory
    parent = json.loads((sweep / "mlflow_parent.json").read_text())
    assert parent["sweep_id"] == "outputs/sweeps/demo"
    assert files_holding(launch_dir, CANARY) == []
    # Ray's own session files do not hold it either (a runtime_env's env_vars would be logged there)
    assert files_holding(temp, CANARY) == []
