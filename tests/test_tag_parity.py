"""One meaning of a language tag: the service and the agent-side client, held to one table.

The client may not import the service or langcodes, so it keeps its own small tables; these
tests run both over tests/data/tag_cases.json, and hold the client's tables to langcodes'.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from langcodes.data_dicts import DEFAULT_SCRIPTS, LANGUAGE_REPLACEMENTS, TERRITORY_REPLACEMENTS
from thinktrans_client import locale as client
from thinktrans_client.acp import locale_from_initialize

from models.languages import ALIASES, canonical
from service.exceptions import InvalidLocale, LocaleNotAllowed, kind_of
from service.text.tags import canonicalize, check_allowed

CASES = json.loads((Path(__file__).parent / "data" / "tag_cases.json").read_text("utf-8"))


def service_form(tag: str) -> str | None:
    try:
        got = canonicalize(tag)
    except InvalidLocale as exc:
        assert kind_of(exc).status == 422
        return None
    assert canonical(tag) == got  # the backends' entry point is the same canonicaliser
    return got


def client_form(tag: str) -> str | None:
    try:
        return client.canonicalize(tag)
    except client.InvalidLocale:
        return None


@pytest.mark.parametrize("case", CASES["canonical"], ids=lambda c: repr(c["tag"]))
def test_service_and_client_give_the_tables_answer(case: dict[str, Any]) -> None:
    assert service_form(case["tag"]) == case["canonical"]
    assert client_form(case["tag"]) == case["canonical"]


def test_an_underscore_is_refused_with_a_hint_on_both_sides() -> None:
    with pytest.raises(InvalidLocale, match="use '-', not '_'"):
        canonicalize("zh_CN")
    with pytest.raises(client.InvalidLocale, match="use '-', not '_'"):
        client.canonicalize("zh_CN")


def service_admits(tag: str, allowed: list[str]) -> bool:
    try:
        check_allowed(canonicalize(tag), [canonicalize(entry) for entry in allowed])
    except LocaleNotAllowed:
        return False
    return True


@pytest.mark.parametrize("case", CASES["allowed"], ids=lambda c: f"{c['tag']}-in-{c['allowed']}")
def test_allowed_locales_treat_aliases_as_one_language(case: dict[str, Any]) -> None:
    assert service_admits(case["tag"], case["allowed"]) is case["admitted"]
    assert client.is_allowed(client.canonicalize(case["tag"]), case["allowed"]) is case["admitted"]


@pytest.mark.parametrize(("sent", "allowed", "kept"), [
    ("tl", ["fil"], "fil"), ("tl-PH", ["fil"], "fil-PH"), ("fil", ["tl"], "fil"),
    ("en-Latn-US", ["en-US"], "en-US"), ("iw", ["he"], "he"), ("no", ["nb"], "no"),
    ("zh_CN", ["zh"], None),
])
def test_the_client_keeps_a_locale_the_sidecar_accepts(sent: str, allowed: list[str],
                                                       kept: str | None) -> None:
    got = locale_from_initialize({"_meta": {"locale": sent}}, allowed=allowed)
    assert got == kept
    if kept is not None:  # and what it keeps is what the sidecar makes of it, and admits
        assert got == canonicalize(sent)
        check_allowed(got, [canonicalize(entry) for entry in allowed])


@pytest.mark.parametrize("case", CASES["client_defers"], ids=lambda c: c["tag"])
def test_where_the_client_defers_to_the_sidecar(case: dict[str, Any]) -> None:
    """Beyond its tables the client sends a well-formed tag as it is; the sidecar decides."""
    assert service_form(case["tag"]) == case["service"]
    assert client_form(case["tag"]) == case["client"]


def _replaced_in_client_domain() -> list[str]:
    """langcodes' replacements of the kinds the client's tables cover."""
    languages = [code for code, to in LANGUAGE_REPLACEMENTS.items() if "-" not in code
                 and (len(code) == 2 or len(to.split("-")[0]) == 2 or to == "fil")]
    whole = [tag for tag in LANGUAGE_REPLACEMENTS if "-" in tag
             and not tag.startswith(("i-", "und-"))]
    regions = [f"en-{code.upper()}" for code in TERRITORY_REPLACEMENTS
               if len(code) == 2 and code.isalpha()]
    scripts = [f"{language}-{script}-CH" for language, script in DEFAULT_SCRIPTS.items()]
    extlangs = [f"{tag}-HK" for tag in ("zh-cmn", "zh-gan", "zh-wuu", "zh-yue")]
    return languages + whole + regions + scripts + extlangs


@pytest.mark.parametrize("tag", _replaced_in_client_domain())
def test_the_clients_tables_are_the_sidecars(tag: str) -> None:
    expected = service_form(tag)
    if expected is not None:  # a few of langcodes' own keys are not valid tags to it
        assert client_form(tag) == expected


def test_one_language_under_two_codes_is_the_same_table() -> None:
    assert client._SAME_LANGUAGE == ALIASES
