"""Ctrl-C and SIGTERM always stop new calls (issue 36, item 15).

A signal's exception is raised wherever the main thread is when the signal comes, and a library's
bare `except:` or a finalizer running just then swallows it: the run used to go on calling, and
end FINISHED with exit code 0. reflact's handlers note the signal before they raise (reflact.core.errors.
StopSignal), every request checks the note, and the run ends KILLED (130 / 143) whatever became of
the exception. The command line is signalled at many moments: no request starts after the signal.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import reflact
from reflact.core.errors import Stopped, StopSignal
from reflact.running import stage as stage_module
from reflact.testing.optimizer_server import Response, chat_body, default_reply
from tests.conftest import stage_for, write_dataset
from tests.test_live import Gate, finish, run_args, runs_of, start, wait_for

WORKERS = 2  # reflect.workers in run_args


def swallowed(signum: int = signal.SIGINT) -> None:
    """A signal delivered to this (main) thread while code that swallows everything runs: a
    library's bare `except:`, a finalizer (CPython prints "Exception ignored" and goes on)."""
    try:
        signal.raise_signal(signum)
        time.sleep(0.05)  # the handler has run by now, on this thread
    except BaseException:  # noqa: BLE001 - the point of the test
        pass


# ---------------------------------------------------------------- the note, at the unit owning it


@pytest.mark.parametrize("signum,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_whose_exception_was_swallowed_is_still_noted(signum, code):
    before = signal.getsignal(signum)
    with StopSignal().handling(signum) as signals:
        stopping = signals.stopping()
        assert not stopping.is_set()
        swallowed(signum)
        assert stopping.is_set()  # every request checks this before it starts
        with pytest.raises(Stopped) as stopped:
            signals.check()
    assert stopped.value.exit_code == code
    assert signal.getsignal(signum) is before  # the handler found is put back


def test_a_signal_python_could_not_raise_is_noted_and_not_printed(tmp_path):
    """In a finalizer (or a generator's close) Python cannot raise the signal's exception: it
    prints "Exception ignored ... Traceback" and goes on. The stop is noted; nothing is printed;
    reflect()'s handling puts Python's hook back after it."""
    script = (
        "import signal, sys, time\n"
        "from reflact.core.errors import StopSignal\n"
        "class Finalized:\n"
        "    def __del__(self):\n"
        "        signal.raise_signal(signal.SIGINT)\n"
        "        time.sleep(0.05)\n"
        "hook = sys.unraisablehook\n"
        "with StopSignal().handling(signal.SIGINT) as signals:\n"
        "    Finalized()\n"
        "    print(signals.received.exit_code)\n"
        "print(sys.unraisablehook is hook)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.split() == ["130", "True"], done.stdout + done.stderr
    assert done.stderr == ""


def test_once_a_signal_is_noted_any_exception_is_the_stop():
    """A signal's exception raised in the middle of a library's change can leave it to fail on its
    own half-made state (OmegaConf composing: AttributeError): that failure is the stop."""
    signals = StopSignal()
    assert signals.stop_of(AttributeError("half-made")) is None  # a bug, when no signal came
    assert signals.stop_of(KeyboardInterrupt()).exit_code == 130
    with signals.handling(signal.SIGTERM):
        swallowed(signal.SIGTERM)
    assert signals.stop_of(AttributeError("half-made")).exit_code == 143


def noted_stage(tmp_path, server, data, signals: StopSignal):
    """The stage through the real client, one worker, a minibatch per trajectory, `signals` its own."""
    made = stage_for(tmp_path, server, data, "reflect.minibatch_size=1", "reflect.workers=1")
    return stage_module.Stage(made.settings, made.dataset, made.asker.optimizer, made.run_dir.root, signals=signals)


def test_a_noted_signal_stops_every_request_of_the_stage(tmp_path, server):
    signals = StopSignal()
    stage = noted_stage(tmp_path, server, write_dataset(tmp_path / "d", n_fail=2, n_succ=0), signals)
    with signals.handling(signal.SIGINT):
        swallowed()
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    asked = stage.asker.ask("minibatch_fail_000", "failure", messages, 0, lambda number, reply: None)
    assert asked.status == "failed" and "interrupted" in asked.error
    assert server.count == 0


def swallow_while_preparing(monkeypatch, index: int, server) -> list[int]:
    """A Ctrl-C swallowed while the launching thread prepares minibatch `index` (after its window
    slot was taken); returns [the requests made by then], once it happened."""
    prepare = stage_module.Stage.prepare
    at_signal: list[int] = []

    def prepare_and_swallow(self, mb):
        if mb.index == index and not at_signal:
            at_signal.append(server.count)
            swallowed()
        return prepare(self, mb)

    monkeypatch.setattr(stage_module.Stage, "prepare", prepare_and_swallow)
    return at_signal


def slow_replies(server, delay_s: float = 0.2) -> None:
    server.script = lambda request, number: Response(body=chat_body(json.dumps(default_reply(request))),
                                                     delay_s=delay_s)


@pytest.mark.parametrize("index", [0, 3, 5])
def test_a_swallowed_signal_stops_the_stage_wherever_it_lands(tmp_path, server, monkeypatch, index):
    """One worker, a window of two prompts: while minibatch `index` is prepared, the worker asks
    minibatch index - 1 (or nothing yet). Nothing after it is asked, nor prepared, and the stage
    raises Stopped (the last one: once its workers are done)."""
    slow_replies(server)
    signals = StopSignal()
    stage = noted_stage(tmp_path, server, write_dataset(tmp_path / "d", n_fail=6, n_succ=0), signals)
    at_signal = swallow_while_preparing(monkeypatch, index, server)
    with signals.handling(signal.SIGINT), pytest.raises(Stopped) as stopped:
        stage.run()
    assert stopped.value.exit_code == 130
    assert at_signal and server.count <= max(index, 0)  # minibatch index - 1 may start as the signal comes
    prepared = sorted(p.name for p in (tmp_path / "run" / "calls").iterdir())
    assert prepared == [f"minibatch_fail_{i:03d}" for i in range(index + 1)]


# ---------------------------------------------------------------- reflect(): the run KILLED, whatever the moment


@pytest.mark.parametrize("where", ["preparing", "summary", "summary, failing on its way"])
def test_ctrl_c_swallowed_stops_reflect_which_raises_stopped_and_kills_its_run(
        tmp_path, server, launch_dir, monkeypatch, where):
    """Swallowed while minibatch 3 of 6 is prepared, or while the summary is written (every call
    made; the analysis and the end are left)."""
    from reflact.orchestration import experiment

    data = write_dataset(tmp_path / "d", n_fail=6, n_succ=0)
    slow_replies(server)
    if where == "preparing":
        swallow_while_preparing(monkeypatch, 3, server)
    elif where == "summary":
        summarize = experiment.summarize
        monkeypatch.setattr(experiment, "summarize", lambda *args: (swallowed(), summarize(*args))[1])
    else:  # the signal's exception left a library's state half-made, which then fails on it

        def half_made(*args):
            swallowed()
            raise AttributeError("'NoneType' object has no attribute '_invalidate_flags_cache'")

        monkeypatch.setattr(experiment, "summarize", half_made)
    before = signal.getsignal(signal.SIGINT)
    uri = f"sqlite:///{launch_dir / 'outputs' / 'mlflow.db'}"
    with pytest.raises(Stopped) as stopped:
        reflact.reflect(data, run_dir=tmp_path / "run", launch_dir=launch_dir, overrides=[
            "optimizer=compatible", f"optimizer.base_url={server.base_url}", "optimizer.model=test",
            "optimizer.cache=off", "reflect.minibatch_size=1", "reflect.workers=1", f"mlflow.tracking_uri={uri}"])
    assert stopped.value.exit_code == 130 and "no new call was started" in str(stopped.value)
    assert server.count <= 3 if where == "preparing" else server.count == 6
    assert signal.getsignal(signal.SIGINT) is before  # the caller's handler is put back
    [run] = runs_of(uri, tmp_path / "run")
    assert run.info.status == "KILLED"


# ---------------------------------------------------------------- the command line, signalled at many moments


def signalled_run(tmp_path: Path, launch_dir: Path, free: int | None, delay_s: float, sig=signal.SIGINT,
                  tracking: bool = True, all_free: bool = False) -> dict:
    """`python -m reflact.run` on 30 minibatches, two workers, against a stand-in answering `free`
    requests and holding the rest. The signal comes once both workers hold a request (free given),
    or `delay_s` after the run dir appeared (start-up); the held requests are let go after it."""
    data = write_dataset(tmp_path / "data", n_fail=30, n_succ=0)
    run_dir = tmp_path / "run"
    gate = Gate(free=free or 0)
    from reflact.testing.optimizer_server import OptimizerServer

    with OptimizerServer(script=gate) as server:
        extra = [] if tracking else ["mlflow.enabled=false"]
        proc = start(run_args(data, server, run_dir, *extra), launch_dir)
        try:
            if free is None:
                wait_for(lambda: run_dir.is_dir() or proc.poll() is not None, what="the run dir")
                time.sleep(delay_s)
            else:
                held = 0 if all_free else WORKERS
                wait_for(lambda: server.count == free + held, what="every worker holding a request")
            at_signal = server.count
            proc.send_signal(sig)
            time.sleep(0.3)  # the stop takes effect while the workers' requests are still held
            gate.open()
            done = finish(proc)
        finally:
            gate.open()
            if proc.poll() is None:
                proc.kill()
        time.sleep(0.2)
        return {"done": done, "at_signal": at_signal, "count": server.count, "run_dir": run_dir}


def check_stopped(result: dict, launch_dir: Path, code: int = 130, started_before: int = 0,
                  tracking: bool = True) -> None:
    done = result["done"]
    assert done.returncode == code, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("reflact:")]
    assert len(lines) == 1 and lines[0].startswith("reflact: interrupted" if code == 130 else "reflact: terminated")
    # no request after the signal: at most one a worker had decided on as it came (each worker then
    # holds its request until the gate opens, after the signal)
    assert result["count"] <= max(result["at_signal"], started_before), (result["at_signal"], result["count"])
    if result["at_signal"]:  # the run called: it says how to go on
        assert "no new call was started" in lines[0] and str(result["run_dir"]) in lines[0]
    if not tracking:
        return
    runs = runs_of(f"sqlite:///{launch_dir / 'outputs' / 'mlflow.db'}", result["run_dir"])
    if result["at_signal"]:  # and it is in MLflow
        assert [run.info.status for run in runs] == ["KILLED"]
    assert all(run.info.status == "KILLED" for run in runs)


@pytest.mark.parametrize("free,tracking", [(0, True), (1, False), (5, True)])
def test_ctrl_c_after_k_requests_stops_every_new_call(tmp_path, launch_dir, free, tracking):
    result = signalled_run(tmp_path, launch_dir, free, 0.0, tracking=tracking)
    check_stopped(result, launch_dir, tracking=tracking)
    assert result["count"] == free + WORKERS


@pytest.mark.parametrize("delay_s,tracking", [(0.0, False), (0.15, False), (0.4, True), (0.8, False)])
def test_ctrl_c_at_start_up_stops_the_run_before_any_new_call(tmp_path, launch_dir, delay_s, tracking):
    result = signalled_run(tmp_path, launch_dir, None, delay_s, tracking=tracking)
    check_stopped(result, launch_dir, started_before=WORKERS, tracking=tracking)


def test_ctrl_c_at_the_end_ends_the_run_killed_or_leaves_it_finished(tmp_path, launch_dir):
    """Every request answered: the signal comes during the summary, the analysis or the wait for
    MLflow, or after the run: KILLED and 130; FINISHED only once all was written (then 0, or 130
    when it came during the last lines)."""
    result = signalled_run(tmp_path, launch_dir, 30, 0.0, tracking=True, all_free=True)
    done = result["done"]
    assert done.returncode in (0, 130) and "Traceback" not in done.stderr, done.stderr[-3000:]
    [run] = runs_of(f"sqlite:///{launch_dir / 'outputs' / 'mlflow.db'}", result["run_dir"])
    if done.returncode == 0 or run.info.status == "FINISHED":  # 130 too, when it came once all was written
        assert run.info.status == "FINISHED" and (result["run_dir"] / "analysis.json").is_file()
    else:
        assert run.info.status == "KILLED"
    assert result["count"] == 30


def test_the_analysis_warm_up_thread_never_prints_a_traceback(monkeypatch):
    """Its imports can fail when a Ctrl-C on the main thread cut the same import short (numpy then
    recurses): the warm-up is a head start only, and the run is stopping."""
    from reflact.analysis import figures, matching

    def cut_short():
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(matching, "warm_imports", cut_short)
    monkeypatch.setattr(figures, "WARM_AFTER_S", 0)
    printed = []
    monkeypatch.setattr(threading, "excepthook", printed.append)
    thread = threading.Thread(target=figures.warm, name="reflact-warm")
    thread.start()
    thread.join()
    assert printed == []


def test_sigterm_while_requests_are_held_ends_the_run_killed_with_143(tmp_path, launch_dir):
    result = signalled_run(tmp_path, launch_dir, 2, 0.0, sig=signal.SIGTERM)
    check_stopped(result, launch_dir, code=143)
    assert result["count"] == 2 + WORKERS



def test_a_failure_a_signal_causes_while_hydra_composes_ends_as_the_stop(tmp_path):
    """Seen under load: Ctrl-C inside OmegaConf's flag_override while Hydra composed made OmegaConf
    fail on its half-made config (AttributeError), a traceback and exit 1. It is the stop: 130."""
    script = (
        "import signal, sys\n"
        "from reflact import config, run\n"
        "def half_made(args):\n"
        "    try:\n"
        "        signal.raise_signal(signal.SIGINT)\n"
        "    finally:\n"
        "        raise AttributeError(\"'NoneType' object has no attribute '_invalidate_flags_cache'\")\n"
        "config.hydra_spelling = half_made\n"
        "sys.argv = ['reflact', 'mlflow.enabled=false']\n"
        "run.main()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip() == "reflact: interrupted" and "Traceback" not in done.stderr


def test_a_signal_once_the_command_is_over_ends_the_process_quietly(tmp_path):
    """The run is over, its records written; a Ctrl-C during the interpreter's teardown (an exit
    handler running) ends the process at once, never an "Exception ignored" and a teardown that goes on."""
    script = (
        "import atexit, os, signal, time\n"
        "from reflact import run\n"
        "def command(signals):\n"
        "    signals.install(signal.SIGINT, signal.SIGTERM)\n"
        "    atexit.register(lambda: (os.kill(os.getpid(), signal.SIGINT), time.sleep(2), print('went on')))\n"
        "run._main = command\n"
        "run.main()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGINT, done.stderr
    assert "went on" not in done.stdout and "Exception ignored" not in done.stderr and "Traceback" not in done.stderr


def test_a_stop_signal_a_launcher_pickles_starts_afresh_in_its_worker():
    """joblib, submitit and Ray pickle the job, the command line's StopSignal with it: the copy
    holds neither the handlers nor the hook it replaced (a builtin does not pickle), nor a note."""
    import pickle

    from reflact.core.errors import StopSignal

    signals = StopSignal()
    with signals.handling(signal.SIGINT):
        signals.received = Stopped()
        copy = pickle.loads(pickle.dumps(signals))
    assert copy.received is None and copy._installed == [] and copy._unraisable is None
