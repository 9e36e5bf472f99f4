"""The viewer in a real browser: Debian's Chromium driven by Playwright, against a sidecar
served on 127.0.0.1 (the app under uvicorn in a thread, a fake backend behind it).

Skipped, saying so, where no Chromium can be found (`apt-get install chromium`, or
THINKTRANS_TEST_CHROMIUM=/path/to/chrome); `bash tests/run.sh` installs it where it can.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from models.passthrough import PassthroughTranslator
from service.schemas import PreviewResult
from tests.conftest import InThread
from tests.fakes import FakeTranslator

playwright_api = pytest.importorskip("playwright.sync_api", reason="Playwright for Python is "
                                     "not installed (pip install playwright)")

# Playwright's waits, in ms: long enough for a hang to fail a test, never what it measures.
HANG_MS = 60_000
TEXT = [
    "First I check the `config.yaml` file. ",
    "这个函数返回一个列表。",
    "Then I run the tests again with `pytest -q`.\n",
    "```python\ndef area(r):\n    return 3.14159 * r ** 2\n```\n",
    "The answer is 42, so the loop ends there. ",
]
HOSTILE = ("Look: <img src=x onerror=\"window.__pwned=1;alert(1)\"> and "
           "<script>window.__pwned=2;alert(2)</script> and <svg onload=alert(3)>. ")


def chromium() -> str | None:
    for name in (os.environ.get("THINKTRANS_TEST_CHROMIUM"), "chromium", "chromium-browser",
                 "google-chrome"):
        if name and (path := shutil.which(name)):
            return path
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    path = chromium()
    if path is None:
        pytest.skip("no Chromium found: install Debian's chromium (apt-get install chromium) "
                    "or set THINKTRANS_TEST_CHROMIUM; the viewer's browser tests need one")
    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, args=["--no-sandbox"])
        yield b
        b.close()


def until(page: Any, expression: str, timeout_s: float = 60.0) -> None:
    """Wait until ``expression`` is true in the page. Playwright's wait_for_function polls
    through eval, which the page's Content-Security-Policy refuses; evaluate does not."""
    give_up = time.monotonic() + timeout_s
    while not page.evaluate(expression):
        assert time.monotonic() < give_up, f"not within {timeout_s} s: {expression}"
        time.sleep(0.05)


class Page:
    """A browser page on the viewer, with what it did: errors, console lines, dialogs, and
    every request it made."""

    def __init__(self, browser: Any, url: str, **context: Any) -> None:
        self.url = url
        self.context = browser.new_context(viewport={"width": 1280, "height": 800},
                                           accept_downloads=True, **context)
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.console: list[str] = []
        self.dialogs: list[str] = []
        self.requests: list[Any] = []
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}"))
        self.page.on("request", lambda r: self.requests.append(r))

        def dialog(d: Any) -> None:
            self.dialogs.append(d.message)
            d.dismiss()

        self.page.on("dialog", dialog)

    def open(self, fragment: str = "") -> Any:
        self.page.goto(f"{self.url}/viewer{fragment}")
        return self.page

    def rows(self) -> list[dict[str, Any]]:
        return self.page.eval_on_selector_all("#rows .row", """rows => rows.map(r => ({
            index: Number(r.dataset.index), status: r.dataset.status,
            original: r.querySelector('.orig').textContent,
            text: r.querySelector('.tran').textContent,
            updated: r.classList.contains('updated'), cached: r.classList.contains('cached'),
            height: r.getBoundingClientRect().height}))""")

    def wait_rows(self, count: int, timeout_s: float = 60.0) -> list[dict[str, Any]]:
        until(self.page, f"document.querySelectorAll('#rows .row').length >= {count}", timeout_s)
        return self.rows()

    def close(self) -> None:
        self.context.close()
        # The page's own files satisfy its Content-Security-Policy: nothing was refused.
        refused = [line for line in self.console if "Content Security Policy" in line]
        assert not refused, refused
        assert not self.errors, self.errors


@pytest.fixture
def opened(browser: Any) -> Iterator[Callable[..., Page]]:
    pages: list[Page] = []

    def make(url: str, **context: Any) -> Page:
        pages.append(Page(browser, url, **context))
        return pages[-1]

    yield make
    for page in pages:
        page.close()


def served(fake: FakeTranslator | None = None, **overrides: Any) -> InThread:
    fake = fake or FakeTranslator()
    overrides.setdefault("default_locale", "zh-CN")
    return InThread({"fake": fake, "passthrough": PassthroughTranslator()}, backend="fake",
                    **overrides)


def post(c: httpx.Client, sid: str, seq: int, text: str) -> int:
    r = c.post(f"/v1/streams/{sid}/chunks", json={"chunks": [{"seq": seq, "text": text}]})
    assert r.status_code == 200, r.text
    return seq + 1


def events(c: httpx.Client, sid: str) -> list[dict[str, Any]]:
    """Every event of an ended stream, by long-poll."""
    for _ in range(100):
        got = c.get(f"/v1/streams/{sid}/events", params={"after": -1, "wait_ms": 200})
        found: list[dict[str, Any]] = got.json()["events"]
        if found and found[-1]["type"] == "end":
            return found
    raise AssertionError("the stream did not end")


def as_now(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each segment as the stream says it at its end: late updates applied."""
    out: dict[int, dict[str, Any]] = {}
    for e in found:
        if e["type"] == "segment":
            out[e["data"]["index"]] = dict(e["data"])
        elif e["type"] == "update":
            out[e["data"]["index"]].update(e["data"])
    return [out[i] for i in sorted(out)]


def watching(opened: Callable[..., Page], url: str, c: httpx.Client, sid: str,
             **opening: Any) -> tuple[Page, Any]:
    """A stream opened (with ``opening``'s choices), and a page on it that is reading it
    live."""
    assert c.post("/v1/streams", json={"stream_id": sid, **opening}).status_code in (200, 201)
    view = opened(url)
    page = view.open(f"#stream={sid}")
    page.wait_for_selector("#state[data-state='live']")
    return view, page


def finished(opened: Callable[..., Page], url: str, c: httpx.Client, sid: str, text: str
             ) -> tuple[Page, Any]:
    """A stream of one chunk, closed, and a page on it that has read it to its end."""
    post(c, sid, 0, text)
    c.post(f"/v1/streams/{sid}/close")
    view = opened(url)
    page = view.open(f"#stream={sid}")
    page.wait_for_selector("#state[data-state='ended']")
    return view, page


# -- a stream, live ------------------------------------------------------------------------


def test_rows_appear_in_order_as_deltas_are_posted(opened: Callable[..., Page]) -> None:
    with served() as url, httpx.Client(base_url=url) as c:
        view, page = watching(opened, url, c, "live:1")
        seq = 0
        for count, sentence in enumerate(TEXT, start=1):
            for i in range(0, len(sentence), 6):  # token-sized deltas
                seq = post(c, "live:1", seq, sentence[i:i + 6])
            if count < len(TEXT):
                # a sentence is cut once the next begins; the last one at close
                rows = view.wait_rows(count - 1) if count > 1 else []
                assert [r["index"] for r in rows] == list(range(len(rows)))
        c.post("/v1/streams/live:1/close")
        page.wait_for_selector("#state[data-state='ended']")
        rows = view.rows()
        stream = as_now(events(c, "live:1"))
        assert [r["index"] for r in rows] == [s["index"] for s in stream]
        # as shown: blank lines around a segment are not (export keeps them, tested below)
        assert [r["original"] for r in rows] == [s["original"].strip() for s in stream]
        assert [r["status"] for r in rows] == [s["status"] for s in stream]
        assert "".join(s["original"] for s in stream) == "".join(TEXT)
        statuses = {r["status"] for r in rows}
        assert {"translated", "same_language", "skipped"} <= statuses
        # code stays code: a <pre>, never reflowed
        code = page.eval_on_selector(".row[data-status='skipped'] .orig pre",
                                     "p => getComputedStyle(p).whiteSpace")
        assert code == "pre"
        assert page.locator(".row .tran code", has_text="`config.yaml`").count() == 1


@pytest.mark.parametrize("layout", ["side", "below"])
def test_a_late_update_replaces_its_row_in_place(opened: Callable[..., Page],
                                                 layout: str) -> None:
    slow = FakeTranslator(delay_s=2.0)
    slow.answers.extend([lambda texts, s, t: ["短。" for _ in texts]])  # shorter than it
    with served(slow, deadline_ms=150) as url, httpx.Client(base_url=url) as c:
        view, page = watching(opened, url, c, "late")
        page.click(f"#layouts button[data-layout='{layout}']")
        post(c, "late", 0, "This sentence will be late, and it is a long one, isn't it. ")
        page.wait_for_selector(".row[data-status='deadline']")
        before = view.rows()[0]
        assert before["text"] == before["original"]  # the original, until the update
        page.evaluate("document.querySelector('.row').dataset.mark = 'first'")
        page.wait_for_selector(".row[data-status='translated']")
        after = view.rows()
        assert len(after) == 1 and after[0]["text"] == "短。"
        assert after[0]["updated"]
        assert page.get_attribute(".row", "data-mark") == "first"  # the same row, in place
        assert abs(after[0]["height"] - before["height"]) < 1  # its height kept, running
        c.post("/v1/streams/late/close")
        page.wait_for_selector("#state[data-state='ended']")
        page.click(".row .status")  # the backend and model, on demand
        meta = page.text_content(".row .meta")
        assert meta is not None and "backend fake" in meta and "after it" in meta
        with page.expect_download() as got:
            page.click("#export-jsonl")
        line = json.loads(open(got.value.path(), encoding="utf-8").read())
        assert (line["translation"], line["status"], line["updated"]) == (
            "短。", "translated", True)  # no space after a Chinese sentence


def test_a_cached_translation_says_so_on_one_line(opened: Callable[..., Page]) -> None:
    with served() as url, httpx.Client(base_url=url) as c:
        post(c, "twice", 0, "Say it once. ")
        c.post("/v1/streams/twice/close")
        events(c, "twice")
        view, page = finished(opened, url, c, "again", "Say it once. ")
        row = view.rows()[0]
        assert row["cached"] and page.text_content(".row .status") == "cached"
        gutter = page.eval_on_selector(".row .gutter", "g => g.getBoundingClientRect().height")
        cell = page.eval_on_selector(".row .tran", "t => t.getBoundingClientRect().height")
        assert gutter <= cell + 1  # the label does not make the row taller


def test_three_layouts_remembered_across_visits(opened: Callable[..., Page]) -> None:
    with served() as url, httpx.Client(base_url=url) as c:
        post(c, "lay", 0, "One sentence here. Another one there. ")
        c.post("/v1/streams/lay/close")
        view = opened(url)
        page = view.open("#stream=lay")
        view.wait_rows(2)

        def box(selector: str) -> dict[str, float]:
            found = page.locator(selector).first.bounding_box()
            assert found is not None, selector
            return found

        orig, tran = box(".row .orig"), box(".row .tran")
        assert orig["x"] < tran["x"] and abs(orig["y"] - tran["y"]) < 2  # side by side
        page.click("#layouts button[data-layout='below']")
        orig, tran = box(".row .orig"), box(".row .tran")
        assert tran["y"] < orig["y"] and abs(orig["x"] - tran["x"]) < 2  # original beneath
        page.click("#layouts button[data-layout='only']")
        assert not page.locator(".row .orig").first.is_visible()
        page.hover(".row .tran >> nth=0")
        assert page.locator(".row .orig").first.is_visible()  # the original on hover
        page.mouse.move(5, 5)
        assert not page.locator(".row .orig").first.is_visible()
        page.click(".row .tran >> nth=1")
        page.mouse.move(5, 5)
        assert page.locator(".row .orig").nth(1).is_visible()  # and on a tap

        page.reload()
        view.wait_rows(2)
        assert page.get_attribute("#rows", "data-layout") == "only"
        pressed = page.get_attribute("#layouts button[data-layout='only']", "aria-pressed")
        assert pressed == "true"


def test_export_matches_the_streams_events(opened: Callable[..., Page]) -> None:
    with served(deadline_ms=5000) as url, httpx.Client(base_url=url) as c:
        seq = 0
        for sentence in TEXT:
            seq = post(c, "exp", seq, sentence)
        c.post("/v1/streams/exp/close")
        stream = as_now(events(c, "exp"))
        view = opened(url)
        page = view.open("#stream=exp")
        page.wait_for_selector("#state[data-state='ended']")
        with page.expect_download() as got:
            page.click("#export-jsonl")
        download = got.value
        assert download.suggested_filename == "exp.jsonl"
        lines = [json.loads(line) for line in open(download.path(), encoding="utf-8")]
        assert len(lines) == len(stream)
        for line, s in zip(lines, stream, strict=True):
            assert (line["index"], line["original"], line["translation"], line["status"]) == (
                s["index"], s["original"], s["text"], s["status"])
            assert line["backend"] == s["backend"] and line["source_lang"] == s["source_lang"]

        with page.expect_download() as got:
            page.click("#export-md")
        markdown = open(got.value.path(), encoding="utf-8").read()
        assert markdown.startswith("# Stream `exp`")
        for s in stream:
            assert f"```text\n{s['original'].rstrip()}\n```" in markdown
        assert "def area(r):" in markdown and "<zh-CN>First I check" in markdown


def test_copy_a_row_and_the_whole_stream(opened: Callable[..., Page]) -> None:
    with served() as url, httpx.Client(base_url=url) as c:
        post(c, "cp", 0, "Copy this one. And this one too. ")
        c.post("/v1/streams/cp/close")
        view = opened(url, permissions=["clipboard-read", "clipboard-write"])
        page = view.open("#stream=cp")
        page.wait_for_selector("#state[data-state='ended']")
        page.hover(".row >> nth=1")
        page.click(".row >> nth=1 >> .copy")
        until(page, "document.querySelectorAll('.row .copy')[1].textContent === 'Copied'")
        assert page.evaluate("navigator.clipboard.readText()") == "<zh-CN>And this one too. "
        page.click("#copy-all")
        until(page, "document.querySelector('#copy-all').textContent === 'Copied'")
        joined = "<zh-CN>Copy this one. <zh-CN>And this one too. "
        assert page.evaluate("navigator.clipboard.readText()") == joined


def test_follow_mode_keeps_the_newest_row_in_view_until_the_reader_scrolls_up(
    opened: Callable[..., Page],
) -> None:
    with served() as url, httpx.Client(base_url=url) as c:
        view, page = watching(opened, url, c, "long")
        seq = 0
        for i in range(40):
            seq = post(c, "long", seq, f"Sentence number {i} of a long stream. ")
        view.wait_rows(39)
        at_bottom = ("(r => r.scrollHeight - r.scrollTop - r.clientHeight < 50)"
                     "(document.getElementById('rows'))")
        until(page, at_bottom)
        page.mouse.move(700, 400)
        page.mouse.wheel(0, -600)
        until(page, "document.getElementById('follow').ariaPressed === 'false'")
        top = page.evaluate("document.getElementById('rows').scrollTop")
        for i in range(40, 50):
            seq = post(c, "long", seq, f"Sentence number {i} of a long stream. ")
        view.wait_rows(49)
        assert page.evaluate("document.getElementById('rows').scrollTop") == top  # left alone
        page.click("#follow")
        until(page, at_bottom)


# -- the stream list and the header ------------------------------------------------------------


def test_the_stream_list_is_live_filtered_and_opens_a_stream(opened: Callable[..., Page]) -> None:
    with served() as url, httpx.Client(base_url=url) as c:
        post(c, "alpha:1", 0, "Alpha starts. ")
        time.sleep(0.02)
        view = opened(url)
        page = view.open()
        page.wait_for_selector("#streams li[data-id='alpha:1']")
        post(c, "beta:2", 0, "Beta starts. ")
        page.wait_for_selector("#streams li[data-id='beta:2']", timeout=HANG_MS)
        ids = page.eval_on_selector_all("#streams li", "items => items.map(i => i.dataset.id)")
        assert ids == ["beta:2", "alpha:1"]  # newest first
        page.fill("#filter", "alp")
        ids = page.eval_on_selector_all("#streams li:not([hidden])",
                                        "items => items.map(i => i.dataset.id)")
        assert ids == ["alpha:1"]
        page.click("#streams li[data-id='alpha:1'] button")
        page.wait_for_selector("#title:text('alpha:1')")
        assert page.evaluate("location.hash") == "#stream=alpha%3A1"
        assert page.get_attribute("#streams li[data-id='alpha:1']", "class") == "selected"


def test_the_header_says_ready_and_busy(opened: Callable[..., Page]) -> None:
    with served() as url, httpx.Client(base_url=url) as c:
        view = opened(url)
        page = view.open()
        page.wait_for_selector("#ready[data-state='ready']")
        page.wait_for_selector("#backends .pill[data-backend='fake'][data-state='ready']")
        assert page.text_content("#queue") == "0"
        until(page, "document.getElementById('rate').textContent !== '–'")  # a first sample
        seq = 0
        for i in range(10):
            seq = post(c, "busy", seq, f"Busy sentence {i}. ")
        until(page, "Number(document.getElementById('rate').textContent) > 0")


def test_the_header_says_why_not_ready(opened: Callable[..., Page]) -> None:
    fake = FakeTranslator()
    fake.ready, fake.reason = False, "the model is still loading"
    with served(fake) as url:
        view = opened(url)
        page = view.open()
        page.wait_for_selector("#ready[data-state='degraded'], #ready[data-state='not_ready']")
        assert page.text_content("#ready-reason")
        title = page.get_attribute("#backends .pill[data-backend='fake']", "title")
        assert title is not None and "the model is still loading" in title


# -- the token ---------------------------------------------------------------------------------


def _v1(view: Page) -> list[Any]:
    return [r for r in view.requests if "/v1/" in r.url]


def test_the_token_from_the_fragment_is_kept_for_the_tab_and_never_in_a_url(
    opened: Callable[..., Page],
) -> None:
    with served(api_token="t0ken-123") as url:
        auth = {"Authorization": "Bearer t0ken-123"}
        with httpx.Client(base_url=url, headers=auth) as c:
            post(c, "sec", 0, "A private thought. ")
            c.post("/v1/streams/sec/close")
        view = opened(url)
        page = view.open("#stream=sec&token=t0ken-123")
        page.wait_for_selector("#state[data-state='ended']")
        assert page.evaluate("location.hash") == "#stream=sec"  # taken out of the address
        assert page.evaluate("sessionStorage.getItem('thinktrans.token')") == "t0ken-123"
        assert page.is_hidden("#auth")
        page.reload()  # kept for the tab
        page.wait_for_selector("#state[data-state='ended']")
        calls = _v1(view)
        assert calls and all(r.headers.get("authorization") == "Bearer t0ken-123" for r in calls)
        assert all("t0ken" not in r.url for r in view.requests)


def test_the_page_asks_for_the_token_once_and_says_when_it_is_refused(
    opened: Callable[..., Page],
) -> None:
    with served(api_token="t0ken-123") as url:
        with httpx.Client(base_url=url, headers={"Authorization": "Bearer t0ken-123"}) as c:
            post(c, "ask", 0, "Another private thought. ")
        view = opened(url)
        page = view.open("#stream=ask")
        page.wait_for_selector("#auth:not([hidden])")
        page.fill("#token", "wrong")
        page.click("#auth button")
        page.wait_for_selector("#auth:not([hidden])")
        until(page, "document.getElementById('auth-error').textContent.length > 0")
        page.fill("#token", "t0ken-123")
        page.click("#auth button")
        page.wait_for_selector(".row")
        assert page.is_hidden("#auth")
        assert view.rows()[0]["original"] == "Another private thought."
        assert all("t0ken" not in r.url and "wrong" not in r.url for r in view.requests)
        health = [r for r in view.requests if "/readyz" in r.url or "/metrics" in r.url]
        assert health and all("authorization" not in r.headers for r in health)


def test_a_token_with_plus_signs_from_the_fragment_works(opened: Callable[..., Page]) -> None:
    token = "a+b/c=="
    with served(api_token=token) as url:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}) as c:
            post(c, "plus", 0, "Base64 tokens have plus signs. ")
            c.post("/v1/streams/plus/close")
        view = opened(url)
        page = view.open("#stream=plus&token=a+b%2Fc%3D%3D")
        page.wait_for_selector("#state[data-state='ended']")
        assert page.evaluate("sessionStorage.getItem('thinktrans.token')") == token


# -- safety ------------------------------------------------------------------------------------


def test_a_hostile_thought_runs_no_script(opened: Callable[..., Page]) -> None:
    fake = FakeTranslator()
    fake.answers.extend([lambda texts, s, t: [f"{x} <img src=y onerror=alert(4)>" for x in texts]])
    with served(fake) as url, httpx.Client(base_url=url) as c:
        code = "```html\n<script>alert(5)</script>\n```\n"
        view, page = finished(opened, url, c, "evil", HOSTILE + code)
        page.click("#layouts button[data-layout='only']")
        page.hover(".row .tran >> nth=0")
        page.click("#export-md")
        time.sleep(0.5)
        rows = view.rows()
        assert rows[0]["original"] == HOSTILE.strip()  # the characters, shown as they are
        assert "<img src=y onerror=alert(4)>" in rows[0]["text"]
        assert page.evaluate("window.__pwned") is None
        assert view.dialogs == []
        assert page.locator("#rows img, #rows script, #rows svg").count() == 0
        allowed = ("/viewer", "/v1/", "/readyz", "/metrics")
        strays = [r.url for r in view.requests
                  if not r.url.startswith("blob:")
                  and not any(r.url.startswith(url + path) for path in allowed)]
        assert strays == []


# -- previews ----------------------------------------------------------------------------------

LONG = ("Let me think about how the cache handles an entry that expired while a reader was "
        "still holding a reference to it, because that decides the answer. ")
# Previews at every other word of a sentence of three or more (as in test_previews.py).
EAGER: dict[str, Any] = {"preview_min_words": 3, "preview_step_words": 2,
                         "preview_interval_ms": 0, "preview_mask_k": 1, "preview_max_decodes": 10,
                         "flush_idle_ms": 5000}
PREVIEW_ROW = """() => { const r = document.querySelector('#rows .row.preview');
    return r && { index: Number(r.dataset.index), status: r.dataset.status, mark: r.dataset.mark,
                  revision: r.querySelector('.status .rev').textContent,
                  label: r.querySelector('.status').getAttribute('aria-label'), title: r.title,
                  text: r.querySelector('.tran').textContent,
                  style: getComputedStyle(r.querySelector('.tran')).fontStyle }; }"""


def test_a_preview_shows_in_its_row_until_its_segment_replaces_it(
    opened: Callable[..., Page],
) -> None:
    with served(FakeTranslator(delay_s=0.005), **EAGER) as url, httpx.Client(base_url=url) as c:
        view, page = watching(opened, url, c, "pv", target="zh-CN", previews=True)
        words = LONG.split(" ")[:-1]
        seq = 0
        for word in words[:8]:  # slowly, as a model thinks
            seq = post(c, "pv", seq, word + " ")
            time.sleep(0.03)
        until(page, "document.querySelector('#rows .row.preview') !== null", 5)
        first = page.evaluate(PREVIEW_ROW)
        assert (first["index"], first["status"], first["style"]) == (0, "preview", "italic")
        assert first["text"].startswith("<zh-CN>Let me")  # the sentence is not done yet
        assert "provisional" in first["label"] and "replace" in first["title"]
        page.evaluate("document.querySelector('#rows .row.preview').dataset.mark = 'it'")
        for word in words[8:]:
            seq = post(c, "pv", seq, word + " ")
            time.sleep(0.03)
        until(page, "document.querySelector('#rows .row.preview .rev').textContent "
                    f"!== {first['revision']!r}", 5)
        later = page.evaluate(PREVIEW_ROW)
        assert later["mark"] == "it" and len(page.query_selector_all("#rows .row")) == 1
        assert int(later["revision"][1:]) > int(first["revision"][1:])  # replaced in place
        assert len(later["text"]) > len(first["text"])
        post(c, "pv", seq, "Then done.")  # the next sentence begins: the first is cut
        page.wait_for_selector(".row[data-index='0'][data-status='translated']", timeout=HANG_MS)
        c.post("/v1/streams/pv/close")
        page.wait_for_selector("#state[data-state='ended']")
        stream = as_now(events(c, "pv"))
        rows = view.rows()
        assert [r["index"] for r in rows] == [0, 1]  # no second row for index 0
        assert [r["text"] for r in rows] == [s["text"].strip() for s in stream]
        assert rows[0]["original"] == LONG.strip()
        assert page.get_attribute(".row[data-index='0']", "data-mark") == "it"  # the same row
        assert page.locator("#rows .preview, #rows .rev, #rows [aria-label]").count() == 0
        assert page.get_attribute(".row[data-index='0']", "title") is None


def test_a_preview_whose_segment_never_comes_is_gone_at_the_end(
    opened: Callable[..., Page],
) -> None:
    server = served(**EAGER)
    with server as url, httpx.Client(base_url=url) as c:
        view, page = watching(opened, url, c, "left", target="zh-CN", previews=True)
        # The service's own call for a preview of the open sentence; none is open, so
        # closing the stream cuts no segment: its end comes with the preview unsuperseded.
        preview = PreviewResult(index=0, text="缓存会保留", source_chars=30, revision=1)
        uv = server._server
        app: Any = uv.config.app
        emitter = app.state.runtime.streams.streams["left"].emitter

        async def publish() -> bool:  # on the server's loop, where the stream lives
            return bool(emitter.publish_preview(preview))

        assert asyncio.run_coroutine_threadsafe(publish(), uv.servers[0].get_loop()).result(5)
        page.wait_for_selector("#rows .row.preview[data-index='0']", timeout=HANG_MS)
        assert view.rows()[0]["text"] == "缓存会保留"
        assert c.post("/v1/streams/left/close").json() == {"segments": 0}
        page.wait_for_selector("#state[data-state='ended']", timeout=HANG_MS)
        assert page.locator("#rows .row").count() == 0


# -- connections -------------------------------------------------------------------------------


class CuttingProxy:
    """A TCP proxy on 127.0.0.1 in front of the sidecar whose connections the test can cut,
    as a network drop would."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.removeprefix("http://").split(":")
        self.upstream = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.open: list[socket.socket] = []
        self.lock = threading.Lock()
        self.passing = threading.Event()  # cleared: what the page sends waits (``hold``)
        self.passing.set()
        threading.Thread(target=self._accept, daemon=True).start()

    def hold(self) -> None:
        """Hold what the page sends (its requests, on any connection) until ``release``;
        answers already on their way still come."""
        self.passing.clear()

    def release(self) -> None:
        self.passing.set()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            with self.lock:
                self.open += [client, server]
            for a, b, gate in ((client, server, self.passing), (server, client, None)):
                threading.Thread(target=self._pipe, args=(a, b, gate), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket, gate: threading.Event | None) -> None:
        try:
            while data := src.recv(65536):
                if gate is not None:
                    gate.wait()
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        with self.lock:
            cut, self.open = self.open, []
        for s in cut:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        self.listener.close()
        self.cut()


def test_the_page_resumes_after_the_connection_drops(opened: Callable[..., Page]) -> None:
    with served(flush_idle_ms=10_000) as url, httpx.Client(base_url=url) as c:
        proxy = CuttingProxy(url)
        try:
            c.post("/v1/streams", json={"stream_id": "drop"})
            view = opened(proxy.url)
            page = view.open("#stream=drop")
            page.wait_for_selector("#state[data-state='live']")
            seq = 0
            for i in range(3):
                seq = post(c, "drop", seq, f"Before the drop {i}. ")
            view.wait_rows(2)  # the third sentence waits for the next (no idle flush)
            proxy.cut()
            page.wait_for_selector("#state[data-state='reconnecting']", timeout=HANG_MS)
            for i in range(3):
                seq = post(c, "drop", seq, f"After the drop {i}. ")
            c.post("/v1/streams/drop/close")
            page.wait_for_selector("#state[data-state='ended']", timeout=HANG_MS)
            rows = view.rows()
            stream = as_now(events(c, "drop"))
            # every segment once: none lost, none twice
            assert [r["original"] for r in rows] == [s["original"].strip() for s in stream]
            resumed = [r for r in view.requests if r.url.endswith("/v1/streams/drop/events")
                       and "last-event-id" in r.headers]
            # resumed after the last event it had (ids 0 and 1 were in before the cut)
            assert resumed and resumed[0].headers["last-event-id"] == "1"
        finally:
            proxy.close()


def test_an_evicted_stream_says_so(opened: Callable[..., Page]) -> None:
    with served(max_ended_streams=1) as url, httpx.Client(base_url=url) as c:
        for sid in ("first", "second"):
            post(c, sid, 0, "Short. ")
            c.post(f"/v1/streams/{sid}/close")
            events(c, sid)
        view = opened(url)
        page = view.open("#stream=first")
        page.wait_for_selector("#state[data-state='evicted']")
        notice = page.text_content("#notice")
        assert notice is not None and "evicted (410)" in notice



def test_the_pages_sse_parser_reads_events_however_the_bytes_are_cut(
    opened: Callable[..., Page],
) -> None:
    """The page's own parser (sse.js), loaded in the page: line ends of each kind, comments
    (keep-alives), multi-line data, and the wire cut at every character."""
    with served() as url:
        view = opened(url)
        page = view.open()
        got = page.evaluate("""async () => {
            const { SSEParser } = await import('./viewer/sse.js');
            const wire = ': keep-alive\\n\\n'
                + 'event: segment\\r\\nid: 7\\r\\ndata: {"a":1}\\r\\n\\r\\n'
                + 'event: update\\rid: 8\\rdata: line one\\rdata: line two\\r\\r'
                + 'data: no type\\n\\nevent: end\\nid: 9\\ndata: {}\\n\\n';
            const runs = [];
            for (const size of [1, 2, 3, 5, 7, 11, wire.length]) {
                const seen = [];
                const parser = new SSEParser((e) => seen.push(e));
                for (let i = 0; i < wire.length; i += size) parser.push(wire.slice(i, i + size));
                runs.push(seen);
            }
            return runs;
        }""")
        expected = [
            {"id": "7", "type": "segment", "data": '{"a":1}'},
            {"id": "8", "type": "update", "data": "line one\nline two"},
            {"id": "8", "type": "message", "data": "no type"},
            {"id": "9", "type": "end", "data": "{}"},
        ]
        assert all(run == expected for run in got), got


def test_a_stream_not_open_yet_is_waited_for(opened: Callable[..., Page]) -> None:
    with served() as url, httpx.Client(base_url=url) as c:
        view = opened(url)
        page = view.open("#stream=soon")
        page.wait_for_selector("#state[data-state='waiting']")
        notice = page.text_content("#notice")
        assert notice is not None and "no stream 'soon'" in notice
        post(c, "soon", 0, "Here it is now. ")
        c.post("/v1/streams/soon/close")
        page.wait_for_selector("#state[data-state='ended']", timeout=HANG_MS)
        assert view.rows()[0]["original"] == "Here it is now."
        assert page.is_hidden("#notice")


def test_a_refused_stream_id_is_not_asked_for_again_and_again(
    opened: Callable[..., Page],
) -> None:
    with served() as url:
        view = opened(url)
        page = view.open("#stream=not%20an%20id")
        page.wait_for_selector("#state[data-state='gone']")
        time.sleep(1.5)
        asked = [r for r in view.requests if "/events" in r.url]
        assert len(asked) == 1  # a 422 does not change by asking again


def test_switching_streams_mid_read_shows_only_the_new_one(opened: Callable[..., Page]) -> None:
    with served() as url, httpx.Client(base_url=url) as c:
        c.post("/v1/streams", json={"stream_id": "one"})
        post(c, "two", 0, "Two says this. ")
        c.post("/v1/streams/two/close")
        view = opened(url)
        page = view.open("#stream=one")
        page.wait_for_selector("#state[data-state='live']")
        page.evaluate("location.hash = '#stream=two'")
        page.wait_for_selector("#state[data-state='ended']")
        post(c, "one", 0, "One says that. And more. ")
        time.sleep(1.0)
        assert [r["original"] for r in view.rows()] == ["Two says this."]


def test_hidden_and_error_rows_say_what_they_are(opened: Callable[..., Page]) -> None:
    from models.errors import BackendError

    failing = FakeTranslator()
    failing.answers.extend([BackendError("the backend broke")] * 4)
    with served(failing) as url, httpx.Client(base_url=url) as c:
        c.post("/v1/streams", json={"stream_id": "hid", "policy": "hide"})
        post(c, "hid", 0, "Not in the user's language. 这句是中文。")
        c.post("/v1/streams/hid/close")
        post(c, "err", 0, "This one fails. ")
        c.post("/v1/streams/err/close")
        view = opened(url)
        page = view.open("#stream=hid")
        page.wait_for_selector("#state[data-state='ended']")
        rows = view.rows()
        assert [r["status"] for r in rows] == ["hidden", "same_language"]
        assert "hidden" in rows[0]["text"] and page.text_content(".row .status") == "hidden"
        page.evaluate("location.hash = '#stream=err'")
        page.wait_for_selector("#title:text('err')")
        page.wait_for_selector(".row[data-status='error']")
        page.click(".row .status")
        meta = page.text_content(".row .meta")
        assert meta is not None and "error:" in meta


def test_a_long_code_block_cut_in_parts_stays_code(opened: Callable[..., Page]) -> None:
    code = "```python\n" + "".join(f"    x_{i} = {i} * 2  # keep   spacing\n"
                                    for i in range(60)) + "```\n"
    with served(max_segment_chars=100) as url, httpx.Client(base_url=url) as c:
        post(c, "code", 0, "Here is the code. " + code + "Done with it. ")
        c.post("/v1/streams/code/close")
        found = as_now(events(c, "code"))
        parts = [s for s in found if s["status"] == "skipped"]
        assert len(parts) > 1 and not parts[1]["original"].lstrip().startswith("```")
        view = opened(url)
        page = view.open("#stream=code")
        page.wait_for_selector("#state[data-state='ended']")
        pres = page.eval_on_selector_all(".row .orig", "cells => cells.map(c => "
                                         "c.querySelector('pre') ? c.textContent : null)")
        assert pres[0] is None and pres[-1] is None  # the prose before and after
        assert all(p is not None for p in pres[1:-1])  # every part of the block is code
        assert "    x_1 = 1 * 2  # keep   spacing" in "".join(pres[1:-1])  # as it was


def test_the_markdown_export_never_renders_the_thinking(opened: Callable[..., Page]) -> None:
    with served() as url, httpx.Client(base_url=url) as c:
        text = "Watch ```` this: <img src=x onerror=alert(1)> and **bold**. "
        _, page = finished(opened, url, c, "md", text)
        with page.expect_download() as got:
            page.click("#export-md")
        markdown = open(got.value.path(), encoding="utf-8").read()
        fence = "`````text\n"  # longer than the text's own run of four
        assert markdown.count(fence) == 2
        body = markdown.split(fence, 1)[1].split("\n`````", 1)[0]
        assert body == "Watch ```` this: <img src=x onerror=alert(1)> and **bold**."


def test_a_stream_whose_first_events_are_gone_shows_what_is_kept(
    opened: Callable[..., Page],
) -> None:
    with served(max_events_retained=16) as url, httpx.Client(base_url=url) as c:
        view, page = finished(opened, url, c, "old", " ".join(f"Sentence {i}." for i in range(30)))
        notice = page.text_content("#notice")
        assert notice is not None and "no longer kept" in notice
        rows = view.rows()
        assert [r["index"] for r in rows] == list(range(15, 30))  # the last 15, and end


# -- a stream opened again under its id ---------------------------------------------------------

OLD = "Old sentence one. Old sentence two. Old sentence three. Old sentence four. "
NEW_FEW = "A new short one."
NEW_MANY = " ".join(f"New sentence {i} here." for i in range(6))
AGAIN_CASES = {
    # the page asks while the stream is gone (404), then it is opened again
    "gone first": NEW_MANY,
    # opened again and ended before the page asks: the page's last id is past its last (409)
    "fewer events": NEW_FEW,
    # opened again before the page asks, with more events than the page had: only the
    # stream's start time (Thinktrans-Stream-Started) tells it is another stream
    "more events": NEW_MANY,
    # the page had read the old stream to its end: the list says another one has its id
    "after its end": NEW_MANY,
}


def _originals(page: Any) -> list[str]:
    return page.eval_on_selector_all("#rows .row .orig", "cells => cells.map(c => c.textContent)")


def _events_asked(view: Page, sid: str) -> int:
    return sum(r.url.endswith(f"/v1/streams/{sid}/events") for r in view.requests)


def _lists_asked(view: Page) -> int:
    return sum("/v1/streams?limit=" in r.url for r in view.requests)


@pytest.mark.parametrize("case", list(AGAIN_CASES))
def test_a_stream_opened_again_under_its_id_shows_only_the_new_ones_rows(
    opened: Callable[..., Page], case: str,
) -> None:
    with served(flush_idle_ms=10_000) as url, httpx.Client(base_url=url) as c:
        proxy = CuttingProxy(url)
        try:
            sid = "again"
            c.post("/v1/streams", json={"stream_id": sid})
            view = opened(proxy.url)
            page = view.open(f"#stream={sid}")
            page.wait_for_selector("#state[data-state='live']")
            post(c, sid, 0, OLD)
            if case == "after its end":
                c.post(f"/v1/streams/{sid}/close")
                page.wait_for_selector("#state[data-state='ended']", timeout=HANG_MS)
            else:
                view.wait_rows(3)  # the fourth sentence waits for more text (no idle flush)
            old = _originals(page)
            assert old[:3] == ["Old sentence one.", "Old sentence two.", "Old sentence three."]
            if case in ("fewer events", "more events"):
                proxy.hold()  # the page's next request waits until the new stream has ended
            assert c.delete(f"/v1/streams/{sid}").status_code == 204
            if case == "gone first":
                page.wait_for_selector("#state[data-state='waiting']", timeout=HANG_MS)
                notice = page.text_content("#notice")
                assert notice is not None and "deleted or expired (404)" in notice
                assert _originals(page) == old  # what was read stays until a new one comes
            assert c.post("/v1/streams", json={"stream_id": sid}).status_code == 201
            post(c, sid, 0, AGAIN_CASES[case])
            c.post(f"/v1/streams/{sid}/close")
            new = [s["original"].strip() for s in as_now(events(c, sid))]
            proxy.release()
            until(page, f"JSON.stringify([...document.querySelectorAll('#rows .row .orig')]"
                        f".map(c => c.textContent)) === JSON.stringify({json.dumps(new)})")
            page.wait_for_selector("#state[data-state='ended']", timeout=HANG_MS)
            assert _originals(page) == new and not set(old) & set(new)
            assert [r["index"] for r in view.rows()] == list(range(len(new)))
            notice = page.text_content("#notice")
            assert notice is not None and "opened again under the same id" in notice
            # and it stops there: two more list refreshes, no more event requests
            asked, lists = _events_asked(view, sid), _lists_asked(view)
            give_up = time.monotonic() + 60
            while _lists_asked(view) < lists + 2:
                assert time.monotonic() < give_up, "the list is not refreshed"
                page.evaluate("true")  # lets Playwright deliver the page's requests
                time.sleep(0.1)
            assert _events_asked(view, sid) == asked
        finally:
            proxy.release()
            proxy.close()


# -- what the page says of a stream: its export, its labels, the list, the Copy button ----------

HOSTILE_MODEL = ("m1\n# Owned <img src=x onerror=alert(1)>\n```\n<script>alert(2)</script>\n"
                 "`` tick `")


def _markdown_tokens(markdown: str) -> list[Any]:
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark").parse(markdown)  # HTML on, as CommonMark has it


def test_the_markdown_export_renders_nothing_a_client_chose(opened: Callable[..., Page]) -> None:
    fake = FakeTranslator(models=(HOSTILE_MODEL,))
    with served(fake) as url, httpx.Client(base_url=url) as c:
        r = c.post("/v1/streams", json={"stream_id": "named", "model": HOSTILE_MODEL})
        assert r.status_code == 201, r.text
        _, page = finished(opened, url, c, "named", "First one here. Second one here. ")
        with page.expect_download() as got:
            page.click("#export-md")
        markdown = open(got.value.path(), encoding="utf-8").read()
        # and every field a client or a backend chose, through the page's own function
        direct = page.evaluate("""async (hostile) => {
            const { toMarkdown } = await import('./viewer/export.js');
            const s = { index: 0, original: 'Hi.', text: 'Hi.', status: 'error',
                        source_lang: hostile, target: hostile, backend: hostile,
                        model: hostile, error: hostile };
            return toMarkdown({ id: hostile, target: hostile }, [s]);
        }""", HOSTILE_MODEL)
    shown = HOSTILE_MODEL.replace("\n", "\\n")
    for text, headings, fields in ((markdown, 3, 2), (direct, 2, 7)):
        tokens = _markdown_tokens(text)
        assert sum(t.type == "heading_open" for t in tokens) == headings, text
        inline = [child for t in tokens if t.children for child in t.children]
        assert not [t for t in [*tokens, *inline] if t.type.startswith("html")], text
        assert sum(t.type == "code_inline" and t.content == shown for t in inline) == fields
        html = "".join(t.content for t in inline if t.type == "text")
        assert "Owned" not in html and "<img" not in html  # none of it outside code
        for t in tokens:
            if t.type == "fence":  # the texts' blocks hold only the texts
                assert t.info == "text"


def test_a_passthrough_segment_is_shown_as_passed_through_not_translated(
    opened: Callable[..., Page],
) -> None:
    with served() as url, httpx.Client(base_url=url) as c:
        assert c.post("/v1/streams", json={"stream_id": "dry", "backend": "passthrough"}
                      ).status_code == 201
        _, page = finished(opened, url, c, "dry", "An English sentence for a dry run. ")
        found = as_now(events(c, "dry"))
        assert (found[0]["status"], found[0]["backend"]) == ("translated", "passthrough")
        row = page.locator(".row").first
        assert row.get_attribute("data-status") == "translated"  # the contract's status
        assert page.text_content(".row .status") == "passed through"
        assert page.get_attribute(".row .tran", "lang") == "en"  # the original's language
        colour = page.eval_on_selector(".row .status", "b => getComputedStyle(b).color")
        page.click(".row .status")
        meta = page.text_content(".row .meta")
        assert meta is not None and "unchanged" in meta and "backend passthrough" in meta
        with page.expect_download() as got:
            page.click("#export-md")
        markdown = open(got.value.path(), encoding="utf-8").read()
        assert "## 0 · passed through, unchanged ·" in markdown
        # a row the fake backend translated is still "translated", in another colour
        page.evaluate("location.hash = '#stream=wet'")
        post(c, "wet", 0, "An English sentence for a real run. ")
        c.post("/v1/streams/wet/close")
        page.wait_for_selector("#title:text('wet')")
        page.wait_for_selector("#state[data-state='ended']", timeout=HANG_MS)
        assert page.text_content(".row .status") == "translated"
        assert page.eval_on_selector(".row .status", "b => getComputedStyle(b).color") != colour
        gutter = page.eval_on_selector(".row .gutter", "g => g.getBoundingClientRect().height")
        cell = page.eval_on_selector(".row .tran", "t => t.getBoundingClientRect().height")
        assert gutter <= cell + 1  # the label on one line


def test_the_list_says_nothing_before_it_was_read(opened: Callable[..., Page]) -> None:
    with served(api_token="t0ken-123") as url:
        view = opened(url)
        page = view.open()
        page.wait_for_selector("#auth:not([hidden])")
        assert page.is_hidden("#list-empty")  # no data read yet: no "No streams yet."
        page.fill("#token", "t0ken-123")
        page.click("#auth button")
        page.wait_for_selector("#list-empty:not([hidden])", timeout=HANG_MS)
        assert page.text_content("#list-empty") == "No streams yet."


@pytest.mark.parametrize("width", [1280, 600])
def test_the_copy_button_covers_no_text(opened: Callable[..., Page], width: int) -> None:
    long = ("This sentence is long enough to fill its cell to the right edge and wrap onto "
            "several lines, so that a button in its corner would sit on its words. ")
    with served() as url, httpx.Client(base_url=url) as c:
        post(c, "wide", 0, long + "Short one. ")
        c.post("/v1/streams/wide/close")
        view = opened(url)
        view.page.set_viewport_size({"width": width, "height": 800})
        page = view.open("#stream=wide")
        page.wait_for_selector("#state[data-state='ended']")

        def box(selector: str) -> dict[str, float] | None:
            found = page.locator(selector)
            return found.bounding_box() if found.is_visible() else None

        for layout in ("side", "below", "only"):
            page.click(f"#layouts button[data-layout='{layout}']")
            for n in (0, 1):
                row = f".row >> nth={n}"
                page.mouse.move(1, 1)  # off the rows: the original shown on hover goes
                page.hover(f"{row} >> .gutter")
                button = box(f"{row} >> .copy")
                assert button is not None, (layout, n)
                for cell in (".tran", ".orig", ".gutter .status"):
                    other = box(f"{row} >> {cell}")
                    if other is None:
                        continue
                    apart = (button["x"] + button["width"] <= other["x"]
                             or other["x"] + other["width"] <= button["x"]
                             or button["y"] + button["height"] <= other["y"]
                             or other["y"] + other["height"] <= button["y"])
                    assert apart, (layout, width, n, cell, button, other)
