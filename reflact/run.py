"""The Hydra entry point: `python -m reflact.run +exp=demo` (add -m for a sweep).

The job returns the run's `optimized_metric` (when set), so Hydra's sweeper plugins (Optuna...)
can drive reflact.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shlex
import signal
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from reflact.cli import usage
from reflact.core import shipped
from reflact.core.errors import (
    RunFailed,
    StopSignal,
    exits_on_user_error,
    fails_the_job,
    warnings_held,
    warnings_to_run_log,
)
from reflact.core.imports import one_at_a_time
from reflact.tracking.process import SpareTracker

# Hydra and reflact's config are imported once the tracker process started (_spare_tracker)
if TYPE_CHECKING:
    from omegaconf import DictConfig


def _job(dict_cfg: DictConfig, spare: SpareTracker, signals: StopSignal) -> float | None:
    with one_at_a_time():
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

    warnings_held()
    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    # inside the job too: Hydra would wrap a mistake in its own report; in a sweep a failed job
    # is the sweep's to record (reflact.sweeps.sweep), so that the other jobs still run
    job = exits_on_user_error(fails_the_job(_run) if multirun else _run_fresh)
    return job(dict_cfg, hc, multirun, spare, signals)


def _run_fresh(
    dict_cfg: DictConfig, hc: DictConfig, multirun: bool, spare: SpareTracker, signals: StopSignal
) -> float | None:
    """A single run: the folders made for it (reflact.running.newdir.FreshRunDir, in this process)
    go again when a mistake stops it."""
    from reflact.running.newdir import discarded_on_mistake, taken

    # Hydra's own log file is all a fresh run dir holds before the run writes anything
    with discarded_on_mistake(taken(Path(hc.runtime.output_dir)), {f"{hc.job.name}.log"}):
        return _run(dict_cfg, hc, multirun, spare, signals)


def _run(
    dict_cfg: DictConfig, hc: DictConfig, multirun: bool, spare: SpareTracker, signals: StopSignal
) -> float | None:
    with one_at_a_time():
        import hydra

    from reflact import config
    from reflact.api import run
    from reflact.orchestration.experiment import Launch
    from reflact.running.summary import optimized_value

    run_dir = Path(hc.runtime.output_dir)
    cfg, params = config.from_hydra(dict_cfg)
    launch = Launch(
        Path(hydra.utils.get_original_cwd()),
        Path(hc.sweep.dir).resolve() if multirun else None,
        hc.job.num if multirun else None,
        tuple(hc.overrides.task),
        record_config=lambda: _record_config(dict_cfg, hc, run_dir),
        tracker=spare,
        go_on=_command_line(run_dir, multirun),
        signals=signals,
    )
    result = run(cfg, params, run_dir, launch)
    if result.status == "FAILED" or result.reason:  # a batch left to run by a fault has its reason too
        raise RunFailed(result.reason)
    return optimized_value(cfg.optimized_metric, result.summary)


def _command_line(run_dir: Path, multirun: bool) -> str:
    """This command again, in this run dir (a sweep: the same sweep): what goes on with a batch."""
    args = [arg for arg in sys.argv[1:] if multirun or not arg.startswith("hydra.run.dir=")]
    return shlex.join(["python", "-m", "reflact.run", *args, *([] if multirun else [f"hydra.run.dir={run_dir}"])])


def _record_config(dict_cfg: DictConfig, hc: DictConfig, run_dir: Path) -> None:
    """What Hydra would write to .hydra/ (hydra.output_subdir is off), written only once the
    config and inputs passed their checks, so a mistaken rerun leaves the record alone; the
    library warnings held until then go to the run's log from now on."""
    with one_at_a_time():
        from omegaconf import OmegaConf

    from reflact.running.rundir import RunDir

    warnings_to_run_log()
    RunDir(run_dir).write_config(
        OmegaConf.to_yaml(dict_cfg), OmegaConf.to_yaml(list(hc.overrides.task)), OmegaConf.to_yaml({"hydra": hc})
    )


# The OpenAI SDK's optional aiohttp transport, which reflact never uses: mlflow installs aiohttp,
# and the SDK then imports it with itself, ~0.15 s before the first request. The SDK takes a
# module it cannot import for the extra not installed.
AIOHTTP_TRANSPORT = "openai._vendor.httpx_aiohttp"


def main() -> None:
    sys.modules.setdefault(AIOHTTP_TRANSPORT, None)  # type: ignore[arg-type]  # None: "cannot be imported"
    ending = _Ending()
    atexit.register(ending.now)  # before any handler of the run's own: it runs after all of them
    signals = StopSignal()
    try:
        _main(signals)
    except SystemExit as done:
        ending.code = done.code or 0 if isinstance(done.code, (int, type(None))) else None
        raise
    finally:
        signals.ended()
    ending.code = 0


@exits_on_user_error  # config errors raised while Hydra composes
def _main(signals: StopSignal) -> None:
    # first thing: Ctrl-C and SIGTERM are noted for every call of every job from here on
    signals.install(signal.SIGINT, signal.SIGTERM)
    help_wanted = usage.wanted(sys.argv[1:])  # Hydra's spelling of the overrides changes no flag
    spare = SpareTracker() if help_wanted else _spare_tracker(sys.argv[1:])
    try:
        with one_at_a_time():
            import hydra

        from reflact import config

        config.register()
        # Hydra then raises instead of printing a multi-line report, so user mistakes get one line
        os.environ["HYDRA_FULL_ERROR"] = "1"
        sys.argv[1:] = config.hydra_spelling(sys.argv[1:])
        if help_wanted:
            print(usage.help_text(sys.argv[1:]))
            return
        # decorated here, not at import: Hydra 1.4 warns about version_base as it decorates, and
        # only now do warnings go to the log (exits_on_user_error)
        job = hydra.main(config_path=str(shipped.conf_dir()), config_name="config", version_base="1.3")(
            lambda dict_cfg: _job(dict_cfg, spare, signals)
        )
        with callbacks_allowed(), _mode_from_command_line():
            job()
    except Exception:
        signals.check()  # after a signal, what failed on its way (Hydra composing) ends as the stop
        raise
    finally:
        spare.discard()  # idle: the run needed no tracking, or the last job is done


def _spare_tracker(args: list[str]) -> SpareTracker:
    """This process's idle tracker (reflact.tracking.process), started first thing, before Hydra
    and reflact's config are imported (~0.3 s), so that its import of mlflow begins with the
    command line. A single run's only: a sweep's first job starts its own, which each next job in
    this process takes over; a command line turning MLflow off needs none."""
    multirun = any(arg in ("-m", "--multirun") or arg.startswith("hydra.mode=") for arg in args)
    if multirun or "mlflow.enabled=false" in args:
        return SpareTracker()
    return SpareTracker.started()


# the callbacks conf/hydra/reflact.yaml names, the only targets Hydra instantiates for reflact
CALLBACKS = ("reflact.sweeps.sweep.MlflowSweep", "reflact.running.newdir.FreshRunDir")


def callbacks_allowed():
    """From Hydra 1.4 on, instantiate() asks for an execution whitelist (1.4 warns without one,
    1.5 refuses): reflact's callbacks are allowed, from this trusted call site. Hydra 1.3 checks
    nothing."""
    with one_at_a_time():
        import hydra

    whitelist = getattr(hydra.utils, "execution_whitelist", None)
    return whitelist(list(CALLBACKS)) if whitelist else contextlib.nullcontext()


@contextlib.contextmanager
def _mode_from_command_line() -> Iterator[None]:
    """Hydra 1.3 composes the whole config a second time only to read `hydra.mode` (~0.1-0.3 s
    before the first request). reflact's own configs never set it (tests/test_presets.py checks), so
    unless the command line sets it or brings configs of its own, `-m` alone decides, as Hydra does
    when the composed mode is unset. Hydra 1.4 reads the mode from the overrides and the primary
    config alone (~1 ms; it then passes `parsed_overrides`): its own is kept."""
    with one_at_a_time():
        from hydra._internal.hydra import Hydra

    own_configs = any(arg.startswith(("--config-dir", "-cd", "--config-path", "-cp")) for arg in sys.argv[1:])
    sets_mode = any("hydra.mode" in arg for arg in sys.argv[1:])
    if own_configs or sets_mode or not composes_for_mode(Hydra.get_mode):
        yield
        return
    composing = Hydra.get_mode
    Hydra.get_mode = lambda self, *args, **kwargs: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        Hydra.get_mode = composing  # type: ignore[method-assign]


def composes_for_mode(get_mode: Callable) -> bool:
    """Whether this Hydra's `get_mode` composes the config (1.3: its arguments are the config's
    name and the overrides alone)."""
    import inspect

    return "parsed_overrides" not in inspect.signature(get_mode).parameters


@dataclass
class _Ending:
    """Ends the process once its exit handlers have run, skipping the interpreter's teardown of
    every module the run imported (~0.5 s after the last reply, with nothing left to do). Python
    has joined the run's threads by then; a launcher's worker processes still running get the
    usual shutdown."""

    code: int | None = None  # the exit code, once the run is over (None: leave the exit to Python)

    def now(self) -> None:
        # no import here (a daemon thread may still be loading): without multiprocessing, no children
        processes = sys.modules.get("multiprocessing")
        if self.code is None or (processes is not None and processes.active_children()):
            return
        logging.shutdown()  # its own exit handler was registered before this one, so would not run
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(self.code)


if __name__ == "__main__":
    main()
