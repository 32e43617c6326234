"""What live.py and sweep.py measure beside reflact: the peer (bench/peer.py), the floors, the load."""

from __future__ import annotations

import json
import math
import os
import shutil
import sqlite3
import time
from pathlib import Path

from _common import BASE_ENV, BENCH, PY, REPO, Server, run_process

TEMPLATES = ("--error-template", str(REPO / "prompts" / "analyst_error.md"),
             "--success-template", str(REPO / "prompts" / "analyst_success.md"))


def skillopt_env(server: Server) -> dict:
    """The environment skillopt's OpenAI chat backend reads at import (bench/_ref_driver.py)."""
    return {**BASE_ENV, "OPTIMIZER_BACKEND": "openai_chat", "AZURE_OPENAI_AUTH_MODE": "openai_compatible",
            "AZURE_OPENAI_ENDPOINT": server.base_url, "AZURE_OPENAI_API_KEY": "dummy",
            "OPTIMIZER_DEPLOYMENT": "bench-model"}


def load() -> str:
    """The 1-, 5- and 15-minute load averages, as `uptime` prints them."""
    return "load " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


# ---------------------------------------------------------------- the peer

def run_peer(data: Path, server: Server, launch: Path, cells: list[tuple[int, int, int]], workers: int,
             timeout_s: float = 3600) -> dict:
    """bench/peer.py from `launch` (its store: launch/outputs/mlflow.db): the process, the calls, the cells."""
    result = launch / "peer-result.json"
    server.reset()
    started_at = time.time()
    proc = run_process([PY, str(BENCH / "peer.py"), "--data", str(data), "--out", str(launch / "patches"),
                        *TEMPLATES, "--workers", str(workers), "--result", str(result),
                        "--cells", *(",".join(map(str, c)) for c in cells)],
                       cwd=launch, env=skillopt_env(server), timeout_s=timeout_s)
    if proc.returncode != 0 or not result.is_file():
        raise SystemExit(f"the peer in {launch} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    stats = server.stats()
    return {"proc": proc, "calls": stats["requests"], "server": stats, "started_at": started_at,
            **json.loads(result.read_text())}


def peer_store(work: Path, data: Path, server: Server, cells: list[tuple[int, int, int]], workers: int) -> Path:
    """The peer's warm store: one peer run of these cells has migrated it and made its experiment."""
    launch = work / "peer-template"
    (launch / "outputs").mkdir(parents=True)
    run_peer(data, server, launch, cells, workers)
    return launch / "outputs" / "mlflow.db"


def peer_launch(work: Path, name: str, store: Path) -> Path:
    """A launch dir holding a copy of the peer's warm store, its experiments' artifacts moved to
    this launch dir's mlruns/ (where MLflow put them for the store's first launch dir)."""
    launch = work / name
    (launch / "outputs").mkdir(parents=True)
    db = launch / "outputs" / "mlflow.db"
    shutil.copyfile(store, db)
    old, new = str(store.parent.parent.resolve()), str(launch.resolve())
    with sqlite3.connect(db) as connection:
        connection.execute("UPDATE experiments SET artifact_location = replace(artifact_location, ?, ?)", (old, new))
    connection.close()
    return launch


# ---------------------------------------------------------------- the floors

def run_compose_floor(overrides: list[str], cwd: Path, with_mlflow: bool) -> float:
    """Wall time of bench/_compose_floor.py: Hydra composes reflact's config for these overrides, exit."""
    proc = run_process([PY, str(BENCH / "_compose_floor.py"), *(["--import-mlflow"] if with_mlflow else []),
                        *overrides], cwd=cwd)
    if proc.returncode != 0:
        raise SystemExit(f"the compose floor failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.wall_s


def latency_floor_s(calls: int, workers: int, latency_s: float) -> float:
    return math.ceil(calls / workers) * latency_s


def cell_calls(data: Path, minibatch_size: int) -> int:
    """The optimizer calls of one cell: its failure and success minibatches (skillopt's split)."""
    results = [json.loads(line) for line in (data / "results.jsonl").read_text(encoding="utf-8").splitlines()
               if line.strip()]
    failures = sum(1 for r in results if not r.get("hard") or float(r.get("hard", 0)) < 1e-9)
    return math.ceil(failures / minibatch_size) + math.ceil((len(results) - failures) / minibatch_size)
