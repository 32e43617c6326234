"""No module is imported by two threads at once: the rule behind reflact's deferred imports.

reflact imports its heavy libraries where they are used, some on its own threads (the MLflow
tracker, the analysis warm-up). Two threads importing one package at once can get a half-made
module (a run that crashed after its last call with `partially initialized module
'rapidfuzz.process' has no attribute 'cdist'`). reflact.core.imports holds the one lock they share.

Two checks: the code (every deferred import of another package is inside the lock), and real runs
(an audit hook in every process of the run records each module loaded while a thread of reflact's
is alive without the lock held: whatever the timing, any such load is a race waiting to happen).
"""

from __future__ import annotations

import ast
import json
import sys

import pytest

from tests.conftest import PROJECT, run_cli, write_dataset

STDLIB = set(sys.stdlib_module_names) | {"__future__"}

# the hook runs in every process the run starts (sitecustomize), writing one line per violation
AUDIT_SITE = '''
import os, sys, threading

_out = os.path.join(os.environ["REFLACT_IMPORT_AUDIT"], f"{os.getpid()}.txt")


def _ours(thread):
    return thread.name.startswith("reflact-")


def _hook(event, args):
    if event != "import":
        return
    current = threading.current_thread()
    alive = [t.name for t in threading.enumerate() if _ours(t) and t is not current]
    if not alive and not _ours(current):
        return
    imports = sys.modules.get("reflact.core.imports")
    if imports is not None and imports.held():
        return
    with open(_out, "a") as out:
        out.write(f"{args[0]} loaded on {current.name} while {', '.join(alive) or 'no other'} ran\\n")


sys.addaudithook(_hook)
'''


def deferred_imports_outside_the_lock(source: str) -> list[str]:
    """Function-local imports of other packages (and import_module calls) not lexically inside
    `with one_at_a_time():`."""
    found: list[str] = []

    def visit(node: ast.AST, in_function: bool, locked: bool) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            in_function = True
        if isinstance(node, ast.With) and any(
            isinstance(item.context_expr, ast.Call) and getattr(item.context_expr.func, "id", "") == "one_at_a_time"
            for item in node.items
        ):
            locked = True
        if in_function and not locked and _imports_another_package(node):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
        for child in ast.iter_child_nodes(node):
            visit(child, in_function, locked)

    visit(ast.parse(source), False, False)
    return found


def _imports_another_package(node: ast.AST) -> bool:
    if isinstance(node, ast.Import):
        return any(alias.name.split(".")[0] not in STDLIB | {"reflact"} for alias in node.names)
    if isinstance(node, ast.ImportFrom):
        return node.level == 0 and (node.module or "").split(".")[0] not in STDLIB | {"reflact"}
    return isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module"


def test_the_checker_sees_an_unlocked_deferred_import():
    source = ("import numpy\n"
              "def f():\n    import numpy\n    import json\n    from reflact import x\n"
              "def g():\n    with one_at_a_time():\n        import numpy\n        importlib.import_module('scipy')\n"
              "def h():\n    importlib.import_module('scipy')\n")
    assert deferred_imports_outside_the_lock(source) == ["line 3: import numpy",
                                                         "line 11: importlib.import_module('scipy')"]


def test_every_deferred_import_of_another_package_takes_the_lock():
    found = {}
    for path in sorted((PROJECT / "reflact").rglob("*.py")):
        if problems := deferred_imports_outside_the_lock(path.read_text(encoding="utf-8")):
            found[str(path.relative_to(PROJECT))] = problems
    assert found == {}


@pytest.fixture
def audited(tmp_path):
    """An environment whose Python processes record each module loaded outside the lock while a
    thread of reflact's runs; returns (env, read violations)."""
    site, out = tmp_path / "audit_site", tmp_path / "audit"
    site.mkdir()
    out.mkdir()
    (site / "sitecustomize.py").write_text(AUDIT_SITE, encoding="utf-8")
    env = {"PYTHONPATH": f"{site}:{PROJECT}", "REFLACT_IMPORT_AUDIT": str(out)}

    def violations() -> list[str]:
        return sorted(line for f in out.glob("*.txt") for line in f.read_text().splitlines())

    return env, violations


def _ok(proc) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.slow
def test_a_run_and_its_reruns_load_no_module_outside_the_lock(server, launch_dir, tmp_path, audited):
    """A run with MLflow on and the analysis warm-up, the same run again (nothing to do), and a
    new run dir answered wholly from the cache (the quickest end, where the old race struck)."""
    env, violations = audited
    data = write_dataset(tmp_path / "data", n_fail=6, n_succ=6)
    point = [f"data.dir={data}", f"optimizer.base_url={server.base_url}", "optimizer.model=test",
             "reflect.minibatch_size=3", "optimizer=compatible"]
    for run in ("first", "first", "cached"):
        _ok(run_cli(*point, f"hydra.run.dir={tmp_path / run}", cwd=launch_dir, env=env))
        assert violations() == []
    counts = json.loads((tmp_path / "cached" / "summary.json").read_text())["counts"]
    assert (counts["cache_hits"], counts["calls"]) == (4, 0)  # the cached run made no request


def test_a_rerun_with_every_patch_reused_never_loads_the_sdk(server, launch_dir, tmp_path):
    """Nothing to ask: the client is never made, so the OpenAI SDK (about half a second of a
    rerun's start) is never imported; the first run, which asks, does import it (without the
    aiohttp transport it would bring along)."""
    data = write_dataset(tmp_path / "data", n_fail=3, n_succ=3)
    point = [f"data.dir={data}", f"optimizer.base_url={server.base_url}", "optimizer.model=test",
             "optimizer=compatible", "mlflow.enabled=false", f"hydra.run.dir={tmp_path / 'run'}"]
    loaded = []
    for _ in ("first", "again"):
        proc = run_cli(*point, cwd=launch_dir, env={"PYTHONPROFILEIMPORTTIME": "1"})
        assert proc.returncode == 0, proc.stderr[-3000:]
        loaded.append({line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()
                       if line.startswith("import time:")})
    assert {"openai", "reflact.calls.client"} <= loaded[0]
    assert "aiohttp" not in loaded[0]  # the SDK's aiohttp transport is never used: not loaded either
    assert not {"openai", "reflact.calls.client"} & loaded[1]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["counts"]["minibatches_reused"] == 2


def test_the_audit_catches_a_thread_importing_without_the_lock(tmp_path, audited):
    """What the old warm-up did: a thread of reflact's loading modules outside the lock."""
    import subprocess

    env, violations = audited
    code = ("import threading\n"
            "t = threading.Thread(target=lambda: __import__('colorsys'), name='reflact-warm')\n"
            "t.start(); t.join()\n")
    subprocess.run([sys.executable, "-c", code], env={**__import__("os").environ, **env}, check=True)
    assert violations() == ["colorsys loaded on reflact-warm while no other ran"]


@pytest.mark.slow
def test_runs_that_end_at_once_end_cleanly_every_time(server, launch_dir, tmp_path):
    """The symptom itself, where it struck: runs answered wholly from the cache end within a few
    tenths of a second of starting, while the tracker and the warm-up are still importing."""
    data = write_dataset(tmp_path / "data", n_fail=4, n_succ=4)
    point = [f"data.dir={data}", f"optimizer.base_url={server.base_url}", "optimizer.model=test",
             "reflect.minibatch_size=2", "optimizer=compatible"]
    for attempt in range(6):  # the wheel's soak in .ci/wheel_surface.sh runs more of them
        _ok(run_cli(*point, f"hydra.run.dir={tmp_path / f'run{attempt}'}", cwd=launch_dir))
    assert server.count == 4  # the first run asked; the five after it were answered by the cache
