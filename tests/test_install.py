"""reflact as a user installs it: the wheel built from this checkout, installed without the
checkout in sight, run from an empty directory.

Nothing is downloaded: the wheel is built with the setuptools already installed (the `test`
extra asks for one that builds wheels on its own), and the test's virtual environment gets the
wheel only, reaching reflact's dependencies through a .pth file that names the running
interpreter's import path minus the checkout. Folders added by a .pth line do not run the .pth
files inside them, so an editable install of the checkout living there stays out of sight; the
tests still check where `reflact` was imported from.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from tests.conftest import PROJECT, ok, write_dataset

pytestmark = pytest.mark.slow

# what a build must not see: local state of the checkout
_NOT_SOURCES = shutil.ignore_patterns(".git", ".venv", "venv", "build", "dist", "outputs", "*.egg-info",
                                      "__pycache__", ".pytest_cache", ".hypothesis", "mlruns")
SHIPPED = {"conf": "reflact/_conf", "prompts": "reflact/_prompts", "examples/demo": "reflact/_demo",
           "bench/data": "reflact/_pairs"}


def _can_build_offline() -> bool:
    """setuptools >= 70.1 builds wheels by itself; older ones need the `wheel` package."""
    try:
        major, minor = (int(part) for part in metadata.version("setuptools").split(".")[:2])
    except (metadata.PackageNotFoundError, ValueError):
        return False
    return (major, minor) >= (70, 1) or _installed("wheel")


def _installed(name: str) -> bool:
    try:
        metadata.version(name)
        return True
    except metadata.PackageNotFoundError:
        return False


def _pip(*args: str, cwd: Path | None = None) -> None:
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    proc = subprocess.run([sys.executable, "-m", "pip", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, f"pip {' '.join(args)}\n{proc.stdout}\n{proc.stderr}"


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A clean copy of the checkout: an in-tree build would leave build/ behind, and reuse it."""
    if not _can_build_offline():
        pytest.skip("building the wheel offline needs setuptools>=70.1: pip install -e '.[test]'")
    src = tmp_path_factory.mktemp("src") / "reflact"
    shutil.copytree(PROJECT, src, ignore=_NOT_SOURCES)
    return src


@pytest.fixture(scope="module")
def wheel(source, tmp_path_factory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    _pip("wheel", "--no-deps", "--no-build-isolation", "--no-index", "--quiet", "-w", str(dist), str(source))
    (built,) = dist.glob("reflact-*.whl")
    return built


def make_venv(root: Path) -> Path:
    """A virtual environment with no packages of its own; the running interpreter's import
    path follows its own, for reflact's dependencies."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=300)
    python = root / ("Scripts" if os.name == "nt" else "bin") / ("python.exe" if os.name == "nt" else "python")
    own = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    # every folder this interpreter imports from (site-packages, and what .pth files there add),
    # except the checkout, which would shadow the installed reflact
    deps = [p for p in dict.fromkeys(sys.path) if p and Path(p).is_dir() and Path(p).resolve() != PROJECT.resolve()]
    Path(own, "_reflact_test_deps.pth").write_text("\n".join(deps) + "\n", encoding="utf-8")
    return python


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """The venv's python, with the wheel installed (console script included)."""
    python = make_venv(tmp_path_factory.mktemp("venv") / "v")
    _pip("--python", str(python), "install", "--no-deps", "--no-index", "--quiet", str(wheel))
    return python


def run(python: Path, *args: str, cwd: Path, script: bool = False) -> subprocess.CompletedProcess:
    """`reflact ARGS` (script=True) or `python -m reflact.run ARGS` from `cwd`, the checkout off the path."""
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "OPENAI_API_KEY")}
    env["MLFLOW_DISABLE_TELEMETRY"] = "true"
    command = [str(python.parent / "reflact")] if script else [str(python), "-m", "reflact.run"]
    return subprocess.run([*command, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)



def imported_from(python: Path, cwd: Path) -> Path:
    code = "import reflact.core.shipped as s; print(s.__file__)"
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    out = subprocess.run([str(python), "-c", code], cwd=cwd, env=env, capture_output=True, text=True, check=True)
    return Path(out.stdout.strip()).resolve()


def only_run_dir(launch_dir: Path) -> Path:
    (run_dir,) = (launch_dir / "outputs" / "runs").glob("*/*")
    return run_dir


def counts(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))["counts"]


# ---------------------------------------------------------------------------------------------
# the wheel's contents


def test_the_wheel_carries_every_config_template_and_demo_file(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {f"{inside}/{path.relative_to(PROJECT / folder).as_posix()}"
                for folder, inside in SHIPPED.items() for path in (PROJECT / folder).rglob("*")
                if path.is_file() and "__pycache__" not in path.parts}
    assert expected - names == set()
    assert {"reflact/_conf/config.yaml", "reflact/_conf/exp/demo.yaml", "reflact/_prompts/analyst_error.md",
            "reflact/_demo/skill.md", "reflact/_demo/results.jsonl"} <= names
    assert any(name.startswith("reflact/_demo/predictions/") for name in names)
    assert not [name for name in names if name.startswith(("tests/", "conf/", "prompts/", "examples/"))]


def test_the_wheel_carries_every_module_of_the_source_tree(wheel):
    """Found, not listed: a new sub-package (reflact.compat was once left out) cannot go missing."""
    names = set(zipfile.ZipFile(wheel).namelist())
    in_wheel = {name for name in names if name.startswith("reflact/") and name.endswith(".py")}
    in_tree = {path.relative_to(PROJECT).as_posix() for path in (PROJECT / "reflact").rglob("*.py")}
    assert in_tree and in_wheel == in_tree
    assert {"reflact/compat/skillopt.py", "reflact/testing/optimizer_server.py", "reflact/py.typed"} <= names


def test_the_wheel_installs_a_reflact_console_script(wheel):
    with zipfile.ZipFile(wheel) as archive:
        (entry_points,) = [name for name in archive.namelist() if name.endswith(".dist-info/entry_points.txt")]
        text = archive.read(entry_points).decode("utf-8")
    section = text.split("[console_scripts]", 1)[1].split("[", 1)[0]
    assert "reflact = reflact.run:main" in [line.strip() for line in section.splitlines()]


# ---------------------------------------------------------------------------------------------
# running the installed wheel from anywhere


def test_help_works_from_an_empty_directory(installed, tmp_path):
    assert imported_from(installed, tmp_path).is_relative_to(installed.parent.parent.resolve())
    for script in (True, False):
        text = ok(run(installed, "--help", cwd=tmp_path, script=script))
        assert "exp: demo" in text and "optimizer: " in text  # the shipped config groups were found
    assert "mlflow:" in ok(run(installed, "+exp=demo", "--cfg", "job", cwd=tmp_path, script=True))
    assert list(tmp_path.iterdir()) == []


def test_the_demo_dry_run_uses_the_shipped_data_and_writes_under_the_launch_dir(installed, tmp_path):
    ok(run(installed, "+exp=demo", "optimizer=dry_run", cwd=tmp_path, script=True))
    run_dir = only_run_dir(tmp_path)
    assert counts(run_dir)["results"] == 30 and counts(run_dir)["minibatches_dry_run"] == 4
    assert (run_dir / "calls" / "minibatch_fail_000" / "system.md").is_file()
    assert (tmp_path / "outputs" / "mlflow.db").is_file()
    assert not (installed.parent.parent / "outputs").exists()
    assert not list(installed.parent.parent.rglob("lib/**/outputs"))


def test_the_shipped_stand_in_serves_a_demo_run_and_the_skillopt_entry_imports(installed, tmp_path):
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    server = subprocess.Popen([str(installed), "-m", "reflact.testing.optimizer_server"], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, text=True)
    try:
        base_url = server.stdout.readline().strip()
        assert base_url.startswith("http://127.0.0.1:") and base_url.endswith("/v1")
        ok(run(installed, "+exp=demo", "optimizer=compatible", f"optimizer.base_url={base_url}",
               "optimizer.model=test", "mlflow.enabled=false", cwd=tmp_path, script=True))
    finally:
        server.terminate()
        server.wait(timeout=30)
    done = counts(only_run_dir(tmp_path))
    assert done["minibatches_done"] == done["minibatches"] == 4 and done["calls"] >= 4
    code = "from reflact.compat.skillopt import run_minibatch_reflect; print(run_minibatch_reflect.__module__)"
    out = subprocess.run([str(installed), "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "reflact.compat.skillopt", out.stderr


def user_project(root: Path) -> Path:
    """A user's folder: their data, and their own experiment beside it."""
    write_dataset(root / "data" / "mine", n_fail=5, n_succ=3)
    (root / "conf" / "exp").mkdir(parents=True)
    (root / "conf" / "exp" / "mine.yaml").write_text(
        "# @package _global_\nname: mine\ndata:\n  dir: data/mine\nreflect:\n  minibatch_size: 2\n"
        "mlflow:\n  enabled: false\n", encoding="utf-8")
    return root


@pytest.mark.parametrize("how", [["--config-dir", "./conf"], ["hydra.searchpath=[file://conf]"]])
def test_a_users_own_experiment_is_found_in_their_config_dir(installed, tmp_path, how):
    project = user_project(tmp_path)
    ok(run(installed, *how, "+exp=mine", "optimizer=dry_run", cwd=project, script=True))
    run_dir = only_run_dir(project)
    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    # their data.dir, relative to where they ran, and their M=2: 5 failures and 3 successes
    assert summary["counts"]["results"] == 8 and summary["counts"]["minibatches_dry_run"] == 3 + 2
    assert all(run_id.startswith("run_") for batch in summary["minibatches"] for run_id in batch["ids"])


def test_an_unknown_experiment_in_a_users_config_dir_is_one_line(installed, tmp_path):
    project = user_project(tmp_path)
    proc = run(installed, "--config-dir", "./conf", "+exp=minee", cwd=project, script=True)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("reflact: error:") and "exp/minee" in line and "mine" in line


# ---------------------------------------------------------------------------------------------
# an editable install of a checkout still finds the checkout's folders


def test_an_editable_install_runs_the_demo_from_anywhere(source, tmp_path_factory, tmp_path):
    python = make_venv(tmp_path_factory.mktemp("editable") / "v")
    _pip("--python", str(python), "install", "--no-deps", "--no-build-isolation", "--no-index", "--quiet",
         "-e", str(source))
    assert imported_from(python, tmp_path).is_relative_to(source.resolve())
    ok(run(python, "+exp=demo", "optimizer=dry_run", "mlflow.enabled=false", cwd=tmp_path, script=True))
    assert counts(only_run_dir(tmp_path))["results"] == 30
