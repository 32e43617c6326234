"""A run dir is made and held by its run; a mistake removes only the folders this process made,
never a folder of the user's, one named by the environment, or one another run holds (issue 36,
item 2). A run or sweep dir that cannot be made is one line (item 14); a mistaken rerun leaves the run's log
as it was, whatever warnings the libraries raised (item 7)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reflact.running.newdir import discard, make
from tests.conftest import run_cli

DRY = ["+exp=demo", "optimizer=dry_run", "mlflow.enabled=false"]
MISTAKE = "reflect.minibatch_size=0"

# `python -c PAUSED READY GO ARGS...`: the command line, its config checks (config.from_hydra, the
# first thing the job does) waiting until GO exists, once READY says the job got there; a library
# warning is raised as reflact registers its config (where Hydra 1.4's deprecations come)
PAUSED = """
import pathlib, sys, time, warnings
import reflact.config as config
ready, go = map(pathlib.Path, sys.argv[1:3])
del sys.argv[1:3]
checks, register = config.from_hydra, config.register
def paused(dict_cfg):
    ready.touch()
    while not go.exists():
        time.sleep(0.01)
    return checks(dict_cfg)
def warned():
    warnings.warn("a library's deprecation", DeprecationWarning)
    register()
config.from_hydra, config.register = paused, warned
from reflact.run import main
main()
"""


def started(tmp_path: Path, name: str, *args: str, cwd: Path) -> tuple[subprocess.Popen, Path]:
    """The command line, paused in its config checks (returned once it got there) until `go` is touched."""
    ready, go = tmp_path / f"{name}.ready", tmp_path / f"{name}.go"
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    proc = subprocess.Popen([sys.executable, "-c", PAUSED, str(ready), str(go), *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not ready.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the run never reached its checks"
        time.sleep(0.02)
    return proc, go


def finished(proc: subprocess.Popen, go: Path) -> tuple[int, str]:
    go.touch()
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


def tree(folder: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(folder)): None if p.is_dir() else p.read_bytes() for p in sorted(folder.rglob("*"))}


@pytest.mark.parametrize("held", [{}, {"run.log": b"the user's own log\n"}], ids=["empty", "with a run.log"])
def test_a_mistake_through_a_dot_dot_path_leaves_the_users_folder_and_makes_no_other(tmp_path, held):
    mine = tmp_path / "mine"
    mine.mkdir()
    for name, data in held.items():
        (mine / name).write_bytes(data)
    done = run_cli(*DRY, "hydra.run.dir=new/../mine", MISTAKE, cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.startswith("reflact: error: reflect.minibatch_size"), done.stderr
    assert mine.is_dir() and tree(mine) == held
    assert not (tmp_path / "new").exists()


def test_a_mistake_keeps_a_users_empty_folder_above_the_run_dir_it_made(tmp_path):
    (tmp_path / "keep").mkdir()
    done = run_cli(*DRY, "hydra.run.dir=new/../keep/run", MISTAKE, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep"] and tree(tmp_path / "keep") == {}


def test_a_fresh_run_dir_named_by_the_environment_is_not_proof(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "run.log").write_text("the user's own log\n")
    for named in (mine, mine / "run.log", tmp_path):
        done = run_cli(*DRY, f"hydra.run.dir={mine}", MISTAKE, cwd=tmp_path, env={"REFLACT_FRESH_RUN_DIR": str(named)})
        assert done.returncode == 2, done.stderr
        assert tree(mine) == {"run.log": b"the user's own log\n"}


def test_a_mistake_leaves_a_run_dir_it_made_while_another_run_holds_it(tmp_path):
    """Two runs started at once into one fresh dir: the first makes it and stops on a mistake while
    the second is still checking its inputs (no run lock yet): the second's dir and log stay."""
    run_dir = tmp_path / "launch" / "outputs" / "runs" / "both"
    launch = tmp_path / "launch"
    launch.mkdir()
    first, first_go = started(tmp_path, "first", *DRY, f"hydra.run.dir={run_dir}", MISTAKE, cwd=launch)
    assert run_dir.is_dir()  # made by the first, before its checks
    second, second_go = started(tmp_path, "second", *DRY, f"hydra.run.dir={run_dir}", cwd=launch)
    code, err = finished(first, first_go)
    assert code == 2 and err.startswith("reflact: error: reflect.minibatch_size"), err
    assert run_dir.is_dir()
    code, err = finished(second, second_go)
    assert code == 0, err
    assert (run_dir / "summary.json").is_file() and "dry run: 4 prompts built" in (run_dir / "run.log").read_text()


def test_a_mistaken_rerun_leaves_the_runs_log_as_it_was_whatever_the_libraries_warned(tmp_path):
    run_dir = tmp_path / "run"
    proc, go = started(tmp_path, "fresh", *DRY, f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert finished(proc, go)[0] == 0
    assert "a library's deprecation" in (run_dir / "run.log").read_text()  # once the checks passed: logged
    before = tree(run_dir)
    proc, go = started(tmp_path, "again", *DRY, f"hydra.run.dir={run_dir}", MISTAKE, cwd=tmp_path)
    assert finished(proc, go)[0] == 2
    assert tree(run_dir) == before


@pytest.mark.parametrize("key", ["hydra.run.dir", "hydra.sweep.dir"])
@pytest.mark.parametrize("where", ["afile", "afile/below"])
def test_a_run_or_sweep_dir_that_is_a_file_is_one_line(tmp_path, key, where):
    (tmp_path / "afile").write_text("not a folder")
    sweep = ["-m", "reflect.minibatch_size=4,8"] if key == "hydra.sweep.dir" else []
    done = run_cli(*sweep, *DRY, f"{key}={where}", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr == f"reflact: error: {key}: {tmp_path / 'afile'} is a file, not a folder\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


# the rule at the unit owning it: what `discard` removes of what `make` made

def test_discard_removes_the_folders_made_and_none_above(tmp_path):
    (tmp_path / "above").mkdir()
    new = make(tmp_path / "above" / "a" / "b", "run_dir")
    assert [m.path for m in new.made] == [tmp_path / "above" / "a" / "b", tmp_path / "above" / "a"]
    (new.root / "run.log").write_text("")
    discard(new, {"run.log"})
    new.release()
    assert tree(tmp_path) == {"above": None}


def test_discard_leaves_a_run_dir_another_run_holds(tmp_path):
    new = make(tmp_path / "run", "run_dir")
    other = make(tmp_path / "run", "run_dir")  # found, not made: held all the same
    assert other.made == [] and other.hold is not None
    discard(new, set())
    assert (tmp_path / "run").is_dir()
    other.release()
    discard(new, set())
    new.release()
    assert not (tmp_path / "run").exists()


def test_discard_leaves_a_folder_made_again_in_the_place_of_the_one_made(tmp_path):
    new = make(tmp_path / "run", "run_dir")
    (tmp_path / "run").rename(tmp_path / "moved")
    (tmp_path / "run").mkdir()  # another's, at the same path
    discard(new, set())
    new.release()
    assert (tmp_path / "run").is_dir() and (tmp_path / "moved").is_dir()


def test_discard_leaves_a_run_dir_holding_more_than_its_own_files(tmp_path):
    new = make(tmp_path / "run", "run_dir")
    (new.root / "run.log").write_text("")
    (new.root / "notes.txt").write_text("the user's")
    discard(new, {"run.log"})
    new.release()
    assert tree(tmp_path / "run") == {"notes.txt": b"the user's", "run.log": b""}


def test_a_sweep_refused_at_its_start_ends_on_its_one_line_whatever_the_hydra(tmp_path, capsys):
    """Hydra 1.4 calls on_multirun_end even when on_multirun_start ended on a mistake: the end then
    reads nothing and says nothing more (no 'sweep failed' from an earlier sweep's records)."""
    from reflact.sweeps.sweep import MlflowSweep
    from tests.test_cluster import composed

    (tmp_path / "afile").write_text("not a folder")
    config = composed("+exp=demo", "mlflow.enabled=false", f"hydra.sweep.dir={tmp_path / 'afile'}")
    sweep = MlflowSweep()
    with pytest.raises(SystemExit) as ended:
        sweep.on_multirun_start(config=config)
    sweep.on_multirun_end(config=config)
    assert ended.value.code == 2 and capsys.readouterr().err.count("\n") == 1
