"""Small shapes of text the run's messages and reports share: one line cut short, a markdown table."""

from __future__ import annotations

ONE_LINE = 300  # characters of a message in a log line or an MLflow tag


def one_line(value: object, limit: int = ONE_LINE) -> str:
    """`value` as text on one line (whitespace runs collapsed), at most `limit` characters."""
    text = " ".join(str(value).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def shown(value: object, limit: int = 40) -> str:
    """A value read back from a file, as a message quotes it: its repr, cut short."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """The lines of a markdown table; a `|` inside a cell is escaped."""
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return out + ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
