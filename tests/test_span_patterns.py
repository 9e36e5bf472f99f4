"""An operator's span pattern runs on untrusted text on the event loop: one that can backtrack
exponentially is refused at start, with one line naming the setting, the pattern and the way
out. Nothing here times a match: the refusal reads the pattern, not a text."""

from __future__ import annotations

import re
from collections import deque

import pytest

from models.spans import SpanFinder
from service.exceptions import ConfigError
from service.settings import load_settings
from tests.fakes import FakeTranslator
from tests.test_config_errors import run
from tests.test_protect import chain_app, keeping, translate

TICKET = r"([A-Z]+-?)+\d"  # 34 capitals and no digit held the loop for hours

# Each shape and the word its reason starts with.
CATASTROPHIC = {
    r"(a+)+": "nested quantifier",
    r"(a*)*b": "nested quantifier",
    r"(\w+\s?)+$": "nested quantifier",
    TICKET: "nested quantifier",
    r"(?:\w+\.)+\w+": "nested quantifier",
    r"(x+x+){10}y": "nested quantifier",  # a count of more than one is a repetition too
    r"(?>(a+)+b)": "nested quantifier",  # inside an atomic group, the inside still backtracks
    r"(?=(a+)+b)": "nested quantifier",
    r"(a|a)*b": "repeated alternation",
    r"(\w|\d\d)+!": "repeated alternation",
    r"(x(a|ab))+y": "repeated alternation",
    r"(?i)(ab|Ac)+": "repeated alternation",
    r"([^a]x|by)+": "repeated alternation",
    r"(ab?|b)+c": "repeated group with an optional part",
    r"(a?a)+b": "repeated group with an optional part",
}

SAFE = [
    r"[A-Z]{2,10}-\d+",
    r"JIRA-\d+",
    r"ticket #\d+",
    r"\b[A-Z][A-Z0-9_]+\b",
    r"(foo|bar)+",  # the branches start differently
    r"(\dx|\sy)+",
    r"(\d{2}:)+\d{2}",  # a fixed count inside a repetition splits one way
    r"(\w|\d)+",  # Python reads it as one class, [\w\d]
    r"[A-Z][A-Z-]*\d",  # the rewrite the reason suggests
    r"(?:[A-Z]+-?)++\d",  # possessive
    r"(?>(?:[A-Z]+-?)+)\d",  # atomic
]


def test_the_ticket_pattern_stops_the_cli_with_one_line_naming_it() -> None:
    result = run(["translate", "--to", "de", "Hello there, this is a test."],
                 {"THINKTRANS_SPAN_PATTERNS": '["([A-Z]+-?)+\\\\d"]'}, None)
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[-3000:]
    assert (result.returncode, lines[0].startswith("thinktrans: ")) == (2, True), lines[0]
    for words in ("span_patterns", "THINKTRANS_SPAN_PATTERNS", "([A-Z]+-?)+",
                  "nested quantifier", "[A-Z][A-Z-]*\\d", "(?:[A-Z]+-?)++\\d"):
        assert words in lines[0]


@pytest.mark.parametrize(("pattern", "reason"), CATASTROPHIC.items(), ids=list(CATASTROPHIC))
def test_a_pattern_that_can_backtrack_exponentially_is_refused(pattern: str, reason: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_settings(span_patterns=[r"JIRA-\d+", pattern])
    message = str(exc.value)
    assert "\n" not in message
    assert "span_patterns" in message
    assert f"pattern 1 ({pattern!r})" in message
    assert f"exponential time on text it almost matches: {reason}" in message
    assert "possessive" in message  # the other way out


@pytest.mark.parametrize("pattern", SAFE)
def test_a_safe_pattern_is_accepted(pattern: str) -> None:
    assert load_settings(span_patterns=[pattern]).span_patterns == [pattern]


@pytest.mark.parametrize("rewrite", [r"[A-Z][A-Z-]*\d", r"(?:[A-Z]+-?)++\d",
                                     r"(?>(?:[A-Z]+-?)+)\d"])
def test_the_suggested_rewrites_protect_what_the_refused_pattern_would(rewrite: str) -> None:
    text = "Fixed in PROJ-12 and ABC-DEF-7, not in NOPE or X-."
    wanted = [m.group() for m in re.finditer(TICKET, text)]
    found = SpanFinder([rewrite], kinds=[]).find(text)
    assert found is not None
    assert [span.out for span in found.spans] == wanted == ["PROJ-1", "ABC-DEF-7"]


async def test_the_app_protects_the_possessive_ticket_pattern() -> None:
    fake = FakeTranslator(answers=deque([keeping]))
    async with chain_app(fake, span_kinds="url",
                         span_patterns=[r"(?:[A-Z]+-?)++\d+"]) as app:
        await translate(app.client, ["See PROJ-ABC-12 about it at https://x.io/a today."])
    [protected] = fake.jobs[0].protected or [None]
    assert protected is not None
    assert [(s.kind, s.out) for s in protected.spans] == [
        ("pattern", "PROJ-ABC-12"), ("url", "https://x.io/a")]
