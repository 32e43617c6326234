"""`python -m reflact.import_traces`: scored MLflow traces as a dataset folder (reflact.inputs.traces).

    python -m reflact.import_traces data/traces --experiment agent --label correctness

The folder holds what a run with data.source=mlflow and the same settings reads, in the layout
of any dataset folder, to look at, edit and pin in git; a run over it builds the same prompts.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from reflact.core.errors import exits_on_user_error


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m reflact.import_traces",
        description="Write the scored traces of MLflow experiments as a reflact dataset folder "
        "(skill.md, results.jsonl, predictions/). The options are data.mlflow's keys.",
    )
    parser.add_argument("dataset_dir", type=Path, help="the dataset folder to write")
    parser.add_argument(
        "--experiment", action="append", required=True, help="an experiment's name or id (repeat for more)"
    )
    parser.add_argument("--label", required=True, help="the feedback whose value says pass or fail")
    parser.add_argument("--filter", default=None, help="MLflow's search_traces filter, passed through as written")
    parser.add_argument("--pass-threshold", type=float, default=0.5, help="a numeric label passes at or above this")
    parser.add_argument(
        "--max-traces", type=int, default=None, help="at most this many labelled traces, the newest first"
    )
    parser.add_argument("--tracking-uri", default=None, help="the store (default: sqlite:///outputs/mlflow.db here)")
    parser.add_argument("--force", action="store_true", help="overwrite a folder that already has a results.jsonl")
    parser.add_argument(
        "--max-file-mb", type=float, default=64.0, help="the largest trace or file, as data.max_file_mb"
    )
    return parser


@exits_on_user_error
def main(argv: list[str] | None = None) -> int:
    from reflact.config import MlflowConfig, TracesConfig, check_traces
    from reflact.core.launch import LaunchDir
    from reflact.inputs.traces import import_traces

    args = build_parser().parse_args(argv)
    t = TracesConfig(args.experiment, args.filter, args.label, args.pass_threshold, args.max_traces, args.tracking_uri)
    check_traces(t, MlflowConfig())
    uri = args.tracking_uri or LaunchDir(Path.cwd()).mlflow_uri
    selection = import_traces(t, uri, args.dataset_dir, args.force, args.max_file_mb)
    for warning in selection.imported.warnings:
        print(f"reflact: warning: {warning}", file=sys.stderr)
    runs = selection.imported.runs
    failures = sum(1 for run in runs if run.result["hard"] == 0)
    print(
        f"reflact: wrote {len(runs)} traces to {args.dataset_dir} ({failures} failures, {len(runs) - failures} "
        f"successes; {selection.origin.unlabelled} unlabelled skipped)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
