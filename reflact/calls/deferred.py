"""The optimizer client made when the run first needs a call, not before: a rerun whose patches
are all reused makes none, and then never imports the OpenAI SDK (about half a second)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from reflact.calls.protocol import Optimizer, Reply
from reflact.config import OptimizerConfig
from reflact.core.errors import UserError
from reflact.core.imports import one_at_a_time


def api_key(cfg: OptimizerConfig, environ: Mapping[str, str]) -> str:
    """The key from the environment; none at all (and no local server named) is the user's mistake."""
    key = environ.get(cfg.api_key_env, "")
    if not key and not cfg.base_url:
        raise UserError(
            f"no optimizer key: set the environment variable {cfg.api_key_env} "
            "(or optimizer.base_url for a local OpenAI-compatible server)"
        )
    return key


class Deferred:
    """An Optimizer that makes the real one when it is first needed: `ready` (the stage's launching
    thread, at the first minibatch that needs a call) or a first call. Made under the import lock,
    which also makes any other thread wait for it instead of importing the SDK as well."""

    def __init__(self, make: Callable[[], Optimizer]) -> None:
        self._make = make
        self._made: Optimizer | None = None

    def _optimizer(self) -> Optimizer:
        if self._made is None:
            with one_at_a_time():
                if self._made is None:
                    self._made = self._make()
        return self._made

    @property
    def fault(self) -> str:
        return self._made.fault if self._made is not None else ""

    def complete(
        self,
        messages: list[dict],
        max_output_tokens: int,
        schema: dict | None = None,
        sample: int | None = None,
        label: str = "",
    ) -> Reply:
        return self._optimizer().complete(messages, max_output_tokens, schema, sample, label)

    def ready(self) -> None:
        self._optimizer()

    def forget(self, replies: list[Reply]) -> None:
        if self._made is not None:
            self._made.forget(replies)

    def close(self) -> None:
        if self._made is not None:
            self._made.close()
