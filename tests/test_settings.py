"""Every setting is checked before any optimizer call: numbers, URLs, secrets, presets, files.

Config-level rules go through the compose API (`make_config` composes conf/ and validates);
a few go through the real CLI to check what the user sees: exit code 2, one line on stderr
naming the key, no traceback, nothing sent to the optimizer server, no secret echoed.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from reflact.core.errors import UserError
from reflact.prompting.prompts import text_or_file
from tests.conftest import make_config, run_cli

DATA = "data.dir=unused"  # validation runs before the dataset is read


def config_error(*overrides: str) -> str:
    with pytest.raises(UserError) as info:
        make_config(DATA, *overrides)
    message = str(info.value)
    assert "\n" not in message, message
    return message


# ---------------------------------------------------------------------------------------------
# numbers: NaN, infinity and range, each error naming its key


NUMERIC_ERRORS = [
    ("optimizer.timeout_s", ["nan", "inf", "0", "-1"]),
    ("data.max_file_mb", ["nan", "inf", "0", "-5"]),
    # NaN compares false with every score: every run silently became a success
    ("reflect.success_threshold", ["nan", "inf", "-inf"]),
    ("optimizer.max_cost_usd", ["nan", "inf", "-1"]),
    ("optimizer.temperature", ["nan", "inf", "-0.1", "2.5"]),
    ("optimizer.context_window", ["0", "-1"]),
    ("optimizer.retry.max_seconds", ["nan", "inf", "-1"]),
    ("optimizer.retry.initial_wait_s", ["nan", "-1"]),
    ("optimizer.retry.max_wait_s", ["inf", "-1"]),
    ("optimizer.retry.max_attempts", ["0"]),
    ("optimizer.rpm", ["0"]),
    ("optimizer.tpm", ["-1"]),
    ("optimizer.max_output_tokens", ["0"]),
    ("optimizer.max_output_tokens_full_rewrite", ["0"]),
    ("optimizer.max_output_tokens_ceiling", ["100"]),
    ("optimizer.sample", ["-1"]),
    ("reflect.minibatch_size", ["0"]),
    ("reflect.workers", ["0"]),
    ("reflect.max_reasks", ["-1"]),
]


@pytest.mark.parametrize("key,value", [(k, v) for k, values in NUMERIC_ERRORS for v in values])
def test_a_bad_number_is_an_error_naming_its_key(key, value):
    assert key in config_error(f"{key}={value}")


@pytest.mark.parametrize("override", [
    "optimizer.temperature=0", "optimizer.temperature=2", "optimizer.max_cost_usd=0",
    "optimizer.retry.max_seconds=0", "optimizer.retry.initial_wait_s=0", "optimizer.sample=0",
    "reflect.success_threshold=0.5", "reflect.success_threshold=-1", "reflect.edit_budget=-1",
    "reflect.seed=-3", "optimizer.context_window=16385", "data.max_file_mb=0.001",
])
def test_numbers_at_the_edge_of_their_range_are_accepted(override):
    make_config(DATA, override)


def test_the_context_window_must_leave_room_beside_the_modes_reply():
    make_config(DATA, "optimizer.context_window=32000")  # patch mode: 16384 for the reply
    message = config_error("reflect.update_mode=full_rewrite", "optimizer.context_window=32000")
    assert "optimizer.context_window" in message and "optimizer.max_output_tokens_full_rewrite" in message
    make_config(DATA, "reflect.update_mode=full_rewrite", "optimizer.context_window=32000",
                "optimizer.max_output_tokens_full_rewrite=16000")


@pytest.mark.parametrize("price", ["{input:nan}", "{input:inf,output:1}", "{output:-1}", "{input:true}", "3"])
def test_a_price_must_be_finite_and_not_negative(price):
    assert "optimizer.prices.my-model" in config_error(f"+optimizer.prices.my-model={price}")


def test_a_good_price_is_kept_as_numbers():
    cfg = make_config(DATA, "+optimizer.prices.my-model={input:1,cached_input:0.1,output:4}")
    price = cfg.optimizer.prices["my-model"]
    assert (price.input, price.cached_input, price.output) == (1.0, 0.1, 4.0)


# ---------------------------------------------------------------------------------------------
# URLs: http(s) with a host


@pytest.mark.parametrize("url", [
    "ftp://host/v1", "localhost:8000", "file:///srv/api/v1", "http://", "http:///v1", "''",
    "https://host:99999/v1", "'http://host /v1'",
])
def test_base_url_must_be_http_with_a_host(url):
    assert "optimizer.base_url" in config_error(f"optimizer.base_url={url}")


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:8000/v1", "https://api.example.com/v1", "'https://res.example.com/openai?api-version=2024-10-21'",
])
def test_ordinary_base_urls_are_accepted(url):
    assert make_config(DATA, f"optimizer.base_url={url}").optimizer.base_url == url.strip("'")


@pytest.mark.parametrize("endpoint", ["ftp://res.openai.azure.com", "res.openai.azure.com", "https://"])
def test_azure_endpoint_must_be_http_with_a_host(endpoint):
    message = config_error("optimizer=azure", f"optimizer.azure.endpoint={endpoint}", "optimizer.azure.deployment=d")
    assert "optimizer.azure.endpoint" in message


def test_a_good_azure_endpoint_is_accepted():
    cfg = make_config(DATA, "optimizer=azure", "optimizer.azure.endpoint=https://res.openai.azure.com",
                      "optimizer.azure.deployment=d")
    assert cfg.optimizer.azure.endpoint == "https://res.openai.azure.com"


# ---------------------------------------------------------------------------------------------
# secrets: refused, never echoed

SECRET = "sk-test-Zq8RwX3Lp0uV7y"


@pytest.mark.parametrize("url", [
    f"https://user:{SECRET}@host/v1", f"https://{SECRET}@host/v1",
    f"'https://host/v1?api_key={SECRET}'", f"'https://host/v1?api-key={SECRET}'", f"'https://host/v1?key={SECRET}'",
    f"'https://host/v1?token={SECRET}'", f"'https://host/v1?access_token={SECRET}'", f"'https://host/v1?x={SECRET}'",
    f"'https://host/v1#token={SECRET}'", f"https://host/v1/{SECRET}",
])
def test_a_base_url_with_credentials_is_refused_without_echoing_them(url):
    message = config_error(f"optimizer.base_url={url}")
    assert "optimizer.base_url" in message
    assert SECRET not in message and "Zq8RwX3Lp0uV7y" not in message


def test_the_credentials_error_points_at_the_key_variable():
    message = config_error("optimizer=compatible", "optimizer.model=m", f"optimizer.base_url=http://u:{SECRET}@h/v1")
    assert "optimizer.api_key_env" in message and "OPENAI_COMPATIBLE_API_KEY" in message


def test_an_azure_endpoint_with_credentials_is_refused_without_echoing_them():
    message = config_error("optimizer=azure", f"optimizer.azure.endpoint=https://u:{SECRET}@res.openai.azure.com",
                           "optimizer.azure.deployment=d")
    assert "optimizer.azure.endpoint" in message and SECRET not in message


@pytest.mark.parametrize("uri", [f"http://u:{SECRET}@mlflow:5000", f"'postgresql://u:{SECRET}@db/mlflow'",
                                 f"'http://mlflow:5000?token={SECRET}'"])
def test_a_tracking_uri_with_credentials_is_refused_without_echoing_them(uri):
    # the config is logged as params: credentials belong in MLflow's own variables
    message = config_error(f"mlflow.tracking_uri={uri}")
    assert "mlflow.tracking_uri" in message and "MLFLOW_TRACKING" in message and SECRET not in message


@pytest.mark.parametrize("uri", ["http://mlflow:5000", "sqlite:///outputs/mlflow.db", "postgresql://u@db/mlflow",
                                 "'sqlite:///my runs/mlflow.db'", "databricks://profile:prefix"])
def test_ordinary_tracking_uris_are_accepted(uri):
    make_config(DATA, f"mlflow.tracking_uri={uri}")


@pytest.mark.parametrize("value", [SECRET + "abcdefgh", "sk_live_Zq8RwX3Lp0abc", "abcDEF123ghiJKL456mnoPQR789stuVWX0"])
def test_a_key_pasted_as_api_key_env_is_refused_without_echoing_it(value):
    message = config_error(f"optimizer.api_key_env={value}")
    assert "optimizer.api_key_env" in message and value not in message


@pytest.mark.parametrize("value", ["''", "1KEY", "'MY KEY'", "MY-KEY"])
def test_api_key_env_must_be_a_variable_name(value):
    assert "optimizer.api_key_env" in config_error(f"optimizer.api_key_env={value}")


@pytest.mark.parametrize("value", ["MY_KEY", "my_openai_key", "_K2", "hf_token_for_ci_runner"])
def test_variable_names_are_accepted_as_api_key_env(value):
    assert make_config(DATA, f"optimizer.api_key_env={value}").optimizer.api_key_env == value


# ---------------------------------------------------------------------------------------------
# presets without a default model


@pytest.mark.parametrize("preset", ["compatible", "ollama", "vllm"])
def test_presets_without_a_model_name_are_an_error(preset):
    # `model: ???` in the group config merged onto the schema's gpt-5 and was silently replaced by it
    assert "optimizer.model" in config_error(f"optimizer={preset}")


@pytest.mark.parametrize("preset", ["compatible", "ollama", "vllm"])
def test_presets_take_the_model_name_given(preset):
    assert make_config(DATA, f"optimizer={preset}", "optimizer.model=qwen3:32b").optimizer.model == "qwen3:32b"


@pytest.mark.parametrize("preset", ["openai", "dry_run", "azure"])
def test_presets_with_a_default_model_keep_it(preset):
    extra = ["optimizer.azure.endpoint=https://res.openai.azure.com", "optimizer.azure.deployment=d"]
    cfg = make_config(DATA, f"optimizer={preset}", *(extra if preset == "azure" else []))
    assert cfg.optimizer.model == "gpt-5"


@pytest.mark.parametrize("key", ["optimizer.model", "prompts.error", "prompts.success", "mlflow.experiment",
                                 "optimizer.cache_path"])
def test_an_empty_name_is_an_error(key):
    assert key in config_error(f"{key}=''")


# ---------------------------------------------------------------------------------------------
# settings that name a file: text_or_file


KEY = "reflect.step_buffer"


@pytest.mark.parametrize("value", ["prompts/missing", "./missing", "../missing", "~/no-such-reflact-file",
                                   "notes.text", "/no/such/dir/ctx"])
def test_a_value_that_looks_like_a_path_must_name_a_file(value, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=r"reflect\.step_buffer: no such file"):
        text_or_file(value, KEY)


def test_a_directory_is_not_a_text_file(tmp_path, monkeypatch):
    (tmp_path / "prompts").mkdir()
    monkeypatch.chdir(tmp_path)
    for value in (str(tmp_path / "prompts"), "prompts"):  # a bare name that is a directory, too
        with pytest.raises(UserError, match=r"reflect\.step_buffer: .* is a directory"):
            text_or_file(value, KEY)


def test_a_device_is_not_a_text_file():
    with pytest.raises(UserError, match=r"reflect\.step_buffer: .* not a regular file"):
        text_or_file(os.devnull, KEY)


def test_an_unreadable_file_names_the_key(tmp_path, monkeypatch):
    path = tmp_path / "ctx.md"
    path.write_text("context", encoding="utf-8")

    def refuse(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "read_text", refuse)  # root reads any file: emulate the refusal
    with pytest.raises(UserError, match=r"reflect\.meta_skill: cannot read .*Permission denied"):
        text_or_file(str(path), "reflect.meta_skill")


@pytest.mark.parametrize("value", [
    "Prefer refund/exchange over cancel.",  # a sentence may hold a slash
    "x" * 300,  # longer than a file name may be: was an OSError traceback
    "one line with a NUL \x00 byte",
    "first line\nprompts/missing",
    "  ",
])
def test_inline_text_stays_text(value):
    assert text_or_file(value, KEY) == value


# ---------------------------------------------------------------------------------------------
# the real CLI: exit 2, one line, nothing called, nothing echoed


def assert_one_line_error(proc, *names: str) -> str:
    assert proc.returncode == 2, f"exit {proc.returncode}\nSTDOUT:\n{proc.stdout}\nSTDERR:\n{proc.stderr}"
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("reflact: error:"), proc.stderr
    assert all(name in lines[0] for name in names), lines[0]
    assert "Traceback" not in proc.stdout + proc.stderr
    return lines[0]


def cli(tmp_path, *args):
    return run_cli("+exp=demo", "mlflow.enabled=false", f"hydra.run.dir={tmp_path / 'run'}", *args, cwd=tmp_path)


def test_cli_preset_without_a_model_stops_before_any_call(tmp_path, server):
    proc = cli(tmp_path, "optimizer=vllm", f"optimizer.base_url={server.base_url}")
    assert_one_line_error(proc, "optimizer.model")
    assert server.count == 0


def test_cli_never_echoes_credentials_in_base_url(tmp_path, server):
    url = server.base_url.replace("://", f"://user:{SECRET}@")
    proc = cli(tmp_path, "optimizer=compatible", "optimizer.model=test", f"optimizer.base_url={url}")
    assert_one_line_error(proc, "optimizer.base_url", "OPENAI_COMPATIBLE_API_KEY")
    assert SECRET not in proc.stdout + proc.stderr
    assert server.count == 0
    written = [p for p in tmp_path.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert written == []


def test_cli_nan_threshold_is_an_error(tmp_path, server):
    proc = cli(tmp_path, "optimizer.model=test", f"optimizer.base_url={server.base_url}",
               "reflect.success_threshold=nan")
    assert_one_line_error(proc, "reflect.success_threshold")
    assert server.count == 0


def test_cli_prompt_path_without_suffix_must_exist(tmp_path, server):
    proc = cli(tmp_path, "optimizer.model=test", f"optimizer.base_url={server.base_url}",
               "prompts.error=prompts/my_error")
    assert_one_line_error(proc, "prompts.error", "prompts/my_error")
    assert server.count == 0
