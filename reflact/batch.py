"""The batches of a run or a sweep (optimizer.execution=batch), looked at and moved on by hand:

    python -m reflact.batch status DIR            every batch of DIR, as the server has it now
    python -m reflact.batch collect DIR           the results of ended batches into the response cache
    python -m reflact.batch cancel DIR            stops the running batches (what they finished is kept)
    python -m reflact.batch export DIR [-o FILE]  the requests not sent yet, as JSONL for a local engine
    python -m reflact.batch import DIR FILE       an engine's output (OpenAI's or vLLM's lines) into the cache

DIR is a run dir or a sweep dir: its `batch/state.json` says what is where (reflact.running.batch).
The server and key are the run's (`optimizer.base_url`, the variable `optimizer.api_key_env`
names); the response cache is the run's. Nothing reruns: the same command as the run's (or
`python -m reflact.run ...` with the same `hydra.run.dir`) then makes the patches from the cache.
A local engine: `python -m reflact.batch export DIR -o in.jsonl`, then
`vllm run-batch -i in.jsonl -o out.jsonl --model M`, then `python -m reflact.batch import DIR out.jsonl`.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections import Counter
from pathlib import Path

from reflact.config import AzureConfig, OptimizerConfig, Price, Provider, RetryConfig
from reflact.core.errors import UserError, exits_on_user_error
from reflact.core.files import write_text
from reflact.running.batch_runner import BatchRunner
from reflact.running.batch_state import ENDED, Submission, load_state
from reflact.running.rundir import BatchFiles

log = logging.getLogger("reflact")
CANCEL_WAIT_S = 60.0  # how long `cancel` waits for its batches to end before it leaves them to `collect`


def runner_for(folder: Path) -> BatchRunner:
    """The batch of a run or sweep dir, with its server and response cache."""
    files = BatchFiles(folder)
    state = load_state(files)
    if state is None:
        raise UserError(
            f"{folder}: no batch here ({files.state_path} is missing): run it with optimizer.execution=batch"
        )
    o = settings(state.endpoint)
    made: list = []

    def api():
        if not made:
            from reflact.calls.batches import make_batch_api

            made.append(make_batch_api(o))
        return made[0]

    return BatchRunner(files, state, api, price=listed_price(state.endpoint.get("price")))


def listed_price(saved: object) -> Price | None:
    """The model's listed price as the state keeps it (collected lines cost their tier's)."""
    if not isinstance(saved, dict):
        return None
    try:
        amounts = [float(saved[key]) for key in ("input", "cached_input", "output")]
        tiers = {name: listed_price({**tier, "tiers": {}}) for name, tier in saved.get("tiers", {}).items()}
        own = {name: tier for name, tier in tiers.items() if tier is not None}
        return Price(input=amounts[0], cached_input=amounts[1], output=amounts[2], tiers=own)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def settings(endpoint: dict) -> OptimizerConfig:
    """The optimizer settings the state keeps for reaching the server again."""
    try:
        azure = endpoint.get("azure") or {}
        return OptimizerConfig(
            model=str(endpoint.get("model") or "unknown"),
            provider=Provider(endpoint.get("provider", "openai")),
            base_url=endpoint.get("base_url"),
            api_key_env=str(endpoint.get("api_key_env") or "OPENAI_API_KEY"),
            azure=AzureConfig(endpoint=azure.get("endpoint"), api_version=str(azure.get("api_version") or "")),
            timeout_s=float(endpoint.get("timeout_s", 600.0)),
            retry=RetryConfig(**endpoint.get("retry", {})),
        )
    except (TypeError, ValueError, AttributeError) as exc:
        raise UserError(f"batch/state.json: its endpoint is damaged ({exc})") from None


def status(runner: BatchRunner) -> None:
    """Each batch as the server has it now (as last saved when it cannot be asked), and the requests."""
    from reflact.calls.batches import BatchFault

    try:
        runner.poll()
    except BatchFault as exc:
        print(f"(as last saved: {exc})")
    for sub in runner.state.submissions:
        print(submission_line(sub))
    print(requests_line(runner))


def submission_line(sub: Submission) -> str:
    counts = sub.counts
    done = f"{counts.get('completed', 0)}/{counts.get('total', len(sub.custom_ids))} completed"
    when = [
        f"{k.removesuffix('_at')} {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(v))}" for k, v in sub.times.items()
    ]
    collected = ", collected" if sub.collected else ""
    line = f"{sub.batch_id or '(not submitted)'}: {sub.file}, round {sub.round}, {sub.status}{collected}, {done}"
    return f"{line}, {counts.get('failed', 0)} failed" + (f"; {', '.join(when)}" if when else "")


def requests_line(runner: BatchRunner) -> str:
    states = Counter(ask.state for ask in runner.state.requests.values())
    shown = ", ".join(f"{n} {state}" for state, n in sorted(states.items())) or "none"
    return f"requests: {shown}; spent ${runner.state.spent_usd:.4f} at the batch's price"


def collect(runner: BatchRunner) -> None:
    """The ended batches' lines into the cache; running ones are looked at once and left."""
    open_cache(runner)
    running = runner.poll()
    for sub in [s for s in runner.state.in_flight() if s.batch_id and s.status in ENDED]:
        runner.collect(sub)
        print(f"{sub.batch_id}: collected")
    for sub in running:
        print(f"{sub.batch_id}: still {sub.status}; collect again later")
    print(requests_line(runner))


def cancel(runner: BatchRunner) -> None:
    """Asks every running batch to stop, waits a while for them to end, and collects them."""
    asked = runner.cancel()
    if not asked:
        print("no batch is running")
    deadline = time.monotonic() + CANCEL_WAIT_S
    pause = 1.0
    while runner.poll() and time.monotonic() < deadline:
        time.sleep(pause)
        pause = min(pause * 2, 15.0)
    collect(runner)


def export(runner: BatchRunner, out: Path | None) -> None:
    """The requests not submitted yet (and those a batch left unanswered) as one JSONL file."""
    wanted = {key for key, ask in runner.state.requests.items() if ask.state == "retry"}
    wanted |= {key for sub in runner.state.in_flight() if not sub.file_id for key in sub.custom_ids}
    lines: dict[str, str] = {}
    for sub in runner.state.submissions:
        path = runner.files.own_file(sub.file)
        if path is None or not path.is_file():
            continue
        for line in path.read_text(encoding="utf-8").splitlines(True):
            key = json.loads(line).get("custom_id")
            if key in wanted and key not in lines:
                lines[key] = line
    target = out or runner.files.folder / "export.jsonl"
    write_text(target, "".join(lines.values()))
    print(f"{len(lines)} requests written to {target}")
    folder = runner.files.folder.parent
    print(f"then: vllm run-batch -i {target} -o OUT --model <model>; python -m reflact.batch import {folder} OUT")


def import_lines(runner: BatchRunner, source: Path) -> None:
    """An engine's output file (OpenAI's or vLLM's lines) into the cache, as a batch's would be."""
    from reflact.calls.batches import read_lines
    from reflact.running.batch import drop_answered
    from reflact.running.batch_intake import Intake

    if not source.is_file():
        raise UserError(f"{source}: no such file")
    lines, damaged = read_lines(source.read_bytes())
    known = [str(line.get("custom_id")) for line in lines if str(line.get("custom_id")) in runner.state.requests]
    pending = [key for key in dict.fromkeys(known) if runner.state.requests[key].state != "done"]
    open_cache(runner)
    intake = Intake(runner.files, runner.state, runner.api, runner.save, runner.cache, runner.price, tier="")
    intake.take_lines(Submission(source.name, pending, 0, batch_id=f"import:{source.name}"), lines)
    drop_answered(runner)
    print(f"{source}: {len(pending)} requests taken{f', {damaged} damaged lines left out' if damaged else ''}")
    print(requests_line(runner))


def open_cache(runner: BatchRunner) -> None:
    from reflact.calls.cache import ResponseCache
    from reflact.config import CacheMode

    runner.cache = runner.cache or ResponseCache(Path(runner.state.cache_path), CacheMode.read_write)


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m reflact.batch", description="The batches of a run or sweep dir (optimizer.execution=batch)."
    )
    parser.add_argument("action", choices=("status", "collect", "cancel", "export", "import"))
    parser.add_argument("dir", type=Path, help="a run dir or a sweep dir")
    parser.add_argument("file", type=Path, nargs="?", help="import: the output file to read")
    parser.add_argument(
        "-o", "--out", type=Path, default=None, help="export: where to write (default DIR/batch/export.jsonl)"
    )
    args = parser.parse_args(argv)
    if (args.action == "import") != (args.file is not None):
        parser.error("import takes DIR and FILE; the other actions DIR alone")
    return args


@exits_on_user_error
def main(argv: list[str] | None = None) -> None:
    args = arguments(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    runner = runner_for(args.dir)
    from reflact.calls.batches import BatchFault

    try:
        {
            "status": lambda: status(runner),
            "collect": lambda: collect(runner),
            "cancel": lambda: cancel(runner),
            "export": lambda: export(runner, args.out),
            "import": lambda: import_lines(runner, args.file),
        }[args.action]()
    except BatchFault as exc:  # the server's failure, in one line; the state is as it was saved
        print(f"reflact: {exc}; the state in {runner.files.folder} is kept", file=sys.stderr)
        raise SystemExit(1) from None
    finally:
        if runner.cache is not None:
            runner.cache.close()


if __name__ == "__main__":
    main(sys.argv[1:])
