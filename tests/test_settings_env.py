"""Every setting arrives from where an operator sets it: its ``THINKTRANS_*`` variable and
its YAML key. The fields are walked from the Settings model, so a setting added later is
checked too, and one of a type these tests cannot give a value for fails here until it
is taught one.

Each gets a valid value that is not its default; lists in both documented forms (comma
separated and a JSON array), mappings as JSON.
"""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import annotated_types
import pytest
import yaml
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from service.exceptions import ConfigError
from service.settings import Settings, load_settings
from service.tools.configdoc import variables

# Fields whose values a validator constrains beyond their type: a value it takes.
CHOSEN: dict[str, Any] = {
    "backend": ["deepl", "local"],
    "extra_backends": ["llm", "pool"],
    "allowed_locales": ["de", "fr-CA"],
    "allowed_hosts": ["thinktrans", "*.agents.internal"],
    "default_locale": "de",  # within allowed_locales when both are set
    "detect_languages": ["en", "de"],
    "span_kinds": ["code", "url"],
    "span_patterns": [r"JIRA-\d+", r"\d{1,3}%"],  # the second holds a comma
    "local_marian_models": ["en-de=Helsinki-NLP/opus-mt-en-de", "en-fr=/models/en-fr"],
    "local_models": ["en-de=/models/opus-mt-en-de", "facebook/m2m100_418M"],
    "local_model_roots": ["/models", "/srv/thinktrans models"],
    "llm_plain_template": "tower",
    "llm_extra_body": {"top_k": 20, "repetition_penalty": 1.05},
    "pool_url": "http://thinktrans-pool:8000",
    "pool_client_id": "agent-7:8088",
    "pool_clients": {"agent-7": {"token": "t-7", "weight": 2.0},
                     "agent-8": {"token_sha256": "ab" * 32, "max_waiting": 10}},
    "price_per_million_chars": {"deepl": 20.0, "llm": 1.5},
}


def _bounds(info: FieldInfo) -> dict[str, float]:
    found: dict[str, float] = {}
    for meta in info.metadata:
        if isinstance(meta, annotated_types.BaseMetadata):
            for attr in ("ge", "gt", "le", "lt"):
                if getattr(meta, attr, None) is not None:
                    found[attr] = getattr(meta, attr)
    return found


def _number(kind: type, default: Any, bounds: dict[str, float]) -> float:
    """A number of ``kind`` within ``bounds`` that is not ``default``."""
    low = bounds.get("ge", bounds.get("gt", 0))
    high = bounds.get("le", bounds.get("lt", low + 1000))
    start = default if isinstance(default, int | float) else low
    step = 1 if kind is int else 0.25
    for candidate in (start + step, start - step, low + step, (low + high) / 2):
        candidate = kind(candidate)
        if (candidate != default and candidate >= low and candidate <= high
                and ("gt" not in bounds or candidate > bounds["gt"])
                and ("lt" not in bounds or candidate < bounds["lt"])):
            return candidate
    raise AssertionError(f"no {kind.__name__} within {bounds} but {default!r}")


def value_for(name: str, info: FieldInfo) -> Any:
    """A valid value of field ``name`` that is not its default, as YAML would hold it."""
    if name in CHOSEN:
        return CHOSEN[name]
    annotation = info.annotation
    default = None if info.default is PydanticUndefined else info.default
    if get_origin(annotation) in (Union, types.UnionType):
        kinds = [a for a in get_args(annotation) if a is not type(None)]
        assert len(kinds) == 1, f"{name}: teach these tests a value of {annotation}"
        annotation = kinds[0]
    if get_origin(annotation) is Literal:
        choices = [c for c in get_args(annotation) if c != default]
        return choices[-1]
    if annotation is bool:
        return not default
    if annotation in (int, float):
        return _number(annotation, default, _bounds(info))
    if annotation in (str, SecretStr):
        return f"set-{name.replace('_', '-')}"
    if annotation is Path:
        return f"/srv/set/{name}"
    raise AssertionError(f"{name}: teach these tests a value of {annotation} (add it to CHOSEN)")


def as_variable(value: Any, form: str = "commas") -> str:
    """``value`` as an environment variable gives it (lists: ``form``)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return json.dumps(value) if form == "json" else ",".join(value)
    if isinstance(value, dict):
        return json.dumps(value)
    return str(value)


def plain(value: Any) -> Any:
    """A loaded value as plain data, to compare with what was given."""
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, BaseModel):
        return {k: plain(v) for k, v in value.model_dump(exclude_unset=True).items()}
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def variable(name: str) -> str:
    return variables(name, Settings.model_fields[name], "THINKTRANS_")[0]


FIELDS = sorted(Settings.model_fields)
LISTS = [name for name in FIELDS if get_origin(Settings.model_fields[name].annotation) is list]
VALUES = {name: value_for(name, Settings.model_fields[name]) for name in FIELDS}


def test_every_kind_of_setting_is_walked() -> None:
    kinds = {type(value) for value in VALUES.values()}
    assert {bool, int, float, str, list, dict} <= kinds
    assert "local_model_roots" in LISTS and "span_patterns" in LISTS
    for name, value in VALUES.items():
        assert plain(getattr(Settings(), name)) != value, f"{name}: {value!r} is its default"


@pytest.mark.parametrize("name", FIELDS)
def test_each_setting_arrives_from_its_variable(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    value = VALUES[name]
    has_comma = isinstance(value, list) and any("," in item for item in value)
    monkeypatch.setenv(variable(name), as_variable(value, "json" if has_comma else "commas"))
    assert plain(getattr(load_settings(), name)) == VALUES[name]


@pytest.mark.parametrize("form", ["commas", "json"])
@pytest.mark.parametrize("name", LISTS)
def test_each_list_arrives_in_both_forms(
    name: str, form: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    value = VALUES[name]
    if form == "commas" and any("," in item for item in value):
        value = [item for item in value if "," not in item]  # commas need the JSON array
    monkeypatch.setenv(variable(name), as_variable(value, form))
    assert getattr(load_settings(), name) == value


def test_a_list_item_with_a_comma_needs_the_json_array(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("THINKTRANS_SPAN_PATTERNS", '["a{1,3}", "b"]')
    assert load_settings().span_patterns == ["a{1,3}", "b"]
    monkeypatch.setenv("THINKTRANS_SPAN_PATTERNS", "x, y ,,z")
    assert load_settings().span_patterns == ["x", "y", "z"]
    monkeypatch.setenv("THINKTRANS_LOCAL_MODEL_ROOTS", "")
    assert load_settings().local_model_roots == []


def test_every_setting_at_once_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in VALUES.items():
        monkeypatch.setenv(variable(name), as_variable(value, "json"))
    loaded = load_settings()
    assert {name: plain(getattr(loaded, name)) for name in FIELDS} == VALUES


def test_every_setting_at_once_from_the_yaml_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in FIELDS:  # a variable wins over the file (the tests set a few)
        monkeypatch.delenv(variable(name), raising=False)
    path = tmp_path / "thinktrans.yaml"
    path.write_text(yaml.safe_dump(VALUES), encoding="utf-8")
    loaded = load_settings(path)
    assert {name: plain(getattr(loaded, name)) for name in FIELDS} == VALUES


def test_a_list_as_a_string_in_the_yaml_file(tmp_path: Path) -> None:
    path = tmp_path / "thinktrans.yaml"
    path.write_text('local_model_roots: /models, /srv/models\n'
                    'span_patterns: \'["a{1,3}"]\'\n', encoding="utf-8")
    loaded = load_settings(path)
    assert loaded.local_model_roots == ["/models", "/srv/models"]
    assert loaded.span_patterns == ["a{1,3}"]


BOOLEANS = [name for name in FIELDS if Settings.model_fields[name].annotation is bool]
# What the documentation promises (docs/configuration.md), and spellings it never did.
TAKEN = {"true": True, "false": False, "1": True, "0": False, "TRUE": True, "False": False}
REFUSED = ["yes", "no", "on", "off", "y", "n", "t", "f", "2", "-1", "enabled", ""]


def test_the_boolean_settings_are_walked() -> None:
    assert {"previews", "protect_spans", "log_text", "pool_fair"} <= set(BOOLEANS)


@pytest.mark.parametrize("name", BOOLEANS)
def test_a_boolean_variable_takes_true_false_1_0(name: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    for given, value in TAKEN.items():
        monkeypatch.setenv(variable(name), given)
        assert getattr(load_settings(), name) is value, given
    for given in REFUSED:
        monkeypatch.setenv(variable(name), given)
        with pytest.raises(ConfigError) as info:
            load_settings()
        assert variable(name) in info.value.detail and "true or false" in info.value.detail


@pytest.mark.parametrize("name", BOOLEANS)
def test_a_boolean_in_the_yaml_file_takes_true_false_1_0(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(variable(name), raising=False)
    path = tmp_path / "thinktrans.yaml"
    # YAML 1.1 loaders read yes, no, on and off as booleans: here they are refused words.
    for given, value in {"true": True, "false": False, "True": True, "1": True, "0": False,
                         "'false'": False}.items():
        path.write_text(f"{name}: {given}\n", encoding="utf-8")
        assert getattr(load_settings(path), name) is value, given
    for given in ["yes", "no", "on", "off", "y", "n", "2", "1.0"]:
        path.write_text(f"{name}: {given}\n", encoding="utf-8")
        with pytest.raises(ConfigError) as info:
            load_settings(path)
        assert variable(name) in info.value.detail and "true or false" in info.value.detail
