"""Agreement, redundancy and seed agreement after the fact, over any finished run dirs:

    python -m reflact.analyze RUN_OR_SWEEP_DIR... [--out DIR] [--threshold X] [--log]
        [--matcher lexical|embedding|judge] [--set analysis.embedding.base_url=URL ...]

A sweep dir stands for its jobs' run dirs. The runs may come from different days and sweeps: runs
whose settings differ only in `reflect.seed` are compared across seeds. Writes `analysis.md` (a
table per run and per cell), `analysis.png` and `analysis.json` into --out (default: the sweep's
`report/` when one sweep dir is given, else `analysis/` here). Nothing in the run dirs changes.
With --log the figures go to the MLflow parent run of each sweep involved (`mlflow_parent.json`):
the seed agreement per cell and its mean, the means of redundancy, agreement and distinct items,
the threshold, and the report under `analysis/`. The matcher and its settings (`analysis.*`, the
optimizer's endpoint, prices and cost cap for the calls) are those of the first run's saved config
unless --matcher and --set say otherwise; the embeddings and judge replies a run already made are
answered from the response cache (outputs/cache.db here, or optimizer.cache_path), so a re-analysis
pays only for new texts. The judge's replies go under --out's judge/. The matcher is also measured on
the labelled pairs reflact ships (reflact.analysis.trust): its recall on paraphrases and its rate of
merged different changes, in the report, in analysis.json (`matcher_trust`) and in the metrics.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from reflact.analysis.figures import (
    Run,
    analyse,
    load_run,
    saved_threshold,
    seed_agreement,
    seed_by_cell,
    seed_metrics,
)
from reflact.config import AnalysisConfig, Matcher, ReflactConfig, check_threshold
from reflact.core.errors import UserError, exits_on_user_error, own_lines_shown
from reflact.core.files import usable_folder
from reflact.core.imports import one_at_a_time
from reflact.core.text import markdown_table
from reflact.running.rundir import ANALYSIS, RunDir, SweepDir

log = logging.getLogger("reflact")
SHOWN = ("edits", "distinct_edits", "distinct_edits_per_usd", "redundancy", "agreement")


def resolve(paths: list[Path]) -> tuple[list[Path], list[SweepDir]]:
    """(the run dirs to analyse, in the order given; the sweeps they belong to)."""
    runs: list[Path] = []
    sweeps: dict[Path, SweepDir] = {}
    for path in paths:
        if not path.is_dir():
            raise UserError(f"{path}: no such directory")
        if RunDir(path).summary() is not None:
            runs.append(path)
            parent = SweepDir.holding(path)
            sweeps.update({parent.root: parent} if parent is not None else {})
            continue
        sweep = SweepDir(path.resolve())
        found = [rd.root for rd in sweep.runs()]
        if not found:
            raise UserError(f"{path}: neither a finished run dir nor a sweep dir holding finished run dirs")
        runs += found
        sweeps[sweep.root] = sweep
    unique = list(dict.fromkeys(p.resolve() for p in runs))
    return unique, list(sweeps.values())


def pick_threshold(given: float | None, runs: list[Run], matcher: str = "lexical") -> float | None:
    """--threshold, else the one the runs were analysed with by this matcher (they must agree),
    else None (the matcher's default)."""
    if given is not None:
        return check_threshold(given, "--threshold")
    for run in runs:
        if run.threshold is not None and run.matcher == matcher and saved_threshold(run) is None:
            raise UserError(
                f"{run.path / ANALYSIS}: damaged (threshold {repr(run.threshold)[:40]} is not a number in (0, 1]); "
                "choose one with --threshold"
            )
    found = sorted({t for run in runs if run.matcher == matcher and (t := saved_threshold(run)) is not None})
    if len(found) > 1:
        raise UserError(
            f"the runs were analysed with different match thresholds ({', '.join(map(str, found))}); "
            "choose one with --threshold"
        )
    return found[0] if found else (AnalysisConfig().match_threshold if matcher == "lexical" else None)


def settings(run_dirs: list[Path], matcher: str | None, overrides: list[str]) -> ReflactConfig:
    """The analysis's settings: the first run's saved config (else the defaults), --set, --matcher."""
    with one_at_a_time():
        from omegaconf import OmegaConf
        from omegaconf.errors import OmegaConfBaseException

    from reflact.analysis.records import saved_config
    from reflact.config import apply_settings, check_analysis, literal, read_price, register, typed

    register()  # a saved config names shipped files as ${shipped:...}
    saved = next((p / ".hydra" / "config.yaml" for p in run_dirs if (p / ".hydra" / "config.yaml").is_file()), None)
    try:
        base = typed(saved_config(saved)) if saved else ReflactConfig()
    except OmegaConfBaseException as exc:
        raise UserError(f"{saved}: damaged ({_first_line(exc)})") from None
    node = OmegaConf.structured(literal(base))
    # as `python -m reflact.run` reads its overrides: `optimizer.cache=off`, `+optimizer.prices.m={input:1,...}`
    apply_settings(node, overrides, "--set", under=("analysis.", "optimizer."))
    try:
        cfg = typed(node)
    except OmegaConfBaseException as exc:
        raise UserError(f"--set: {_first_line(exc)}") from None
    if matcher is not None:
        cfg.analysis.matcher = Matcher(matcher)
    cfg.optimizer.prices = {m: read_price(m, p) for m, p in cfg.optimizer.prices.items()}
    check_analysis(cfg)
    return cfg


def _first_line(exc: Exception) -> str:
    return " ".join(str(exc).split())[:200]


def figures(runs: list[Run], matcher) -> dict:
    """What the report shows: each run's figures and each cell's seed agreement, by `matcher`
    (or a lexical threshold)."""
    from reflact.analysis.figures import as_matcher
    from reflact.analysis.trust import measured

    matcher = as_matcher(matcher)
    per_run = []
    for run in runs:
        result = analyse(run, matcher)
        result.pop("near_duplicates")  # in each run's own analysis
        per_run.append(
            {"run_dir": str(run.path), **run.label(), "seed": run.seed, "support_share": run.support_share, **result}
        )
    cells = seed_agreement(runs, matcher)
    by_cell = seed_by_cell(cells)
    described = matcher.describe()
    trust = measured(matcher)
    return {
        **described,
        "matcher_trust": trust,
        "runs": per_run,
        "cells": cells,
        "metrics": {
            **seed_metrics(by_cell),
            **_means(per_run),
            "analysis_threshold": described["threshold"],
            **{f"matcher_{k}": v for k, v in trust.items() if k.endswith(("_recall", "_rate")) and v is not None},
        },
    }


def _means(per_run: list[dict]) -> dict[str, float]:
    means = {}
    for key in ("redundancy", "agreement", "distinct_edits"):
        values = [r[key] for r in per_run if isinstance(r.get(key), (int, float))]
        if values:
            means[f"{key}_mean"] = round(sum(values) / len(values), 6)
    return means


def markdown(result: dict) -> str:
    from reflact.analysis.trust import sentence

    lines = [
        "# Agreement and redundancy",
        "",
        f"Matcher {result.get('matcher', 'lexical')}, threshold {result['threshold']} ({result.get('matching', '')}).",
        "",
        sentence(result.get("matcher_trust") or {}),
        "",
        "## Runs",
        "",
    ]
    head = ["run", "mode", "M", "L", "seed", "k", *SHOWN, "support_share"]
    lines += markdown_table(head, [[_short(r["run_dir"]), *(_cell(r[k]) for k in head[1:])] for r in result["runs"]])
    lines += ["", "## Across seeds", "", "Runs whose settings differ only in the seed form a cell.", ""]
    head = ["mode", "M", "L", "k", "seeds", "runs", "edits", "recurring", "seed_agreement"]
    lines += markdown_table(head, [[_cell(c[k]) for k in head] for c in result["cells"]])
    lines += [
        "",
        "agreement: share of a minibatch's items that another of its draws repeats (k >= 2); "
        "redundancy: share of items that another minibatch of the same group repeats; seed_agreement: "
        "share of a cell's items that a run with another seed repeats; – where not defined.",
    ]
    return "\n".join(lines) + "\n"


def _cell(value: object) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.3g}"
    return str(value)


def _short(path: str, limit: int = 48) -> str:
    name = Path(path).name
    return name if len(name) <= limit else "…" + name[-(limit - 1) :]


def picture(result: dict, path: Path) -> Path:
    """Per cell: the mean redundancy and agreement of its runs, and its seed agreement, as bars."""
    with one_at_a_time():
        import matplotlib

    matplotlib.use("Agg")
    with one_at_a_time():
        import matplotlib.pyplot as plt

    cells = result["cells"]
    names = [f"{c['mode']} M{c['M']} L{c['L']}" + (f" k{c['k']}" if c["k"] != 1 else "") for c in cells]
    series = {"redundancy": [], "agreement": [], "seed_agreement": [c["seed_agreement"] for c in cells]}
    for c in cells:
        members = [
            r
            for r in result["runs"]
            if (r["update_mode"], r["M"], r["L"], r["k"]) == (c["update_mode"], c["M"], c["L"], c["k"])
        ]
        for key in ("redundancy", "agreement"):
            values = [r[key] for r in members if r[key] is not None]
            series[key].append(sum(values) / len(values) if values else None)
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(cells) + 2), 4.5))
    width = 0.8 / len(series)
    for n, (key, values) in enumerate(series.items()):
        ax.bar(
            [i + n * width for i in range(len(cells))], [v if v is not None else 0 for v in values], width, label=key
        )
    ax.set_xticks([i + width for i in range(len(cells))], names, rotation=20, ha="right")
    ax.set_ylim(0, 1)
    ax.set_ylabel("share of kept items")
    ax.set_title(f"agreement and redundancy ({result.get('matcher', 'lexical')}, threshold {result['threshold']})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(result: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "analysis.md").write_text(markdown(result), encoding="utf-8")
    (out / "analysis.json").write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return [out / "analysis.md", picture(result, out / "analysis.png"), out / "analysis.json"]


def log_to_parents(sweeps: list[SweepDir], metrics: dict[str, float], paths: list[Path]) -> bool:
    """The figures on each sweep's MLflow parent run; False when a store failed (with a warning)."""
    from reflact.core.text import one_line
    from reflact.tracking.store import mlflow_defaults

    mlflow_defaults()
    with one_at_a_time():
        from mlflow.tracking import MlflowClient

    ok = True
    for sweep in sweeps:
        record = sweep.parent_record()
        if not record.get("run_id") or not record.get("tracking_uri"):
            continue
        try:
            client = MlflowClient(tracking_uri=record["tracking_uri"])
            for key, value in metrics.items():
                client.log_metric(record["run_id"], key, float(value))
            for path in paths:
                client.log_artifact(record["run_id"], str(path), "analysis")
            log.info("logged to the MLflow parent run %s of %s", record["run_id"], sweep.root)
        except Exception as exc:  # the store's failure, in one line; the report is on disk
            log.warning("MLflow logging to %s failed: %s", record["tracking_uri"], one_line(exc))
            ok = False
    return ok


def analyze(
    paths: list[Path],
    out: Path | None,
    threshold: float | None,
    to_mlflow: bool,
    matcher: str | None = None,
    overrides: Sequence[str] = (),
) -> tuple[list[Path], bool]:
    """The command, from Python: (the report's files, whether everything asked was logged)."""
    from reflact.analysis.matchers import matcher_for

    run_dirs, sweeps = resolve(paths)
    if to_mlflow and not any(s.parent_record().get("run_id") for s in sweeps):
        raise UserError(
            "--log: none of the given dirs belongs to a sweep with an MLflow parent run (mlflow_parent.json)"
        )
    cfg = settings(run_dirs, matcher, list(overrides))
    runs = [load_run(path) for path in run_dirs]
    if out is None:
        out = sweeps[0].report if len(sweeps) == 1 and all(SweepDir(p).is_sweep() for p in paths) else Path("analysis")
    usable_folder(out, "--out")  # before any call the analysis makes
    chosen = matcher_for(
        cfg.analysis,
        cfg.optimizer,
        Path.cwd(),
        0.0,
        out / "judge",
        pick_threshold(threshold, runs, cfg.analysis.matcher.value),
    )
    try:
        result = figures(runs, chosen.matcher)
    finally:
        chosen.close()
    result["metrics"].update({k: v for k, v in chosen.usage().items() if k != "analysis_calls"})
    result.update(chosen.usage())
    written = write_report(result, out)
    return written, log_to_parents(sweeps, result["metrics"], written) if to_mlflow else True


@exits_on_user_error
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Agreement, redundancy and seed agreement of finished runs.")
    parser.add_argument("dirs", type=Path, nargs="+", metavar="RUN_OR_SWEEP_DIR")
    parser.add_argument("--out", type=Path, default=None, help="folder for the report")
    parser.add_argument(
        "--threshold",
        type=float,
        default=None,
        help="match threshold in (0, 1] (default: the runs' own, else the matcher's default)",
    )
    parser.add_argument("--log", action="store_true", help="log the figures to the sweeps' MLflow parent runs")
    parser.add_argument(
        "--matcher",
        choices=[m.value for m in Matcher],
        default=None,
        help="lexical, embedding or judge (default: the runs' own analysis.matcher)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        dest="overrides",
        help="an analysis.* or optimizer.* setting, e.g. analysis.embedding.base_url=URL (repeatable)",
    )
    args = parser.parse_args(argv)
    own_lines_shown()
    written, logged = analyze(args.dirs, args.out, args.threshold, args.log, args.matcher, args.overrides)
    print("\n".join(str(path) for path in written))
    return 0 if logged else 1


if __name__ == "__main__":
    sys.exit(main())
