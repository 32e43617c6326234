"""Shared pieces of the benchmarks: the loopback server process, datasets, measured processes."""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
DEFAULT_DATA = REPO.parent / "shared" / "data" / "reflexion_hotpotqa_react"
PY = sys.executable  # the project venv's python (reflact installed in it)

# environment for every measured process: nothing leaves the machine, nothing phones home
BASE_ENV = {
    **os.environ,
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "true",
    "PYTHONUNBUFFERED": "1",
}
BASE_ENV.pop("OPENAI_API_KEY", None)
BASE_ENV.pop("OPENAI_BASE_URL", None)


def stage_arguments(parser) -> None:
    """The options every side-by-side benchmark takes: data, latency and the stage's settings."""
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the real dataset (default: %(default)s)")
    parser.add_argument("--latency", type=float, default=0.5, help="server latency per request, seconds")
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("-M", "--minibatch-size", type=int, default=8)
    parser.add_argument("-L", "--edit-budget", type=int, default=4)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--runs", type=int, default=2000, help="runs in a generated dataset as well (0: skip it)")


@contextmanager
def side_by_side_inputs(args, name: str):
    """(datasets, work dir, stage settings) for a benchmark on the real dataset and, with
    --runs, a generated one; the temp dirs are removed afterwards."""
    data = check_data(args.data)
    work = scratch(name)
    inputs = scratch(f"{name}-data", memory=True)
    try:
        datasets = [(data.name, data)]
        if args.runs:
            datasets.append((f"generated_{args.runs}", make_dataset(inputs / f"gen{args.runs}", args.runs)))
        settings = dict(workers=args.workers, minibatch_size=args.minibatch_size, edit_budget=args.edit_budget,
                        seed=args.seed)
        print(f"latency {args.latency} s, W={args.workers}, M={args.minibatch_size}, L={args.edit_budget}, "
              f"seed {args.seed}, repeat {args.repeat}; python {sys.version.split()[0]}")
        yield datasets, work, settings
    finally:
        rmtree(work)
        rmtree(inputs)


def check_data(path: Path) -> Path:
    path = Path(path).resolve()
    if not (path / "results.jsonl").is_file() and not (path / "results.json").is_file():
        sys.exit(f"no dataset at {path} (pass --data DIR)")
    return path


def scratch(prefix: str, memory: bool = False) -> Path:
    """A temp dir for one benchmark, removed by the caller (rmtree). Run dirs go under the system
    temp dir (a real disk here, so reflact's writes cost what they cost a user); with `memory`, under
    /dev/shm when there is one: generated datasets are only read (from the page cache either way),
    and deleting tens of thousands of files on this machine's disk is slow (~1.5 ms a file when busy)."""
    base = "/dev/shm" if memory and os.access("/dev/shm", os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix=f"reflact-bench-{prefix}-", dir=base))


class Server:
    """bench/_server.py in its own process: a fixed latency, per-request prompt characters."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.proc = subprocess.Popen(
            [PY, str(BENCH / "_server.py"), "--delay", str(delay_s)],
            stdout=subprocess.PIPE, text=True, env=BASE_ENV,
        )
        line = self.proc.stdout.readline().strip()
        if not line.startswith("http://127.0.0.1:"):
            self.stop()
            sys.exit(f"the bench server did not start (got {line!r})")
        self.base_url = line

    def _post(self, body: dict) -> dict:
        request = urllib.request.Request(
            self.base_url + "/chat/completions", data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"}, method="POST",
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read())

    def stats(self) -> dict:
        return self._post({"bench": "stats"})

    def reset(self) -> None:
        self._post({"bench": "reset"})

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def make_dataset(out: Path, runs: int, fail_share: float = 0.6, steps: int = 8, seed: int = 0) -> Path:
    subprocess.run(
        [PY, str(BENCH / "make_dataset.py"), str(out), "--runs", str(runs), "--fail-share", str(fail_share),
         "--steps", str(steps), "--seed", str(seed)],
        check=True, stdout=subprocess.DEVNULL, env=BASE_ENV,
    )
    return out


@dataclass
class ProcResult:
    returncode: int
    wall_s: float
    max_rss_mb: float  # the child's own peak resident set (ru_maxrss of wait4 on its pid)
    cpu_s: float  # user + system
    stdout: str
    stderr: str


def adopt_orphans() -> bool:
    """Makes this process the one a measured process's orphans are given to when it ends (Linux's
    child subreaper), so that run_process(..., orphans_s=...) can count them. A reflact run stops
    its tracker process at its end without waiting for it: without this, its CPU would be lost."""
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def reap_orphans(settle_s: float) -> tuple[float, float]:
    """(CPU seconds, largest peak RSS in MB) of the orphans that end within `settle_s` (adopt_orphans)."""
    cpu, rss = 0.0, 0.0
    deadline = time.perf_counter() + settle_s
    while time.perf_counter() < deadline:
        try:
            pid, _, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid:
            cpu, rss = cpu + usage.ru_utime + usage.ru_stime, max(rss, usage.ru_maxrss / 1024)
        else:
            time.sleep(0.005)
    return cpu, rss


def run_process(cmd: list[str], cwd: Path, env: dict | None = None, timeout_s: float = 3600,
                orphans_s: float = 0.0) -> ProcResult:
    """Run a command, timing it and reading its own peak RSS from wait4 (not RUSAGE_CHILDREN,
    which is the maximum over every child this process ever waited for). With `orphans_s` (and
    adopt_orphans), the processes it left that end within that long after it add their CPU, and
    their RSS when larger; the wall time is the command's alone."""
    out_path = cwd / f".bench-{os.getpid()}-{time.monotonic_ns()}.out"
    err_path = out_path.with_suffix(".err")
    with open(out_path, "w") as out, open(err_path, "w") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env or BASE_ENV, stdout=out, stderr=err)
        deadline = started + timeout_s
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                proc.kill()
            time.sleep(0.005)
        wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    orphans_cpu, orphans_rss = reap_orphans(orphans_s) if orphans_s else (0.0, 0.0)
    result = ProcResult(
        returncode=proc.returncode, wall_s=wall, max_rss_mb=max(usage.ru_maxrss / 1024, orphans_rss),
        cpu_s=usage.ru_utime + usage.ru_stime + orphans_cpu, stdout=out_path.read_text(),
        stderr=err_path.read_text(),
    )
    out_path.unlink()
    err_path.unlink()
    return result


def reflact_cmd(data: Path, base_url: str | None, run_dir: Path, workers: int = 16, minibatch_size: int = 8,
                edit_budget: int = 4, seed: int = 42, mlflow: bool = False, extra: tuple[str, ...] = ()) -> list[str]:
    cmd = [PY, "-m", "reflact.run", f"data.dir={data}", f"hydra.run.dir={run_dir}",
           f"reflect.workers={workers}", f"reflect.minibatch_size={minibatch_size}",
           f"reflect.edit_budget={edit_budget}", f"reflect.seed={seed}",
           f"mlflow.enabled={'true' if mlflow else 'false'}", "optimizer.cache=off"]
    if base_url:
        cmd += ["optimizer=compatible", f"optimizer.base_url={base_url}", "optimizer.model=bench-model"]
    return cmd + list(extra)


def run_reflact(data: Path, server: Server, launch: Path, name: str, **kw) -> dict:
    """`python -m reflact.run ...` as a subprocess from `launch`; returns figures of the run."""
    run_dir = launch / "runs" / name
    server.reset()
    started_at = time.time()
    proc = run_process(reflact_cmd(data, server.base_url, run_dir, **kw), cwd=launch)
    if proc.returncode != 0:
        sys.exit(f"reflact run {name} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    stats = server.stats()
    return {"proc": proc, "summary": summary, "counts": summary["counts"], "server": stats, "run_dir": run_dir,
            "phases": log_phases(run_dir, started_at)}


def compose_config(*overrides: str):
    """The typed, validated config `python -m reflact.run OVERRIDES` would use (Hydra's compose API)."""
    from hydra import compose, initialize_config_dir

    from reflact import config as reflact_config

    reflact_config.register()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        dict_cfg = compose(config_name="config", overrides=list(overrides))
    return reflact_config.from_hydra(dict_cfg)[0]


def run_stage(data: Path, server: Server, run_dir: Path, workers: int = 16, minibatch_size: int = 8,
              edit_budget: int = 4, seed: int = 42) -> dict:
    """The reflect stage alone (reflact.running.stage.Stage.run) in a fresh process (bench/_stage_child.py):
    no interpreter start, Hydra job, preview or summary in the time; the client is built (the SDK
    imported) before the clock starts, but nothing is warmed up that a real run would not warm."""
    run_dir.mkdir(parents=True, exist_ok=True)
    result = run_dir.parent / f"{run_dir.name}.stage.json"
    server.reset()
    proc = run_process(
        [PY, str(BENCH / "_stage_child.py"), "--data", str(data), "--base-url", server.base_url,
         "--run-dir", str(run_dir), "--result", str(result), "--workers", str(workers),
         "-M", str(minibatch_size), "-L", str(edit_budget), "--seed", str(seed)],
        cwd=run_dir.parent,
    )
    if proc.returncode != 0:
        sys.exit(f"the in-process stage run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return {**json.loads(result.read_text()), "server": server.stats(), "proc": proc}


def ideal_s(calls: int, workers: int, latency_s: float) -> float:
    return math.ceil(calls / workers) * latency_s


def chars_per_call(stats: dict) -> float:
    chars = stats.get("chars") or []
    return statistics.mean(chars) if chars else 0.0


def rmtree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def run_sdk_floor(server: Server, calls: int, chars: int, workers: int, work: Path) -> float:
    """Wall time of `calls` bare SDK requests of `chars` characters, W at a time (bench/_sdk_floor.py)."""
    result = work / f"floor-{calls}-{chars}.json"
    server.reset()
    proc = run_process([PY, str(BENCH / "_sdk_floor.py"), "--base-url", server.base_url, "--calls", str(calls),
                        "--chars", str(chars), "--workers", str(workers), "--result", str(result)], cwd=work)
    if proc.returncode != 0:
        sys.exit(f"the SDK floor run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(result.read_text())["wall_s"]


def median_text(values: list[float], unit: str = "s") -> str:
    """`1.234 s` for one value, `1.234 s (1.200-1.300, n=3)` for several."""
    text = f"{statistics.median(values):.3f} {unit}"
    if len(values) > 1:
        text += f" ({min(values):.3f}-{max(values):.3f}, n={len(values)})"
    return text


def log_phases(run_dir: Path, process_started_at: float) -> dict | None:
    """Phases of a `python -m reflact.run` process from the timestamps of its run.log: start-up and
    loading (to the "reflect:" line), the stage (to the last minibatch line), then preview and summary
    (to the "done:" line). None when the log does not have those lines."""
    import re
    from datetime import datetime

    stamp = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]")

    def when(line: str) -> float | None:
        match = stamp.match(line)
        return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() if match else None

    try:
        lines = (run_dir / "run.log").read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    start = next((when(line) for line in lines if "] - reflect:" in line), None)
    progress = [when(line) for line in lines if re.search(r"\] - \[ *\d+/\d+\]", line)]
    done = next((when(line) for line in lines if "] - done:" in line), None)
    if start is None or not progress or done is None or progress[-1] is None:
        return None
    return {"startup_load_s": start - process_started_at, "stage_s": progress[-1] - start,
            "post_s": done - progress[-1]}
