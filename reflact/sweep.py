"""A multirun as one MLflow group: a parent run per sweep, opened before the jobs start.

Hydra runs this callback in the launching process. Opening the parent there also creates the
experiment, which migrates a fresh sqlite store once, before parallel jobs could race on it.
Hydra only warns when a callback fails, so jobs do not rely on the parent: each also carries
the sweep id as a tag, and `python -m reflact.report` groups by that tag.
"""

from __future__ import annotations

import logging
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from reflact.files import read_json, write_json

log = logging.getLogger("reflact")


class MlflowSweep(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        if not config.mlflow.enabled:
            return
        from reflact.tracking import PARENT_FILE, experiment_id, sweep_id

        uri, sweep_dir, launch_dir = _where(config)
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=uri)
        exp_id = experiment_id(client, config.mlflow.experiment, uri, launch_dir)
        known = read_json(sweep_dir / PARENT_FILE)
        if isinstance(known, dict) and known.get("tracking_uri") == uri and _alive(client, known["run_id"]):
            client.update_run(known["run_id"], status="RUNNING")  # the same sweep again: resume its parent
            return
        sid = sweep_id(sweep_dir, launch_dir)
        run = client.create_run(exp_id, run_name=f"sweep {config.name}", tags={"reflact.sweep_id": sid,
                                                                                 "reflact.sweep_parent": "true"})
        write_json(sweep_dir / PARENT_FILE, {"run_id": run.info.run_id, "tracking_uri": uri, "sweep_id": sid})
        log.info("MLflow parent run %s for sweep %s", run.info.run_id, sid)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        if not config.mlflow.enabled:
            return
        from reflact.report import report_sweep
        from reflact.tracking import PARENT_FILE

        uri, sweep_dir, _ = _where(config)
        parent = read_json(sweep_dir / PARENT_FILE)
        if not isinstance(parent, dict):
            log.warning("no MLflow parent run was opened for this sweep; no report logged")
            return
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=uri)
        report_sweep(client, parent["sweep_id"], sweep_dir / "report", parent_run_id=parent["run_id"])
        client.set_terminated(parent["run_id"], "FINISHED")


def _where(config: DictConfig) -> tuple[str, Path, Path]:
    """(tracking URI, sweep dir, launch dir) for this multirun."""
    from hydra.core.hydra_config import HydraConfig

    from reflact.tracking import default_tracking_uri

    HydraConfig.instance().set_config(config)  # lets `${hydra:...}` in the sweep dir resolve
    launch_dir = Path.cwd()
    sweep_dir = Path(config.hydra.sweep.dir).resolve()
    sweep_dir.mkdir(parents=True, exist_ok=True)
    return config.mlflow.tracking_uri or default_tracking_uri(launch_dir), sweep_dir, launch_dir


def _alive(client, run_id: str) -> bool:
    try:
        return client.get_run(run_id).info.lifecycle_stage == "active"
    except Exception:  # noqa: BLE001 - deleted or from another store
        return False
