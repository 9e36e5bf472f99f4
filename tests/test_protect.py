"""Protected spans and glossaries through the service: what a segment's chain is given,
what it must give back, the glossary's limits and file, and the target's typography."""

from __future__ import annotations

import re
from collections import deque
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from models.passthrough import PassthroughTranslator
from models.spans import Glossary, SpanFinder
from service.exceptions import ConfigError
from service.text.glossary import GlossaryBook
from service.text.typography import keep_whitespace
from tests.conftest import (
    Running,
    app_with,
    assert_problem,
    make_settings,
    read_until,
    segments,
)
from tests.fakes import FakeTranslator

TEXT = "Open a pull request that fixes config.yaml and call `load_config()` at https://x.io/a."


@asynccontextmanager
async def chain_app(*fakes: FakeTranslator, **overrides: Any) -> AsyncIterator[Running]:
    backends = {f.name: f for f in fakes}
    backends["passthrough"] = PassthroughTranslator()
    overrides.setdefault("backend", ",".join(f.name for f in fakes))
    overrides.setdefault("default_locale", "zh-CN")
    async with app_with(backends=backends, **overrides) as running:
        yield running


async def translate(client: httpx.AsyncClient, texts: list[str], **fields: Any) -> Any:
    resp = await client.post("/v1/translate", json={"texts": texts, **fields})
    assert resp.status_code == 200, resp.text
    return resp.json()["results"]


def mangling(texts: Sequence[str], source: str | None, target: str) -> list[str]:
    """A translator that 'translates' file names, as NMT models do."""
    return [t.replace("config.yaml", "配置.yaml") for t in texts]


def keeping(texts: Sequence[str], source: str | None, target: str) -> list[str]:
    return [f"译：{t}" for t in texts]


async def test_the_chain_is_given_each_segments_spans() -> None:
    fake = FakeTranslator(answers=deque([keeping]))
    async with chain_app(fake) as app:
        [result] = await translate(app.client, [TEXT])
    [job] = fake.jobs
    assert job.protected is not None
    [protected] = job.protected
    assert protected is not None and protected.text == job.texts[0]
    assert [(s.kind, s.out) for s in protected.spans] == [
        ("path", "config.yaml"), ("code", "`load_config()`"), ("url", "https://x.io/a")]
    assert result["segments"][0]["status"] == "translated"


async def test_a_translation_that_lost_a_span_goes_down_the_chain() -> None:
    fake = FakeTranslator(answers=deque([mangling]))
    async with chain_app(fake, backend="fake,passthrough") as app:
        [result] = await translate(app.client, [TEXT])
    [seg] = result["segments"]
    assert (seg["status"], seg["backend"]) == ("translated", "passthrough")
    assert "config.yaml" in seg["text"]


async def test_a_segment_whose_spans_no_backend_kept_is_an_error_with_the_original() -> None:
    fake = FakeTranslator(answers=deque([mangling]))
    async with chain_app(fake) as app:
        [result] = await translate(app.client, [TEXT])
        backends = (await app.client.get("/v1/backends")).json()
    [seg] = result["segments"]
    assert seg["status"] == "error" and seg["text"] == TEXT
    assert "fake: lost 1 protected span of 3 (path)" in seg["error"]
    assert "config" not in seg["error"]  # kinds and counts, never the text
    assert backends is not None


def digits_dropped(texts: Sequence[str], source: str | None, target: str) -> list[str]:
    """A translator that loses the numbers, as small models do."""
    return [re.sub(r"\d", "", t) for t in texts]


def grouping(texts: Sequence[str], source: str | None, target: str) -> list[str]:
    """A translator that groups long numbers the target's way (a narrow no-break space)."""
    return [re.sub(r"(\d\d)(\d{3})\b", "\\1\u202f\\2", t) for t in texts]


NUMBERED = ["Then it returns 404 when the token is missing.", "So maxRetryCount is set to 3.",
            "It stops after 10000 steps."]


async def test_a_translation_that_lost_an_integer_goes_down_the_chain() -> None:
    fake = FakeTranslator(answers=deque([digits_dropped] * len(NUMBERED)))  # a batch or more
    async with chain_app(fake, backend="fake,passthrough") as app:
        results = await translate(app.client, NUMBERED)
    for text, result in zip(NUMBERED, results, strict=True):
        [seg] = result["segments"]
        assert (seg["status"], seg["backend"], seg["text"]) == (
            "translated", "passthrough", text)


async def test_a_long_integer_grouped_the_targets_way_is_kept() -> None:
    fake = FakeTranslator(answers=deque([grouping]))
    async with chain_app(fake, backend="fake,passthrough") as app:
        [result] = await translate(app.client, [NUMBERED[2]])
    [seg] = result["segments"]
    assert (seg["status"], seg["backend"]) == ("translated", "fake")
    assert "10\u202f000" in seg["text"]


async def test_with_protection_off_a_mangled_span_passes() -> None:
    fake = FakeTranslator(answers=deque([mangling]))
    async with chain_app(fake, protect_spans=False) as app:
        [result] = await translate(app.client, [TEXT])
    assert result["segments"][0]["status"] == "translated"
    assert fake.jobs[0].protected is None


async def test_span_kinds_and_extra_patterns_choose_what_is_protected() -> None:
    fake = FakeTranslator(answers=deque([keeping]))
    async with chain_app(fake, span_kinds="url", span_patterns=[r"JIRA-\d+"]) as app:
        await translate(app.client, ["See JIRA-123 about config.yaml at https://x.io/a today."])
    [protected] = fake.jobs[0].protected or [None]
    assert protected is not None
    assert [(s.kind, s.out) for s in protected.spans] == [
        ("pattern", "JIRA-123"), ("url", "https://x.io/a")]


async def test_glossary_terms_come_out_as_given_and_keep_terms_unchanged() -> None:
    async with chain_app(FakeTranslator(), backend="passthrough") as app:
        [result] = await translate(app.client, [TEXT], glossary={
            "terms": {"pull request": "拉取请求"}, "keep": ["fixes"]})
    [seg] = result["segments"]
    assert seg["status"] == "translated"
    assert "拉取请求" in seg["text"] and "fixes" in seg["text"]
    assert "pull request" not in seg["text"]


async def test_a_translation_without_the_glossary_term_goes_down_the_chain() -> None:
    fake = FakeTranslator(answers=deque([keeping]))  # keeps spans, ignores the glossary
    async with chain_app(fake, backend="fake,passthrough") as app:
        [result] = await translate(app.client, [TEXT], glossary={
            "terms": {"pull request": "拉取请求"}})
    [seg] = result["segments"]
    assert (seg["status"], seg["backend"]) == ("translated", "passthrough")
    assert "lost" not in seg.get("error", "")


async def test_the_cache_keys_on_the_glossary() -> None:
    fake = FakeTranslator()
    async with chain_app(fake, backend="fake", cache_mb=8) as app:
        glossary = {"keep": ["pull"]}
        first = await translate(app.client, [TEXT], glossary=glossary)
        again = await translate(app.client, [TEXT], glossary=glossary)
        other = await translate(app.client, [TEXT], glossary={"keep": ["request"]})
        plain = await translate(app.client, [TEXT])
    assert len(fake.jobs) == 3  # the same glossary again came from the cache
    assert again[0]["segments"][0].get("cached") is True
    assert not first[0]["segments"][0].get("cached")
    assert not other[0]["segments"][0].get("cached")
    assert not plain[0]["segments"][0].get("cached")


@pytest.mark.parametrize(("glossary", "words"), [
    ({"terms": {"": "x"}}, ["glossary.terms key", "blank"]),
    ({"terms": {"a ": "x"}}, ["leading or trailing spaces"]),
    ({"terms": {"a": "x\ny"}}, ["line break"]),
    ({"keep": ["ok", " "]}, ["glossary.keep[1]", "blank"]),
    ({"keep": ["x" * 201]}, ["201 characters", "THINKTRANS_MAX_GLOSSARY_TERM_CHARS=200"]),
    ({"keep": [f"t{i}" for i in range(257)]}, ["257 entries", "MAX_GLOSSARY_TERMS=256"]),
    ({"terms": {"a": 1}}, ["glossary.terms.a", "string"]),
    ({"term": {"a": "b"}}, ["glossary.term"]),
])
async def test_a_bad_glossary_is_a_422_that_says_what_to_fix(
        passthrough_app: Running, glossary: dict[str, Any], words: list[str]) -> None:
    resp = await passthrough_app.client.post(
        "/v1/translate", json={"target": "de", "texts": ["Hallo"], "glossary": glossary})
    assert_problem(resp, 422, *words)
    resp = await passthrough_app.client.post(
        "/v1/streams", json={"stream_id": "g1", "target": "de", "glossary": glossary})
    assert_problem(resp, 422, *words)


async def test_a_stream_runs_with_its_glossary_and_reopening_it_with_another_is_409(
        passthrough_app: Running) -> None:
    client = passthrough_app.client
    body = {"stream_id": "g2", "target": "zh-CN", "glossary": {"terms": {"pull request": "PR"}}}
    assert (await client.post("/v1/streams", json=body)).status_code == 201
    assert (await client.post("/v1/streams", json=body)).status_code == 200
    other = {**body, "glossary": {"terms": {"pull request": "拉取请求"}}}
    assert_problem(await client.post("/v1/streams", json=other), 409, "another glossary")
    resp = await client.post("/v1/streams/g2/chunks",
                             json={"chunks": [{"seq": 0, "text": "Open a pull request now. "}]})
    assert resp.status_code == 200
    await client.post("/v1/streams/g2/close")
    [seg] = segments(await read_until(client, "g2"))
    assert seg["text"] == "Open a PR now. "


async def test_the_limits_name_the_glossary_bounds(passthrough_app: Running) -> None:
    limits = (await passthrough_app.client.get("/v1/limits")).json()
    assert limits["max_glossary_terms"] == 256
    assert limits["max_glossary_term_chars"] == 200


# -- the glossary file ----------------------------------------------------------------------

GLOSSARY_FILE = """\
"*":
  keep: [thinktrans]
zh:
  terms: {pull request: 拉取请求, merge: 合并}
zh-tw:
  terms: {pull request: 拉取請求}
"""


def book(tmp_path: Path, text: str = GLOSSARY_FILE, **overrides: Any) -> GlossaryBook:
    path = tmp_path / "glossary.yaml"
    path.write_text(text, encoding="utf-8")
    return GlossaryBook(make_settings(glossary_file=str(path), **overrides))


def test_the_file_gives_each_target_its_glossary_most_specific_last(tmp_path: Path) -> None:
    glossaries = book(tmp_path)
    assert glossaries.shared("zh-CN") == Glossary.of(
        {"pull request": "拉取请求", "merge": "合并"}, ["thinktrans"])
    assert glossaries.shared("zh-TW") == Glossary.of(
        {"pull request": "拉取請求", "merge": "合并"}, ["thinktrans"])
    assert glossaries.shared("de") == Glossary.of(keep=["thinktrans"])
    # A request's own terms win the ones it shares with the file.
    mine = glossaries.resolve("zh-CN", {"terms": {"merge": "合入"}, "keep": []})
    assert mine == Glossary.of({"pull request": "拉取请求", "merge": "合入"}, ["thinktrans"])


@pytest.mark.parametrize(("text", "words"), [
    ("- a list\n", ["must map targets"]),
    ("zh: {terms: {a: b}, other: 1}\n", ["'zh' must be"]),
    ("zh_cn: {keep: [x]}\n", ["not a target"]),
    ("zh: {keep: ['']}\n", ["keep[0]", "blank"]),
    ("zh: [unclosed\n", ["not valid YAML"]),
])
def test_a_bad_glossary_file_is_a_config_error_naming_it(
        tmp_path: Path, text: str, words: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        book(tmp_path, text)
    assert "THINKTRANS_GLOSSARY_FILE" in str(info.value)
    for word in words:
        assert word in str(info.value)


def test_the_file_reads_yes_and_no_as_words(tmp_path: Path) -> None:
    # YAML 1.1 read them as booleans: "terms.no must be a string", or a term lost.
    glossaries = book(tmp_path, "de: {terms: {no: nein, on: an}, keep: [yes, off]}\n")
    assert glossaries.shared("de") == Glossary.of({"no": "nein", "on": "an"}, ["yes", "off"])


def test_a_missing_glossary_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot be read"):
        GlossaryBook(make_settings(glossary_file=str(tmp_path / "none.yaml")))


async def test_the_file_applies_to_every_stream_of_its_target(tmp_path: Path) -> None:
    path = tmp_path / "glossary.yaml"
    path.write_text(GLOSSARY_FILE, encoding="utf-8")
    async with chain_app(FakeTranslator(), backend="passthrough",
                         glossary_file=str(path)) as app:
        [zh, de] = [await translate(app.client, ["Please merge the pull request. "],
                                    target=target) for target in ("zh-TW", "de")]
    assert zh[0]["text"] == "Please 合并 the 拉取請求. "
    assert de[0]["text"] == "Please merge the pull request. "


# -- the target's typography ----------------------------------------------------------------


@pytest.mark.parametrize(("original", "translated", "tight", "expected"), [
    ("Done here. ", "这里完成了。", True, "这里完成了。"),
    ("Done here.  \n", "这里完成了。", True, "这里完成了。\n"),
    ("Done. Next one. ", "完成了。 下一个。 ", True, "完成了。下一个。"),
    ("Use config.yaml ", "使用 config.yaml", True, "使用 config.yaml "),
    ("  Indented. ", "缩进。", True, "  缩进。"),
    ("Done here. ", "Hier fertig.", False, "Hier fertig. "),
    ("Done. Next one. ", "これで完了。 次へ。", True, "これで完了。次へ。"),
])
def test_whitespace_between_sentences_follows_the_target(
        original: str, translated: str, tight: bool, expected: str) -> None:
    assert keep_whitespace(original, translated, tight=tight) == expected


async def test_chinese_and_japanese_output_has_no_space_between_sentences() -> None:
    def answer(texts: Sequence[str], source: str | None, target: str) -> list[str]:
        return ["第一句。" if "first" in t else "第二句。" for t in texts]

    fake = FakeTranslator(answers=deque([answer, answer]))
    text = "This is the first one. This is the second one. "
    async with chain_app(fake, max_wait_ms=50) as app:
        [result] = await translate(app.client, [text], target="ja")
    assert result["text"] == "第一句。第二句。"
    assert "".join(s["original"] for s in result["segments"]) == text


def test_finding_spans_changes_no_text() -> None:
    protected = SpanFinder().find(TEXT)
    assert protected is not None and protected.text == TEXT


async def test_a_segment_of_spans_alone_is_skipped_unless_a_term_is_in_it() -> None:
    fake = FakeTranslator(answers=deque([keeping]))
    async with chain_app(fake, backend="fake,passthrough") as app:
        [result] = await translate(app.client, ["`load_config()` -> src/app.py\n"])
        [term] = await translate(app.client, ["pull request: src/app.py\n"],
                                 glossary={"terms": {"pull request": "拉取请求"}})
    [seg] = result["segments"]
    assert (seg["status"], seg["text"]) == ("skipped", seg["original"])
    assert [(s["status"], s["text"]) for s in term["segments"]] == [
        ("translated", "拉取请求: src/app.py\n")]
    assert len(fake.jobs) == 1  # only the one with a term (the fake ignored it)
