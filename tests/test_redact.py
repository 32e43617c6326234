"""The API key echoed in an error text is redacted, also URL-encoded or JSON-escaped (reflact.calls.client.redact)."""

from __future__ import annotations

import json
import urllib.parse

import pytest

from reflact.calls.client import make_client, redact
from reflact.calls.protocol import CallError
from reflact.testing.optimizer_server import Response
from tests.conftest import make_config

# a key from the base64 alphabet: '+', '/' and '=' change when URL-encoded or JSON-escaped
B64_KEY = "k3y+Ab/Cd=Ef+Gh/Ij+Kl/Mn=="
OPENAI_KEY = "sk-proj-AbCdEf0123456789_xyz-QRSTuvwx"


def url_lower(text: str) -> str:
    return urllib.parse.quote(text, safe="").replace("%2B", "%2b").replace("%2F", "%2f").replace("%3D", "%3d")


ECHOES = {
    "as is": lambda k: k,
    "url-encoded": lambda k: urllib.parse.quote(k, safe=""),
    "url-encoded, lower-case hex": url_lower,
    "form-encoded": urllib.parse.quote_plus,
    "json string": lambda k: json.dumps(k)[1:-1],
    "json with escaped slashes": lambda k: json.dumps(k)[1:-1].replace("/", "\\/"),
    "json \\u escapes": lambda k: "".join(c if c.isalnum() else f"\\u{ord(c):04x}" for c in k),
    "json \\u escapes, upper-case hex": lambda k: "".join(c if c.isalnum() else f"\\u{ord(c):04X}" for c in k),
    "json inside a url": lambda k: urllib.parse.quote(json.dumps({"key": k}), safe=""),
}


@pytest.mark.parametrize("key", [B64_KEY, OPENAI_KEY], ids=["base64-alphabet key", "openai-style key"])
@pytest.mark.parametrize("echo", list(ECHOES.values()), ids=list(ECHOES))
def test_an_echoed_key_is_redacted_however_it_was_encoded(key, echo):
    text = f'HTTP 400: invalid request {{"api_key": "{echo(key)}", "url": "/v1?key={echo(key)}&x=1"}}'
    out = redact(text, key)
    assert echo(key) not in out
    assert not [key[i:i + 8] for i in range(len(key) - 7) if key[i:i + 8] in out]
    assert out.count("***") == 2 and out.startswith("HTTP 400: invalid request")


@pytest.mark.parametrize("echo", [ECHOES["url-encoded"], ECHOES["json with escaped slashes"]],
                         ids=["url-encoded", "json with escaped slashes"])
def test_an_echoed_tail_of_the_key_is_redacted_however_it_was_encoded(echo):
    out = redact(f"key ending in {echo(B64_KEY[-8:])} was refused", B64_KEY)
    assert out == "key ending in *** was refused"


def test_text_without_the_key_is_unchanged():
    text = "HTTP 429: rate limit %2B \\u002f \\/ reached for sk-other-key"
    assert redact(text, B64_KEY) == text and redact(text, "") == text


def test_a_server_echoing_the_key_url_encoded_leaks_none_of_it(tmp_path, server):
    server.script = lambda request, number: Response(status=401, body={"error": {
        "message": f"no access for /v1/chat?api_key={urllib.parse.quote(B64_KEY, safe='')}",
        "type": "invalid_request_error"}})
    cfg = make_config("data.dir=unused", f"optimizer.base_url={server.base_url}", "optimizer.model=test",
                      "optimizer.cache=off", "optimizer.retry.initial_wait_s=0.01")
    client = make_client(cfg.optimizer, tmp_path, environ={"OPENAI_API_KEY": B64_KEY})
    with pytest.raises(CallError) as caught:
        client.complete([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}], 10)
    cause = caught.value.cause
    assert cause.startswith("HTTP 401") and cause.endswith("no access for /v1/chat?api_key=***")
