"""Each part gets only its part: the whole config reaches the entry points and the module that
records it, nothing else (issue 38). Computed from the code, as tests/test_imports_direction.py is.

The rule, outside WHOLE_CONFIG_ALLOWED:
- the name `ReflactConfig` appears in no annotation and no import, and no function whose signature
  takes or returns it (`config.from_hydra`, `config.typed`, `config.params`, ...) is imported or called
  through its module;
- no section of the config (`.reflect`, `.optimizer`, `.data`, ...) is read off a parameter that is
  unannotated or annotated `Any`, `object` or `DictConfig` (a whole config under another name), nor
  off an attribute named `cfg` or `config` (a whole config carried inside an object);
- `Parts` (all the sections, built by the entry) is taken only by the orchestration (ORCHESTRATION).
A part takes the typed sections it reads (`ReflectConfig`, `OptimizerConfig`, ...) or a small
dataclass made from them (`running.stage.StageSettings`, `config.Shape`, `tracking.process.RunContext`).
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from reflact.config import ReflactConfig

PACKAGE = Path(__file__).resolve().parent.parent / "reflact"

# paths relative to reflact/; an entry ending in "/" holds every module under that folder. Only the
# entry points that need the whole config are listed (batch.py and import_traces.py do not)
WHOLE_CONFIG_ALLOWED = (
    "config/",  # the schema, its checks, and the one place that records it (params, UNCHANGING, SHAPING)
    "run.py",  # the command line
    "api.py",  # reflact.reflect and compose
    "analyze.py",
    "relog.py",
    "compat/skillopt.py",  # SkillOpt's drop-in: its public functions take a user's config
    "compat/mlflow.py",  # the optimizer for mlflow.genai.optimize_prompts: composes a config per prompt
    "sweeps/sweep.py",  # the multirun's Hydra callbacks: Hydra hands them the composed DictConfig
    "sweeps/batch.py",  # the sweep's batch: composes each job's config as Hydra's launcher does
)
ORCHESTRATION = ("orchestration/experiment.py",)  # takes config.Parts from the entry and hands each part its own
WHOLE_TYPES = ("ReflactConfig",)
OPAQUE = ("Any", "object", "DictConfig")  # annotations that would let a whole config through unseen
# each section's keys, by its name in the config (`optimized_metric`: a key of its own)
SECTIONS = {
    f.name: {k.name for k in dataclasses.fields(f.default_factory)}  # type: ignore[arg-type]
    for f in dataclasses.fields(ReflactConfig)
    if dataclasses.is_dataclass(f.default_factory)
}
SECTIONS["optimized_metric"] = set()
AMBIGUOUS = ("data",)  # also a trace's or a response's attribute: a section only when one of its keys is read
CARRIERS = ("cfg", "config")  # an attribute of these names holding a config is the whole config


def allowed(rel: str, entries: tuple[str, ...] = WHOLE_CONFIG_ALLOWED) -> bool:
    return any(rel == e or (e.endswith("/") and rel.startswith(e)) for e in entries)


def modules() -> dict[str, ast.Module]:
    return {p.relative_to(PACKAGE).as_posix(): ast.parse(p.read_text(encoding="utf-8")) for p in PACKAGE.rglob("*.py")}


def dotted(rel: str) -> str:
    parts = ["reflact", *Path(rel).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _names(node: ast.AST | None) -> set[str]:
    """Every name an annotation mentions (strings too: `from __future__ import annotations` style)."""
    if node is None:
        return set()
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            return _names(ast.parse(node.value, mode="eval").body)
        except SyntaxError:
            return set()
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
    }


def _functions(tree: ast.AST):
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _params(fn) -> list[ast.arg]:
    a = fn.args
    return [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, [a.vararg, a.kwarg])]


def whole_functions(trees: dict[str, ast.Module]) -> set[tuple[str, str]]:
    """(module, name) of every top-level function that takes or returns the whole config."""
    found = set()
    for rel, tree in trees.items():
        for fn in tree.body:
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                mentioned = _names(fn.returns).union(*(_names(p.annotation) for p in _params(fn)))
                if mentioned & set(WHOLE_TYPES):
                    found.add((dotted(rel), fn.name))
    # a package's __init__ re-exports its modules' names (`from reflact.config import from_hydra`)
    for rel, tree in trees.items():
        if rel.endswith("__init__.py"):
            for node in tree.body:
                if isinstance(node, ast.ImportFrom):
                    found |= {(dotted(rel), a.asname or a.name) for a in node.names if (node.module, a.name) in found}
    return found


def _import_offences(tree: ast.Module, whole: set[tuple[str, str]]) -> list[str]:
    found, aliases = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("reflact"):
            for a in node.names:
                if a.name in WHOLE_TYPES or (node.module, a.name) in whole:
                    found.append(f"line {node.lineno}: imports {a.name} from {node.module}")
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"  # a module imported by name
        elif isinstance(node, ast.Import):
            aliases.update({a.asname or a.name: a.name for a in node.names if a.name.startswith("reflact")})
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            if (aliases[node.value.id], node.attr) in whole or node.attr in WHOLE_TYPES:
                found.append(f"line {node.lineno}: uses {node.value.id}.{node.attr}")
    return found


def _annotation_offences(tree: ast.Module, types: tuple[str, ...]) -> list[str]:
    found = []
    for node in ast.walk(tree):
        annotations = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            annotations = [(p.arg, p.annotation) for p in _params(node)] + [("return", node.returns)]
        elif isinstance(node, ast.AnnAssign):
            annotations = [(ast.unparse(node.target), node.annotation)]
        for name, annotation in annotations:
            if _names(annotation) & set(types):
                found.append(f"line {node.lineno}: {name} is annotated {ast.unparse(annotation)}")  # type: ignore[arg-type]
    return found


def _section_offences(tree: ast.Module) -> list[str]:
    found = []
    for fn in _functions(tree):
        opaque = {p.arg for p in _params(fn) if p.annotation is None or _names(p.annotation) & set(OPAQUE)}
        opaque -= {"self", "cls"}
        keys_read = {
            id(n.value)
            for n in ast.walk(fn)
            if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Attribute)
            and n.attr in SECTIONS.get(n.value.attr, ())
        }
        for node in ast.walk(fn):
            if not (isinstance(node, ast.Attribute) and node.attr in SECTIONS):
                continue
            if node.attr in AMBIGUOUS and id(node) not in keys_read:
                continue
            off = node.value
            if isinstance(off, ast.Name) and off.id in opaque:
                found.append(f"line {node.lineno}: {fn.name} reads {ast.unparse(node)} off an opaque parameter")
            elif isinstance(off, ast.Attribute) and off.attr in CARRIERS:
                found.append(f"line {node.lineno}: {fn.name} reads {ast.unparse(node)} off a carried config")
    return sorted(set(found))


def offences(trees: dict[str, ast.Module]) -> dict[str, list[str]]:
    whole = whole_functions(trees)
    found = {}
    for rel, tree in trees.items():
        if allowed(rel):
            continue
        parts_ok = allowed(rel, ORCHESTRATION)
        listed = [
            *_import_offences(tree, whole),
            *_annotation_offences(tree, WHOLE_TYPES if parts_ok else (*WHOLE_TYPES, "Parts")),
            *_section_offences(tree),
        ]
        if listed:
            found[rel] = listed
    return found


def test_only_the_entry_points_take_the_whole_config():
    assert offences(modules()) == {}


def test_the_allowed_modules_exist():
    """A module moved or renamed must be updated here, not silently dropped from the rule."""
    rels = set(modules())
    for entry in (*WHOLE_CONFIG_ALLOWED, *ORCHESTRATION):
        if entry.endswith("/"):
            continue  # a folder that may not exist yet (config/, once config is a package)
        assert entry in rels or any(r.startswith(entry.removesuffix(".py") + "/") for r in rels), entry


STAGE_TAKES_IT_WHOLE = """
from reflact.config import ReflactConfig

def fingerprint(cfg: ReflactConfig, messages):
    return cfg.optimizer.model
"""
UNANNOTATED = """
def run_name(cfg, job=None):
    return f"{cfg.reflect.minibatch_size} {cfg.optimizer.samples}"
"""
CARRIED = """
class Mirror:
    def open(self):
        return self.context.cfg.mlflow.experiment
"""
PARTS_IN_A_STAGE = """
from reflact.config import Parts

def make_asker(parts: Parts):
    return parts.reflect.edit_budget
"""
CALLS_THROUGH_THE_MODULE = """
from reflact import config

def load(dict_cfg: dict):
    return config.from_hydra(dict_cfg)[0].reflect
"""
SECTIONS_ONLY = """
from reflact.config import OptimizerConfig, ReflectConfig

def run_name(r: ReflectConfig, o: OptimizerConfig, job=None):
    return f"{r.minibatch_size} {o.samples} {job}"
"""


@pytest.mark.parametrize(
    "source",
    [STAGE_TAKES_IT_WHOLE, UNANNOTATED, CARRIED, PARTS_IN_A_STAGE, CALLS_THROUGH_THE_MODULE],
    ids=["annotated", "unannotated", "carried", "parts", "through-module"],
)
def test_a_stage_that_takes_the_whole_config_again_is_found(source):
    trees = modules()
    trees["running/stage.py"] = ast.parse(source)
    assert "running/stage.py" in offences(trees)
    trees["orchestration/experiment.py"] = ast.parse(source)  # the orchestration takes Parts, never the config
    assert ("orchestration/experiment.py" in offences(trees)) == (source is not PARTS_IN_A_STAGE)


def test_a_part_that_takes_its_sections_passes():
    trees = modules()
    trees["tracking/store.py"] = ast.parse(SECTIONS_ONLY)
    assert "tracking/store.py" not in offences(trees)


def _keys(node: object, prefix: str = "") -> list[str]:
    """Every key of the schema as `section.key` (a dict, such as the price table, is one key)."""
    found = []
    for f in dataclasses.fields(node):  # type: ignore[arg-type]
        value = getattr(node, f.name)
        found += _keys(value, f"{prefix}{f.name}.") if dataclasses.is_dataclass(value) else [prefix + f.name]
    return found


def test_every_key_is_decided_once_whether_it_changes_results():
    """Adding a key means deciding in config whether a rerun may reuse what was saved: UNCHANGING,
    SHAPING (in every fingerprint), THROUGH_MESSAGES or REUSED, exactly one."""
    from reflact.config import decided

    assert {key: decided(key) for key in _keys(ReflactConfig()) if len(decided(key)) != 1} == {}


def test_a_fingerprint_holds_what_shaping_names():
    """The fingerprint's settings are the keys SHAPING names: changing one redoes every patch."""
    from reflact.config import SHAPING, shape
    from reflact.running.rundir import fingerprint
    from tests.conftest import make_config

    common = ("data.dir=unread", "optimizer.samples=2", "optimizer.temperature=1.0")
    base = make_config(*common)
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    changed = {
        "optimizer.model": "another-model",
        "reflect.update_mode": "full_rewrite",
        "reflect.edit_budget": "7",
        "optimizer.temperature": "0.5",
        "optimizer.reasoning_effort": "high",
        "optimizer.sample": "3",
        "optimizer.samples": "1",
    }
    assert set(changed) == set(SHAPING)
    before = fingerprint(shape(base.reflect, base.optimizer), messages)
    for key, value in changed.items():
        cfg = make_config(*common, f"{key}={value}")
        assert fingerprint(shape(cfg.reflect, cfg.optimizer), messages) != before, key
