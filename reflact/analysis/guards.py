"""Cheap vetoes on a match, for what embeddings are known to miss: checked on the items' own text,
before any judge call, in numpy over the candidate pairs.

Each guard: two items may match only when ...; and what it costs (bench/README.md):
- `numbers`: their changes name the same numbers (as digits); costs a paraphrase that writes a number
  another way ("2 times" / "twice").
- `negation`: both or neither says no (not, never, no, don't, avoid, unless, without, ...); costs a
  paraphrase that turns "instead of guessing" into "do not guess".
- `target`: an `insert_after` or `replace` edit names the same target line; costs none seen: the model
  copies target lines from the skill.

The first two are sound where a number or a "not" is the whole difference; a rule put the other
way round without a negation word ("prefer A over B" / "prefer B over A") passes them: the guards
`order`, `operation` and `wording` look at what two close wordings differ in (reflact.analysis.contrast).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from reflact.analysis import contrast
from reflact.analysis.matching import Key
from reflact.core.imports import one_at_a_time

NAMES = ("numbers", "negation", "target", *contrast.PAIRWISE, "wording")
_WORDS = re.compile(r"[a-z]+(?:'t)?|\d+(?:[.,]\d+)?")
# digits only: number words are as often no quantity ("one more try", "the two candidates")
# an outright "no" in a whole edit: contrast's words less those it reads only in the differing parts
NEGATIONS = contrast.SAYS_NO - {"none", "nothing", "instead", "rather"}


def numbers(text: str) -> tuple[str, ...]:
    words = _WORDS.findall(text.lower())
    return tuple(sorted(w for w in words if w[0].isdigit()))


def negated(text: str) -> bool:
    return any(w in NEGATIONS for w in _WORDS.findall(text.lower()))


def feature(name: str, key: Key) -> object:
    if name == "numbers":
        return numbers(key.meaning)
    if name == "negation":
        return negated(key.meaning)
    return key.anchor


def passing(keys: list[Key], names: tuple[str, ...], a, b, embed: Callable | None = None):
    """A mask over the pairs (a, b), positions in `keys` (one block): True where every guard named lets
    them match; `embed` (texts -> unit vectors) serves the `wording` guard."""
    with one_at_a_time():
        import numpy as np

    keep = np.ones(len(a), dtype=bool)
    for name in names:
        if name in ("numbers", "negation", "target"):
            codes: dict = {}
            values = np.array([codes.setdefault(feature(name, key), len(codes)) for key in keys])
            keep &= values[a] == values[b]
    pairwise = tuple(name for name in names if name in (*contrast.PAIRWISE, "wording"))
    if pairwise and keep.any():
        kept = np.nonzero(keep)[0]  # only what the cheap guards let through is looked at closer
        keep[kept] = contrast.passing(keys, pairwise, a[kept], b[kept], embed)
    return keep
