"""The launch dir: the folder a run is started from. Its outputs/ holds what the runs started
there share: the response cache, the default MLflow store and its artifacts, and (named by
conf/hydra/reflact.yaml for the command line) the runs and sweeps."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class LaunchDir:
    root: Path

    @property
    def outputs(self) -> Path:
        return self.root / "outputs"

    def cache(self, configured: str | None) -> Path:
        """The response cache: `optimizer.cache_path` when set, else outputs/cache.db."""
        return Path(configured) if configured else self.outputs / "cache.db"

    @property
    def mlflow_store(self) -> Path:
        return self.outputs / "mlflow.db"

    @property
    def mlflow_uri(self) -> str:
        """The store a run logs to (and reads traces and prompts from) when mlflow.tracking_uri is unset."""
        return f"sqlite:///{self.mlflow_store.resolve()}"

    @property
    def mlflow_artifacts(self) -> Path:
        return self.outputs / "mlartifacts"

    def new_run_dir(self) -> Path:
        """outputs/runs/<date>/<time>, as the command line names a run dir, unique within the second."""
        base = self.outputs / "runs" / time.strftime("%Y-%m-%d") / time.strftime("%H-%M-%S")
        folder, n = base, 1
        while folder.exists():
            n += 1
            folder = base.with_name(f"{base.name}-{n}")
        return folder
