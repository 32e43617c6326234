"""What SkillOpt's own reflect would use, read from SkillOpt's process-wide settings, as reflact overrides.

SkillOpt's trainer publishes its config once per process: the optimizer's endpoint, auth mode, key
and API version (`configure_azure_openai`, module settings of `skillopt.model.azure_openai`), the
optimizer backend and deployment, `reasoning_effort` (`set_reasoning_effort`) and the skill-aware
switch with its appendix source (`configure_skill_aware_reflection`). SkillOpt's reflect reads them
at call time; so does the drop-in, here, when the caller gives reflact no config of its own. Keys
are never copied: reflact is told the name of the variable SkillOpt keeps the key in.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from reflact.core.errors import UserError
from reflact.core.imports import one_at_a_time

COMPATIBLE_MODES = ("openai_compatible", "compat", "openai")
KEY_MODES = ("api_key", "key")
TOKEN_MODES = ("azure_cli", "managed_identity", "azure_ad", "aad")  # Azure AD tokens, which reflact cannot send
# where SkillOpt keeps the optimizer key, most specific first (configure_azure_openai writes the first)
KEY_VARIABLES = ("OPTIMIZER_AZURE_OPENAI_API_KEY", "AZURE_OPENAI_OPTIMIZER_API_KEY", "AZURE_OPENAI_API_KEY")


@dataclass
class Endpoint:
    """The optimizer settings SkillOpt's reflect would use: config groups to compose (`optimizer=azure`),
    then values set on the typed config. The values are never written as override text: a URL or a
    name from the environment is data (an override would parse its `=`, quotes and `${`)."""

    groups: list[str] = field(default_factory=list)
    values: dict[str, str] = field(default_factory=dict)  # `section.key` -> its value

    def apply(self, cfg) -> None:
        for dotted, value in self.values.items():
            *path, name = dotted.split(".")
            node = cfg
            for part in path:
                node = getattr(node, part)
            setattr(node, name, value)


def endpoint_overrides(environ: Mapping[str, str] | None = None) -> Endpoint:
    """The optimizer settings: OPENAI_BASE_URL wins when set (it names a server); otherwise the
    endpoint SkillOpt's optimizer backend is configured with; with neither, reflact's default
    (OpenAI, OPENAI_API_KEY). The model is SkillOpt's optimizer deployment in every case."""
    environ = os.environ if environ is None else environ
    backend = _skillopt_backend()
    if environ.get("OPENAI_BASE_URL"):
        endpoint = Endpoint(values={"optimizer.base_url": environ["OPENAI_BASE_URL"]})
    elif backend is not None:
        _check_protocol()
        endpoint = _backend_endpoint(backend, environ) if backend.OPTIMIZER_ENDPOINT else Endpoint()
    else:
        endpoint = Endpoint()
    if backend is not None:
        endpoint.values["optimizer.model"] = _setting(backend.OPTIMIZER_DEPLOYMENT, "optimizer_model")
    elif environ.get("OPTIMIZER_DEPLOYMENT"):
        endpoint.values["optimizer.model"] = environ["OPTIMIZER_DEPLOYMENT"]
    effort = backend.get_reasoning_effort() if backend is not None else None
    if effort:
        endpoint.values["optimizer.reasoning_effort"] = str(effort)
    return endpoint


def skill_aware() -> tuple[bool, str] | None:
    """SkillOpt's process-wide skill-aware switch and appendix source (None without SkillOpt)."""
    try:
        with one_at_a_time():
            from skillopt.optimizer.skill_aware import get_skill_aware_appendix_source, is_skill_aware_enabled
    except ImportError:
        return None
    return is_skill_aware_enabled(), get_skill_aware_appendix_source()


def token_tracker():
    """SkillOpt's per-stage token counter of its OpenAI-protocol backend, whose totals the trainer
    reports (None without SkillOpt)."""
    backend = _skillopt_backend()
    return None if backend is None else backend.tracker


def _skillopt_backend():
    """SkillOpt's OpenAI-protocol backend module (its optimizer settings), None without SkillOpt."""
    try:
        with one_at_a_time():
            from skillopt.model import azure_openai
    except ImportError:
        return None
    return azure_openai


def _check_protocol() -> None:
    with one_at_a_time():
        from skillopt.model.backend_config import get_optimizer_backend

    name = get_optimizer_backend()
    if name != "openai_chat":
        raise UserError(
            f"SkillOpt's optimizer_backend is {name!r}: reflact speaks the OpenAI protocol only "
            "(openai_chat: Azure or openai_compatible); set OPENAI_BASE_URL or pass config="
        )


def _backend_endpoint(backend, environ) -> Endpoint:
    """Azure with a key, or any OpenAI-compatible server, as SkillOpt's optimizer client would reach it."""
    mode = _setting(backend.OPTIMIZER_AUTH_MODE, "optimizer_azure_openai_auth_mode")
    endpoint = str(backend.OPTIMIZER_ENDPOINT)
    key_env = _key_variable(backend.OPTIMIZER_API_KEY, environ)
    if mode in COMPATIBLE_MODES:
        values = {
            "optimizer.base_url": endpoint.rstrip("/"),
            "optimizer.api_key_env": key_env,
            "optimizer.token_limit_param": "max_completion_tokens",  # as SkillOpt's client sends it
        }
        return Endpoint(["optimizer=compatible"], values)
    if mode in KEY_MODES:
        values = {
            "optimizer.azure.endpoint": endpoint,
            "optimizer.azure.deployment": _setting(backend.OPTIMIZER_DEPLOYMENT, "optimizer_model"),
            "optimizer.azure.api_version": _setting(
                backend.OPTIMIZER_API_VERSION, "optimizer_azure_openai_api_version"
            ),
            "optimizer.api_key_env": key_env,
        }
        return Endpoint(["optimizer=azure"], values)
    kind = "Azure AD token auth" if mode in TOKEN_MODES else "not a mode SkillOpt knows"
    raise UserError(
        f"SkillOpt's optimizer auth mode is {mode!r} ({kind}): reflact's client takes a key only; "
        "set optimizer_azure_openai_auth_mode to api_key or openai_compatible, or pass config="
    )


def _setting(value: object, key: str) -> str:
    """A setting SkillOpt's client would send, as text; one it does not have (None, empty) is named by
    SkillOpt's own config key, never sent as the text `None`."""
    if value is None or not str(value).strip():
        raise UserError(f"SkillOpt's {key} is not set (it is {value!r}): set it in SkillOpt's config, or pass config=")
    return str(value)


def _key_variable(key: str, environ) -> str:
    """The variable holding SkillOpt's optimizer key (SkillOpt's own name when it has none: reflact
    then sends no key, never another variable's)."""
    return next((name for name in KEY_VARIABLES if key and environ.get(name) == key), KEY_VARIABLES[0])
