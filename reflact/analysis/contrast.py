"""What two close wordings differ in: vetoes for pairs the embeddings call alike but that make two
different changes on one topic (reflact.analysis.guards names them; bench/README.md measures them).

Each guard: two items may match only when ...
- `order`: no relation word (over, than, before, after, not, instead, rather, ...) has the same words
  on its two sides exchanged ("prefer A over B" / "prefer B over A"); embeddings hardly see the swap.
- `operation`: two full-rewrite summaries that open on an operation verb (added, removed, moved,
  shortened) open on the same one ("Moved the check" / "Removed the check").
- `wording`: when they share most of their wording (at least SHARED_WORDING of their words, in order),
  what differs is the change, so it must say the same thing: both or neither of the differing parts
  says no, and the differing parts' own embeddings are at least SAME_DIFFERENCE similar. Two draws
  that keep a sentence's frame and change its action ("When Lookup finds nothing, try a synonym" /
  "... Search the entity again") are different changes; a paraphrase rarely shares so much wording,
  and a light rewording differs in small words (dropped before comparing) or a near synonym.

The constants were chosen on bench/data/match_pairs.jsonl and measured, unchanged, on the held-out
bench/data/match_pairs_heldout.jsonl (bench/README.md). Each pair is judged once per distinct pair of
texts: items with one wording (templated ones) cost nothing here.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass

from reflact.analysis.matching import Key
from reflact.core.imports import one_at_a_time

SHARED_WORDING = 0.4  # share of both texts' words that are the same words in the same order
SAME_DIFFERENCE = 0.9  # cosine the differing parts need, once the wording is mostly shared
_WORDS = re.compile(r"[a-z0-9_]+(?:'[a-z]+)?")
# what says no, in the differing parts: "not X" and "rather than X" say the same, so both count
SAYS_NO = frozenset(
    {
        "not",
        "no",
        "never",
        "nor",
        "neither",
        "none",
        "nothing",
        "without",
        "unless",
        "avoid",
        "cannot",
        "instead",
        "rather",
        "don't",
        "doesn't",
        "didn't",
        "isn't",
        "aren't",
        "won't",
        "can't",
        "shouldn't",
        "mustn't",
    }
)
# words that carry no change of their own: a light rewording adds or drops them
SMALL = frozenset(
    "a an the to of in on for and or by with from at as is are be it its this that your you their them any each".split()
)
RELATIONS = frozenset("over than before after not instead rather below above then ahead".split())
OPERATIONS = {
    "add": {"added", "adds", "introduced"},
    "remove": {"removed", "removes", "dropped", "deleted"},
    "move": {"moved", "reordered"},
    "shorten": {"shortened", "trimmed", "tightened"},
}
PAIRWISE = ("order", "operation")  # judged on the texts alone; `wording` also needs embeddings


def words(text: str) -> list[str]:
    return _WORDS.findall(text.lower())


@dataclass(frozen=True)
class Difference:
    shared: float  # share of the words that are the same words in the same order
    left: tuple[str, ...]  # the words only the first says (small words dropped)
    right: tuple[str, ...]
    negation_differs: bool  # one differing part says no, the other does not


def difference(first: str, second: str) -> Difference:
    a, b = words(first), words(second)
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    left: list[str] = []
    right: list[str] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            left += a[i1:i2]
            right += b[j1:j2]
    same = sum(block.size for block in matcher.get_matching_blocks())
    return Difference(
        2 * same / max(len(a) + len(b), 1),
        tuple(w for w in left if w not in SMALL),
        tuple(w for w in right if w not in SMALL),
        any(w in SAYS_NO for w in left) != any(w in SAYS_NO for w in right),
    )


def _sides(text: list[str]) -> tuple[str, set[str], set[str]] | None:
    """The first relation word and the words before and after it (small words dropped)."""
    for i, word in enumerate(text):
        if word in RELATIONS:
            return word, set(text[:i]) - SMALL, set(text[i + 1 :]) - SMALL
    return None


def swapped(first: str, second: str) -> bool:
    """The same relation, with words of one side moved to the other ("A over B" / "B over A")."""
    a, b = _sides(words(first)), _sides(words(second))
    if a is None or b is None or a[0] != b[0]:
        return False
    _, a_before, a_after = a
    _, b_before, b_after = b
    return bool((a_before & b_after) - b_before) and bool((a_after & b_before) - b_after)


def operation(key: Key) -> str | None:
    """The operation a full-rewrite summary opens on, if any."""
    if key.block != "candidate":
        return None
    first = words(key.meaning)[:1]
    return next((name for name, verbs in OPERATIONS.items() if first and first[0] in verbs), None)


def vetoed(name: str, first: Key, second: Key) -> bool:
    """Does the guard `name` (order, operation) keep two items apart."""
    if name == "order":
        return swapped(first.meaning, second.meaning)
    ops = operation(first), operation(second)
    return ops[0] is not None and ops[1] is not None and ops[0] != ops[1]


def passing(keys: list[Key], names: tuple[str, ...], a, b, embed: Callable | None = None):
    """A mask over the pairs (a, b), positions in `keys`: True where the guards named (of PAIRWISE and
    `wording`; `wording` needs `embed`, texts -> unit vectors) let them match."""
    with one_at_a_time():
        import numpy as np

    keep = np.ones(len(a), dtype=bool)
    codes: dict[str, int] = {}
    code = np.array([codes.setdefault(key.meaning, len(codes)) for key in keys])
    differ = np.nonzero(code[a] != code[b])[0]  # one wording: nothing differs
    if not len(differ) or not names:
        return keep
    first: dict[int, Key] = {}  # one key per wording (the block is the same: pairs are made within one)
    for key, c in zip(keys, code.tolist(), strict=True):
        first.setdefault(c, key)
    pairs, where = np.unique(np.stack([code[a[differ]], code[b[differ]]], axis=1), axis=0, return_inverse=True)
    verdict = _wording([_judge(names, first[i], first[j]) for i, j in pairs.tolist()], embed)
    keep[differ] = np.array(verdict, dtype=bool)[where.reshape(-1)]
    return keep


def _judge(names: tuple[str, ...], first: Key, second: Key) -> bool | Difference:
    """True (may match), False (vetoed), or a Difference left for the embeddings to decide."""
    if any(vetoed(name, first, second) for name in names if name in PAIRWISE):
        return False
    if "wording" not in names:
        return True
    diff = difference(first.meaning, second.meaning)
    if diff.shared < SHARED_WORDING:
        return True
    if diff.negation_differs:
        return False
    return diff if diff.left and diff.right else True  # only small words differ, or one side adds detail


def _wording(verdict: list, embed: Callable | None) -> list:
    """Decides the pairs left open: their differing parts must mean the same (without embeddings,
    `wording` vetoes only what the words alone decide)."""
    open_ = [i for i, v in enumerate(verdict) if isinstance(v, Difference)]
    if embed is None:
        return [v is not False for v in verdict]
    if not open_:
        return verdict
    texts = [" ".join(verdict[i].left) for i in open_] + [" ".join(verdict[i].right) for i in open_]
    vectors = embed(texts)
    n = len(open_)
    similar = (vectors[:n] * vectors[n:]).sum(axis=1) >= SAME_DIFFERENCE - 1e-6
    for i, alike in zip(open_, similar, strict=True):
        verdict[i] = bool(alike)
    return verdict
