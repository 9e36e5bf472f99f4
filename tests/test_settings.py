from __future__ import annotations

from pathlib import Path

import pytest

from service.exceptions import ConfigError
from service.settings import load_settings


def test_defaults() -> None:
    s = load_settings()
    assert s.backend == ["local"]
    assert s.all_backends() == ["local", "passthrough"]
    assert s.api_token is None


def test_yaml_file_and_variable_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "thinktrans.yaml"
    cfg.write_text("backend: deepl,local\ndefault_locale: ZH-cn\nmax_batch_size: 8\n"
                   "allowed_locales: [zh, en]\n")
    s = load_settings(cfg)
    assert s.backend == ["deepl", "local"]
    assert s.default_locale == "zh-CN"
    assert s.max_batch_size == 8
    assert s.allowed_locales == ["zh", "en"]
    monkeypatch.setenv("THINKTRANS_MAX_BATCH_SIZE", "16")
    monkeypatch.setenv("THINKTRANS_ALLOWED_LOCALES", "ja, zh, en")
    s = load_settings(cfg)
    assert s.max_batch_size == 16
    assert s.allowed_locales == ["ja", "zh", "en"]


@pytest.mark.parametrize(
    ("env", "value", "message"),
    [("THINKTRANS_MAX_BATCH_SIZE", "0", "max_batch_size (THINKTRANS_MAX_BATCH_SIZE)"),
     ("THINKTRANS_DEFAULT_LOCALE", "zh_CN", "use '-', not '_'"),
     ("THINKTRANS_ALLOWED_LOCALES", "en,??", "not a BCP 47 tag"),
     ("THINKTRANS_BACKEND", "local,local", "appears twice"),
     ("THINKTRANS_DEADLINE_MS", "soon", "deadline_ms"),
     ("THINKTRANS_NO_SUCH_SETTING", "1", None)],
)
def test_invalid_settings_give_one_clear_line(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str, message: str | None
) -> None:
    monkeypatch.setenv(env, value)
    if message is None:  # unknown variables are ignored, as the environment is shared
        load_settings()
        return
    with pytest.raises(ConfigError) as exc:
        load_settings()
    assert message in exc.value.detail
    assert "\n" not in exc.value.detail


def test_default_must_be_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("THINKTRANS_DEFAULT_LOCALE", "de")
    monkeypatch.setenv("THINKTRANS_ALLOWED_LOCALES", "zh,ja")
    with pytest.raises(ConfigError, match="default_locale"):
        load_settings()


def test_unknown_yaml_key_is_an_error(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("max_batch_sise: 4\n")
    with pytest.raises(ConfigError, match="max_batch_sise"):
        load_settings(cfg)


def test_bad_yaml_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_settings(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_settings(bad)


def test_deepl_auth_key_is_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEEPL_AUTH_KEY", "abc:fx")
    s = load_settings()
    assert s.deepl_api_key is not None
    assert s.deepl_api_key.get_secret_value() == "abc:fx"


@pytest.mark.parametrize("value", ["", "   "])
def test_empty_token_is_refused(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    # Compose passes ${THINKTRANS_API_TOKEN} as "" when the host variable is unset.
    monkeypatch.setenv("THINKTRANS_API_TOKEN", value)
    with pytest.raises(ConfigError) as exc:
        load_settings()
    detail = exc.value.detail
    assert "THINKTRANS_API_TOKEN" in detail and "set but empty" in detail
    assert "unset the variable" in detail and "\n" not in detail


def test_unknown_variable_warns_with_the_closest_name(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("THINKTRANS_MAX_QUEU_SIZE", "8")
    # Read by the project, not settings: no warning for these.
    monkeypatch.setenv("THINKTRANS_URL", "http://127.0.0.1:8088")
    monkeypatch.setenv("THINKTRANS_DEEPL_API_KEY", "abc:fx")
    monkeypatch.setenv("DEEPL_AUTH_KEY", "abc:fx")
    monkeypatch.setenv("THINKTRANS_FUZZ_EXAMPLES", "5")
    with caplog.at_level("WARNING", logger="thinktrans.settings"):
        s = load_settings()
    assert s.max_queue_size == 4096
    assert [r.getMessage() for r in caplog.records] == [
        "unknown setting THINKTRANS_MAX_QUEU_SIZE ignored; "
        "did you mean THINKTRANS_MAX_QUEUE_SIZE?"
    ]


def test_unknown_yaml_key_names_the_closest_setting(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("max_batch_sise: 4\n")
    with pytest.raises(ConfigError) as exc:
        load_settings(cfg)
    assert "unknown setting 'max_batch_sise'; did you mean max_batch_size?" in exc.value.detail
    assert "Extra inputs" not in exc.value.detail


# -- operator mistakes: one line naming the setting, never a traceback later ---------------


@pytest.mark.parametrize(
    ("env", "value", "words"),
    [("THINKTRANS_CACHE_MB", "inf", "finite"),
     ("THINKTRANS_CACHE_MB", "1e400", "finite"),  # too big for a float: inf again
     ("THINKTRANS_CACHE_MB", "nan", "finite"),
     ("THINKTRANS_CACHE_MB", "-1", "greater than or equal to 0"),
     ("THINKTRANS_CACHE_MB", "1e30", "less than or equal to"),
     ("THINKTRANS_CACHE_TTL_S", "inf", "finite")],
)
def test_cache_sizes_must_be_finite_and_bounded(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str, words: str
) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(ConfigError) as exc:
        load_settings()
    detail = exc.value.detail
    assert f"({env})" in detail and words in detail and "\n" not in detail


def test_the_largest_cache_is_usable(monkeypatch: pytest.MonkeyPatch) -> None:
    from service.runtime import Runtime

    monkeypatch.setenv("THINKTRANS_CACHE_MB", "1048576")
    settings = load_settings(backend="passthrough")
    assert Runtime(settings)._cache().max_bytes == 1024 * 1024 * 1024 * 1024


def test_a_config_file_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_bytes("backend: passthrough\ndefault_locale: de # für\n".encode("latin-1"))
    with pytest.raises(ConfigError) as exc:
        load_settings(cfg)
    detail = exc.value.detail
    assert str(cfg) in detail and "UTF-8" in detail and "line 2" in detail
    assert "\n" not in detail


@pytest.mark.parametrize(
    ("text", "key", "lines"),
    [("backend: passthrough\nmax_batch_size: 4\nbackend: local\n", "backend", (1, 3)),
     ("price_per_million_chars:\n  deepl: 25\n  deepl: 20\n", "price_per_million_chars.deepl",
      (2, 3)),
     ("backend: passthrough\nbackend: passthrough\n", "backend", (1, 2))],  # even alike
)
def test_a_key_twice_in_the_config_file_is_refused(
    tmp_path: Path, text: str, key: str, lines: tuple[int, int]
) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    with pytest.raises(ConfigError) as exc:
        load_settings(cfg)
    detail = exc.value.detail
    assert str(cfg) in detail and repr(key) in detail and "twice" in detail
    assert f"lines {lines[0]} and {lines[1]}" in detail and "\n" not in detail


def test_nested_mappings_of_the_file_still_load(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("backend: passthrough\nprice_per_million_chars: {deepl: 20, llm: 2}\n")
    s = load_settings(cfg)
    assert s.backend == ["passthrough"] and s.price_per_million_chars == {"deepl": 20, "llm": 2}


_FLOAT_FIELDS = sorted(
    name for name, info in __import__("service.settings", fromlist=["Settings"])
    .Settings.model_fields.items() if "float" in str(info.annotation)
)


@pytest.mark.parametrize("name", _FLOAT_FIELDS)
@pytest.mark.parametrize("value", ["inf", "-inf", "nan"])
def test_no_setting_takes_an_infinite_or_nan_number(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    # inf passed every bound of the form ge=0 and then failed where the number was used
    # (an OverflowError at int(), a timer that never fires): refused at start, one line.
    monkeypatch.setenv(f"THINKTRANS_{name.upper()}", value)
    with pytest.raises(ConfigError) as exc:
        load_settings()
    assert name in exc.value.detail
    assert "\n" not in exc.value.detail


def test_a_mapping_setting_that_is_not_json_gives_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # pydantic-settings decodes a mapping's variable as JSON and raised its SettingsError,
    # which the CLI showed as a traceback.
    monkeypatch.setenv("THINKTRANS_PRICE_PER_MILLION_CHARS", "llm=20")
    with pytest.raises(ConfigError) as exc:
        load_settings()
    assert "THINKTRANS_PRICE_PER_MILLION_CHARS" in exc.value.detail
    assert "\n" not in exc.value.detail
