"""Shared fixtures: a loopback optimizer server, generated datasets, configs, a migrated MLflow store."""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from reflact import config as reflact_config
from reflact.testing.optimizer_server import OptimizerServer

PROJECT = Path(__file__).resolve().parent.parent


def docs_script(name: str):
    """A script of docs/ (keys.py, screenshots.py) imported as the module `docs_<name>`."""
    spec = importlib.util.spec_from_file_location(f"docs_{name}", PROJECT / "docs" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[f"docs_{name}"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

SKILL = """# Support skill

## Orders
- Look up the order before acting on it.
- Amounts passed to refund() are in cents.

<!-- SLOW_UPDATE_START -->
- Never refund an order with an open dispute.
<!-- SLOW_UPDATE_END -->
"""


def write_dataset(root: Path, n_fail: int, n_succ: int, seed: int = 0, missing: int = 0, empty: int = 0) -> Path:
    """A dataset folder with the given numbers of failed and successful runs (results shuffled on disk).

    The first `missing` runs have no conversation folder, the next `empty` an empty list.
    """
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    (root / "skill.md").write_text(SKILL, encoding="utf-8")
    rows = []
    for i in range(n_fail + n_succ):
        run_id = f"run_{i:05d}"
        failed = i < n_fail
        rows.append({
            "id": run_id,
            "hard": 0 if failed else 1,
            "task_description": f"Task number {i}",
            "task_type": "support",
            "fail_reason": "wrong refund amount" if failed else "",
            "n_turns": 3,
        })
        if i < missing:
            continue
        conv = [] if i < missing + empty else [
            {"role": "user", "content": f"Please help with order {i}"},
            {"type": "tool_call", "cmd": f"lookup_order({i})", "obs": "status: shipped"},
            {"role": "assistant", "content": "Done."},
        ]
        folder = root / "predictions" / run_id
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "conversation.json").write_text(json.dumps(conv), encoding="utf-8")
    rng.shuffle(rows)
    (root / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return root

def stage_settings(cfg: reflact_config.ReflactConfig):
    """The sections the stage reads, as the run's orchestration hands them to it."""
    from reflact.running.stage import StageSettings

    return StageSettings(cfg.reflect, cfg.prompts, cfg.optimizer)


def shape_of(cfg: reflact_config.ReflactConfig) -> reflact_config.Shape:
    """What a fingerprint holds of the settings besides the messages."""
    return reflact_config.shape(cfg.reflect, cfg.optimizer)


def run_context(cfg: reflact_config.ReflactConfig, **given):
    """A run's context for its tracker, with the sections it reads."""
    from reflact.tracking.process import RunContext

    sections = {name: getattr(cfg, name) for name in ("data", "reflect", "prompts", "optimizer", "mlflow")}
    return RunContext(**sections, **given)


def long_dataset(root: Path, n_fail: int, obs_chars: int) -> Path:
    """Failures only, each with an observation of `obs_chars` characters between HEAD and TAIL
    (about obs_chars / 4 tokens a trajectory): for the context-window rules."""
    data = write_dataset(root, n_fail=n_fail, n_succ=0)
    for conv in (data / "predictions").glob("*/conversation.json"):
        items = json.loads(conv.read_text())
        items[1]["obs"] = "HEAD " + "x" * obs_chars + " TAIL"
        conv.write_text(json.dumps(items))
    return data



def make_config(*overrides: str) -> reflact_config.ReflactConfig:
    """The typed, validated config Hydra composes from conf/ with these overrides. Plain `a.b=value`
    settings are applied to a composed base shared by tests, as Hydra applies them after composing
    (composing costs ~0.2 s a test); a setting the base refuses composes in full, for Hydra's error."""
    groups, settings = _split_overrides(overrides)
    if not settings:
        return reflact_config.from_hydra(_composed(groups))[0]
    with contextlib.suppress(Exception):
        dict_cfg = copy.deepcopy(_composed(groups))
        for key, value in settings:
            OmegaConf.update(dict_cfg, key, value, merge=True)
        return reflact_config.from_hydra(dict_cfg)[0]
    return reflact_config.from_hydra(_compose(overrides))[0]


def _split_overrides(overrides: tuple[str, ...]) -> tuple[tuple[str, ...], list[tuple[str, object]]]:
    """Group, `+`, `~`, sweep and hydra overrides (Hydra composes them), and plain settings."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    groups, settings = [], []
    for line, parsed in zip(overrides, OverridesParser.create().parse_overrides(list(overrides)), strict=True):
        special = parsed.is_add() or parsed.is_delete() or parsed.is_force_add() or parsed.is_sweep_override()
        if special or "." not in parsed.key_or_group or parsed.is_hydra_override() or parsed.package is not None:
            groups.append(line)
        else:
            settings.append((parsed.key_or_group, parsed.value()))
    return tuple(groups), settings


def _composed(overrides: tuple[str, ...]):
    return _compose(overrides)


def _compose(overrides):
    reflact_config.register()
    with initialize_config_dir(config_dir=str(PROJECT / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def stage_for(tmp_path: Path, server, data: Path, *overrides: str, run_dir: Path | None = None, optimizer=None):
    """The stage through the real client against `server` (response cache off unless a test turns
    it on), or through `optimizer` when given."""
    from reflact.calls.client import make_client
    from reflact.inputs.dataset import load_dataset
    from reflact.running.stage import Stage

    cfg = make_config(f"data.dir={data}", f"optimizer.base_url={server.base_url}", "optimizer.model=test",
                      "optimizer.retry.initial_wait_s=0.01", "optimizer.retry.max_wait_s=0.02", "optimizer.cache=off",
                      *overrides)
    client = optimizer or make_client(cfg.optimizer, tmp_path, environ={})
    return Stage(stage_settings(cfg), load_dataset(cfg.data), client, run_dir or tmp_path / "run")


@pytest.fixture
def server():
    with OptimizerServer() as srv:
        yield srv


@pytest.fixture(scope="session")
def migrated_store(tmp_path_factory) -> Path:
    """One MLflow sqlite store migrated once; tests copy it (a fresh store takes seconds)."""
    import mlflow

    path = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    mlflow.MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def launch_dir(tmp_path, migrated_store) -> Path:
    """A launch directory whose outputs/mlflow.db is already migrated."""
    outputs = tmp_path / "launch" / "outputs"
    outputs.mkdir(parents=True)
    shutil.copy(migrated_store, outputs / "mlflow.db")
    return tmp_path / "launch"


def run_cli(*args: str, cwd: Path, env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    """`python -m reflact.run ARGS` in a subprocess, as a user types it."""
    full_env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", **(env or {})}
    full_env.pop("OPENAI_API_KEY", None) if env is None or "OPENAI_API_KEY" not in env else None
    return subprocess.run(
        [sys.executable, "-m", "reflact.run", *args],
        cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout,
    )


def output(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout + proc.stderr


def ok(proc: subprocess.CompletedProcess) -> str:
    """The command succeeded (its output's tail shown when not); returns what it printed."""
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\nSTDOUT:\n{proc.stdout[-4000:]}\nSTDERR:\n{proc.stderr[-6000:]}"
    )
    return output(proc)


def summary_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))


def patches_of(run_dir: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in sorted((run_dir / "patches").glob("*.json"))}


def file_bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def start_mlflow_server(root: Path, store: Path) -> tuple[subprocess.Popen, str]:
    """`mlflow server` on a free loopback port, on a copy of a migrated store; waits for /health."""
    shutil.copy(store, root / "server.db")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mlflow_bin = Path(sys.executable).parent / "mlflow"
    command = [str(mlflow_bin)] if mlflow_bin.exists() else [sys.executable, "-m", "mlflow"]
    log = open(root / "server.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        [*command, "server", "--backend-store-uri", f"sqlite:///{root / 'server.db'}",
         "--artifacts-destination", str(root / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1"],
        cwd=root, stdout=log, stderr=subprocess.STDOUT,
        # no background job runner (huey consumers) for a short-lived test server
        env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        start_new_session=True,  # its own process group: the server and the uvicorn it starts stop together
    )
    proc.log_file = log  # type: ignore[attr-defined]
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    return proc, url
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc)
            pytest.fail(f"mlflow server did not come up:\n{(root / 'server.log').read_text(errors='replace')[-3000:]}")
        time.sleep(0.25)


def stop(proc: subprocess.Popen) -> None:
    """Stop the server's process group (the group this test started for it)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=15)
            break
        except subprocess.TimeoutExpired:
            continue
    proc.log_file.close()  # type: ignore[attr-defined]


# end-to-end fixtures that run several whole commands (sweeps, kills and reruns, broken stores):
# the tests sharing them are slow, out of the quick `pytest -m "not slow"` loop (CI runs them all)
SLOW_FIXTURES = {"sweeps", "killed_and_rerun", "tracking_failure", "shown"}


def pytest_collection_modifyitems(items) -> None:
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
