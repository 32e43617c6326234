"""No credential in the logged config: a key's variable named, never the key; URLs with a scheme
and a host and no user:password, key-like query, fragment or path segment. A refused value is
never echoed: it may be the key."""

from __future__ import annotations

import re
from urllib.parse import SplitResult, parse_qsl, urlsplit

from reflact.config.schema import OptimizerConfig
from reflact.core.errors import UserError

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


# well-known prefixes of provider keys and tokens: such a value is a secret, never a name or a URL part
_KEY_PREFIXES = ("sk-", "sk_", "sess-", "gsk_", "xai-", "pplx-", "hf_", "AIza", "ghp_", "github_pat_", "glpat-")


_SECRET_WORDS = {
    "key",
    "apikey",
    "token",
    "secret",
    "password",
    "passwd",
    "pwd",
    "auth",
    "authorization",
    "sig",
    "signature",
    "credential",
    "credentials",
    "jwt",
    "bearer",
    "session",
}


def _check_key_env(name: str, key: str = "optimizer.api_key_env") -> None:
    """The key lives in the environment; the config (logged in full) only names the variable.
    A value that is not a variable's name may be the key itself: it is never echoed."""
    if name and _ENV_NAME.fullmatch(name) and not _looks_like_key(name):
        return
    if not name:
        raise UserError(f"{key} is empty: name the environment variable that holds the key, e.g. OPENAI_API_KEY")
    # a short value that is no key is echoed to help spot the typo; anything else may be the key
    shown = "value not shown: it may be a key" if _looks_like_key(name) or len(name) > 20 else f"got {name!r}"
    raise UserError(
        f"{key} must be the name of an environment variable (letters, digits, _; "
        f"{shown}), not the key: put the key in a variable such as OPENAI_API_KEY and set "
        f"{key} to that variable's name"
    )


def _check_optimizer_urls(o: OptimizerConfig) -> None:
    hint = f"put the key in the environment variable named by optimizer.api_key_env ({o.api_key_env})"
    if o.base_url is not None:
        _check_url(o.base_url, "optimizer.base_url", "http://127.0.0.1:8000/v1", hint)
    if o.azure.endpoint is not None:
        _check_url(o.azure.endpoint, "optimizer.azure.endpoint", "https://<resource>.openai.azure.com", hint)


def _check_url(value: str, key: str, example: str, hint: str) -> None:
    """An http(s) URL with a host and no credentials; the value is never echoed, it may hold a key."""
    if not value.strip():
        raise UserError(f"{key} is empty: give a URL such as {example}, or leave it unset (null)")
    parts = _split_url(value, key)
    _refuse_credentials(parts, key, hint)
    if "://" not in value:
        raise UserError(f"{key} has no scheme: write it as a full URL such as {example}")
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        shown = f" ({scheme}://)" if re.fullmatch(r"[a-z][a-z0-9+.-]{0,9}", scheme) else ""  # a key is longer
        raise UserError(f"{key} must be an http:// or https:// URL{shown}, e.g. {example}")
    if not parts.hostname:
        raise UserError(f"{key} has no host, e.g. {example}")


def _split_url(value: str, key: str) -> SplitResult:
    if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise UserError(f"{key} contains whitespace or control characters")
    try:
        parts = urlsplit(value)
        _ = parts.port  # raises on a port that is not a number in 0..65535
    except ValueError:
        raise UserError(f"{key} is not a valid URL (check the host and port)") from None
    return parts


def _refuse_credentials(parts: SplitResult, key: str, hint: str, path_too: bool = True) -> None:
    """A URL is logged with the config: user:password@, a key-like query parameter or value, a
    fragment, or (path_too) a path segment that looks like a key stop the run, unechoed."""
    netloc_user = parts.netloc.rpartition("@")[0] if "@" in parts.netloc else ""
    if netloc_user and (path_too or ":" in netloc_user or parts.scheme.lower() in ("http", "https")):
        raise UserError(f"{key} carries credentials (user:password@host; not shown): remove them and {hint}")
    for name, val in parse_qsl(parts.query, keep_blank_values=True):
        if _is_secret_param(name) or _looks_like_key(val) or _looks_like_key(name):
            named = f" ({name}=...)" if _is_secret_param(name) and not _looks_like_key(name) else ""
            raise UserError(f"{key} carries a credential in its query{named}; not shown: remove it and {hint}")
    if path_too and parts.fragment:
        raise UserError(f"{key} must not have a #fragment (not shown): remove it")
    if path_too and any(_looks_like_key(segment) for segment in parts.path.split("/")):
        raise UserError(f"{key} has a path segment that looks like a key (not shown): remove it and {hint}")


def _is_secret_param(name: str) -> bool:
    words = name.lower().replace("-", "_").split("_")
    return bool(_SECRET_WORDS.intersection(words)) or name.lower().endswith(("key", "token", "secret", "password"))


def _looks_like_key(text: str) -> bool:
    """A provider key's well-known prefix (with the length and digits of a key, not of a name such
    as hf_token_for_ci), or a long random-looking token (mixed case and digits)."""
    text = text.strip()
    if len(text) >= 20 and text.startswith(_KEY_PREFIXES) and any(c.isdigit() for c in text):
        return True
    return (
        len(text) >= 32
        and any(c.islower() for c in text)
        and any(c.isupper() for c in text)
        and any(c.isdigit() for c in text)
    )


def _shown(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
