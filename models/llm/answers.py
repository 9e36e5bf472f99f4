"""Whether an LLM's answer is usable: its JSON, its ids, and each item's plausibility.

A chat model may obey the text instead of translating it, answer it, or swap items; these
are cheap structural checks that such an answer rarely passes, and the one check that every
protected span is kept, byte for byte, which holds whatever the settings say.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable, Sequence
from typing import Any

from models.llm.replies import CLOSE, opens_thinking, thinking_ends
from models.spans import Protected, Span, numbers

# An answer item holding the last this-many characters of its context returned the context.
CONTEXT_PROBE_CHARS = 40

# Plausible translation length, in "Latin-equivalent" characters (a wide CJK character
# counts 3): translations between most languages stay well within 0.25x-4x of the source.
MIN_RATIO = 0.25
MAX_RATIO = 4.0
# Short sources vary too much to judge shortness; they may grow by this much and more.
MIN_CHECKED_WEIGHT = 20
LONG_SLACK = 60

# The </think> tags tried as a reasoning block's end: each try parses the rest.
MAX_THINKING_ENDS = 32
_FENCE = re.compile(r"```(?:json|JSON)?\s*\n?(.*?)```", re.DOTALL)


_ORDINAL_SUFFIX = re.compile(r"(?:st|nd|rd|th)\b", re.IGNORECASE)
_INLINE_CODE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
_URL = re.compile(r"\b(?:https?|ftp)://[!-~]+", re.IGNORECASE)
_URL_TAIL = ".,;:!?'\")]}>*_`"
# Wording, not code: a translator may rightly translate `Save` or `the config`.
_PLAIN_WORDS = re.compile(r"[^\W\d_]+(?:[ '-][^\W\d_]+)*")


def text_weight(text: str) -> int:
    """Length in Latin-equivalent characters: wide (CJK) characters count 3, spaces 0."""
    return sum(
        3 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text if not ch.isspace()
    )


def number_forms(text: str) -> list[set[str]]:
    """The numbers that matter in ``text``, each as the set of forms that count as it
    (``models.spans.numbers``: grouped or not, in any script's digits).

    Single digits and English ordinals ("2nd") are left out: translations rightly write them
    as words ("两个", "第二"), and a protected integer is checked with the spans. A number
    with a myriad unit counts as its value too ("15万" is 15 or 150000; "1.5万" is 15000).
    """
    forms: list[set[str]] = []
    for number in numbers(text):
        if not number.scaled:
            [digits] = number.forms
            if len(digits) < 2 or _ORDINAL_SUFFIX.match(text, number.end):
                continue
        forms.append(set(number.forms))
    return forms


def code_spans(text: str) -> list[str]:
    """Inline code (`...`) that a translation keeps as it is; plain words are left out."""
    spans = (m.group(1).strip() for m in _INLINE_CODE.finditer(text))
    return [span for span in spans if span and not _PLAIN_WORDS.fullmatch(span)]


def urls(text: str) -> list[str]:
    """The URLs in ``text``, without the punctuation that usually follows one."""
    return [m.group().rstrip(_URL_TAIL) for m in _URL.finditer(text)]


SPAN_PROBLEM = "a protected span missing"


def span_problem(lost: Sequence[Span]) -> str | None:
    """The reason for spans an answer lost, naming their kinds (never their text)."""
    if not lost:
        return None
    kinds = ", ".join(sorted({span.kind for span in lost}))
    return f"{SPAN_PROBLEM} ({kinds})"


def summary(problems: Iterable[str]) -> str:
    """Items' problems in one phrase: each once, the missing spans' kinds together."""
    kinds: set[str] = set()
    others: set[str] = set()
    head = f"{SPAN_PROBLEM} ("
    for problem in problems:
        if problem.startswith(head) and problem.endswith(")"):
            kinds.update(problem[len(head):-1].split(", "))
        else:
            others.add(problem)
    if kinds:
        others.add(f"{head}{', '.join(sorted(kinds))})")
    return ", ".join(sorted(others))


def item_problem(source: str, translated: object, *, checks: bool = True,
                 protected: Protected | None = None) -> str | None:
    """Why ``translated`` cannot be a translation of ``source``, or None when it can.

    Cheap structural checks, not a judgement of quality: an answer that obeys or answers
    the text, or another item's translation, rarely keeps the source's numbers, code and
    URLs and its length. The reasons name what failed, never the text. With ``checks``
    off only emptiness and ``protected``'s spans are checked: the service checks every
    answer for its spans all the same (``Protected.missing``), and catching it here asks
    the item again before the batch fails. With ``protected`` its spans stand for the
    inline code and URL checks, stricter than those: every inline code span counts,
    backticks included (`Save` too, which ``code_spans`` lets a translator translate), and
    a URL is what the span table calls one. Numbers are checked in any form either way.
    """
    if not isinstance(translated, str) or not translated.strip():
        return "empty"
    if not checks:
        return None if protected is None else span_problem(protected.missing(translated))
    src, out = text_weight(source), text_weight(translated)
    if out > max(MAX_RATIO * src, src + LONG_SLACK):
        return "far too long"
    if src >= MIN_CHECKED_WEIGHT and out < MIN_RATIO * src:
        return "far too short"
    if protected is not None:
        problem = span_problem(protected.missing(translated))
        if problem is not None:
            return problem
    else:
        if any(url not in translated for url in urls(source)):
            return "a URL missing"
        if any(span not in translated for span in code_spans(source)):
            return "inline code missing"
    kept = set().union(*number_forms(translated))
    if any(not forms & kept for forms in number_forms(source)):
        return "a number missing"
    return None


def context_problem(context: str | None, source: str, translated: str) -> str | None:
    """Why ``translated`` is no answer for an item sent with ``context``: it holds the
    context's last characters (which its source does not), so the model copied the context
    into its answer. A context too short to tell is not judged; a context the model
    translated along with the text is left to the length check."""
    if context is None:
        return None
    probe = context.strip()[-CONTEXT_PROBE_CHARS:].strip()
    if text_weight(probe) < MIN_CHECKED_WEIGHT or probe in source:
        return None
    return "the context returned" if probe in translated else None


def _load_json(content: str) -> Any:
    """The JSON in an answer, tolerating code fences and chatter around it."""
    text = content.strip()
    candidates = [text]
    candidates += [m.group(1).strip() for m in _FENCE.finditer(text)]
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        candidates.append(text[start : end + 1])
    for candidate in candidates:
        try:
            return json.loads(candidate)
        except ValueError:
            continue
    return None


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


class MalformedAnswer(ValueError):
    """An answer that is unusable as a whole; the message says how, after "the LLM"."""


def parse_answer(content: str | None, count: int) -> dict[int, object]:
    """Map id -> text from an answer; MalformedAnswer when it is malformed as a whole.

    Malformed: no content, not JSON, not ``{"translations": [...]}``, a different count,
    or ids that are not exactly 1..count once each (a shifted or renumbered list would
    misalign). Each says which, so an operator can tell a model that cannot count from
    one that cannot write JSON. A reasoning block at its start is left out
    (``read_answer``).
    """
    return read_answer(content, count)[0]


def read_answer(content: str | None, count: int) -> tuple[dict[int, object], bool]:
    """``parse_answer``, and whether the answer followed a bare ``</think>`` (reasoning
    whose ``<think>`` a template opened in the prompt: DeepSeek-R1's).

    Reasoning stands only before the JSON, never inside it: the answer is what follows
    the first ``</think>`` after which the JSON parses (a leading ``<think>`` block); with
    no ``<think>`` opening the content, a ``</think>`` closes reasoning only where what
    follows parses and what precedes does not, else where the content whole does not.
    A ``<think>`` or ``</think>`` inside the translations' strings is their text.
    """
    if not content:
        raise MalformedAnswer(f"answered no content for {_count(count, 'segment')}")
    ends = thinking_ends(content)[:MAX_THINKING_ENDS]
    after = [(end, _attempt(content[end:], count)) for end in ends]
    parsed = [answer for _, answer in after if not isinstance(answer, MalformedAnswer)]
    if opens_thinking(content):
        if parsed:
            return parsed[0], False
        if not after:  # never closed: all of it was reasoning
            raise MalformedAnswer(f"answered no content for {_count(count, 'segment')}")
        raise next(answer for _, answer in after if isinstance(answer, MalformedAnswer))
    for end, answer in after:
        before = _attempt(content[: end - len(CLOSE)], count)
        if not isinstance(answer, MalformedAnswer) and isinstance(before, MalformedAnswer):
            return answer, True
    whole = _attempt(content, count)
    if not isinstance(whole, MalformedAnswer):
        return whole, False
    if parsed:  # both sides of a </think> parse, the whole does not: the answer follows
        return parsed[0], True
    raise whole


def _attempt(content: str, count: int) -> dict[int, object] | MalformedAnswer:
    """``content``'s answer, or why it is none."""
    try:
        return _parsed(content, count)
    except MalformedAnswer as exc:
        return exc


def _parsed(content: str, count: int) -> dict[int, object]:
    """Map id -> text from ``content``, reasoning not taken out."""
    if not content.strip():
        raise MalformedAnswer(f"answered no content for {_count(count, 'segment')}")
    data = _load_json(content)
    if data is None:
        raise MalformedAnswer(f"answered malformed JSON for {_count(count, 'segment')}")
    items = data.get("translations") if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise MalformedAnswer("answered JSON without a translations list")
    if len(items) != count:
        raise MalformedAnswer(
            f"returned {_count(len(items), 'item')} for {_count(count, 'segment')}"
        )
    out: dict[int, object] = {}
    for item in items:
        if not isinstance(item, dict):
            raise MalformedAnswer("returned an item that is not an object")
        ident = item.get("id")
        if isinstance(ident, str) and ident.strip().isdigit():
            ident = int(ident)
        if (
            not isinstance(ident, int)
            or isinstance(ident, bool)
            or not 1 <= ident <= count
            or ident in out
        ):
            raise MalformedAnswer(f"returned ids other than 1..{count} once each")
        out[ident] = item.get("text")
    return out


def judge(
    cores: list[str],
    contexts: list[str | None],
    ids: list[int],
    answer: dict[int, object],
    *,
    checks: bool = True,
    protected: Sequence[Protected | None] | None = None,
) -> tuple[dict[int, str], dict[int, str]]:
    """Split ``ids`` into accepted translations and the problem with each rejected one;
    ``contexts`` are those sent with the items, which no answer may hold; ``protected``
    (one per core, or None) the spans each must keep."""
    good: dict[int, str] = {}
    bad: dict[int, str] = {}
    for k in ids:
        value = answer.get(k)
        spans = protected[k - 1] if protected is not None else None
        problem = item_problem(cores[k - 1], value, checks=checks, protected=spans)
        if problem is None and isinstance(value, str):
            problem = context_problem(contexts[k - 1], cores[k - 1], value)
            if problem is None:
                good[k] = value
                continue
        bad[k] = problem or "empty"
    return good, bad


def rewrap(original: str, core: str) -> str:
    """``core`` with the original's leading and trailing whitespace."""
    lead = original[: len(original) - len(original.lstrip())]
    trail = original[len(original.rstrip()) :]
    return f"{lead}{core}{trail}"
