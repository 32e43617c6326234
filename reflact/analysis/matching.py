"""When are two items the same change? Matching by what they change, fast enough for 10,000 items.

An item becomes a `Key`: a block (items match only within one) and the texts compared.

| item | block | texts compared |
|---|---|---|
| edit | its `op` | `append`: content; `delete`: target; `insert_after`, `replace`: target and content |
| suggestion | its `type` | title and instruction |
| skill candidate | one block | the change summary, joined |

Each text is normalised (lowercase, whitespace collapsed, words sorted) and two items match when
every compared text scores at least the threshold on rapidfuzz's `fuzz.ratio` (normalised Indel
similarity) / 100; on word-sorted texts that is rapidfuzz's token-sort ratio, so a reordered
sentence still matches. The threshold's default (`analysis.match_threshold`, 0.85) sits between
a light rewording (word order, case, a word or two, scores 0.87 to 0.97) and the nearest
different rule of the hand-made examples in tests/test_analysis.py (a negation, 0.82). This
matching is lexical: a paraphrase in other words does not match, while two rules that differ
only in a number do. `analysis.matcher` chooses another (reflact.analysis.embedding, reflact.analysis.judge): each
matcher is an object with `chunks(keys)` (the matching pairs, chunk by chunk) and `describe()`.

Speed and memory: texts are compared by their first MAX_COMPARED_CHARS characters; within a block
the texts are sorted by length and each chunk of rows is scored (all cores, `process.cdist` with the
cutoff) only against the longer texts that could still reach it: a ratio of t needs the shorter text
to be at least t / (2 - t) of the longer. The pairs found are used chunk by chunk (numpy, no Python
loop over pairs) and never all kept, so templated items that all match one another cost time, not
memory.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from reflact.core.imports import one_at_a_time

if TYPE_CHECKING:  # numpy is imported where it is used (it is slow to import)
    import numpy as np

SCORER = "rapidfuzz fuzz.ratio on lowercased, whitespace-collapsed, word-sorted text"
CELLS_PER_CHUNK = 2_000_000  # scores computed at once (8 MB as float32); rows per chunk follow from it
# a score costs about the product of the two lengths: a chunk holds at most this many character
# pairs (a fraction of a second), so SIGTERM and Ctrl-C, handled between chunks, take effect soon
PAIRS_PER_CHUNK = CELLS_PER_CHUNK * 100 * 100
# an item's text is compared by its first characters only: an edit that says what to change is a
# line or a paragraph, and a megabyte-long one would cost minutes per pair
MAX_COMPARED_CHARS = 4000
MAX_MEANING_CHARS = 16000  # what an embedding reads of it (inside an embedding model's input limit)
# the work (character pairs, see work()) a run's own analysis may take: as much as
# analysis.max_items items of this many characters would
BUDGET_ITEM_CHARS = 300


@dataclass(frozen=True)
class Key:
    block: str
    texts: tuple[str, ...]  # normalised; all must be similar for two items to match
    meaning: str = ""  # the change in its own words (whitespace collapsed): what an embedding reads
    anchor: str = ""  # normalised target line of an insert_after or replace edit: it must be the same


@dataclass(frozen=True)
class Lexical:
    """The default matcher: every compared text at least `threshold` similar (module docstring)."""

    threshold: float
    name = "lexical"

    def chunks(self, keys: list[Key | None]):
        return match_chunks(keys, self.threshold)

    def describe(self) -> dict:
        return {"matcher": self.name, "threshold": self.threshold, "matching": SCORER}


def collapse(text: object) -> str:
    return " ".join(str(text or "")[:MAX_MEANING_CHARS].split())


def normalise(text: object) -> str:
    """Lowercase, whitespace collapsed, words sorted (so word order does not count), of the text's
    first MAX_COMPARED_CHARS characters (cut before sorting: two long texts that differ stay apart)."""
    return " ".join(sorted(str(text or "")[:MAX_COMPARED_CHARS].lower().split()))


def work(keys: list[Key | None]) -> int:
    """What matching the keys costs, in character pairs: within each block, every pair of items,
    each with all its compared texts."""
    total = 0
    for members in blocks_of(keys):
        chars = sum(sum(len(text) for text in cast(Key, keys[i]).texts) + 1 for i in members)
        total += chars * chars // 2
    return total


def work_budget(max_items: int) -> int:
    """The work a run's own analysis may take (module constants)."""
    chars = max_items * BUDGET_ITEM_CHARS
    return chars * chars // 2


def item_key(item: object) -> Key | None:
    """What an item changes; None for something that is no item of any mode."""
    if not isinstance(item, dict):
        return None
    if "op" in item:
        op = str(item["op"])
        fields = {"append": ("content",), "delete": ("target",)}.get(op, ("target", "content"))
        anchor = normalise(item.get("target")) if len(fields) == 2 else ""
        return Key(
            f"edit:{op}", tuple(normalise(item.get(name)) for name in fields), collapse(item.get(fields[-1])), anchor
        )
    if "instruction" in item or "type" in item:
        title, instruction = collapse(item.get("title")), collapse(item.get("instruction"))
        return Key(
            f"suggestion:{item.get('type')}",
            (normalise(title), normalise(instruction)),
            f"{title}: {instruction}" if title else instruction,
        )
    if "change_summary" in item or "new_skill" in item:
        summary = item.get("change_summary")
        joined = " ".join(map(str, summary)) if isinstance(summary, list) else summary
        return Key("candidate", (normalise(joined),), collapse(joined))
    return None


@dataclass
class Matched:
    """What the matches of some items come to, item by item."""

    cluster: np.ndarray  # each item's cluster (connected components of the match graph)
    recurs: dict[str, np.ndarray]  # per label: does a matching item share its `same` and differ in `other`

    def distinct(self) -> int:
        return len(set(self.cluster.tolist()))


def match(keys: list[Key | None], matcher, labels: dict[str, tuple[list[int], list[int]]]) -> Matched:
    """Matches every pair of keys with `matcher` (a threshold: the lexical one). `labels` name integer labels
    (same, other) per item; for each, an item recurs when a matching item has its `same` and
    another `other` (say same = the minibatch, other = the draw)."""
    with one_at_a_time():
        import numpy as np

    n = len(keys)
    component = np.arange(n)
    arrays = {name: (np.asarray(same), np.asarray(other)) for name, (same, other) in labels.items()}
    recurs = {name: np.zeros(n, dtype=bool) for name in labels}
    matcher = Lexical(matcher) if isinstance(matcher, (int, float)) else matcher
    for a, b in matcher.chunks(keys):
        for name, (same, other) in arrays.items():
            hit = (same[a] == same[b]) & (other[a] != other[b])
            recurs[name][a[hit]] = True
            recurs[name][b[hit]] = True
        component = _joined(component, a, b)
    return Matched(component, recurs)


def _joined(component: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The components once the pairs (a, b) are linked too."""
    with one_at_a_time():
        import numpy as np
        from scipy.sparse import coo_matrix
        from scipy.sparse.csgraph import connected_components

    ca, cb = component[a], component[b]
    apart = ca != cb
    if not apart.any():
        return component
    n = len(component)
    links = coo_matrix((np.ones(int(apart.sum()), dtype=np.int8), (ca[apart], cb[apart])), shape=(n, n))
    _, merged = connected_components(links, directed=False)
    return merged[component]


def blocks_of(keys: list[Key | None]) -> list[list[int]]:
    """The positions of the keys, block by block (items match only within one)."""
    blocks: dict[str, list[int]] = defaultdict(list)
    for index, key in enumerate(keys):
        if key is not None:
            blocks[key.block].append(index)
    return list(blocks.values())


def match_chunks(keys: list[Key | None], threshold: float):
    """Every matching pair (i, j), once, as two index arrays, a chunk of rows at a time."""
    with one_at_a_time():
        import numpy as np

    for members in blocks_of(keys):
        positions = np.asarray(members)
        for a, b in _block_chunks(cast("list[Key]", [keys[i] for i in members]), threshold):
            yield positions[a], positions[b]


def _block_chunks(keys: list[Key], threshold: float):
    """Matching pairs within one block (positions in `keys`): every text of both must reach the cutoff."""
    with one_at_a_time():
        import numpy as np
        from rapidfuzz import fuzz, process

    cutoff = threshold * 100
    order = np.array(sorted(range(len(keys)), key=lambda i: len(keys[i].texts[0])), dtype=np.int64)
    fields = [[keys[i].texts[f] for i in order] for f in range(len(keys[0].texts))]
    lengths = np.array([len(text) for text in fields[0]])
    sizes = np.array([sum(len(text) for text in keys[i].texts) + 1 for i in order])  # what each one costs
    stretch = (2 - threshold) / threshold  # how much longer a text may be and still match
    start = 0
    while start < len(keys):
        stop = start + _rows(sizes, start)
        reach = int(np.searchsorted(lengths, lengths[stop - 1] * stretch + 1e-9, side="right"))
        found: Any = None  # the scores' mask, once the first field is scored
        for texts in fields:  # cdist leaves every score below the cutoff at 0
            scores = process.cdist(
                texts[start:stop],
                texts[start:reach],
                scorer=fuzz.ratio,
                score_cutoff=cutoff,
                dtype=np.float32,
                workers=-1,
            )
            found = scores > 0 if found is None else found & (scores > 0)
        row, col = np.nonzero(found)
        later = col > row  # the window starts at the chunk's first row: each pair once
        yield order[start + row[later]], order[start + col[later]]
        start = stop


def _rows(sizes, start: int) -> int:
    """Rows of the chunk from `start`: at most CELLS_PER_CHUNK scores and PAIRS_PER_CHUNK character
    pairs, counting each row with its largest text and each column with the largest of all."""
    n = len(sizes)
    rows = min(max(16, min(1024, CELLS_PER_CHUNK // max(n, 1))), n - start)
    largest_row, largest = int(sizes[start : start + rows].max()), int(sizes.max())
    return min(rows, max(1, PAIRS_PER_CHUNK // ((n - start) * largest_row * largest)))


def warm_imports() -> None:
    """Imports the libraries matching uses, ahead of time (they are imported where used)."""
    import importlib

    with one_at_a_time():  # the run's end may import the same libraries meanwhile
        for name in ("numpy", "rapidfuzz.process", "scipy.sparse.csgraph"):
            importlib.import_module(name)
