"""Batch execution (`optimizer.execution=batch`): a run's or a sweep's requests sent as Batch API
jobs at the batch's price, their replies put in the response cache, the stage then run as usual.

Design.

- **Where the state lives.** In the folder the batch is for: `batch/` of the run dir for a run,
  of the sweep dir for a sweep (reflact.running.rundir.BatchFiles). `batch/state.json`
  (reflact.running.batch_state) names every input file, its file id and batch id, and each
  request's state by its custom_id; it is written before each step (files written, upload,
  `batches.create`, each poll, each collection), so a command killed or returned at any moment
  is resumed by the next: it polls what is in flight and never submits it again. A batch asked
  for by a command killed before it noted the id is found by its input file (`batches.list`).
- **Results through the cache.** A request's custom_id is its response cache key, and its body is
  the one the live client would send (reflact.calls.client: `keyed`, `as_sent`). Each output
  line goes into the cache as a live reply would, marked with its batch and priced at the batch's
  tier; then the stage runs as it always does and is answered from the cache: the same prompts,
  the same conversations, so the same patches, byte for byte. A batch's line is the call of the
  first run that uses it (the cache's claim) and a cache hit for any other, as a live reply is.
- **Rounds.** Which requests go is found by playing every conversation as far as the cache
  answers it (reflact.running.batch_requests): first requests, then the re-asks of replies that
  do not parse or were cut off (`optimizer.batch_reasks=live`: those are left to the stage). A
  sweep's jobs are looked at together by its callback (reflact.sweeps.batch): identical requests
  of different cells are one line, and one batch holds the grid where it fits
  (`optimizer.batch_max_requests`, `batch_max_mb` per file).
- **Expiry and partial results.** An expired, cancelled or partly failed batch keeps every line
  it finished; only the requests it did not answer go in the next batch (expired, cancelled, 5xx:
  at most `optimizer.retry.max_attempts` batches each), a request's own 4xx is reported, one line
  per distinct reason, and fails its minibatch. A request is never in two batches in flight.
- **Before anything is uploaded** the round's worst case (every prompt byte a token, the whole
  output allowance, at the batch's price) must fit `optimizer.max_cost_usd`, and the server must
  serve `/v1/batches` (else one line naming `python -m reflact.batch export`).
- **MLflow.** While it waits the run is RUNNING with its batches' ids, status times, request
  counts and usage (on the sweep's parent for a sweep); one left to run (`batch_wait=false`, or
  a fault with batches in flight) is SCHEDULED with a tag naming them, never FAILED, and the
  command that goes on makes it RUNNING again and ends it FINISHED once its results are in.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

from reflact.calls.batches import BatchApi, BatchFault, NoBatchApi, input_line
from reflact.calls.cache import ResponseCache
from reflact.calls.client import OptimizerClient
from reflact.config import BatchReasks, OptimizerConfig
from reflact.core.errors import UserError
from reflact.core.files import write_text
from reflact.core.imports import one_at_a_time
from reflact.core.launch import LaunchDir
from reflact.running.batch_requests import Collector, Request, Unit, look_ahead
from reflact.running.batch_runner import BatchRunner, Stop
from reflact.running.batch_state import Ask, BatchState, Submission, load_state
from reflact.running.rundir import BatchFiles

log = logging.getLogger("reflact")


class Batching:
    """The batch of one run or sweep: its rounds, and what the stage may send when the cache has no
    reply (`gate`). `check` and `first` do what may refuse the batch (nothing uploaded), `finish`
    the rest."""

    def __init__(self, files: BatchFiles, units: list[Unit], name: str, launch_dir: Path, go_on: str) -> None:
        self.units, self.name, self.go_on = units, name, go_on
        self.o: OptimizerConfig = units[0].settings.optimizer
        self.launch_dir = launch_dir
        self._clients: dict[str, OptimizerClient] = {}
        self._api: BatchApi | None = None
        cache_path = LaunchDir(launch_dir).cache(self.o.cache_path).resolve()
        state = load_state(files) or BatchState(name, endpoint_settings(self.o), str(cache_path))
        self.runner = BatchRunner(files, state, self.api, price=self.o.prices.get(self.o.model))
        self.sent_now: set[str] = set()  # requests this command put in a batch
        self.ledgers = [state]  # whose failures `gate` reports (a sweep job's: its sweep's too)
        self._next: tuple[dict[str, Request], list] = ({}, [])  # the first round, once checked

    @property
    def state(self) -> BatchState:
        return self.runner.state

    def check(self) -> None:
        """What the runs ask for first, held to the cost cap and the file limit before anything is
        written (a run's dir not held yet): UserError with nothing written or uploaded."""
        self._next = self._ahead(first=True)

    def first(self) -> None:
        """The first round written as input files (the dir held), and the server's Batch API looked
        for before any upload: UserError naming `export` when it has none."""
        self._write(self._next)
        if any(not s.batch_id for s in self.state.in_flight()):
            self._probe()

    def finish(self, notify: Callable[[list[dict], int], None], wait: bool | None = None) -> Stop | None:
        """Submits, waits, collects, and goes on with the next rounds until the cache answers every
        request a batch may; a Stop when the command returns first (its batches left to run)."""
        if not self.state.submissions:  # nothing was ever needed (a sweep's job its sweep answered)
            return None
        self.runner.notify = notify
        self.runner.cache = self.runner.cache or ResponseCache(Path(self.state.cache_path), self.o.cache)
        self.runner.secret = self.api().secret
        waiting = self.o.batch_wait if wait is None else wait
        while True:
            try:
                stop = self._settle(waiting)
            except BatchFault as exc:
                return Stop(f"{exc}; the state is kept: go on with {self.go_on}", fault=True)
            if stop is not None or not self._round(first=False):
                return stop

    def gate(self, key: str, first: bool) -> str | None:
        """Why the stage may not send a request the cache does not answer (None: it may)."""
        failed = self._failed(key)
        if failed:
            return f"the batch did not answer it: {failed}"
        if not first and self.o.batch_reasks is BatchReasks.live:
            return None
        return f"not answered by a batch; {self.go_on} sends it in the next one"

    def _failed(self, key: str) -> str:
        """Why a batch (this one's, or a sweep's for its job) gave up on `key` ("" if none did)."""
        asks = [ledger.requests.get(key) for ledger in self.ledgers]
        return next((ask.error for ask in asks if ask is not None and ask.state == "failed"), "")

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        if self.runner.cache is not None:
            self.runner.cache.close()

    # ------------------------------------------------------------------ rounds

    def _round(self, first: bool) -> bool:
        """Looks ahead; writes the requests to send as new input files. Whether there are any."""
        ahead = self._ahead(first)
        self._write(ahead)
        return bool(ahead[0])

    def _ahead(self, first: bool) -> tuple[dict[str, Request], list]:
        """(the requests to send next, within the cap; their input files' lines)."""
        found: dict[str, Request] = {}
        for unit in self.units:
            look_ahead(unit, Collector(self._client(unit.settings.optimizer), found))
        new = within_cap(self.state, self._sendable(found), self.o.max_cost_usd, first)
        return new, split_lines(new, self.o.batch_max_requests, int(self.o.batch_max_mb * 1_000_000))

    def _write(self, ahead: tuple[dict[str, Request], list]) -> None:
        new, files = ahead
        if new:
            prepare(self.runner, new, files)
            self.sent_now.update(new)

    def _sendable(self, found: dict[str, Request]) -> dict[str, Request]:
        return sendable(found, self.state, self.o, self.sent_now, self._failed)

    def _settle(self, waiting: bool) -> Stop | None:
        """Every input file submitted, every batch waited for and collected."""
        for sub in self.state.in_flight():
            if not sub.batch_id:
                self.runner.submit(sub, {"reflact": self.name[:500], "file": sub.file, "fingerprint": fingerprint(sub)})
        self.runner.told()
        stop = self.runner.wait(waiting, self.o.batch_max_wait_h, self.go_on)
        if stop is not None:
            return stop
        for sub in self.state.in_flight():
            self.runner.collect(sub)
        self.runner.told()
        return None

    # ------------------------------------------------------------------ the server

    def _client(self, o: OptimizerConfig) -> OptimizerClient:
        """The client whose keys and bodies a run's requests take (one per set of optimizer settings)."""
        shape = repr(o)
        if shape not in self._clients:
            with one_at_a_time():
                from reflact.calls.client import make_client

                self._clients[shape] = make_client(o, self.launch_dir)
        return self._clients[shape]

    def api(self) -> BatchApi:
        if self._api is None:
            with one_at_a_time():
                from reflact.calls.batches import make_batch_api

                self._api = make_batch_api(self.o)
        return self._api

    def _probe(self) -> None:
        try:
            self.api().probe()
        except NoBatchApi as exc:
            folder = self.runner.files.folder.parent
            raise UserError(
                f"optimizer.execution=batch: the server at {self.api().url} has no Batch API ({exc} on "
                f"/v1/batches); nothing was uploaded. python -m reflact.batch export {folder} writes the "
                "requests for a local engine (vllm run-batch), or use optimizer.execution=live"
            ) from None


def sendable(
    found: dict[str, Request], state: BatchState, o: OptimizerConfig, sent_now: set[str], failed: Callable[[str], str]
) -> dict[str, Request]:
    """The requests to send now: not in flight, not failed, not sent by this command already
    (its answer went to another cache), at most retry.max_attempts batches each."""
    new = {}
    for key, request in found.items():
        ask = state.requests.get(key)
        if not request.first and o.batch_reasks is BatchReasks.live:
            continue
        answered_elsewhere = ask is not None and ask.state == "done" and key in sent_now
        if ask is not None and (ask.state in ("in_flight", "failed") or answered_elsewhere) or failed(key):
            continue
        if ask is not None and ask.attempts >= o.retry.max_attempts:
            ask.state, ask.error = "failed", f"no answer after {ask.attempts} batches (last: {ask.error})"
            continue
        new[key] = request
    return new


def fingerprint(sub: Submission) -> str:
    """What the batch holds, for its metadata: a digest of its requests' custom_ids (cache keys)."""
    return hashlib.sha256("\n".join(sub.custom_ids).encode()).hexdigest()[:32]


def within_cap(state: BatchState, new: dict[str, Request], cap: float | None, first: bool) -> dict[str, Request]:
    """The round's requests when their worst case fits optimizer.max_cost_usd beside what the batch
    spent; else the first round is refused (nothing uploaded), a later one's requests fail."""
    worst = sum(request.worst for request in new.values())
    if cap is None or not new or state.spent_usd + worst <= cap:
        return new
    spent = f" beside ${state.spent_usd:.4f} spent" if state.spent_usd else ""
    why = f"the batch's worst case ${worst:.4f} for {len(new)} requests{spent} is over optimizer.max_cost_usd"
    why += f"={cap:g}"
    if first:
        raise UserError(f"{why}; nothing was uploaded: raise the cap or lower optimizer.max_output_tokens")
    for key, request in new.items():
        refused = f"cost limit reached ({why})"
        state.requests[key] = Ask("failed", 0, refused, request.structured, request.worst)
    log.warning("%s: %d request(s) not sent", why, len(new))
    return {}


def prepare(runner: BatchRunner, new: dict[str, Request], files: list[list[tuple[str, str]]]) -> None:
    """The requests as input files (`split_lines`), noted in the state (in flight) before anything
    is uploaded."""
    state = runner.state
    round_number = max((s.round for s in state.submissions), default=0) + 1
    for chunk in files:
        path = runner.files.input_path(state.next_file())
        write_text(path, "".join(line for _, line in chunk))
        custom_ids = [key for key, _ in chunk]
        state.submissions.append(Submission(path.name, custom_ids, round_number))
        for key in custom_ids:
            ask = state.requests.get(key) or Ask()
            request = new[key]
            state.requests[key] = replace(
                ask, state="in_flight", attempts=ask.attempts + 1, structured=request.structured, worst=request.worst
            )
    runner.save()


def drop_answered(runner: BatchRunner) -> None:
    """Input files not uploaded yet lose the requests answered meanwhile (an engine's output
    imported): a file left with none is dropped, the others written again with the rest."""
    for sub in [s for s in runner.state.in_flight() if not s.file_id]:
        left = [key for key in sub.custom_ids if runner.state.requests[key].state == "in_flight"]
        if len(left) == len(sub.custom_ids):
            continue
        path = runner.files.own_file(sub.file)
        assert path is not None  # the state's own names
        kept = [line for line in path.read_text(encoding="utf-8").splitlines(True) if _custom_id(line) in left]
        write_text(path, "".join(kept))
        sub.custom_ids = left
        sub.status = "prepared" if left else "dropped"
    runner.save()


def _custom_id(line: str) -> str:
    try:
        return str(json.loads(line).get("custom_id", ""))
    except (ValueError, AttributeError):
        return ""


def split_lines(new: dict[str, Request], max_lines: int, max_bytes: int) -> list[list[tuple[str, str]]]:
    """(custom_id, line) in files of at most `max_lines` lines and `max_bytes` bytes each."""
    files: list[list[tuple[str, str]]] = [[]]
    size = 0
    for key, request in new.items():
        line = input_line(key, request.body)
        length = len(line.encode("utf-8"))
        if length > max_bytes:
            raise UserError(
                f"optimizer.batch_max_mb={max_bytes / 1e6:g}: one request is {length / 1e6:.1f} MB, larger than a "
                "batch file may be; nothing was uploaded: raise it (OpenAI takes 200 MB) or use "
                "optimizer.execution=live"
            )
        if len(files[-1]) >= max_lines or size + length > max_bytes:
            files.append([])
            size = 0
        files[-1].append((key, line))
        size += length
    return [chunk for chunk in files if chunk]


def endpoint_settings(o: OptimizerConfig) -> dict:
    """What the batch tool needs to reach the server again (the key variable's name, never a key)."""
    return {
        "provider": o.provider.value,
        "base_url": o.base_url,
        "api_key_env": o.api_key_env,
        "azure": {"endpoint": o.azure.endpoint, "api_version": o.azure.api_version},
        "timeout_s": o.timeout_s,
        "retry": {k: getattr(o.retry, k) for k in ("max_attempts", "max_seconds", "initial_wait_s", "max_wait_s")},
        "model": o.model,
        "price": asdict(o.prices[o.model]) if o.model in o.prices else None,
    }
