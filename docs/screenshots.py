"""Screenshots of reflact's MLflow dashboards for the docs, taken from a real `mlflow ui`.

    python docs/screenshots.py                  # from the repository root, with the project's python
    python docs/screenshots.py --out shots --keep

In a temporary launch dir it runs the demo sweep (M = 4, 8 x L = 2, 4) and one single run through
the real CLI against the tests' loopback optimizer (nothing leaves the machine), serves that store
with `mlflow ui` on 127.0.0.1 and photographs five pages with headless Chromium: runs_table.png
(the runs, sweep expanded), run.png (one run's overview and description), compare.png (the sweep's
runs compared, as the UI opens it: on edits kept), outcomes.png (the parent's heatmaps of edits
kept, agreement and cost over M x L) and metric.png (a per-minibatch series of one sweep run). The
CLI runs this checkout's code, copied into the launch dir (see stage_code). About 40 s on two cores.

Chromium is driven over the DevTools protocol on a pipe (--remote-debugging-pipe: JSON messages
ended by NUL on file descriptors 3 and 4), so only the standard library is needed. It needs a
`chromium` on PATH (Debian: apt-get install chromium) or --chromium PATH. Pillow, when importable
(matplotlib, an MLflow dependency, brings it), shrinks the PNGs.

The routes and the readiness checks are those of the MLflow 3.17 UI (see ROUTES and READY); the
view settings it seeds into the browser's localStorage are that UI's own keys (see seed_storage).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import io
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CODE = ("reflact", "conf", "prompts", "examples")  # what `python -m reflact.run +exp=demo` reads
SIZE = (1600, 1000)
PNG_LIMIT = 400_000  # bytes; above it a screenshot is reduced to a 256-colour palette
PLOT_METRICS = ("minibatch/proposed", "minibatch/kept")  # side by side they show the budget cut
OPENING_METRIC = "edits_kept"  # what reflact logs first, so that the compare view opens on it
SIZES = {"run": (1600, 1250)}  # the run page: its metrics and its first parameters both in view
TABLE_METRICS = 8  # metric columns in the runs table: those that differ between the sweep's runs
# Without the networking flags Chromium's background connections are refused here and it stalls.
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--remote-debugging-pipe", f"--window-size={SIZE[0]},{SIZE[1]}"]
# Hash routes of the MLflow 3.17 UI (its route table: /experiments/:experimentId/runs,
# /experiments/:experimentId/runs/:runUuid, /compare-runs, /metric/*).
ROUTES = {
    "runs_table": "#/experiments/{exp}/runs",
    "run": "#/experiments/{exp}/runs/{run}",
    "compare": "#/compare-runs?runs={runs}&experiments={exps}",
    "outcomes": "#/experiments/{exp}/runs/{parent}/artifacts/{outcomes}",
    "metric": "#/metric/?runs={runs}&metric={metric}&experiments={exps}&plot_metric_keys={keys}"
              "&plot_layout=%7B%7D&x_axis=step&y_axis_scale=linear&line_smoothness=1&show_point=true"
              "&deselected_curves=%5B%5D&last_linear_y_axis_range=%5B%5D",
}
# What shows once each page has its data (MLflow 3.17's DOM: ag-grid table, plotly charts).
READY = {
    "runs_table": "document.querySelectorAll('.ag-center-cols-container .ag-row').length > 0",
    "run": "document.body.innerText.includes({run!r}) && document.body.innerText.includes('Parameters')",
    "compare": "!!document.querySelector('.js-plotly-plot .main-svg')",
    "outcomes": "[...document.images].some(i => i.src.startsWith('blob:') && i.naturalWidth > 1000)",
    "metric": "!!document.querySelector('.js-plotly-plot .scatterlayer .trace')",
}
# Loading placeholders: spinners, skeletons, the grid's loading overlay.
BUSY = "[class*='-spin-spinning'], [class*='skeleton'], .ag-overlay-loading-center"


class ShotError(Exception):
    """A step failed; main prints it as one line and exits 1."""


@dataclass
class Picked:
    """What the shots show, found in the store rather than assumed from today's run names."""

    experiment_id: str
    parent_id: str
    children: list[str]
    single_id: str
    metric_run: str
    metric_keys: list[str]
    table_metrics: list[str]
    outcomes: str  # the parent's picture of the outcomes over M x L (an artifact path)


# --- processes -------------------------------------------------------------------------------

def start(stack: contextlib.ExitStack, cmd: list[str], log: Path, **kwargs) -> subprocess.Popen:
    """Start cmd in a process group of its own, output to log; stopped with its children at exit."""
    out = open(log, "ab")
    stack.callback(out.close)
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True, **kwargs)
    stack.callback(stop, proc)
    return proc


def stop(proc: subprocess.Popen) -> None:
    """The whole group: mlflow ui's server processes and Chromium's helpers are children of the leader."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        deadline = time.monotonic() + 15
        while group_alive(proc) and time.monotonic() < deadline:
            time.sleep(0.2)
        if not group_alive(proc):
            return


def group_alive(proc: subprocess.Popen) -> bool:
    proc.poll()  # reaps the leader once it has exited
    try:
        os.killpg(proc.pid, 0)
    except ProcessLookupError:
        return False
    return True


def stage_code(launch: Path) -> Path:
    """A copy of this checkout's code, config, templates and demo data in the launch dir.

    The runs log their resolved data.dir as a param (shown on run.png): it then names the
    temporary dir, not where this checkout happens to live.
    """
    src = launch / "src"
    for name in CODE:
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(REPO / "pyproject.toml", src)  # marks a checkout: reflact finds conf/ and prompts/ beside it
    return src


def child_env(code: Path = REPO) -> dict[str, str]:
    env = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(code), env.get("PYTHONPATH")) if p)
    env.pop("OPENAI_API_KEY", None)  # the stand-in optimizer needs none; never hand a real key around
    return env


def tail(log: Path, lines: int = 8) -> str:
    text = log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""
    return "\n  ".join(text.splitlines()[-lines:])


def run_cli(args: list[str], launch: Path, code: Path, log: Path) -> None:
    try:
        with open(log, "ab") as out:
            done = subprocess.run([sys.executable, "-m", "reflact.run", *args], cwd=launch, env=child_env(code),
                                  stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, timeout=900)
    except subprocess.TimeoutExpired:
        raise ShotError(f"`python -m reflact.run {' '.join(args)}` ran over 900 s:\n  {tail(log)}") from None
    if done.returncode:
        raise ShotError(f"`python -m reflact.run {' '.join(args)}` exited {done.returncode}:\n  {tail(log)}")


def run_demo(launch: Path, base_url: str) -> None:
    """The demo sweep and one single run, through the real entry point, in the launch dir."""
    common = ["+exp=demo", "optimizer=compatible", f"optimizer.base_url={base_url}", "optimizer.model=test"]
    log, code = launch / "reflact.log", stage_code(launch)
    # the sweep priced (a made-up price for the stand-in) and drawn twice, so that its pictures of
    # cost and agreement have figures
    drawn = ["+optimizer.prices.test={input:1,cached_input:0.1,output:4}", "optimizer.samples=2",
             "optimizer.temperature=1"]
    run_cli(["-m", *common, *drawn, "reflect.minibatch_size=4,8", "reflect.edit_budget=2,4"], launch, code, log)
    run_cli(common, launch, code, log)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def serve_ui(stack: contextlib.ExitStack, launch: Path, store: str, timeout_s: float = 180) -> str:
    """`mlflow ui` on a free loopback port; returns its base URL once it serves the app."""
    port = free_port()
    log = launch / "mlflow-ui.log"
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", store, "--host", "127.0.0.1",
           "--port", str(port), "--workers", "1"]
    # no background job workers (GenAI evaluation jobs): seven processes and ~2 GB that no page here uses
    proc = start(stack, cmd, log, cwd=launch, env=dict(child_env(), MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"))
    base = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + timeout_s
    while not (answers(base + "health") and answers(base)):
        if proc.poll() is not None:
            raise ShotError(f"mlflow ui exited {proc.returncode}:\n  {tail(log)}")
        if time.monotonic() > deadline:
            raise ShotError(f"mlflow ui did not answer within {timeout_s:.0f} s:\n  {tail(log)}")
        time.sleep(0.5)
    return base


# --- what to show ----------------------------------------------------------------------------

def pick(store: str) -> Picked:
    """The sweep with the most child runs, a single run beside it, a minibatch series to plot."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store)
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id], max_results=5000)]
    kids: dict[str, list] = {}
    for run in runs:
        if parent := run.data.tags.get("mlflow.parentRunId"):
            kids.setdefault(parent, []).append(run)
    if not kids:
        raise ShotError("the store holds no sweep (no run has child runs)")
    parent_id = max(kids, key=lambda p: len(kids[p]))
    children = sorted(kids[parent_id], key=lambda r: r.info.run_name or "")
    exp = children[0].info.experiment_id
    singles = [r for r in runs if r.info.experiment_id == exp and r.info.run_id not in kids
               and "mlflow.parentRunId" not in r.data.tags]
    single = max(singles, key=lambda r: r.info.start_time) if singles else children[0]
    keys = sorted({k for r in children for k in r.data.metrics if k.startswith("minibatch/")})
    if not keys:
        raise ShotError("the sweep's runs have no minibatch/... metric to plot")
    plot = [k for k in PLOT_METRICS if k in keys] or keys[:1]
    longest = max(children, key=lambda r: len(client.get_metric_history(r.info.run_id, plot[0])))
    pictures = [a.path for a in client.list_artifacts(parent_id, "report") if "/outcomes_" in a.path]
    if not pictures:
        raise ShotError("the sweep's parent run has no report/outcomes_<mode>.png")
    return Picked(exp, parent_id, [r.info.run_id for r in children], single.info.run_id,
                  longest.info.run_id, plot, varying_metrics(children), pictures[0])


def varying_metrics(children: list) -> list[str]:
    """Run-level metrics whose values differ between the sweep's runs: the ones worth a column."""
    keys = sorted({k for r in children for k in r.data.metrics if not k.startswith("minibatch/")})
    differ = [k for k in keys if len({r.data.metrics.get(k) for r in children}) > 1]
    return (differ or keys)[:TABLE_METRICS]


def urls(base: str, picked: Picked) -> dict[str, str]:
    def q(value) -> str:
        return urllib.parse.quote(json.dumps(value, separators=(",", ":")), safe="")

    fields = {"exp": picked.experiment_id, "run": picked.single_id, "exps": q([picked.experiment_id]),
              "metric": q(picked.metric_keys[0]), "keys": q(picked.metric_keys), "parent": picked.parent_id,
              "outcomes": picked.outcomes}
    return {
        "runs_table": base + ROUTES["runs_table"].format(**fields),
        "run": base + ROUTES["run"].format(**fields),
        "compare": base + ROUTES["compare"].format(**fields, runs=q(picked.children)),
        "outcomes": base + ROUTES["outcomes"].format(**fields),
        "metric": base + ROUTES["metric"].format(**fields, runs=q([picked.metric_run])),
    }


# --- Chromium over the DevTools protocol -----------------------------------------------------

class Chromium:
    """Headless Chromium driven over --remote-debugging-pipe: it reads commands on fd 3, answers on fd 4."""

    def __init__(self, stack: contextlib.ExitStack, exe: str, profile: Path, log: Path) -> None:
        cmd_r, self._cmd_w = os.pipe()
        self._out_r, out_w = os.pipe()
        # moved above 9 first, so putting them on 3 and 4 in the child cannot overwrite one with the other
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (cmd_r, out_w)]
        for fd in (cmd_r, out_w):
            os.close(fd)
        remap = ("import os, sys; r, w = int(sys.argv[1]), int(sys.argv[2]); os.dup2(r, 3); os.dup2(w, 4); "
                 "os.close(r); os.close(w); os.execvp(sys.argv[3], sys.argv[3:])")
        cmd = [sys.executable, "-c", remap, *map(str, high), exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
               "about:blank"]
        start(stack, cmd, log, pass_fds=high)
        for fd in high:
            os.close(fd)  # the child holds them now: its exit then reads as end of file here
        stack.callback(self.close)
        self._buf = b""
        self._id = 0

    def call(self, method: str, session: str | None = None, timeout_s: float = 60, **params) -> dict:
        self._id += 1
        message = {"id": self._id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        data = json.dumps(message).encode() + b"\0"
        while data:
            data = data[os.write(self._cmd_w, data):]
        deadline = time.monotonic() + timeout_s
        while (reply := self._next(deadline)).get("id") != self._id:
            pass  # an event: nothing here needs them
        if "error" in reply:
            raise ShotError(f"Chromium: {method}: {reply['error'].get('message')}")
        return reply["result"]

    def _next(self, deadline: float) -> dict:
        while (end := self._buf.find(b"\0")) < 0:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._out_r], [], [], left)[0]:
                raise ShotError("Chromium did not answer in time")
            chunk = os.read(self._out_r, 1 << 20)
            if not chunk:
                raise ShotError("Chromium exited (its log is chromium.log in the launch dir; --keep keeps it)")
            self._buf += chunk
        raw, self._buf = self._buf[:end], self._buf[end + 1:]
        return json.loads(raw)

    def close(self) -> None:
        with contextlib.suppress(ShotError, OSError):
            self.call("Browser.close", timeout_s=5)
        for fd in (self._cmd_w, self._out_r):
            with contextlib.suppress(OSError):
                os.close(fd)


class Tab:
    def __init__(self, browser: Chromium) -> None:
        self.browser = browser
        target = browser.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = browser.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Page.enable")
        self.resize(SIZE)

    def resize(self, size: tuple[int, int]) -> None:
        self.call("Emulation.setDeviceMetricsOverride", width=size[0], height=size[1], deviceScaleFactor=1,
                  mobile=False)

    def call(self, method: str, **params) -> dict:
        return self.browser.call(method, session=self.session, **params)

    def js(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise ShotError(f"in the page: {result['exceptionDetails'].get('text')}: {expression[:80]}")
        return result["result"].get("value")

    def open(self, url: str) -> None:
        """A fresh document each time, so no element of the previous page can pass for this one's."""
        self.call("Page.navigate", url="about:blank")
        self.call("Page.navigate", url=url)

    def settle(self, ready: str, what: str, timeout_s: float = 90) -> None:
        """Until `ready` holds, nothing is loading, and the page's text and element count stay put for ~1 s."""
        busy = (f"[...document.querySelectorAll({BUSY!r})].some(e => e.getClientRects().length"
                " && e.checkVisibility({checkOpacity: true, checkVisibilityCSS: true}))")  # some stay, hidden
        probe = (f"(document.readyState === 'complete' && ({ready}) && !{busy})"
                 " ? document.body.innerText.length + ':' + document.getElementsByTagName('*').length : ''")
        deadline = time.monotonic() + timeout_s
        last, same = None, 0
        while time.monotonic() < deadline:
            state = self.js(probe)
            same = same + 1 if state and state == last else 0
            if same >= 3:
                return
            last = state
            time.sleep(0.35)
        raise ShotError(f"{what}: the page did not finish loading within {timeout_s:.0f} s")

    def screenshot(self) -> bytes:
        return base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])


# --- the shots ------------------------------------------------------------------------------

def seed_storage(tab: Tab, base: str, picked: Picked) -> None:
    """The UI's own view settings, written where it keeps them before it first loads."""
    view = {  # merged by the UI over its defaults
        "selectedColumns": [f"metrics.`{k}`" for k in picked.table_metrics],
        "runsExpanded": {picked.parent_id: True},
    }
    scope = json.dumps([picked.experiment_id], separators=(",", ":"))
    items = {
        "mlflow.workflowType_v1": json.dumps("machine_learning"),  # the "Model training" UI: Runs, not GenAI
        "mlflow.assistant.panelOpen_v1": "false",  # else the assistant panel opens over a third of the page
        "mlflow.assistant.fab.autoOpenedOnFirstLoad_v1": "true",
        f"MLflowLocalStorage-1.1-ExperimentPage-{scope}-ReactComponentState": json.dumps(view),
    }
    tab.open(base + "health")  # a plain page of the same origin: the app is not running to overwrite them
    tab.settle("true", "the UI's origin")
    tab.js(f"Object.entries({json.dumps(items)}).forEach(([k, v]) => localStorage.setItem(k, v)); true")


def shoot(tab: Tab, name: str, url: str, picked: Picked) -> bytes:
    tab.resize(SIZES.get(name, SIZE))
    tab.open(url)
    tab.settle(READY[name].format(run=picked.single_id), name)
    # plotly's toolbar otherwise sits over the top of each chart
    tab.js("document.head.insertAdjacentHTML('beforeend', '<style>.modebar-container{display:none}</style>')")
    if name == "runs_table":
        rows = tab.js("document.querySelectorAll('.ag-center-cols-container .ag-row').length")
        if rows < len(picked.children) + 1:
            warn(f"the sweep's runs are not expanded in {name}.png ({rows} rows)")
    if name == "compare" and compared_metrics(tab) != [OPENING_METRIC]:
        warn(f"the compare view opened on {compared_metrics(tab)}, not on {OPENING_METRIC}")
    time.sleep(0.5)  # the charts' last transition
    return tab.screenshot()


def compared_metrics(tab: Tab) -> list[str]:
    """The metric axes the compare view's parallel coordinates plot shows (the UI picks them)."""
    select = ("[...document.querySelectorAll('.du-bois-light-select')].find(s => "
              "s.previousElementSibling && s.previousElementSibling.textContent.trim() === 'Metrics:')")
    return tab.js(f"[...({select})?.querySelectorAll('.du-bois-light-select-selection-item-content') ?? []]"
                  ".map(e => e.textContent)")


def warn(message: str) -> None:
    print(f"screenshots: warning: {message}", file=sys.stderr)


def save_png(data: bytes, path: Path) -> None:
    """As Chromium made it, or reduced to a palette when large (UI pictures have few colours)."""
    try:
        from PIL import Image
    except ImportError:
        path.write_bytes(data)
        return
    with Image.open(io.BytesIO(data)) as image:
        image = image.convert("RGB")
    image.save(path, optimize=True)
    if path.stat().st_size > PNG_LIMIT:
        image.quantize(256, dither=Image.Dither.NONE).save(path, optimize=True)


def take(stack: contextlib.ExitStack, launch: Path, exe: str, out: Path) -> list[Path]:
    sys.path.insert(0, str(REPO))
    from reflact.testing.optimizer_server import OptimizerServer

    began = time.monotonic()
    with OptimizerServer() as server:
        run_demo(launch, server.base_url)
    store = f"sqlite:///{launch / 'outputs' / 'mlflow.db'}"
    picked = pick(store)
    print(f"demo sweep and run logged ({time.monotonic() - began:.0f} s)", flush=True)
    base = serve_ui(stack, launch, store)
    print(f"mlflow ui answers at {base} ({time.monotonic() - began:.0f} s)", flush=True)
    tab = Tab(Chromium(stack, exe, launch / "chromium-profile", launch / "chromium.log"))
    seed_storage(tab, base, picked)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, url in urls(base, picked).items():
        path = out / f"{name}.png"
        save_png(shoot(tab, name, url, picked), path)
        print(f"wrote {path} ({path.stat().st_size // 1024} KB, {time.monotonic() - began:.0f} s)", flush=True)
        written.append(path)
    return written


def find_chromium(given: str | None) -> str:
    for name in ([given] if given else ["chromium", "chromium-browser", "google-chrome"]):
        if found := shutil.which(name):
            return found
    raise ShotError(f"no Chromium found ({given or 'chromium'}); install it (Debian: apt-get install chromium) "
                    "or pass --chromium PATH")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "img", help="where the PNGs go (default: docs/img)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary launch dir (store, logs)")
    parser.add_argument("--chromium", help="the Chromium executable (default: chromium on PATH)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM ends us through the same clean-up as Ctrl-C: every started process is stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    began = time.monotonic()
    launch = Path(tempfile.mkdtemp(prefix="reflact-shots-"))
    try:
        exe = find_chromium(args.chromium)
        with contextlib.ExitStack() as stack:
            written = take(stack, launch, exe, args.out)
    except ShotError as exc:
        print(f"screenshots: error: {exc}", file=sys.stderr)
        return 1
    finally:
        if args.keep:
            print(f"kept the launch dir: {launch}")
        else:
            shutil.rmtree(launch, ignore_errors=True)
    print(f"{len(written)} screenshots in {args.out}, {time.monotonic() - began:.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
