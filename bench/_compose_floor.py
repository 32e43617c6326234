"""Our stack's floor: a process that composes reflact's config for a command line and exits.

    python bench/_compose_floor.py [--import-mlflow] OVERRIDE ...

Hydra composes reflact's config with the same overrides as `python -m reflact.run OVERRIDE ...`
(reflact.api.compose: Hydra's compose API, then reflact's typed config and its checks), and the
process exits: no stage, no dataset, no client, no MLflow. With --import-mlflow, `import mlflow`
follows (in this one process). Whatever a reflact run does beyond this, it does on top of it.
"""

from __future__ import annotations

import sys


def main() -> None:
    args = sys.argv[1:]
    with_mlflow = "--import-mlflow" in args
    overrides = [a for a in args if a != "--import-mlflow"]
    import hydra  # noqa: F401  (the import Hydra's entry point makes)

    from reflact.api import compose

    compose(overrides)
    if with_mlflow:
        import mlflow  # noqa: F401


if __name__ == "__main__":
    main()
