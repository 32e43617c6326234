"""The skill read from MLflow's Prompt Registry: `data.skill=prompts:/name@alias` or `prompts:/name/N`.

The template is the skill, verbatim: `{{ ... }}` in it (Jinja, Handlebars) is the user's text and
is never formatted. A chat prompt (a list of messages) is no skill. The registry is the run's own
MLflow store (mlflow.tracking_uri); mlflow is imported only when a skill comes from it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from reflact.core.errors import UserError
from reflact.core.imports import one_at_a_time
from reflact.core.text import one_line

SCHEME = "prompts:/"
# prompts:/name@alias or prompts:/name/version (MLflow's own URI forms)
_URI = re.compile(r"prompts:/(?P<name>[^/@]+)(?:@(?P<alias>[^/@]+)|/(?P<version>[0-9]+))")


@dataclass(frozen=True)
class RegisteredSkill:
    """The prompt version a run's skill came from."""

    uri: str  # as the user wrote it
    name: str
    version: int
    text: str


def is_prompt_uri(value: object) -> bool:
    return isinstance(value, str) and value.startswith(SCHEME)


def load_registered_skill(uri: str, store_uri: str, max_bytes: int, key: str = "data.skill") -> RegisteredSkill:
    """The prompt version `uri` names in the store's registry; a mistake is one UserError naming `key`."""
    match = _URI.fullmatch(uri)
    if match is None:
        raise UserError(f"{key}: {uri!r} is not a prompt URI: write prompts:/<name>@<alias> or prompts:/<name>/<N>")
    # a tracking server that is down costs seconds, not MLflow's minutes of retries
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
    with one_at_a_time():
        from mlflow import MlflowClient

    name, alias, version = match["name"], match["alias"], match["version"]
    try:
        client = MlflowClient(tracking_uri=store_uri, registry_uri=store_uri)
        # get_prompt_version*, not load_prompt: loading would also link the prompt to an experiment
        found = client.get_prompt_version_by_alias(name, alias) if alias else client.get_prompt_version(name, version)
    except Exception as exc:  # noqa: BLE001  # MLflow's reason, in the one line
        raise UserError(f"{key}: {uri} not read from the Prompt Registry at {store_uri}: {_why(exc)}") from None
    if found is None:
        raise UserError(f"{key}: {uri}: no such prompt version in {store_uri}")
    if not found.is_text_prompt:
        raise UserError(f"{key}: {uri} is a chat prompt (a list of messages); a skill is a text prompt")
    text = found.template
    if len(text.encode("utf-8")) > max_bytes:
        raise UserError(f"{key}: {uri} is larger than data.max_file_mb")
    return RegisteredSkill(uri, found.name, int(found.version), text)


def _why(exc: Exception) -> str:
    """MLflow's message without its advice paragraphs."""
    return one_line(str(exc).split(". Please", 1)[0], 200)
