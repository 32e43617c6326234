"""docs/keys.md, the reference of every config key, is what docs/keys.py makes of the schema and
the default config: CI fails when a key is added, removed, retyped, given another default or
another comment without the reference being made again, and a key without a comment is refused."""

from __future__ import annotations

import sys

import pytest

from tests.conftest import PROJECT, docs_script


@pytest.fixture(scope="module")
def keys_script():
    yield docs_script("keys")
    del sys.modules["docs_keys"]


@pytest.fixture(scope="module")
def made(keys_script) -> str:
    return keys_script.reference()


def test_docs_keys_md_is_up_to_date_with_the_schema(made):
    written = (PROJECT / "docs" / "keys.md").read_text(encoding="utf-8")
    assert written == made, "docs/keys.md is out of date: run python docs/keys.py and commit docs/keys.md"


def test_every_key_of_the_schema_is_listed_with_its_composed_default(made):
    from dataclasses import fields, is_dataclass
    from typing import get_type_hints

    from reflact.config import ReflactConfig

    def names(kind, prefix=""):
        hints = get_type_hints(kind)
        for item in fields(kind):
            if is_dataclass(hints[item.name]):
                yield from names(hints[item.name], f"{prefix}{item.name}.")
            else:
                yield prefix + item.name

    rows = {line.split("|")[1].strip(" `"): line for line in made.splitlines() if line.startswith("| `")}
    assert set(rows) == set(names(ReflactConfig))
    # defaults come from the composed config (conf/optimizer/openai.yaml prices gpt-5), not the dataclass
    assert "gpt-5: {input: 1.25" in rows["optimizer.prices"]
    assert "| `8` | M: trajectories per call" in rows["reflect.minibatch_size"]
    assert "`error` \\| `skip`" in rows["data.on_bad_conversation"]  # an enum shows its values


def test_a_key_without_a_comment_is_refused_by_name(keys_script, tmp_path, monkeypatch, capsys):
    source = (PROJECT / "reflact" / "config" / "schema.py").read_text(encoding="utf-8")
    comment = "    # calls in flight at once\n    workers: int = 16\n"
    assert comment in source
    schema = tmp_path / "schema.py"
    schema.write_text(source.replace(comment, "    workers: int = 16\n"), encoding="utf-8")
    out = tmp_path / "keys.md"
    out.write_text("before", encoding="utf-8")
    monkeypatch.setattr(keys_script, "SCHEMA", schema)
    monkeypatch.setattr(keys_script, "OUT", out)
    assert keys_script.main([]) == 2
    err = capsys.readouterr().err
    assert err.strip() == ("docs/keys.py: no comment on reflect.workers in reflact/config/schema.py: "
                           "say in a comment what each does")
    assert out.read_text(encoding="utf-8") == "before"  # nothing written


def test_check_mode_says_when_the_reference_is_stale(keys_script, tmp_path, monkeypatch, capsys):
    out = tmp_path / "keys.md"
    out.write_text("stale", encoding="utf-8")
    monkeypatch.setattr(keys_script, "OUT", out)
    assert keys_script.main(["--check"]) == 1
    assert "docs/keys.md is out of date: run python docs/keys.py" in capsys.readouterr().err
    assert out.read_text(encoding="utf-8") == "stale"
