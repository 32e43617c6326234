"""The code's shape, as the project keeps it: small functions and classes, the run dir's layout
spelled in one module, the dry run an optimizer like any other."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "reflact"
SOURCES = sorted(PACKAGE.rglob("*.py"))
# file and folder names of the run dir (reflact/rundir.py owns them)
LAYOUT = re.compile(r"""/ ["'](patches|calls|preview)["']|["'](patches|calls|preview)/|"""
                    r"""(outcome\.json|summary\.json|kept_items\.jsonl|report\.md|mlflow_run\.json|user\.md|"""
                    r"""system\.md|reply_\{)""")


def test_no_function_over_40_lines_and_no_class_over_150():
    too_long = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                limit = 150 if isinstance(node, ast.ClassDef) else 40
                if node.end_lineno - node.lineno + 1 > limit:
                    too_long.append(f"{path.name}:{node.lineno} {node.name}")
    assert not too_long


def docstring_lines(tree: ast.AST) -> set[int]:
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and ast.get_docstring(node) is not None:
            first = node.body[0]
            lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def test_the_run_dir_layout_is_spelled_in_rundir_only():
    spelled = []
    for path in SOURCES:
        if path.name == "rundir.py":
            continue
        text = path.read_text(encoding="utf-8")
        skip = docstring_lines(ast.parse(text))
        spelled += [f"{path.name}:{number}" for number, line in enumerate(text.splitlines(), 1)
                    if number not in skip and LAYOUT.search(line.split("#")[0])]
    assert not spelled


def test_no_branch_on_a_missing_client():
    assert not [path.name for path in SOURCES if "client is None" in path.read_text(encoding="utf-8")]


def test_the_stand_in_optimizer_is_reached_only_when_asked_for():
    """reflact.testing ships in the wheel for tests and try-outs; no module of reflact's own imports it."""
    users = [path.name for path in SOURCES if path.relative_to(PACKAGE).parts[0] != "testing"
             and re.search(r"^\s*(from|import) reflact\.testing", path.read_text(encoding="utf-8"), re.M)]
    assert (PACKAGE / "testing" / "optimizer_server.py").is_file() and not users
