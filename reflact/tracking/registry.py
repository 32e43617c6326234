"""The patched skill handed back to MLflow's Prompt Registry (`mlflow.register_skill=true`).

The patched skill is the source skill with the run's kept edits applied in plan order (patch mode;
a full rewrite's one candidate). It becomes a new version of the prompt the skill came from (or of
`mlflow.skill_name`), linked to the run, tagged with the run's settings, and the alias
`mlflow.skill_alias` moves to it. No other alias is ever touched. A version already holding the
same text (a rerun, a relog) is used again: nothing new is registered.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections import Counter
from dataclasses import dataclass

from reflact.core.modes import get_mode
from reflact.core.text import one_line
from reflact.replies.apply import apply_edits
from reflact.running.rundir import RunDir, SweepDir
from reflact.tracking.process import RunContext

log = logging.getLogger("reflact")

MAX_CHARS = 100_000  # MLflow's limit on a prompt template
HASH_TAG = "reflact.skill_hash"
RUN_TAG = "reflact.skill_version"  # on the run (and, per job, on a sweep's parent): the version registered
_LATER_DRAW = re.compile(r"\.d[0-9]+$")  # a further draw of a minibatch (optimizer.samples > 1)
PAGE = 200


@dataclass(frozen=True)
class Patched:
    text: str
    kept: list[dict]  # the kept items applied, in plan order
    minibatches: int


def patched_skill(c: RunContext) -> Patched | None:
    """The source skill with the run's kept items applied (None, said in a warning, when the mode
    has no text to register)."""
    assert c.dataset is not None  # a run registers only with its dataset
    patched, why = patched_text(c.dataset.skill, c.run_dir, c.reflect.update_mode)
    if patched is None:
        log.warning("mlflow.register_skill: the run made %s; nothing registered (the run dir keeps them)", why)
    return patched


def patched_text(skill: str, run_dir: RunDir, update_mode: str) -> tuple[Patched | None, str]:
    """(`skill` with the run dir's kept items applied in plan order, "") or (None, why not): patch
    mode applies every kept edit (a further draw's are left out: they are alternatives), a full
    rewrite is its one candidate, suggestions are no skill."""
    mode = get_mode(update_mode)
    rows = [row for row in run_dir.kept_items() if not _LATER_DRAW.search(row["minibatch"])]
    items = [row["item"] for row in rows]
    minibatches = len({row["minibatch"] for row in rows})
    if mode.name == "patch":
        text, _ = apply_edits(skill, items)
        return Patched(text, items, minibatches), ""
    if mode.full_rewrite and len(items) == 1:
        return Patched(str(items[0].get("new_skill", "")), items, 1), ""
    if mode.full_rewrite:
        return None, f"{len(items)} candidate skills, one per minibatch"
    return None, "suggestions, not a skill"


def register_skill(store, c: RunContext) -> str | None:
    """Registers the patched skill (or finds the version holding it), moves the alias, links the
    version to the run; returns its URI (None when nothing was registered, said in a warning)."""
    patched = patched_skill(c)
    if patched is None:
        return None
    if len(patched.text) > MAX_CHARS:
        log.warning(
            "mlflow.register_skill: the patched skill has %d characters, over MLflow's %d; not registered "
            "(the run dir keeps the edits)",
            len(patched.text),
            MAX_CHARS,
        )
        return None
    if patched.text == c.dataset.skill:  # type: ignore[union-attr]  # patched_skill needs it
        log.warning("mlflow.register_skill: no kept edit changes the skill; nothing registered")
        return None
    source = c.dataset.source  # type: ignore[union-attr]
    name = source.name if source is not None and not c.mlflow.skill_name else str(c.mlflow.skill_name)
    digest = hashlib.sha256(patched.text.encode("utf-8")).hexdigest()[:16]
    client = store.client
    version = _holding(client, name, digest)
    if version is None:
        message = commit_message(c, patched)
        tags = _tags(store, c, patched, digest)
        version = client.register_prompt(name=name, template=patched.text, commit_message=message, tags=tags)
    client.set_prompt_alias(name, c.mlflow.skill_alias, int(version.version))
    client.link_prompt_version_to_run(store.run_id, version)
    uri = f"prompts:/{name}/{version.version}"
    client.set_tag(store.run_id, RUN_TAG, uri)
    _list_on_parent(store, c, uri)
    log.info("registered the patched skill as %s (alias %s)", uri, c.mlflow.skill_alias)
    return uri


def _holding(client, name: str, digest: str):
    """The version of `name` registered with this text before, if any."""
    token = None
    while True:
        try:
            page = client.search_prompt_versions(name, max_results=PAGE, page_token=token)
        except Exception:  # noqa: BLE001  # no such prompt yet
            return None
        for version in page:
            if version.tags.get(HASH_TAG) == digest:
                return version
        token = page.token
        if not token:
            return None


def commit_message(c: RunContext, patched: Patched) -> str:
    """What was kept, in one line: how many items from how many minibatches, by kind, and the settings."""
    r = c.reflect
    kinds = Counter(str(item.get("op") or item.get("type") or "candidate") for item in patched.kept)
    shown = ", ".join(f"{n} {kind}" for kind, n in kinds.most_common())
    return one_line(
        f"reflact: {len(patched.kept)} kept from {patched.minibatches} minibatch(es) ({shown}); "
        f"{get_mode(r.update_mode).short} M{r.minibatch_size} L{r.edit_budget} seed {r.seed}",
        500,
    )


def _tags(store, c: RunContext, patched: Patched, digest: str) -> dict[str, str]:
    r = c.reflect
    source = c.dataset.source if c.dataset is not None else None
    tags = {
        "reflact.run_id": store.run_id,
        "reflact.M": str(r.minibatch_size),
        "reflact.L": str(r.edit_budget),
        "reflact.mode": get_mode(r.update_mode).name,
        "reflact.seed": str(r.seed),
        "reflact.source_version": f"prompts:/{source.name}/{source.version}" if source else "file",
        "reflact.edits_kept": str(len(patched.kept)),
        HASH_TAG: digest,
    }
    if c.job is not None and c.sweep_dir is not None:
        tags["reflact.job"] = str(c.job)
        tags["reflact.cell"] = cell(c.sweep_dir, c.overrides)
    return tags


def cell(sweep_dir, overrides: tuple[str, ...]) -> str:
    """A sweep job's cell: its values of the keys the sweep varies (all its overrides when unknown)."""
    swept = set(SweepDir(sweep_dir).identity().get("swept", {}))
    own = [o for o in overrides if o.split("=", 1)[0].lstrip("+") in swept] if swept else list(overrides)
    return one_line(" ".join(own), 1000)


def _list_on_parent(store, c: RunContext, uri: str) -> None:
    """A sweep's parent run lists each job's version as a tag of its own (jobs end in any order)."""
    if c.sweep_dir is None:
        return
    parent = SweepDir(c.sweep_dir).parent_record()
    if parent.get("tracking_uri") == store.uri and parent.get("run_id"):
        store.client.set_tag(parent["run_id"], f"{RUN_TAG}.{c.job}", uri)
