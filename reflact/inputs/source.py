"""The run's dataset from where data.source says: a dataset folder, or scored traces in MLflow."""

from __future__ import annotations

from pathlib import Path

from reflact.config import DataConfig, DataSource, MlflowConfig, ReflectConfig
from reflact.core.errors import UserError
from reflact.core.groups import failed
from reflact.core.launch import LaunchDir
from reflact.inputs.dataset import Dataset, load_dataset


def load_input(data: DataConfig, mlflow: MlflowConfig, r: ReflectConfig, launch_dir: Path) -> Dataset:
    """The checked dataset; traces are read from data.mlflow.tracking_uri, by default the store
    the run logs to (mlflow.tracking_uri), asked as long as the run waits for it at its end."""
    store = mlflow.tracking_uri or LaunchDir(launch_dir).mlflow_uri
    if data.source is DataSource.files:
        return load_dataset(data, store)  # a prompts:/ skill is read from the run's store
    from reflact.inputs.traces import load_traces

    uri = data.mlflow.tracking_uri or store
    dataset = load_traces(data, uri, mlflow.deadline_s)
    if r.failure_only and not any(failed(x.hard, r.success_threshold) for x in dataset.results):
        raise UserError(
            f"data.mlflow.label: every selected trace passes, and reflect.failure_only=true reflects on "
            f"failures only; select traces that failed (feedback {data.mlflow.label!r})"
        )
    return dataset
