"""Imports point one way: entry points -> orchestration -> stages -> shared basics, with no circle.

Computed from the code's own import statements (function-local ones too). A module may import
its own subpackage and anything below its layer; `ls reflact/` then reads as the pipeline.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "reflact"

# bottom to top; a name is a top-level module or a subpackage of reflact/
LAYERS = (
    ("core",),  # shared basics: the import lock, errors, file writes, text, groups, modes, metric names
    ("config",),  # the schema, its checks, the Hydra glue
    ("inputs",),  # a dataset folder read and checked; one trajectory block; other logs as datasets
    ("calls",),  # the optimizer seam and its OpenAI-SDK client, cache, rate limits
    ("prompting",),  # minibatches, templates, a minibatch's messages fitted to the window
    ("replies",),  # a reply to a checked patch and what it would do to the skill
    ("running",),  # one run: a conversation, the stage, the run dir, events, the summary
    ("analysis",),  # agreement, redundancy, distinct items
    ("tracking",),  # MLflow as a view of the run dir
    ("sweeps",),  # a multirun's parent run and grid report
    ("orchestration",),  # one run end to end
    # the ways in
    ("run", "cli", "api", "analyze", "relog", "report", "importers", "import_traces", "compat", "testing", "batch"),
)
LAYER = {name: i for i, names in enumerate(LAYERS) for name in names}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """The reflact modules a file imports (`from reflact.x import y` names module y or an attribute of x)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("reflact.")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("reflact"):
            folder = PACKAGE.parent.joinpath(*node.module.split("."))
            for alias in node.names:
                is_module = (folder / f"{alias.name}.py").exists() or (folder / alias.name).is_dir()
                found.add(f"{node.module}.{alias.name}" if is_module else node.module)
    return found - {"reflact"}


def graph() -> dict[str, set[str]]:
    # the package's own __init__ (its version, `reflact.reflect` loaded on first use) is left out:
    # every import of a submodule imports it first, whatever the direction
    return {module_name(p): imports_of(p) - {module_name(p)} for p in PACKAGE.rglob("*.py")
            if p != PACKAGE / "__init__.py"}


def layer(module: str) -> int:
    return LAYER[module.split(".")[1]]


def test_every_module_has_a_layer():
    assert sorted(m for m in graph() if m.split(".")[1] not in LAYER) == []


def test_the_top_level_holds_only_the_ways_in():
    """Beside the subpackages, reflact/ holds the entry points and the public API only (the last
    layer): a module of a stage or a shared basic goes in its subpackage."""
    top = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")
    assert [name for name in top if LAYER.get(name) != len(LAYERS) - 1] == []


def test_no_import_points_upward():
    edges = graph()  # once: rebuilt for every edge it took minutes
    upward = sorted(f"{m} -> {d}" for m, deps in edges.items() for d in deps if d in edges and layer(d) > layer(m))
    assert upward == []


def test_no_import_circle():
    edges = graph()
    circles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for dep in sorted(edges.get(node, ())):
            if state.get(dep) == 1:
                circles.append(" -> ".join(path[path.index(dep):] + [dep]))
            elif dep not in state:
                visit(dep, path + [dep])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert circles == []


def test_the_checks_see_an_upward_import_and_a_circle(tmp_path, monkeypatch):
    """The checks themselves, on a made-up package: running -> sweeps points up; a -> b -> a."""
    package = tmp_path / "reflact"
    (package / "running").mkdir(parents=True)
    (package / "sweeps").mkdir()
    (package / "running" / "a.py").write_text("from reflact.sweeps import b\n")
    (package / "sweeps" / "b.py").write_text("def f():\n    from reflact.running import a\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", package)
    assert {m: sorted(d) for m, d in graph().items()} == {"reflact.running.a": ["reflact.sweeps.b"],
                                                          "reflact.sweeps.b": ["reflact.running.a"]}
    with pytest.raises(AssertionError, match="reflact.running.a -> reflact.sweeps.b"):
        test_no_import_points_upward()
    with pytest.raises(AssertionError, match="reflact.running.a -> reflact.sweeps.b -> reflact.running.a"):
        test_no_import_circle()
